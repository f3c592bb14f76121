// The GPU memory interface: one accelerator's memory (HBM) as the engines see
// it. A `device` hands out budgeted device memory (`device_buffer`), registers
// host memory for DMA (`pinned_host`), creates streams and events, copies lists
// of chunks host->device and device->host asynchronously on a stream, and
// checksums device memory where it lies.
//
// Backends (one per file, chosen by `gpu.backend = auto|cuda|host`):
//   - cuda (gpu/cuda_device.cpp): cudaMalloc, cudaHostRegister, cudaStream_t,
//     cudaEvent_t, cudaMemcpyAsync per chunk or cudaMemcpyBatchAsync per list,
//     and a checksum kernel (gpu/cuda_checksum.cu);
//   - host (gpu/host_device.cpp): host memory standing in for HBM; each stream
//     is a worker thread running its copies with memcpy in order, so copies
//     are asynchronous and events complete later, like CUDA's.
//
// Budget: a device refuses an allocation that would take the bytes it has
// handed out above its HBM budget (gpu_errc::budget_exceeded), so engines can
// assert that GPU-memory residency never exceeds their window.
//
// Ownership: devices are shared (std::shared_ptr); every buffer, registration,
// stream and event keeps its device alive and releases its resource when it
// dies (RAII, move-only). A pinned_host does not own the host memory it
// registers: that memory must outlive the registration and any copy using it.
// Buffers used by an enqueued copy must stay alive until the copy completes
// (synchronize an event recorded after it, or the stream).
//
// Thread-safety: a device may be used from several threads at once. A stream
// must be used (submitted to) by one thread at a time; an event likewise.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <caf/error.hpp>
#include <caf/expected.hpp>

#include "gpu/errors.hpp"

namespace dualpath::gpu {

class device;

/// Which backend a device is.
enum class backend_kind : uint8_t {
  /// Host memory standing in for HBM (always available).
  host,
  /// A CUDA GPU.
  cuda,
};

std::string to_string(backend_kind x);

/// The `gpu.backend` setting.
enum class backend_choice : uint8_t {
  /// cuda when a CUDA device is present, else host.
  automatic,
  /// cuda or an error.
  cuda,
  /// host.
  host,
};

std::string to_string(backend_choice x);

/// Parses "auto", "cuda" or "host".
caf::expected<backend_choice> parse_backend_choice(const std::string& str);

/// What a device can do; callers branch on these, never on the backend type.
struct device_capabilities {
  backend_kind kind = backend_kind::host;
  /// Human-readable device name ("NVIDIA H200", "host memory").
  std::string name;
  /// Device memory is real accelerator memory (false: host stand-in).
  bool real_device = false;
  /// device_buffer::data() may be dereferenced by the host.
  bool host_addressable = false;
  /// copy_method::batched submits a whole chunk list in one call.
  bool batched_copy = false;
  /// checksum() runs on the device itself (false: host computes it).
  bool device_checksum = false;
  /// Memory of the device in bytes (host: the budget).
  uint64_t total_memory = 0;
  /// Why an optional capability is off (e.g. the batch API's refusal);
  /// empty when nothing needs explaining.
  std::string notes;
};

/// Options of make_device().
struct device_options {
  backend_choice backend = backend_choice::automatic;
  /// Most bytes of device memory handed out at once; cuda caps it at the
  /// device's memory. 0 = cuda: the device's free memory at creation; host:
  /// invalid.
  uint64_t hbm_budget = uint64_t{1} << 30;
  /// CUDA device ordinal.
  int cuda_device = 0;
  /// Host backend only. false: an accounting-only device for a simulation
  /// whose engines copy nothing: allocations count against the budget (the
  /// same refusals as with memory) but hold none; every buffer's data()
  /// points at one inaccessible page, and copies and checksums fail.
  bool backed = true;
};

/// One copy: `length` bytes from offset `src_offset` of the source to offset
/// `dst_offset` of the destination.
struct copy_chunk {
  size_t src_offset = 0;
  size_t dst_offset = 0;
  size_t length = 0;
};

/// How a chunk list is submitted.
enum class copy_method : uint8_t {
  /// One asynchronous copy call per chunk (cudaMemcpyAsync).
  per_chunk,
  /// One call for the whole list (cudaMemcpyBatchAsync); needs
  /// capabilities().batched_copy.
  batched,
};

std::string to_string(copy_method x);

/// The kinds of resource a device hands out; each is released through its
/// device (device::release_handle).
enum class handle_kind : uint8_t { buffer, pinned, stream, event };

/// The one move-only RAII handle behind device_buffer, pinned_host, stream and
/// event: it holds its device (keeping it alive), the backend's pointer and a
/// byte count, and releases the resource through the device when it dies or
/// is reset. Moving transfers all three and leaves the source empty; an empty
/// handle holds no device.
template <handle_kind Kind>
class device_handle {
public:
  device_handle() = default;

