#include "gpu/device.hpp"

#include <mutex>
#include <utility>

namespace dualpath::gpu {

// -- names --------------------------------------------------------------------

std::string to_string(backend_kind x) {
  switch (x) {
    case backend_kind::host:
      return "host";
    case backend_kind::cuda:
      return "cuda";
  }
  return "backend_kind(" + std::to_string(static_cast<int>(x)) + ")";
}

std::string to_string(backend_choice x) {
  switch (x) {
    case backend_choice::automatic:
      return "auto";
    case backend_choice::cuda:
      return "cuda";
    case backend_choice::host:
      return "host";
  }
  return "backend_choice(" + std::to_string(static_cast<int>(x)) + ")";
}

std::string to_string(copy_method x) {
  switch (x) {
    case copy_method::per_chunk:
      return "per_chunk";
    case copy_method::batched:
      return "batched";
  }
  return "copy_method(" + std::to_string(static_cast<int>(x)) + ")";
}

caf::expected<backend_choice> parse_backend_choice(const std::string& str) {
  if (str == "auto")
    return backend_choice::automatic;
  if (str == "cuda")
    return backend_choice::cuda;
  if (str == "host")
    return backend_choice::host;
  return caf::make_error(gpu_errc::invalid_argument,
                         "gpu.backend must be auto, cuda or host, not '" + str
                             + "'");
}

// -- device -------------------------------------------------------------------

struct device::accounting {
  mutable std::mutex mtx;
  uint64_t allocated = 0;
  uint64_t peak = 0;
};

device::device(uint64_t budget)
    : budget_(budget), accounting_(std::make_unique<accounting>()) {
}

device::~device() = default;

uint64_t device::bytes_allocated() const {
  std::lock_guard<std::mutex> guard{accounting_->mtx};
  return accounting_->allocated;
}

uint64_t device::peak_bytes_allocated() const {
  std::lock_guard<std::mutex> guard{accounting_->mtx};
  return accounting_->peak;
}

caf::expected<device_buffer> device::allocate(size_t bytes) {
  if (bytes == 0)
    return caf::make_error(gpu_errc::invalid_argument, "allocate: 0 bytes");
  {
    // Reserve first so that concurrent allocations cannot overshoot together.
    std::lock_guard<std::mutex> guard{accounting_->mtx};
    auto& acc = *accounting_;
    if (bytes > budget_ || acc.allocated > budget_ - bytes)
      return caf::make_error(gpu_errc::budget_exceeded,
                             "allocate " + std::to_string(bytes) + " B with "
                                 + std::to_string(acc.allocated) + " B of a "
                                 + std::to_string(budget_)
                                 + " B HBM budget in use");
    acc.allocated += bytes;
    if (acc.allocated > acc.peak)
      acc.peak = acc.allocated;
  }
  auto ptr = do_allocate(bytes);
  if (!ptr) {
    std::lock_guard<std::mutex> guard{accounting_->mtx};
    accounting_->allocated -= bytes;
    return std::move(ptr.error());
  }
  return device_buffer{shared_from_this(), *ptr, bytes};
}

void device::release_handle(handle_kind kind, void* ptr, size_t size) noexcept {
  switch (kind) {
    case handle_kind::buffer: {
      do_free(static_cast<std::byte*>(ptr), size);
      std::lock_guard<std::mutex> guard{accounting_->mtx};
      accounting_->allocated -= size;
      return;
    }
    case handle_kind::pinned:
      do_unpin(static_cast<std::byte*>(ptr));
      return;
    case handle_kind::stream:
      do_destroy_stream(ptr);
      return;
    case handle_kind::event:
      do_destroy_event(ptr);
      return;
  }
}

caf::expected<pinned_host> device::pin(void* data, size_t bytes) {
  if (data == nullptr || bytes == 0)
    return caf::make_error(gpu_errc::invalid_argument,
                           "pin: null pointer or 0 bytes");
  auto ptr = static_cast<std::byte*>(data);
  if (auto err = do_pin(ptr, bytes))
    return err;
  return pinned_host{shared_from_this(), ptr, bytes};
}

caf::expected<stream> device::make_stream() {
  auto handle = do_make_stream();
  if (!handle)
    return std::move(handle.error());
  return stream{shared_from_this(), *handle, 0};
}

caf::expected<event> device::make_event() {
  auto handle = do_make_event();
  if (!handle)
    return std::move(handle.error());
  return event{shared_from_this(), *handle, 0};
}

caf::error device::check_stream(const stream& s) const {
  if (!s.valid() || s.owner() != this)
    return caf::make_error(gpu_errc::invalid_handle,
                           "stream is empty or belongs to another device");
  return caf::none;
}

caf::error device::translate(const std::vector<copy_chunk>& chunks,
                             const std::byte* src, size_t src_size,
                             std::byte* dst, size_t dst_size,
                             std::vector<raw_chunk>& out) const {
  out.clear();
  out.reserve(chunks.size());
  for (size_t i = 0; i < chunks.size(); ++i) {
    const auto& c = chunks[i];
    // Written as subtractions so that huge offsets cannot wrap around.
    if (c.src_offset > src_size || c.length > src_size - c.src_offset
        || c.dst_offset > dst_size || c.length > dst_size - c.dst_offset)
      return caf::make_error(
          gpu_errc::out_of_bounds,
          "chunk " + std::to_string(i) + " (src " + std::to_string(c.src_offset)
              + ", dst " + std::to_string(c.dst_offset) + ", length "
              + std::to_string(c.length) + ") exceeds source "
              + std::to_string(src_size) + " B or destination "
              + std::to_string(dst_size) + " B");
    if (c.length == 0)
      continue; // nothing to move; CUDA's batch API rejects zero sizes
    out.push_back(raw_chunk{src + c.src_offset, dst + c.dst_offset, c.length});
  }
  return caf::none;
}

caf::error device::copy_h2d(const pinned_host& src, device_buffer& dst,
                            const std::vector<copy_chunk>& chunks, stream& s,
                            copy_method method) {
  if (!src.valid() || src.owner() != this || !dst.valid()
      || dst.owner() != this)
    return caf::make_error(gpu_errc::invalid_handle,
                           "copy_h2d: registration or buffer is empty or "
                           "belongs to another device");
  if (auto err = check_stream(s))
    return err;
  if (method == copy_method::batched && !capabilities().batched_copy)
    return caf::make_error(gpu_errc::unsupported,
                           "copy_h2d: batched copies not supported by "
                               + capabilities().name);
  std::vector<raw_chunk> raw;
  if (auto err = translate(chunks, src.data(), src.size(), dst.data(),
                           dst.size(), raw))
    return err;
  if (raw.empty())
    return caf::none;
  return do_copy(direction::h2d, raw, s.native(), method);
}

caf::error device::copy_d2h(const device_buffer& src, pinned_host& dst,
                            const std::vector<copy_chunk>& chunks, stream& s,
                            copy_method method) {
  if (!src.valid() || src.owner() != this || !dst.valid()
      || dst.owner() != this)
    return caf::make_error(gpu_errc::invalid_handle,
                           "copy_d2h: buffer or registration is empty or "
                           "belongs to another device");
  if (auto err = check_stream(s))
    return err;
  if (method == copy_method::batched && !capabilities().batched_copy)
    return caf::make_error(gpu_errc::unsupported,
                           "copy_d2h: batched copies not supported by "
                               + capabilities().name);
  std::vector<raw_chunk> raw;
  if (auto err = translate(chunks, src.data(), src.size(), dst.data(),
                           dst.size(), raw))
    return err;
  if (raw.empty())
    return caf::none;
  return do_copy(direction::d2h, raw, s.native(), method);
}

caf::error device::record(event& e, stream& s) {
  if (!e.valid() || e.owner() != this)
    return caf::make_error(gpu_errc::invalid_handle,
                           "event is empty or belongs to another device");
  if (auto err = check_stream(s))
    return err;
  return do_record(e.native(), s.native());
}

caf::expected<bool> device::query(const event& e) {
  if (!e.valid() || e.owner() != this)
    return caf::make_error(gpu_errc::invalid_handle,
                           "event is empty or belongs to another device");
  return do_query(e.native());
}

caf::error device::synchronize(const event& e) {
  if (!e.valid() || e.owner() != this)
    return caf::make_error(gpu_errc::invalid_handle,
                           "event is empty or belongs to another device");
  return do_synchronize_event(e.native());
}

caf::error device::synchronize(stream& s) {
  if (auto err = check_stream(s))
    return err;
  return do_synchronize_stream(s.native());
}

caf::expected<uint64_t> device::checksum(const device_buffer& buf,
                                         size_t offset, size_t length,
                                         stream& s) {
  if (!buf.valid() || buf.owner() != this)
    return caf::make_error(gpu_errc::invalid_handle,
                           "checksum: buffer is empty or belongs to another "
                           "device");
  if (auto err = check_stream(s))
    return err;
  if (offset > buf.size() || length > buf.size() - offset)
    return caf::make_error(gpu_errc::out_of_bounds,
                           "checksum of [" + std::to_string(offset) + ", +"
                               + std::to_string(length) + ") in a "
                               + std::to_string(buf.size()) + " B buffer");
  return do_checksum(buf.data() + offset, length, s.native());
}

// -- factory ------------------------------------------------------------------

namespace {

// The context string of an error made with caf::make_error(code, "text"),
// else CAF's rendering.
std::string describe(const caf::error& err) {
  const auto& ctx = err.context();
  if (ctx.match_elements<std::string>())
    return ctx.get_as<std::string>(0);
  return caf::to_string(err);
}

} // namespace

#if !DUALPATH_HAVE_CUDA
// Built without nvcc: gpu/cuda_*.cpp are not compiled, the cuda backend is
// absent and says so.
caf::expected<int> probe_cuda() {
  return caf::make_error(gpu_errc::no_device,
                         "no CUDA device: built without CUDA (nvcc not found)");
}

caf::expected<std::shared_ptr<device>> make_cuda_device(const device_options&) {
  return probe_cuda().error();
}
#endif

caf::expected<device_selection> make_device(const device_options& opts) {
  const auto prefix = "gpu.backend=" + to_string(opts.backend) + ": ";
  auto summary = [](const device& dev) {
    return to_string(dev.capabilities().kind) + " (" + dev.capabilities().name
           + ", HBM budget " + std::to_string(dev.hbm_budget()) + " B)";
  };
  switch (opts.backend) {
    case backend_choice::host: {
      auto dev = make_host_device(opts);
      if (!dev)
        return std::move(dev.error());
      auto reason = prefix + summary(**dev) + " as configured";
      return device_selection{std::move(*dev), std::move(reason)};
    }
    case backend_choice::cuda: {
      auto dev = make_cuda_device(opts);
      if (!dev)
        return std::move(dev.error());
      auto reason = prefix + summary(**dev) + " as configured";
      return device_selection{std::move(*dev), std::move(reason)};
    }
    case backend_choice::automatic:
      break;
  }
  std::string why_not_cuda;
  if (auto count = probe_cuda()) {
    auto dev = make_cuda_device(opts);
    if (dev) {
      auto reason = prefix + summary(**dev) + ", device "
                    + std::to_string(opts.cuda_device) + " of "
                    + std::to_string(*count);
      return device_selection{std::move(*dev), std::move(reason)};
    }
    why_not_cuda = describe(dev.error());
  } else {
    why_not_cuda = describe(count.error());
  }
  auto dev = make_host_device(opts);
  if (!dev)
    return std::move(dev.error());
  auto reason = prefix + summary(**dev) + ", because " + why_not_cuda;
  return device_selection{std::move(*dev), std::move(reason)};
}

} // namespace dualpath::gpu
