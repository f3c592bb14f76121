// The cuda backend of gpu::device: device memory from cudaMalloc(Async), host
// memory registered with cudaHostRegister, non-blocking streams, timing-free
// events, copies by cudaMemcpyAsync per chunk or one cudaMemcpyBatchAsync per
// list, and the checksum kernel of gpu/cuda_checksum.cu.
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
// - Whether the batch API works is probed once at creation with a real 8-byte
//   batch copy: a CUDA 13 runtime on an older driver can return
//   cudaErrorNotSupported / cudaErrorCallRequiresNewerDriver, in which case
//   capabilities().batched_copy is false and callers use per-chunk copies.
// - Device memory comes from the device's default memory pool
//   (cudaMallocAsync/cudaFreeAsync on an internal stream, freed memory kept
//   in the pool) where pools are supported, because engines free GPU memory
//   per layer and cudaFree would synchronise the whole device each time.
// - The checksum needs an 8-byte device accumulator and an 8-byte pinned host
//   landing slot; each stream owns one pair (a stream is used by one thread at
//   a time, and checksum() waits for its result before returning).

#include <cuda_runtime_api.h>

#include <algorithm>
#include <vector>

#include "gpu/checksum.hpp"
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
    case cudaErrorInsufficientDriver:
    case cudaErrorInvalidDevice:
      return caf::make_error(gpu_errc::no_device, "no CUDA device: " + what);
    case cudaErrorNotSupported:
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

/// Per-stream state: the stream and the checksum's result slots.
struct cuda_stream {
  cudaStream_t handle = nullptr;
  unsigned long long* device_sum = nullptr; // cudaMalloc, 8 bytes
  unsigned long long* host_sum = nullptr;   // cudaMallocHost, 8 bytes

  /// Releases in reverse order of acquisition; waits for pending work first.
  /// Errors are ignored: nothing can be done about them in a destructor.
  ~cuda_stream() {
    if (handle != nullptr)
      release_call("cudaStreamSynchronize", cudaStreamSynchronize(handle));
    if (host_sum != nullptr)
      release_call("cudaFreeHost", cudaFreeHost(host_sum));
    if (device_sum != nullptr)
      release_call("cudaFree", cudaFree(device_sum));
    if (handle != nullptr)
      release_call("cudaStreamDestroy", cudaStreamDestroy(handle));
  }
};

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
        new cuda_device(opts.cuda_device, budget, prop, total_bytes)};
    if (auto err = dev->setup_pool())
      return err;
    if (auto err = dev->probe_batched_copy()) {
      dev->caps_.batched_copy = false;
      const auto& ctx = err.context();
      dev->add_note("batched copies off: "
                    + (ctx.match_elements<std::string>()
                           ? ctx.get_as<std::string>(0)
                           : std::string{"probe failed"}));
    } else {
      dev->caps_.batched_copy = true;
    }
    return std::shared_ptr<device>{std::move(dev)};
  }

  ~cuda_device() override {
    // Every buffer is gone (each held a reference to this device); wait for
    // the pool's frees, then drop the allocation stream.
    if (alloc_stream_ != nullptr) {
      release_call("cudaSetDevice", cudaSetDevice(ordinal_));
      release_call("cudaStreamSynchronize",
                   cudaStreamSynchronize(alloc_stream_));
      release_call("cudaStreamDestroy", cudaStreamDestroy(alloc_stream_));
    }
  }

  const device_capabilities& capabilities() const override {
    return caps_;
  }