  device_handle(device_handle&& other) noexcept
      : owner_(std::move(other.owner_)),
        ptr_(std::exchange(other.ptr_, nullptr)),
        size_(std::exchange(other.size_, 0)) {
  }

  device_handle& operator=(device_handle&& other) noexcept {
    if (this != &other) {
      reset();
      owner_ = std::move(other.owner_);
      ptr_ = std::exchange(other.ptr_, nullptr);
      size_ = std::exchange(other.size_, 0);
    }
    return *this;
  }

  device_handle(const device_handle&) = delete;
  device_handle& operator=(const device_handle&) = delete;

  ~device_handle() {
    reset();
  }

  bool valid() const {
    return ptr_ != nullptr;
  }

  const device* owner() const {
    return owner_.get();
  }

  /// Releases the resource now (a buffer's bytes return to the budget).
  void reset() noexcept;

protected:
  friend class device;

  device_handle(std::shared_ptr<device> owner, void* ptr, size_t size)
      : owner_(std::move(owner)), ptr_(ptr), size_(size) {
  }

  std::shared_ptr<device> owner_;
  void* ptr_ = nullptr;
  size_t size_ = 0;
};

/// A move-only owner of device memory, counted against the device's budget.
class device_buffer : public device_handle<handle_kind::buffer> {
public:
  device_buffer() = default;

  /// Address in the device's address space (see host_addressable).
  std::byte* data() const {
    return static_cast<std::byte*>(ptr_);
  }

  size_t size() const {
    return size_;
  }

private:
  friend class device;
  using device_handle::device_handle;
};

/// A move-only registration of host memory for DMA to and from a device
/// (cudaHostRegister; a record of the range on the host backend). Does not own
/// the memory.
class pinned_host : public device_handle<handle_kind::pinned> {
public:
  pinned_host() = default;

  std::byte* data() const {
    return static_cast<std::byte*>(ptr_);
  }

  size_t size() const {
    return size_;
  }

private:
  friend class device;
  using device_handle::device_handle;
};

/// A move-only in-order queue of device work. Destroying a stream waits for
/// its work to finish.
class stream : public device_handle<handle_kind::stream> {
public:
  stream() = default;

  /// The backend's handle (cuda: the cudaStream_t state); for backends only.
  void* native() const {
    return ptr_;
  }

private:
  friend class device;
  using device_handle::device_handle;
};

/// A move-only marker in a stream: complete once all work submitted to the
/// stream before record() has finished. An event never recorded counts as
/// complete (as in CUDA).
class event : public device_handle<handle_kind::event> {
public:
  event() = default;

  void* native() const {
    return ptr_;
  }

private:
  friend class device;
  using device_handle::device_handle;
};

/// One accelerator (or its host stand-in). The public functions validate
/// arguments (ownership, bounds, budget) once here; backends implement the
/// protected do_* hooks on already-validated raw pointers.
class device : public std::enable_shared_from_this<device> {
public:
  virtual ~device();

  device(const device&) = delete;
  device& operator=(const device&) = delete;

  virtual const device_capabilities& capabilities() const = 0;

  /// Allocates `bytes` (> 0) of device memory, refused with budget_exceeded
  /// when bytes_allocated() + bytes would exceed hbm_budget().
  caf::expected<device_buffer> allocate(size_t bytes);

  /// Registers `bytes` (> 0) of host memory at `data` for DMA.
  caf::expected<pinned_host> pin(void* data, size_t bytes);

  caf::expected<stream> make_stream();

  caf::expected<event> make_event();

  /// Enqueues copies of `chunks` from `src` (host) into `dst` (device) on
  /// `s`. Returns once submitted; completion is observed with an event.
  caf::error copy_h2d(const pinned_host& src, device_buffer& dst,
                      const std::vector<copy_chunk>& chunks, stream& s,
                      copy_method method = copy_method::per_chunk);

  /// Enqueues copies of `chunks` from `src` (device) into `dst` (host).
  caf::error copy_d2h(const device_buffer& src, pinned_host& dst,
                      const std::vector<copy_chunk>& chunks, stream& s,
                      copy_method method = copy_method::per_chunk);

