// The cuda backend of gpu::device: pool slabs from cudaMalloc, host memory
// registered with cudaHostRegister, non-blocking streams, timing-free events,
// copies by cudaMemcpyAsync per chunk or one cudaMemcpyBatchAsync per list,
// completion notices through cudaLaunchHostFunc, the checksum kernels of
// gpu/cuda_checksum.cu, dma-buf export through the driver API
// (gpu/cuda_driver.hpp) and GPUDirect RDMA write ordering.
//
// Why some choices:
// - Every CUDA call goes through cuda_call(), which keeps the call's name and
//   cudaGetErrorName/cudaGetErrorString in the error's context.
// - The CUDA runtime's current device is per host thread, and devices are used
//   from whatever thread an actor runs on, so every operation first selects
//   this device (cudaSetDevice is cheap when it is already current).
// - Streams are created cudaStreamNonBlocking so that they never serialise
//   with the legacy default stream (cudaMemcpyBatchAsync refuses that stream
//   anyway).
// - Whether the batch API works is probed once per process and device with a
//   real 8-byte batch copy: a CUDA 13 runtime on an older driver can return
//   cudaErrorNotSupported / cudaErrorCallRequiresNewerDriver, in which case
//   capabilities().batched_copy is false, the note says why, and automatic
//   copies go per chunk.
// - Device memory comes in pool slabs (gpu/pool.hpp): one cudaMalloc per
//   slab, none per allocation, and cudaFree (which synchronises the whole
//   device) only when the device dies. A slab is page-aligned cudaMalloc
//   memory, which is what cuMemGetHandleForAddressRange exports as dma-buf.
// - "No device" and "a driver too old for this runtime" are told apart: the
//   runtime reports both as cudaErrorInsufficientDriver, so the driver
//   library itself is asked (loaded with dlopen, never linked). Only the
//   first lets callers skip; the second is a failure.
// - dma-buf export is offered only where RDMA writes into device memory can
//   also be made visible to later kernels: the device orders them itself
//   (cudaDevAttrGPUDirectRDMAWritesOrdering >= owner) or supports
//   cudaDeviceFlushGPUDirectRDMAWrites, and where a real export of a small
//   allocation succeeded (probed once per process and device: a VM or a
//   kernel without dma-buf refuses what the attribute claims).
// - The single-range checksum needs an 8-byte device accumulator and an
//   8-byte pinned host landing slot, and the segment checksums a device
//   array of results; each stream owns its own (a stream is used by one
//   thread at a time; the array grows by doubling, after the stream's
//   earlier kernels finished).

#include <cuda_runtime_api.h>

#include <algorithm>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "gpu/checksum.hpp"
#include "gpu/cuda_driver.hpp"
#include "gpu/cuda_kernels.hpp"
#include "gpu/device.hpp"

namespace dualpath::gpu {

namespace {

/// Turns a CUDA status into an error value naming the call, e.g.
/// "cudaMalloc -> cudaErrorMemoryAllocation (out of memory)".
caf::error cuda_call(const char* call, cudaError_t rc) {
  if (rc == cudaSuccess)
    return caf::none;
  std::string what = call;
  what += " -> ";
  what += cudaGetErrorName(rc);
  what += " (";
  what += cudaGetErrorString(rc);
  what += ")";
  switch (rc) {
    case cudaErrorMemoryAllocation:
      return caf::make_error(gpu_errc::out_of_memory, std::move(what));
    case cudaErrorNoDevice:
    case cudaErrorInvalidDevice:
      return caf::make_error(gpu_errc::no_device, "no CUDA device: " + what);
    case cudaErrorInsufficientDriver:
      return caf::make_error(gpu_errc::driver_too_old, std::move(what));
    case cudaErrorNotSupported:
    case cudaErrorCallRequiresNewerDriver:
      return caf::make_error(gpu_errc::unsupported, std::move(what));
    default:
      return caf::make_error(gpu_errc::cuda_error, std::move(what));
  }
}

/// For release paths (destructors, noexcept): the call still goes through
/// cuda_call, but its error has nowhere to go. A failure here means the
/// context is already broken, which the next fallible call reports.
void release_call(const char* call, cudaError_t rc) noexcept {
  if (rc != cudaSuccess)
    cudaGetLastError(); // consume a non-sticky error; sticky ones persist
  static_cast<void>(call);
}

/// The runtime's version as "13.0".
std::string runtime_version_text() {
  return cuda_driver::version_text(CUDART_VERSION);
}

/// Per-stream state: the stream and the checksums' result slots.
struct cuda_stream {
  cudaStream_t handle = nullptr;
  unsigned long long* device_sum = nullptr; // cudaMalloc, 8 bytes
  unsigned long long* host_sum = nullptr;   // cudaMallocHost, 8 bytes
  uint64_t* segment_sums = nullptr;         // cudaMalloc, grown as needed
  size_t segment_capacity = 0;              // values segment_sums holds

