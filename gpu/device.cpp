#include "gpu/device.hpp"

#include <algorithm>
#include <mutex>
#include <utility>

#include <unistd.h>

#include "config/enum_names.hpp"

namespace dualpath::gpu {

// -- names --------------------------------------------------------------------

constexpr std::string_view backend_kind_names[] = {"host", "cuda"};

std::string to_string(backend_kind x) {
  return config::name_of(x, backend_kind_names, "backend_kind");
}

constexpr std::string_view backend_choice_names[] = {"auto", "cuda", "host"};

std::string to_string(backend_choice x) {
  return config::name_of(x, backend_choice_names, "backend_choice");
}

constexpr std::string_view copy_method_names[] = {"per_chunk", "batched",
                                                  "automatic"};

std::string to_string(copy_method x) {
  return config::name_of(x, copy_method_names, "copy_method");
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

caf::expected<copy_method> resolve_copy_method(copy_method requested,
                                               bool batch_available,
                                               size_t chunks) {
  switch (requested) {
    case copy_method::per_chunk:
      return copy_method::per_chunk;
    case copy_method::batched:
      if (!batch_available)
        return caf::make_error(gpu_errc::unsupported,
                               "batched copies not supported by this device");
      return copy_method::batched;
    case copy_method::automatic:
      // One chunk is one call either way; the plain copy is the cheaper one.
      return batch_available && chunks > 1 ? copy_method::batched
                                           : copy_method::per_chunk;
  }
  return caf::make_error(gpu_errc::invalid_argument, "unknown copy method");
}

caf::expected<int> device_for_rank(uint32_t rank, int first,
                                   const std::vector<uint32_t>& node_gpus,
                                   int count) {
  if (count <= 0)
    return caf::make_error(gpu_errc::no_device, "no CUDA device to place "
                                                "engine rank "
                                                    + std::to_string(rank)
                                                    + " on");
  if (!node_gpus.empty()) {
    if (rank >= node_gpus.size())
      return caf::make_error(gpu_errc::invalid_argument,
                             "engine rank " + std::to_string(rank)
                                 + " has no entry in the node's gpus list ("
                                 + std::to_string(node_gpus.size())
                                 + " entries)");
    auto g = node_gpus[rank];
    if (g >= static_cast<uint32_t>(count))
      return caf::make_error(gpu_errc::invalid_argument,
                             "gpus lists device " + std::to_string(g)
                                 + " for engine rank " + std::to_string(rank)
                                 + ", but this machine has "
                                 + std::to_string(count) + " CUDA device"
                                 + (count == 1 ? "" : "s"));
    return static_cast<int>(g);
  }
  if (first < 0 || first >= count)
    return caf::make_error(
        gpu_errc::invalid_argument,
        "gpu.device = " + std::to_string(first) + ", but this machine has "
            + std::to_string(count) + " CUDA device" + (count == 1 ? "" : "s")
            + " (ordinals 0.." + std::to_string(count - 1) + ")");
  return static_cast<int>((static_cast<uint64_t>(first) + rank)
                          % static_cast<uint64_t>(count));
}

std::string describe(const caf::error& err) {
  if (!err)
    return "no error";
  const auto& ctx = err.context();
  if (ctx.match_elements<std::string>())
    return ctx.get_as<std::string>(0);
  return caf::to_string(err);
}

// -- dma-buf ------------------------------------------------------------------

dmabuf& dmabuf::operator=(dmabuf&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0)
      ::close(fd_);
    fd_ = std::exchange(other.fd_, -1);
    base_ = std::exchange(other.base_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

dmabuf::~dmabuf() {
  if (fd_ >= 0)
    ::close(fd_);
}

// -- device -------------------------------------------------------------------

struct device::accounting {
  mutable std::mutex mtx;
  uint64_t allocated = 0;
  uint64_t peak = 0;
  device_stats stats;
  /// The pool (empty for an unpooled device: every buffer is its own
  /// backend allocation).
  bool pooled = true;
  uint64_t reserve = 0;
  uint64_t grain = 0;
  range_pool pool{256}; // cudaMalloc's alignment guarantee
  /// Handles of share_pinned(): released without unregistering.
  std::vector<const void*> shared_pins;
};

device::device(uint64_t budget, const device_options& opts, bool pooled)
    : budget_(budget), accounting_(std::make_unique<accounting>()) {
  accounting_->pooled = pooled;
  accounting_->reserve = std::min(opts.pool_reserve, budget);
  accounting_->grain = std::max<uint64_t>(opts.pool_grain, 1);
}

device::~device() = default;

namespace {

// Slabs are whole 2 MiB pages: GPU large pages, and page-aligned for a
// dma-buf export of the slab.
constexpr uint64_t slab_granule = uint64_t{2} << 20;

uint64_t slab_round(uint64_t bytes) {
  if (bytes > UINT64_MAX - (slab_granule - 1))
    return 0;
  return (bytes + slab_granule - 1) / slab_granule * slab_granule;
}

} // namespace

caf::error device::reserve_pool() {
  std::lock_guard<std::mutex> guard{accounting_->mtx};
  auto& acc = *accounting_;
  if (!acc.pooled || acc.reserve == 0 || !acc.pool.slabs().empty())
    return caf::none;
  auto bytes = slab_round(acc.reserve);
  auto slab = do_allocate(bytes);
  if (!slab)
    return std::move(slab.error());
  acc.pool.add_slab(*slab, bytes);
  ++acc.stats.slabs;
  return caf::none;
}

void device::release_pool() noexcept {
  std::vector<pool_slab> slabs;
  {
    std::lock_guard<std::mutex> guard{accounting_->mtx};
    slabs = accounting_->pool.slabs();
    accounting_->pool = range_pool{256};
  }
  for (auto& s : slabs)
    do_free(s.base, s.size);
}

void device::count_host_wait() {
  std::lock_guard<std::mutex> guard{accounting_->mtx};
  ++accounting_->stats.host_waits;
}

uint64_t device::bytes_allocated() const {
  std::lock_guard<std::mutex> guard{accounting_->mtx};
  return accounting_->allocated;
}

uint64_t device::peak_bytes_allocated() const {
  std::lock_guard<std::mutex> guard{accounting_->mtx};
  return accounting_->peak;
}

device_stats device::stats() const {
  std::lock_guard<std::mutex> guard{accounting_->mtx};
  return accounting_->stats;
}

std::vector<pool_slab> device::slabs() const {
  std::lock_guard<std::mutex> guard{accounting_->mtx};
  return accounting_->pool.slabs();
}

caf::expected<device_buffer> device::allocate(size_t bytes) {
  if (bytes == 0)
    return caf::make_error(gpu_errc::invalid_argument, "allocate: 0 bytes");
  std::lock_guard<std::mutex> guard{accounting_->mtx};
  auto& acc = *accounting_;
  if (bytes > budget_ || acc.allocated > budget_ - bytes)
    return caf::make_error(gpu_errc::budget_exceeded,
                           "allocate " + std::to_string(bytes) + " B with "
                               + std::to_string(acc.allocated) + " B of a "
                               + std::to_string(budget_)
                               + " B HBM budget in use");
  std::byte* ptr = nullptr;
  if (!acc.pooled) {
    auto got = do_allocate(bytes);
    if (!got)
      return std::move(got.error());
    ptr = *got;
  } else {
    ptr = acc.pool.take(bytes);
    if (ptr == nullptr) {
      // Grow by one slab: at least the grain (within the budget left), at
      // least this allocation. The backend is called with the lock held:
      // growing is rare (engines reserve their pool up front) and keeps
      // two threads from adding a slab each for one shortage.
      uint64_t held = acc.pool.capacity();
      uint64_t room = held < budget_ ? budget_ - held : 0;
      uint64_t want = std::max<uint64_t>(acc.pool.rounded(bytes),
                                         std::min(acc.grain, room));
      auto slab_bytes = slab_round(want);
      if (slab_bytes == 0)
        return caf::make_error(gpu_errc::out_of_memory,
                               "allocate " + std::to_string(bytes)
                                   + " B: no slab that large");
      auto slab = do_allocate(slab_bytes);
      if (!slab)
        return std::move(slab.error());
      acc.pool.add_slab(*slab, slab_bytes);
      ++acc.stats.slabs;
      ptr = acc.pool.take(bytes);
      if (ptr == nullptr) // cannot happen: the new slab is large enough
        return caf::make_error(gpu_errc::out_of_memory,
                               "allocate " + std::to_string(bytes)
                                   + " B: the new slab has no room");
    }
  }
  acc.allocated += bytes;
  acc.peak = std::max(acc.peak, acc.allocated);
  ++acc.stats.allocations;
  if (!acc.pooled)
    ++acc.stats.slabs;
  return device_buffer{shared_from_this(), ptr, bytes};
}

void device::release_handle(handle_kind kind, void* ptr, size_t size) noexcept {
  switch (kind) {
    case handle_kind::buffer: {
      std::lock_guard<std::mutex> guard{accounting_->mtx};
      auto& acc = *accounting_;
      if (acc.pooled)
        acc.pool.give_back(static_cast<std::byte*>(ptr));
      else
        do_free(static_cast<std::byte*>(ptr), size);
      acc.allocated -= size;
      return;
    }
    case handle_kind::pinned: {
      {
        std::lock_guard<std::mutex> guard{accounting_->mtx};
        auto& shared = accounting_->shared_pins;
        auto i = std::find(shared.begin(), shared.end(), ptr);
        if (i != shared.end()) {
          shared.erase(i); // another device's registration: not ours
          return;
        }
      }
      do_unpin(static_cast<std::byte*>(ptr));
      return;
    }
    case handle_kind::stream:
      do_destroy_stream(ptr);
      return;
    case handle_kind::event:
      do_destroy_event(ptr);
      return;
  }
}

caf::expected<pool_location> device::locate(const device_buffer& buf) const {
  if (auto err = check_owned(buf, "locate: buffer"))
    return err;
  std::lock_guard<std::mutex> guard{accounting_->mtx};
  auto& pool = accounting_->pool;
  auto slab = pool.slab_of(buf.data(), buf.size());
  if (slab < 0)
    return caf::make_error(gpu_errc::invalid_handle,
                           "locate: buffer is not in a pool slab");
  auto& s = pool.slabs()[static_cast<size_t>(slab)];
  return pool_location{static_cast<size_t>(slab),
                       static_cast<size_t>(buf.data() - s.base)};
}

caf::expected<dmabuf> device::export_dmabuf(size_t slab) {
  if (!capabilities().dmabuf_export) {
    auto why = capabilities().notes;
    return caf::make_error(
        gpu_errc::unsupported,
        "export_dmabuf: " + capabilities().name + " cannot export dma-buf"
            + (why.empty() ? std::string{} : " (" + why + ")"));
  }
  pool_slab s;
  {
    std::lock_guard<std::mutex> guard{accounting_->mtx};
    auto& slabs = accounting_->pool.slabs();
    if (slab >= slabs.size())
      return caf::make_error(gpu_errc::out_of_bounds,
                             "export_dmabuf: slab " + std::to_string(slab)
                                 + " of " + std::to_string(slabs.size()));
    s = slabs[slab];
  }
  return do_export_dmabuf(s.base, s.size);
}

caf::error device::order_remote_writes() {
  return do_order_remote_writes();
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

caf::expected<pinned_host> device::share_pinned(const pinned_host& registered) {
  if (!registered.valid() || registered.owner() == nullptr
      || registered.owner()->capabilities().name != capabilities().name)
    return caf::make_error(gpu_errc::invalid_handle,
                           "share_pinned: an empty registration or one of "
                           "another backend");
  {
    std::lock_guard<std::mutex> guard{accounting_->mtx};
    accounting_->shared_pins.push_back(registered.data());
  }
  return pinned_host{shared_from_this(), registered.data(), registered.size()};
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
  return check_owned(s, "stream");
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

caf::error device::check_copy(const char* what, bool handles_ok, stream& s,
                              copy_method& method) const {
  if (!handles_ok)
    return caf::make_error(gpu_errc::invalid_handle,
                           std::string{what}
                               + ": registration or buffer is empty or "
                                 "belongs to another device");
  if (auto err = check_stream(s))
    return err;
  if (method == copy_method::batched && !capabilities().batched_copy)
    return caf::make_error(gpu_errc::unsupported,
                           std::string{what}
                               + ": batched copies not supported by "
                               + capabilities().name);
  return caf::none;
}

caf::error device::submit_copy(direction dir,
                               const std::vector<raw_chunk>& chunks, stream& s,
                               copy_method method) {
  if (chunks.empty())
    return caf::none;
  auto how =
      resolve_copy_method(method, capabilities().batched_copy, chunks.size());
  if (!how)
    return std::move(how.error());
  if (auto err = do_copy(dir, chunks, s.native(), *how))
    return err;
  std::lock_guard<std::mutex> guard{accounting_->mtx};
  auto& st = accounting_->stats;
  ++st.copy_lists;
  if (*how == copy_method::batched) {
    ++st.batched_lists;
    ++st.copy_calls;
  } else {
    st.copy_calls += chunks.size();
  }
  return caf::none;
}

caf::error device::copy(const char* what, direction dir, bool handles_ok,
                        const std::byte* src, size_t src_size, std::byte* dst,
                        size_t dst_size, const std::vector<copy_chunk>& chunks,
                        stream& s, copy_method method) {
  if (auto err = check_copy(what, handles_ok, s, method))
    return err;
  std::vector<raw_chunk> raw;
  if (auto err = translate(chunks, src, src_size, dst, dst_size, raw))
    return err;
  return submit_copy(dir, raw, s, method);
}

caf::error device::copy_h2d(const pinned_host& src, device_buffer& dst,
                            const std::vector<copy_chunk>& chunks, stream& s,
                            copy_method method) {
  return copy("copy_h2d", direction::h2d, owns(src) && owns(dst), src.data(),
              src.size(), dst.data(), dst.size(), chunks, s, method);
}

caf::error device::copy_d2h(const device_buffer& src, pinned_host& dst,
                            const std::vector<copy_chunk>& chunks, stream& s,
                            copy_method method) {
  return copy("copy_d2h", direction::d2h, owns(src) && owns(dst), src.data(),
              src.size(), dst.data(), dst.size(), chunks, s, method);
}

caf::error device::record(event& e, stream& s) {
  if (auto err = check_owned(e, "event"))
    return err;
  if (auto err = check_stream(s))
    return err;
  return do_record(e.native(), s.native());
}

caf::expected<bool> device::query(const event& e) {
  if (auto err = check_owned(e, "event"))
    return err;
  return do_query(e.native());
}

caf::error device::synchronize(const event& e) {
  if (auto err = check_owned(e, "event"))
    return err;
  count_host_wait();
  return do_synchronize_event(e.native());
}

caf::error device::synchronize(stream& s) {
  if (auto err = check_stream(s))
    return err;
  count_host_wait();
  return do_synchronize_stream(s.native());
}

caf::error device::notify(const event& e, stream& s,
                          std::function<void()> done) {
  if (auto err = check_owned(e, "notify: event"))
    return err;
  if (auto err = check_stream(s))
    return err;
  if (!done)
    return caf::make_error(gpu_errc::invalid_argument,
                           "notify: no function to call");
  return do_notify(e.native(), s.native(), std::move(done));
}

caf::expected<uint64_t> device::checksum(const device_buffer& buf,
                                         size_t offset, size_t length,
                                         stream& s) {
  if (auto err = check_owned(buf, "checksum: buffer"))
    return err;
  if (auto err = check_stream(s))
    return err;
  if (offset > buf.size() || length > buf.size() - offset)
    return caf::make_error(gpu_errc::out_of_bounds,
                           "checksum of [" + std::to_string(offset) + ", +"
                               + std::to_string(length) + ") in a "
                               + std::to_string(buf.size()) + " B buffer");
  count_host_wait();
  return do_checksum(buf.data() + offset, length, s.native());
}

caf::error device::enqueue_checksums(const device_buffer& buf,
                                     const segment_grid& grid, pinned_host& out,
                                     size_t out_offset, stream& s) {
  if (!buf.valid() || buf.owner() != this || !out.valid()
      || out.owner() != this)
    return caf::make_error(gpu_errc::invalid_handle,
                           "enqueue_checksums: buffer or registration is "
                           "empty or belongs to another device");
  if (auto err = check_stream(s))
    return err;
  const auto count = grid.count();
  if (count == 0)
    return caf::none;
  // The last row's end, as subtractions: offset + (rows-1)*stride + bytes.
  auto size = buf.size();
  bool fits = grid.row_bytes <= size && grid.offset <= size - grid.row_bytes;
  if (fits && grid.rows > 1) {
    auto room = size - grid.row_bytes - grid.offset;
    fits = grid.row_stride <= room / (grid.rows - 1);
  }
  if (!fits)
    return caf::make_error(gpu_errc::out_of_bounds,
                           "enqueue_checksums: " + std::to_string(grid.rows)
                               + " rows of " + std::to_string(grid.row_bytes)
                               + " B every " + std::to_string(grid.row_stride)
                               + " B from " + std::to_string(grid.offset)
                               + " exceed a " + std::to_string(size)
                               + " B buffer");
  if (count > SIZE_MAX / sizeof(uint64_t) || out_offset > out.size()
      || count * sizeof(uint64_t) > out.size() - out_offset)
    return caf::make_error(gpu_errc::out_of_bounds,
                           "enqueue_checksums: " + std::to_string(count)
                               + " results do not fit "
                               + std::to_string(out.size()) + " B at "
                               + std::to_string(out_offset));
  if (out_offset % alignof(uint64_t) != 0
      || reinterpret_cast<uintptr_t>(out.data()) % alignof(uint64_t) != 0)
    return caf::make_error(gpu_errc::invalid_argument,
                           "enqueue_checksums: results must be 8-byte "
                           "aligned");
  raw_grid raw{buf.data() + grid.offset, grid.rows, grid.row_stride,
               grid.row_bytes, grid.segment_bytes};
  return do_enqueue_checksums(
      raw, reinterpret_cast<uint64_t*>(out.data() + out_offset), s.native());
}

// -- factory ------------------------------------------------------------------

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
  auto as_configured = [&](caf::expected<std::shared_ptr<device>> dev)
      -> caf::expected<device_selection> {
    if (!dev)
      return std::move(dev.error());
    auto reason = prefix + summary(**dev) + " as configured";
    return device_selection{std::move(*dev), std::move(reason)};
  };
  switch (opts.backend) {
    case backend_choice::host:
      return as_configured(make_host_device(opts));
    case backend_choice::cuda:
      return as_configured(make_cuda_device(opts));
    case backend_choice::automatic:
      break;
  }
  // auto: cuda where a device can be used; host where none exists or the
  // driver cannot run this binary's CUDA runtime (said in the reason). A
  // device that exists but fails otherwise (a bad ordinal, no memory) is an
  // error: falling back would hide it.
  std::string why_not_cuda;
  if (auto count = probe_cuda()) {
    auto dev = make_cuda_device(opts);
    if (!dev)
      return std::move(dev.error());
    auto reason = prefix + summary(**dev) + ", device "
                  + std::to_string(opts.cuda_device) + " of "
                  + std::to_string(*count);
    return device_selection{std::move(*dev), std::move(reason)};
  } else if (count.error() == gpu_errc::no_device
             || count.error() == gpu_errc::driver_too_old) {
    why_not_cuda = describe(count.error());
  } else {
    return std::move(count.error());
  }
  auto dev = make_host_device(opts);
  if (!dev)
    return std::move(dev.error());
  auto reason = prefix + summary(**dev) + ", because " + why_not_cuda;
  return device_selection{std::move(*dev), std::move(reason)};
}

} // namespace dualpath::gpu
