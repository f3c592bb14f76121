// The GPU memory interface: one accelerator's memory (HBM) as the engines see
// it. A `device` hands out budgeted device memory (`device_buffer`) from a
// pool, registers host memory for DMA (`pinned_host`), creates streams and
// events, copies lists of chunks host->device and device->host
// asynchronously on a stream, tells the caller when an event completes
// without blocking it, checksums device memory where it lies, and exports its
// memory as dma-buf for RDMA NICs.
//
// Backends (one per file, chosen by `gpu.backend = auto|cuda|host`):
//   - cuda (gpu/cuda_device.cpp): cudaMalloc per pool slab, cudaHostRegister,
//     cudaStream_t, cudaEvent_t, cudaMemcpyAsync per chunk or one
//     cudaMemcpyBatchAsync per list, cudaLaunchHostFunc for completion
//     notices, checksum kernels (gpu/cuda_checksum.cu), dma-buf export
//     through the driver API loaded with dlopen (gpu/cuda_driver.hpp);
//   - host (gpu/host_device.cpp): host memory standing in for HBM; each stream
//     is a worker thread running its copies with memcpy in order, so copies
//     are asynchronous and events complete later, like CUDA's.
//
// Budget: a device refuses an allocation that would take the bytes it has
// handed out above its HBM budget (gpu_errc::budget_exceeded), so engines can
// assert that GPU-memory residency never exceeds their window.
//
// Pool: memory comes from the backend in slabs (device_options::pool_reserve
// up front, then pool_grain at a time) and is handed out in 256-byte aligned
// ranges (gpu/pool.hpp). allocate() and a buffer's release call no backend,
// so neither synchronises anything; slabs are returned when the device dies.
// A slab is one region: export_dmabuf() exports it once for an RDMA NIC.
//
// Ownership: devices are shared (std::shared_ptr); every buffer, registration,
// stream and event keeps its device alive and releases its resource when it
// dies (RAII, move-only). A pinned_host does not own the host memory it
// registers: that memory must outlive the registration and any copy using it.
// Buffers used by an enqueued copy must stay alive until the copy completes
// (an event recorded after it completed, or the stream was synchronised):
// freed pool memory is handed out again at once.
//
// Thread-safety: a device may be used from several threads at once. A stream
// must be used (submitted to) by one thread at a time; an event likewise.
// Completion callbacks (notify()) run on a backend thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <caf/error.hpp>
#include <caf/expected.hpp>

#include "gpu/errors.hpp"
#include "gpu/pool.hpp"

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
  /// checksum() and enqueue_checksums() run on the device itself (false:
  /// the backend's stream computes them on the host).
  bool device_checksum = false;
  /// export_dmabuf() works: the pool's slabs can be registered with an RDMA
  /// NIC (ibv_reg_dmabuf_mr), and order_remote_writes() makes such writes
  /// visible to later device work.
  bool dmabuf_export = false;
  /// Memory of the device in bytes (host: the budget).
  uint64_t total_memory = 0;
  /// Why an optional capability is off (e.g. the batch API's refusal);
  /// empty when nothing needs explaining.
  std::string notes;
};

/// Whether a device uses the batch copy API (device_options::batch_copy).
enum class batch_copy_use : uint8_t {
  /// Where the backend has one and its probe (once per process and device)
  /// succeeds.
  probe,
  /// Never: every list goes per chunk (as after a failed probe).
  off,
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
  /// Bytes of the pool's first slab, taken at creation (capped at the
  /// budget); 0 = none, the pool grows when an allocation needs it. An engine
  /// reserves its whole budget: one slab, one dma-buf, one registration.
  uint64_t pool_reserve = 0;
  /// Smallest slab the pool adds when it grows (capped at the budget left).
  uint64_t pool_grain = uint64_t{64} << 20;
  /// The batch copy API: probed, or off.
  batch_copy_use batch_copy = batch_copy_use::probe;
  /// Host backend only: runs first on each stream's worker thread (the
  /// thread that copies and checksums the KV), e.g. to name it and put it
  /// below the threads that carry control messages; an error fails the
  /// stream's creation with it. Empty: the thread is left as started.
  std::function<caf::error()> thread_start;
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
  /// batched where the device has it and the list has more than one chunk,
  /// else per_chunk.
  automatic,
};