  /// Releases in reverse order of acquisition; waits for pending work first.
  /// Errors are ignored: nothing can be done about them in a destructor.
  ~cuda_stream() {
    if (handle != nullptr)
      release_call("cudaStreamSynchronize", cudaStreamSynchronize(handle));
    if (segment_sums != nullptr)
      release_call("cudaFree", cudaFree(segment_sums));
    if (host_sum != nullptr)
      release_call("cudaFreeHost", cudaFreeHost(host_sum));
    if (device_sum != nullptr)
      release_call("cudaFree", cudaFree(device_sum));
    if (handle != nullptr)
      release_call("cudaStreamDestroy", cudaStreamDestroy(handle));
  }
};

/// The host function behind notify(): runs the caller's function once, on
/// the driver's callback thread, and frees it.
void CUDART_CB run_notice(void* arg) {
  std::unique_ptr<std::function<void()>> fn{
      static_cast<std::function<void()>*>(arg)};
  (*fn)();
}

} // namespace

// The probes below run once per process (and device): engines create one
// device each, many on the same GPU.

caf::expected<int> probe_cuda() {
  static std::once_flag once;
  static caf::expected<int> result{0};
  std::call_once(once, [] {
    int count = 0;
    auto rc = cudaGetDeviceCount(&count);
    if (rc == cudaSuccess) {
      if (count > 0)
        result = count;
      else
        result = caf::make_error(gpu_errc::no_device,
                                 "no CUDA device: cudaGetDeviceCount reports "
                                 "0");
      return;
    }
    release_call("cudaGetDeviceCount", rc);
    auto runtime_says = std::string{"cudaGetDeviceCount -> "}
                        + cudaGetErrorName(rc) + " (" + cudaGetErrorString(rc)
                        + ")";
    // The runtime says "insufficient driver" both when there is none and
    // when it is too old: the driver library tells which.
    auto driver = cuda_driver::library::load();
    if (!driver) {
      result = caf::make_error(gpu_errc::no_device,
                               "no CUDA device: " + describe(driver.error()));
      return;
    }
    if (rc == cudaErrorInsufficientDriver
        || rc == cudaErrorCallRequiresNewerDriver) {
      result = caf::make_error(
          gpu_errc::driver_too_old,
          "the CUDA driver (" + cuda_driver::version_text((*driver)->version())
              + ") is older than the CUDA " + runtime_version_text()
              + " runtime this program was built with: " + runtime_says
              + "; update the NVIDIA driver");
      return;
    }
    if (rc == cudaErrorNoDevice) {
      result = caf::make_error(gpu_errc::no_device,
                               "no CUDA device: " + runtime_says);
      return;
    }
    result = cuda_call("cudaGetDeviceCount", rc);
  });
  return result;
}

namespace {

class cuda_device final : public device {
public:
  static caf::expected<std::shared_ptr<device>>
  create(const device_options& opts) {
    auto count = probe_cuda();
    if (!count)
      return std::move(count.error());
    if (opts.cuda_device < 0 || opts.cuda_device >= *count)
      return caf::make_error(gpu_errc::invalid_argument,
                             "CUDA device " + std::to_string(opts.cuda_device)
                                 + " requested, " + std::to_string(*count)
                                 + " present");
    if (auto err = cuda_call("cudaSetDevice", cudaSetDevice(opts.cuda_device)))
      return err;
    cudaDeviceProp prop{};
    if (auto err = cuda_call("cudaGetDeviceProperties",
                             cudaGetDeviceProperties(&prop, opts.cuda_device)))
      return err;
    size_t free_bytes = 0;
    size_t total_bytes = 0;
    if (auto err = cuda_call("cudaMemGetInfo",
                             cudaMemGetInfo(&free_bytes, &total_bytes)))
      return err;
    // The budget is a promise that the engines keep to themselves; it cannot
    // exceed the memory that exists.
    uint64_t budget = opts.hbm_budget == 0 ? free_bytes : opts.hbm_budget;
    budget = std::min<uint64_t>(budget, total_bytes);
    std::shared_ptr<cuda_device> dev{
        new cuda_device(opts, budget, prop, total_bytes)};
    if (opts.batch_copy == batch_copy_use::off) {
      dev->add_note("batched copies off (device_options::batch_copy)");
    } else if (auto err = batch_probe(opts.cuda_device)) {
      dev->add_note("batched copies off: " + describe(err));
    } else {
      dev->caps_.batched_copy = true;
    }
    if (auto err = dev->probe_rdma()) {
      dev->add_note("no dma-buf export: " + describe(err));
    } else {
      dev->caps_.dmabuf_export = true;
    }
    if (auto err = dev->reserve_pool())
      return err;
    return std::shared_ptr<device>{std::move(dev)};
  }