protected:
  caf::expected<std::byte*> do_allocate(size_t bytes) override {
    if (auto err = activate())
      return err;
    void* ptr = nullptr;
    if (!pooled_) {
      if (auto err = cuda_call("cudaMalloc", cudaMalloc(&ptr, bytes)))
        return err;
      return static_cast<std::byte*>(ptr);
    }
    if (auto err = cuda_call("cudaMallocAsync",
                             cudaMallocAsync(&ptr, bytes, alloc_stream_)))
      return err;
    // Once the allocation stream has reached it, the memory may be used from
    // any stream.
    if (auto err = cuda_call("cudaStreamSynchronize",
                             cudaStreamSynchronize(alloc_stream_))) {
      release_call("cudaFreeAsync", cudaFreeAsync(ptr, alloc_stream_));
      return err;
    }
    return static_cast<std::byte*>(ptr);
  }

  void do_free(std::byte* data, size_t) noexcept override {
    release_call("cudaSetDevice", cudaSetDevice(ordinal_));
    // The caller guarantees no pending work uses the buffer (device.hpp), so
    // a stream-ordered free needs no device-wide synchronisation; plain
    // cudaFree (no memory pools) synchronises the device.
    if (pooled_)
      release_call("cudaFreeAsync", cudaFreeAsync(data, alloc_stream_));
    else
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

private:
  cuda_device(int ordinal, uint64_t budget, const cudaDeviceProp& prop,
              size_t total_bytes)
      : device(budget), ordinal_(ordinal) {
    caps_.kind = backend_kind::cuda;
    caps_.name = prop.name;
    caps_.real_device = true;
    caps_.host_addressable = false;
    caps_.batched_copy = false; // set by create() after probing
    caps_.device_checksum = true;
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

  /// Engines allocate and free per layer; cudaFree would synchronise the
  /// whole device each time and defeat the overlap of copies and compute.
  /// Where the device supports memory pools, allocations come from the
  /// default pool (stream-ordered, freed memory kept cached in the pool) on
  /// an internal stream instead.
  caf::error setup_pool() {
    int supported = 0;
    if (auto err = cuda_call(
            "cudaDeviceGetAttribute",
            cudaDeviceGetAttribute(&supported, cudaDevAttrMemoryPoolsSupported,
                                   ordinal_)))
      return err;
    if (supported == 0) {
      add_note("no memory pools: cudaMalloc/cudaFree (cudaFree synchronises "
               "the device)");
      return caf::none;
    }
    cudaMemPool_t pool = nullptr;
    if (auto err = cuda_call("cudaDeviceGetDefaultMemPool",
                             cudaDeviceGetDefaultMemPool(&pool, ordinal_)))
      return err;
    uint64_t keep_all = UINT64_MAX;
    if (auto err =
            cuda_call("cudaMemPoolSetAttribute",
                      cudaMemPoolSetAttribute(
                          pool, cudaMemPoolAttrReleaseThreshold, &keep_all)))
      return err;
    if (auto err = cuda_call(
            "cudaStreamCreateWithFlags",
            cudaStreamCreateWithFlags(&alloc_stream_, cudaStreamNonBlocking)))
      return err;
    pooled_ = true;
    return caf::none;
  }

  /// One cudaMemcpyBatchAsync for the whole list. Every copy reads its source
  /// in stream order (the source may be written by earlier work on the
  /// stream, e.g. a D2H copy or an RDMA write the caller waited for).
  caf::error batch_copy(const std::vector<raw_chunk>& chunks, cudaStream_t s) {
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

  /// Tries one real 8-byte batch copy host -> device -> host; none when the
  /// batch API works, else why not.
  caf::error probe_batched_copy() {
    auto st = do_make_stream();
    if (!st)
      return std::move(st.error());
    std::unique_ptr<cuda_stream> guard{static_cast<cuda_stream*>(*st)};
    void* dev = nullptr;
    if (auto err = cuda_call("cudaMalloc", cudaMalloc(&dev, 8)))
      return err;
    auto& slot = *guard->host_sum; // the stream's pinned 8 bytes
    slot = 0x0123456789ABCDEFull;
    const unsigned long long expected = slot;
    std::vector<raw_chunk> up{{reinterpret_cast<const std::byte*>(&slot),
                               static_cast<std::byte*>(dev), 8}};
    std::vector<raw_chunk> down{{static_cast<const std::byte*>(dev),
                                 reinterpret_cast<std::byte*>(&slot), 8}};
    auto err = batch_copy(up, guard->handle);
    if (!err)
      err = cuda_call("cudaStreamSynchronize",
                      cudaStreamSynchronize(guard->handle));
    if (!err) {
      slot = 0;
      err = batch_copy(down, guard->handle);
    }
    if (!err)
      err = cuda_call("cudaStreamSynchronize",
                      cudaStreamSynchronize(guard->handle));
    if (!err && slot != expected)
      err = caf::make_error(gpu_errc::cuda_error,
                            "cudaMemcpyBatchAsync probe moved wrong bytes");
    release_call("cudaFree", cudaFree(dev));
    return err;
  }

  int ordinal_;
  device_capabilities caps_;
  /// Allocations are stream-ordered on alloc_stream_ (memory pools).
  bool pooled_ = false;
  cudaStream_t alloc_stream_ = nullptr;
};

} // namespace

caf::expected<int> probe_cuda() {
  int count = 0;
  auto rc = cudaGetDeviceCount(&count);
  if (rc != cudaSuccess) {
    // Consume the error so that later calls start clean.
    release_call("cudaGetDeviceCount", rc);
    auto err = cuda_call("cudaGetDeviceCount", rc);
    if (err.code() != static_cast<uint8_t>(gpu_errc::no_device))
      return caf::make_error(gpu_errc::no_device,
                             "no CUDA device: cudaGetDeviceCount -> "
                                 + std::string{cudaGetErrorName(rc)} + " ("
                                 + cudaGetErrorString(rc) + ")");
    return err;
  }
  if (count <= 0)
    return caf::make_error(gpu_errc::no_device,
                           "no CUDA device: cudaGetDeviceCount reports 0");
  return count;
}

caf::expected<std::shared_ptr<device>>
make_cuda_device(const device_options& opts) {
  return cuda_device::create(opts);
}

} // namespace dualpath::gpu