std::string to_string(copy_method x);

/// The submission a list of `chunks` chunks gets when `requested`, on a
/// device whose batch API is `batch_available` (its probe's result): never
/// `automatic`; gpu_errc::unsupported for `batched` without the API. Pure.
caf::expected<copy_method>
resolve_copy_method(copy_method requested, bool batch_available, size_t chunks);

/// Equal rows cut into equal segments, e.g. the Layer Blocks of a decode
/// slot ([layer][token][bpt]): `rows` rows of `row_bytes` bytes, row r at
/// `offset + r * row_stride`, each cut into segments of `segment_bytes` (the
/// last one of a row shorter when segment_bytes does not divide row_bytes).
/// Segment s of row r is result r * segments_per_row() + s.
struct segment_grid {
  size_t offset = 0;
  size_t rows = 0;
  size_t row_stride = 0;
  size_t row_bytes = 0;
  size_t segment_bytes = 0;

  size_t segments_per_row() const {
    return segment_bytes == 0 ? 0
                              : (row_bytes + segment_bytes - 1) / segment_bytes;
  }

  size_t count() const {
    return rows * segments_per_row();
  }
};

/// What a device did since creation (monotonic counters).
struct device_stats {
  /// Buffers handed out by allocate().
  uint64_t allocations = 0;
  /// Backend allocations (pool slabs); allocate() adds none while the pool
  /// has room.
  uint64_t slabs = 0;
  /// Calls that blocked their caller until device work finished
  /// (synchronize(), checksum(), and any backend-internal wait).
  uint64_t host_waits = 0;
  /// Chunk lists submitted by copy_h2d / copy_d2h.
  uint64_t copy_lists = 0;
  /// Of those, lists submitted in one batched call.
  uint64_t batched_lists = 0;
  /// Backend copy calls: one per chunk per_chunk, one per list batched.
  uint64_t copy_calls = 0;
};

/// A dma-buf file descriptor exporting a range of device memory (closed on
/// destruction; move-only). An RDMA NIC registers it with ibv_reg_dmabuf_mr;
/// the registration holds its own reference, so the fd may be closed after.
class dmabuf {
public:
  dmabuf() = default;
  dmabuf(int fd, std::byte* base, size_t size) noexcept
      : fd_(fd), base_(base), size_(size) {
  }
  dmabuf(dmabuf&& other) noexcept
      : fd_(std::exchange(other.fd_, -1)),
        base_(std::exchange(other.base_, nullptr)),
        size_(std::exchange(other.size_, 0)) {
  }
  dmabuf& operator=(dmabuf&& other) noexcept;
  dmabuf(const dmabuf&) = delete;
  dmabuf& operator=(const dmabuf&) = delete;
  ~dmabuf();

  int fd() const {
    return fd_;
  }

  /// The exported range (device addresses).
  std::byte* base() const {
    return base_;
  }

  size_t size() const {
    return size_;
  }

  bool valid() const {
    return fd_ >= 0;
  }

private:
  int fd_ = -1;
  std::byte* base_ = nullptr;
  size_t size_ = 0;
};