  ~cuda_device() override {
    // Every buffer is gone (each held a reference to this device).
    release_call("cudaSetDevice", cudaSetDevice(ordinal_));
    release_pool();
  }

  const device_capabilities& capabilities() const override {
    return caps_;
  }

protected:
  caf::expected<std::byte*> do_allocate(size_t bytes) override {
    if (auto err = activate())
      return err;
    void* ptr = nullptr;
    if (auto err = cuda_call("cudaMalloc", cudaMalloc(&ptr, bytes)))
      return err;
    return static_cast<std::byte*>(ptr);
  }

  void do_free(std::byte* data, size_t) noexcept override {
    // Slabs only, when the device dies: cudaFree synchronises the device.
    release_call("cudaSetDevice", cudaSetDevice(ordinal_));
    release_call("cudaFree", cudaFree(data));
  }

  caf::error do_pin(std::byte* data, size_t bytes) override {
    if (auto err = activate())
      return err;
    // Portable: usable as pinned memory by every CUDA context of the process.
    return cuda_call("cudaHostRegister",
                     cudaHostRegister(data, bytes, cudaHostRegisterPortable));
  }

  void do_unpin(std::byte* data) noexcept override {
    release_call("cudaSetDevice", cudaSetDevice(ordinal_));
    release_call("cudaHostUnregister", cudaHostUnregister(data));
  }

  caf::expected<void*> do_make_stream() override {
    if (auto err = activate())
      return err;
    auto st = std::make_unique<cuda_stream>();
    if (auto err = cuda_call(
            "cudaStreamCreateWithFlags",
            cudaStreamCreateWithFlags(&st->handle, cudaStreamNonBlocking)))
      return err;
    void* dsum = nullptr;
    if (auto err = cuda_call("cudaMalloc", cudaMalloc(&dsum, 8)))
      return err;
    st->device_sum = static_cast<unsigned long long*>(dsum);
    void* hsum = nullptr;
    if (auto err = cuda_call("cudaMallocHost", cudaMallocHost(&hsum, 8)))
      return err;
    st->host_sum = static_cast<unsigned long long*>(hsum);
    return static_cast<void*>(st.release());
  }

  void do_destroy_stream(void* handle) noexcept override {
    release_call("cudaSetDevice", cudaSetDevice(ordinal_));
    delete static_cast<cuda_stream*>(handle);
  }

  caf::expected<void*> do_make_event() override {
    if (auto err = activate())
      return err;
    cudaEvent_t ev = nullptr;
    if (auto err =
            cuda_call("cudaEventCreateWithFlags",
                      cudaEventCreateWithFlags(&ev, cudaEventDisableTiming)))
      return err;
    return static_cast<void*>(ev);
  }

  void do_destroy_event(void* handle) noexcept override {
    release_call("cudaSetDevice", cudaSetDevice(ordinal_));
    release_call("cudaEventDestroy",
                 cudaEventDestroy(static_cast<cudaEvent_t>(handle)));
  }

  caf::error do_copy(direction dir, const std::vector<raw_chunk>& chunks,
                     void* stream_handle, copy_method method) override {
    if (auto err = activate())
      return err;
    auto s = static_cast<cuda_stream*>(stream_handle)->handle;
    const auto kind =
        dir == direction::h2d ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost;
    if (method == copy_method::per_chunk) {
      for (const auto& c : chunks)
        if (auto err =
                cuda_call("cudaMemcpyAsync",
                          cudaMemcpyAsync(c.dst, c.src, c.length, kind, s)))
          return err;
      return caf::none;
    }
    return batch_copy(chunks, s);
  }