  /// Marks the current end of `s` in `e` (re-recording moves the mark).
  caf::error record(event& e, stream& s);

  /// True when `e` is complete, false while pending.
  caf::expected<bool> query(const event& e);

  /// Blocks until `e` is complete.
  caf::error synchronize(const event& e);

  /// Blocks until all work submitted to `s` is complete.
  caf::error synchronize(stream& s);

  /// The block_checksum() (gpu/checksum.hpp) of bytes [offset, offset+length)
  /// of `buf`, computed in stream order on `s` (after the copies submitted
  /// before) and waited for.
  caf::expected<uint64_t> checksum(const device_buffer& buf, size_t offset,
                                   size_t length, stream& s);

  /// Most bytes handed out at once.
  uint64_t hbm_budget() const {
    return budget_;
  }

  /// Bytes of device memory currently handed out.
  uint64_t bytes_allocated() const;

  /// Highest bytes_allocated() seen since creation.
  uint64_t peak_bytes_allocated() const;

protected:
  explicit device(uint64_t budget);

  enum class direction : uint8_t { h2d, d2h };

  /// A validated copy list with absolute addresses.
  struct raw_chunk {
    const std::byte* src;
    std::byte* dst;
    size_t length;
  };

  virtual caf::expected<std::byte*> do_allocate(size_t bytes) = 0;
  virtual void do_free(std::byte* data, size_t bytes) noexcept = 0;
  virtual caf::error do_pin(std::byte* data, size_t bytes) = 0;
  virtual void do_unpin(std::byte* data) noexcept = 0;
  virtual caf::expected<void*> do_make_stream() = 0;
  /// Waits for the stream's work, then destroys it.
  virtual void do_destroy_stream(void* handle) noexcept = 0;
  virtual caf::expected<void*> do_make_event() = 0;
  virtual void do_destroy_event(void* handle) noexcept = 0;
  virtual caf::error do_copy(direction dir,
                             const std::vector<raw_chunk>& chunks,
                             void* stream_handle, copy_method method) = 0;
  virtual caf::error do_record(void* event_handle, void* stream_handle) = 0;
  virtual caf::expected<bool> do_query(void* event_handle) = 0;
  virtual caf::error do_synchronize_event(void* event_handle) = 0;
  virtual caf::error do_synchronize_stream(void* stream_handle) = 0;
  virtual caf::expected<uint64_t>
  do_checksum(const std::byte* data, size_t length, void* stream_handle) = 0;

private:
  template <handle_kind>
  friend class device_handle;

  /// Releases what a handle of `kind` holds (its destructor's work).
  void release_handle(handle_kind kind, void* ptr, size_t size) noexcept;
  caf::error check_stream(const stream& s) const;
  caf::error translate(const std::vector<copy_chunk>& chunks,
                       const std::byte* src, size_t src_size, std::byte* dst,
                       size_t dst_size, std::vector<raw_chunk>& out) const;

  uint64_t budget_;
  struct accounting;
  std::unique_ptr<accounting> accounting_;
};

template <handle_kind Kind>
void device_handle<Kind>::reset() noexcept {
  if (ptr_ != nullptr && owner_ != nullptr)
    owner_->release_handle(Kind, ptr_, size_);
  ptr_ = nullptr;
  size_ = 0;
  owner_.reset();
}

/// A device and why it was chosen.
struct device_selection {
  std::shared_ptr<device> dev;
  /// E.g. "gpu.backend=auto: cuda device 0 (NVIDIA H200)" or
  /// "gpu.backend=auto: host, because no CUDA device: cudaGetDeviceCount ->
  /// cudaErrorInsufficientDriver (CUDA driver version is insufficient ...)".
  std::string reason;
};

/// Creates the device `opts.backend` asks for; `automatic` falls back to host
/// when probe_cuda() fails and says why in `reason`.
caf::expected<device_selection> make_device(const device_options& opts);

/// The host backend (always available).
caf::expected<std::shared_ptr<device>>
make_host_device(const device_options& opts);

/// The cuda backend; gpu_errc::no_device when built without CUDA or no device
/// is present.
caf::expected<std::shared_ptr<device>>
make_cuda_device(const device_options& opts);

/// Number of CUDA devices, or gpu_errc::no_device with the reason (the failed
/// call and its CUDA error, or "built without CUDA").
caf::expected<int> probe_cuda();

} // namespace dualpath::gpu