/// Where a buffer lies in the device's pool: slab `slab`, `offset` bytes in.
struct pool_location {
  size_t slab = 0;
  size_t offset = 0;
};

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

  /// Hands out `bytes` (> 0) of device memory from the pool, refused with
  /// budget_exceeded when bytes_allocated() + bytes would exceed
  /// hbm_budget(). Usable by every stream at once. Calls the backend only
  /// when the pool must grow by a slab; never synchronises.
  caf::expected<device_buffer> allocate(size_t bytes);

  /// Registers `bytes` (> 0) of host memory at `data` for DMA.
  caf::expected<pinned_host> pin(void* data, size_t bytes);

  /// This device's handle on memory another device of the same backend
  /// registered (`registered`): one registration serves every device of the
  /// process (CUDA registers portable pinned memory, and refuses to register
  /// a page twice). Releasing the handle unregisters nothing; `registered`
  /// must outlive it. Fails with invalid_handle for an empty registration or
  /// one of another backend.
  caf::expected<pinned_host> share_pinned(const pinned_host& registered);

  caf::expected<stream> make_stream();

  caf::expected<event> make_event();

  /// Enqueues copies of `chunks` from `src` (host) into `dst` (device) on
  /// `s`. Returns once submitted; completion is observed with an event.
  caf::error copy_h2d(const pinned_host& src, device_buffer& dst,
                      const std::vector<copy_chunk>& chunks, stream& s,
                      copy_method method = copy_method::automatic);

  /// Enqueues copies of `chunks` from `src` (device) into `dst` (host).
  caf::error copy_d2h(const device_buffer& src, pinned_host& dst,
                      const std::vector<copy_chunk>& chunks, stream& s,
                      copy_method method = copy_method::automatic);

  /// Marks the current end of `s` in `e` (re-recording moves the mark).
  caf::error record(event& e, stream& s);

  /// True when `e` is complete, false while pending.
  caf::expected<bool> query(const event& e);

  /// Blocks until `e` is complete.
  caf::error synchronize(const event& e);

  /// Blocks until all work submitted to `s` is complete.
  caf::error synchronize(stream& s);

  /// Calls `done` once `e` is complete and the work submitted to `s` before
  /// this call has finished (work submitted to `s` afterwards waits for
  /// both). Never calls it inline: it runs on a backend thread (cuda: the
  /// driver's callback thread), so it must be short and must not call into
  /// this device; sending an actor a message is the intended use. Returns
  /// an error, and never calls `done`, when nothing could be enqueued.
  caf::error notify(const event& e, stream& s, std::function<void()> done);

  /// The block_checksum() (gpu/checksum.hpp) of bytes [offset, offset+length)
  /// of `buf`, computed in stream order on `s` (after the copies submitted
  /// before) and waited for.
  caf::expected<uint64_t> checksum(const device_buffer& buf, size_t offset,
                                   size_t length, stream& s);

  /// Enqueues on `s` the block_checksum() of every segment of `grid` in
  /// `buf`, computed where the bytes lie; the results (grid.count() values
  /// of uint64_t, host byte order) land in `out` at `out_offset` once `s`
  /// reaches this point (record an event, or notify()). Only 8 bytes per
  /// segment leave the device. `out` must stay alive until then.
  caf::error enqueue_checksums(const device_buffer& buf,
                               const segment_grid& grid, pinned_host& out,
                               size_t out_offset, stream& s);

  /// The pool's slabs (device addresses), in the order they were added.
  std::vector<pool_slab> slabs() const;

  /// Where `buf` lies in the pool (gpu_errc::invalid_handle for a buffer of
  /// another device or of an accounting-only one).
  caf::expected<pool_location> locate(const device_buffer& buf) const;

  /// Exports slab `slab` as a dma-buf (needs capabilities().dmabuf_export,
  /// else gpu_errc::unsupported naming why).
  caf::expected<dmabuf> export_dmabuf(size_t slab);

  /// Makes RDMA writes into this device's memory whose completions the
  /// caller has observed visible to device work submitted afterwards (the
  /// kernel that reads them): a GPUDirect RDMA flush where the device does
  /// not order such writes itself, nothing where it does. Blocks briefly.
  caf::error order_remote_writes();

  /// Most bytes handed out at once.
  uint64_t hbm_budget() const {
    return budget_;
  }

  /// Bytes of device memory currently handed out.
  uint64_t bytes_allocated() const;

  /// Highest bytes_allocated() seen since creation.
  uint64_t peak_bytes_allocated() const;

  /// Counters since creation.
  device_stats stats() const;