  caf::error do_record(void* event_handle, void* stream_handle) override {
    if (auto err = activate())
      return err;
    return cuda_call(
        "cudaEventRecord",
        cudaEventRecord(static_cast<cudaEvent_t>(event_handle),
                        static_cast<cuda_stream*>(stream_handle)->handle));
  }

  caf::expected<bool> do_query(void* event_handle) override {
    if (auto err = activate())
      return err;
    auto rc = cudaEventQuery(static_cast<cudaEvent_t>(event_handle));
    if (rc == cudaSuccess)
      return true;
    if (rc == cudaErrorNotReady)
      return false;
    return cuda_call("cudaEventQuery", rc);
  }

  caf::error do_synchronize_event(void* event_handle) override {
    if (auto err = activate())
      return err;
    return cuda_call(
        "cudaEventSynchronize",
        cudaEventSynchronize(static_cast<cudaEvent_t>(event_handle)));
  }

  caf::error do_synchronize_stream(void* stream_handle) override {
    if (auto err = activate())
      return err;
    return cuda_call("cudaStreamSynchronize",
                     cudaStreamSynchronize(
                         static_cast<cuda_stream*>(stream_handle)->handle));
  }

  caf::error do_notify(void* event_handle, void* stream_handle,
                       std::function<void()> done) override {
    if (auto err = activate())
      return err;
    auto s = static_cast<cuda_stream*>(stream_handle)->handle;
    if (auto err = cuda_call(
            "cudaStreamWaitEvent",
            cudaStreamWaitEvent(s, static_cast<cudaEvent_t>(event_handle), 0)))
      return err;
    auto fn = std::make_unique<std::function<void()>>(std::move(done));
    if (auto err = cuda_call("cudaLaunchHostFunc",
                             cudaLaunchHostFunc(s, run_notice, fn.get())))
      return err; // not enqueued: `fn` is freed here, never called
    fn.release(); // run_notice owns it now
    return caf::none;
  }

  caf::expected<uint64_t> do_checksum(const std::byte* data, size_t length,
                                      void* stream_handle) override {
    if (auto err = activate())
      return err;
    auto& st = *static_cast<cuda_stream*>(stream_handle);
    if (auto err = cuda_call("checksum kernel launch",
                             cuda_kernels::enqueue_checksum_sum(
                                 data, length, st.device_sum, st.handle)))
      return err;
    if (auto err = cuda_call(
            "cudaMemcpyAsync",
            cudaMemcpyAsync(st.host_sum, st.device_sum, sizeof(*st.host_sum),
                            cudaMemcpyDeviceToHost, st.handle)))
      return err;
    if (auto err = cuda_call("cudaStreamSynchronize",
                             cudaStreamSynchronize(st.handle)))
      return err;
    return checksum_finish(*st.host_sum, length);
  }

  caf::error do_enqueue_checksums(const raw_grid& grid, uint64_t* out,
                                  void* stream_handle) override {
    if (auto err = activate())
      return err;
    auto& st = *static_cast<cuda_stream*>(stream_handle);
    const size_t per_row =
        (grid.row_bytes + grid.segment_bytes - 1) / grid.segment_bytes;
    const size_t count = grid.rows * per_row;
    if (count > st.segment_capacity) {
      // Grows rarely (doubling). Kernels enqueued before may still write
      // the old array: they finish first (the only wait, counted).
      size_t want = std::max(count, 2 * st.segment_capacity);
      if (st.segment_sums != nullptr) {
        count_host_wait();
        if (auto err = cuda_call("cudaStreamSynchronize",
                                 cudaStreamSynchronize(st.handle)))
          return err;
        release_call("cudaFree", cudaFree(st.segment_sums));
        st.segment_sums = nullptr;
        st.segment_capacity = 0;
      }
      void* bigger = nullptr;
      if (auto err = cuda_call("cudaMalloc",
                               cudaMalloc(&bigger, want * sizeof(uint64_t))))
        return err;
      st.segment_sums = static_cast<uint64_t*>(bigger);
      st.segment_capacity = want;
    }
    if (auto err =
            cuda_call("segment checksum kernel launch",
                      cuda_kernels::enqueue_segment_checksums(
                          grid.base, grid.rows, grid.row_stride, grid.row_bytes,
                          grid.segment_bytes, st.segment_sums, st.handle)))
      return err;
    return cuda_call("cudaMemcpyAsync",
                     cudaMemcpyAsync(out, st.segment_sums,
                                     count * sizeof(uint64_t),
                                     cudaMemcpyDeviceToHost, st.handle));
  }

  caf::expected<dmabuf> do_export_dmabuf(std::byte* base,
                                         size_t size) override {
    auto driver = cuda_driver::library::load();
    if (!driver)
      return std::move(driver.error());
    auto fd = (*driver)->export_dmabuf(base, size);
    if (!fd)
      return std::move(fd.error());
    return dmabuf{*fd, base, size};
  }

  caf::error do_order_remote_writes() override {
    if (!flush_remote_writes_)
      return caf::none; // the device orders GPUDirect RDMA writes itself
    if (auto err = activate())
      return err;
    return cuda_call("cudaDeviceFlushGPUDirectRDMAWrites",
                     cudaDeviceFlushGPUDirectRDMAWrites(
                         cudaFlushGPUDirectRDMAWritesTargetCurrentDevice,
                         cudaFlushGPUDirectRDMAWritesToOwner));
  }

private:
  cuda_device(const device_options& opts, uint64_t budget,
              const cudaDeviceProp& prop, size_t total_bytes)
      : device(budget, opts), ordinal_(opts.cuda_device) {
    caps_.kind = backend_kind::cuda;
    caps_.name = prop.name;
    caps_.real_device = true;
    caps_.host_addressable = false;
    caps_.batched_copy = false; // set by create() after probing
    caps_.device_checksum = true;
    caps_.dmabuf_export = false; // likewise
    caps_.total_memory = total_bytes;
  }

  caf::error activate() {
    return cuda_call("cudaSetDevice", cudaSetDevice(ordinal_));
  }

  void add_note(const std::string& note) {
    if (!caps_.notes.empty())
      caps_.notes += "; ";
    caps_.notes += note;
  }

  /// One batch copy call for the whole list. Every copy reads its source in
  /// stream order (the source may be written by earlier work on the stream,
  /// e.g. a D2H copy or an RDMA write the caller waited for).
  static caf::error batch_copy(const std::vector<raw_chunk>& chunks,
                               cudaStream_t s) {
#if CUDART_VERSION >= 12080
    std::vector<void*> dsts;
    std::vector<const void*> srcs;
    std::vector<size_t> sizes;
    dsts.reserve(chunks.size());
    srcs.reserve(chunks.size());
    sizes.reserve(chunks.size());
    for (const auto& c : chunks) {
      dsts.push_back(c.dst);
      srcs.push_back(c.src);
      sizes.push_back(c.length);
    }
    cudaMemcpyAttributes attr{};
    attr.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
    size_t attr_index = 0;
#  if CUDART_VERSION >= 13000
    auto rc = cudaMemcpyBatchAsync(dsts.data(), srcs.data(), sizes.data(),
                                   chunks.size(), &attr, &attr_index, 1, s);
#  else
    size_t fail_index = 0;
    auto rc = cudaMemcpyBatchAsync(dsts.data(), const_cast<void**>(srcs.data()),
                                   sizes.data(), chunks.size(), &attr,
                                   &attr_index, 1, &fail_index, s);
#  endif
    return cuda_call("cudaMemcpyBatchAsync", rc);
#else
    (void)chunks;
    (void)s;
    return caf::make_error(gpu_errc::unsupported,
                           "cudaMemcpyBatchAsync needs CUDA 12.8 or newer");
#endif
  }

  /// Whether dma-buf export works and RDMA writes can be ordered before
  /// kernels, once per process and device; sets flush_remote_writes_.
  caf::error probe_rdma() {
    struct outcome {
      caf::error err;
      bool flush = false;
    };
    static std::mutex mtx;
    static std::map<int, outcome> results;
    std::lock_guard<std::mutex> guard{mtx};
    auto i = results.find(ordinal_);
    if (i == results.end()) {
      outcome o;
      auto flush = run_rdma_probe(ordinal_);
      if (flush)
        o.flush = *flush;
      else
        o.err = std::move(flush.error());
      i = results.emplace(ordinal_, std::move(o)).first;
    }
    flush_remote_writes_ = i->second.flush;
    return i->second.err;
  }