protected:
  /// A device pooling its memory with `opts`' reserve and grain (the
  /// reserve is taken by reserve_pool(), which backends call once created).
  device(uint64_t budget, const device_options& opts, bool pooled = true);

  /// Takes the pool's first slab (device_options::pool_reserve); backends
  /// call it at the end of their factory.
  caf::error reserve_pool();

  /// Backends count a wait of their own (e.g. a synchronising free).
  void count_host_wait();

  enum class direction : uint8_t { h2d, d2h };

  /// A validated copy list with absolute addresses.
  struct raw_chunk {
    const std::byte* src;
    std::byte* dst;
    size_t length;
  };

  /// A validated segment grid with an absolute start.
  struct raw_grid {
    const std::byte* base; // segment (0, 0)
    size_t rows;
    size_t row_stride;
    size_t row_bytes;
    size_t segment_bytes;
  };

  /// Backend memory: a pool slab (or, unpooled, one buffer).
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
  virtual caf::error do_notify(void* event_handle, void* stream_handle,
                               std::function<void()> done) = 0;
  virtual caf::expected<uint64_t>
  do_checksum(const std::byte* data, size_t length, void* stream_handle) = 0;
  virtual caf::error do_enqueue_checksums(const raw_grid& grid, uint64_t* out,
                                          void* stream_handle) = 0;
  virtual caf::expected<dmabuf> do_export_dmabuf(std::byte* base,
                                                 size_t size) = 0;
  virtual caf::error do_order_remote_writes() = 0;

  /// Returns every pool slab to the backend; a backend's destructor calls
  /// it first, while its own state still exists.
  void release_pool() noexcept;

private:
  template <handle_kind>
  friend class device_handle;

  /// Releases what a handle of `kind` holds (its destructor's work).
  void release_handle(handle_kind kind, void* ptr, size_t size) noexcept;
  caf::error check_stream(const stream& s) const;
  caf::error check_copy(const char* what, bool handles_ok, stream& s,
                        copy_method& method) const;
  caf::error translate(const std::vector<copy_chunk>& chunks,
                       const std::byte* src, size_t src_size, std::byte* dst,
                       size_t dst_size, std::vector<raw_chunk>& out) const;
  caf::error submit_copy(direction dir, const std::vector<raw_chunk>& chunks,
                         stream& s, copy_method method);
  /// check_copy, translate and submit_copy: a whole copy_h2d or copy_d2h.
  caf::error copy(const char* what, direction dir, bool handles_ok,
                  const std::byte* src, size_t src_size, std::byte* dst,
                  size_t dst_size, const std::vector<copy_chunk>& chunks,
                  stream& s, copy_method method);

  /// Whether `h` holds something of this device.
  template <class Handle>
  bool owns(const Handle& h) const {
    return h.valid() && h.owner() == this;
  }

  /// invalid_handle ("<what> is empty or belongs to another device") unless
  /// `h` holds something of this device.
  template <class Handle>
  caf::error check_owned(const Handle& h, const char* what) const {
    if (owns(h))
      return caf::none;
    return caf::make_error(gpu_errc::invalid_handle,
                           std::string{what}
                               + " is empty or belongs to another device");
  }

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
  /// "gpu.backend=auto: host, because no CUDA device: no CUDA driver
  /// (dlopen libcuda.so.1: ...)".
  std::string reason;
};

/// Creates the device `opts.backend` asks for; `automatic` falls back to host
/// when probe_cuda() fails and says why in `reason`.
caf::expected<device_selection> make_device(const device_options& opts);

/// The host backend (always available).
caf::expected<std::shared_ptr<device>>
make_host_device(const device_options& opts);

/// The cuda backend; gpu_errc::no_device when built without CUDA or no device
/// is present, gpu_errc::driver_too_old when a driver is present but older
/// than the CUDA runtime.
caf::expected<std::shared_ptr<device>>
make_cuda_device(const device_options& opts);

/// Number of CUDA devices; gpu_errc::no_device with the reason (no driver,
/// no GPU, or built without CUDA), or gpu_errc::driver_too_old naming both
/// versions. Probes once per process.
caf::expected<int> probe_cuda();

/// The CUDA device engine rank `rank` of a node uses: `node_gpus[rank]` when
/// the node lists its GPUs (cluster file `gpus`), else (`first` + rank) mod
/// `count` (`gpu.device`, ranks sharing devices round robin when the node
/// has more ranks than the machine has GPUs). gpu_errc::invalid_argument,
/// naming what is wrong, for an ordinal outside [0, count) or a list too
/// short for the rank. Pure.
caf::expected<int> device_for_rank(uint32_t rank, int first,
                                   const std::vector<uint32_t>& node_gpus,
                                   int count);

/// The text of an error made with caf::make_error(code, "text"), else CAF's
/// rendering; "no error" for an empty one.
std::string describe(const caf::error& err);

} // namespace dualpath::gpu