  /// The attributes say whether the driver claims dma-buf export and how
  /// RDMA writes are ordered; a real export of a 2 MiB allocation says
  /// whether the claim holds on this machine (a VM or a kernel without
  /// dma-buf can refuse it). Returns whether RDMA writes need a flush.
  static caf::expected<bool> run_rdma_probe(int ordinal) {
    auto driver = cuda_driver::library::load();
    if (!driver)
      return std::move(driver.error());
    if (auto err = (*driver)->dmabuf_supported(ordinal))
      return err;
    int ordering = 0;
    if (auto err = cuda_call(
            "cudaDeviceGetAttribute",
            cudaDeviceGetAttribute(
                &ordering, cudaDevAttrGPUDirectRDMAWritesOrdering, ordinal)))
      return err;
    const bool flush_needed = ordering < cudaGPUDirectRDMAWritesOrderingOwner;
    if (flush_needed) {
      int flush = 0;
      if (auto err = cuda_call(
              "cudaDeviceGetAttribute",
              cudaDeviceGetAttribute(
                  &flush, cudaDevAttrGPUDirectRDMAFlushWritesOptions, ordinal)))
        return err;
      if ((flush & cudaFlushGPUDirectRDMAWritesOptionHost) == 0)
        return caf::make_error(gpu_errc::unsupported,
                               "the device neither orders GPUDirect RDMA "
                               "writes nor supports "
                               "cudaDeviceFlushGPUDirectRDMAWrites");
    }
    if (auto err = cuda_call("cudaSetDevice", cudaSetDevice(ordinal)))
      return err;
    constexpr size_t probe_bytes = size_t{2} << 20;
    void* mem = nullptr;
    if (auto err = cuda_call("cudaMalloc", cudaMalloc(&mem, probe_bytes)))
      return err;
    auto fd = (*driver)->export_dmabuf(mem, probe_bytes);
    if (fd) {
      dmabuf close_now{*fd, static_cast<std::byte*>(mem), probe_bytes};
    } // the fd is closed before the memory goes
    release_call("cudaFree", cudaFree(mem));
    if (!fd)
      return std::move(fd.error());
    return flush_needed;
  }

  /// Tries one real 8-byte batch copy host -> device -> host, once per
  /// process and device; none when the batch API works, else why not.
  static caf::error batch_probe(int ordinal) {
    static std::mutex mtx;
    static std::map<int, caf::error> results;
    std::lock_guard<std::mutex> guard{mtx};
    auto i = results.find(ordinal);
    if (i == results.end())
      i = results.emplace(ordinal, run_batch_probe(ordinal)).first;
    return i->second;
  }

  static caf::error run_batch_probe(int ordinal) {
    if (auto err = cuda_call("cudaSetDevice", cudaSetDevice(ordinal)))
      return err;
    cuda_stream st;
    if (auto err = cuda_call(
            "cudaStreamCreateWithFlags",
            cudaStreamCreateWithFlags(&st.handle, cudaStreamNonBlocking)))
      return err;
    void* hsum = nullptr;
    if (auto err = cuda_call("cudaMallocHost", cudaMallocHost(&hsum, 8)))
      return err;
    st.host_sum = static_cast<unsigned long long*>(hsum);
    void* dev = nullptr;
    if (auto err = cuda_call("cudaMalloc", cudaMalloc(&dev, 8)))
      return err;
    st.device_sum = static_cast<unsigned long long*>(dev);
    auto& slot = *st.host_sum;
    slot = 0x0123456789ABCDEFull;
    const unsigned long long expected = slot;
    std::vector<raw_chunk> up{{reinterpret_cast<const std::byte*>(&slot),
                               static_cast<std::byte*>(dev), 8}};
    std::vector<raw_chunk> down{{static_cast<const std::byte*>(dev),
                                 reinterpret_cast<std::byte*>(&slot), 8}};
    auto err = batch_copy(up, st.handle);
    if (!err)
      err =
          cuda_call("cudaStreamSynchronize", cudaStreamSynchronize(st.handle));
    if (!err) {
      slot = 0;
      err = batch_copy(down, st.handle);
    }
    if (!err)
      err =
          cuda_call("cudaStreamSynchronize", cudaStreamSynchronize(st.handle));
    if (!err && slot != expected)
      err = caf::make_error(gpu_errc::cuda_error,
                            "cudaMemcpyBatchAsync probe moved wrong bytes");
    return err;
  }

  int ordinal_;
  device_capabilities caps_;
  /// GPUDirect RDMA writes need cudaDeviceFlushGPUDirectRDMAWrites before a
  /// kernel may read them.
  bool flush_remote_writes_ = false;
};

} // namespace

caf::expected<std::shared_ptr<device>>
make_cuda_device(const device_options& opts) {
  return cuda_device::create(opts);
}

} // namespace dualpath::gpu
