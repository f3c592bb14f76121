// The cuda implementation of gpu::device_pages (gpu/device_pages.hpp): the
// pages are checked with cudaPointerGetAttributes (device memory, which
// device) and cuMemGetAddressRange (all in one allocation), staged in portable
// pinned host memory (cudaHostAlloc) and copied with cudaMemcpyAsync on a
// non-blocking stream of their device, then cudaStreamSynchronize.
#include <cuda_runtime_api.h>

#include <unistd.h>

#include <cstdio>
#include <mutex>

#include "gpu/cuda_driver.hpp"
#include "gpu/device_pages.hpp"

namespace dualpath::gpu {

namespace {

caf::error call(const char* what, cudaError_t rc) {
  if (rc == cudaSuccess)
    return caf::none;
  cudaGetLastError(); // consume a non-sticky error
  auto text = std::string{what} + " -> " + cudaGetErrorName(rc) + " ("
              + cudaGetErrorString(rc) + ")";
  if (rc == cudaErrorMemoryAllocation)
    return caf::make_error(gpu_errc::out_of_memory, std::move(text));
  return caf::make_error(gpu_errc::cuda_error, std::move(text));
}

std::string address_text(const void* p) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%p", p);
  return buf;
}

const char* memory_type_name(cudaMemoryType t) {
  switch (t) {
    case cudaMemoryTypeUnregistered:
      return "memory CUDA does not know (unregistered host memory or no "
             "allocation)";
    case cudaMemoryTypeHost:
      return "pinned host memory";
    case cudaMemoryTypeDevice:
      return "device memory";
    case cudaMemoryTypeManaged:
      return "managed memory";
  }
  return "memory of an unknown type";
}

/// The device ordinal `p` lies on, or invalid_argument naming what it is.
caf::expected<int> device_of(const void* p, const char* which) {
  cudaPointerAttributes attr{};
  auto rc = cudaPointerGetAttributes(&attr, p);
  if (rc != cudaSuccess) {
    auto err = call("cudaPointerGetAttributes", rc);
    return caf::make_error(gpu_errc::invalid_argument,
                           std::string{which} + " " + address_text(p)
                               + " is not device memory: "
                               + gpu::describe(err));
  }
  if (attr.type != cudaMemoryTypeDevice)
    return caf::make_error(gpu_errc::invalid_argument,
                           std::string{which} + " " + address_text(p)
                               + " is not device memory but "
                               + memory_type_name(attr.type));
  return attr.device;
}

class cuda_device_pages final : public device_pages {
public:
  cuda_device_pages(void* base, size_t size, int ordinal, std::string name)
      : device_pages(base, size, ordinal), name_(std::move(name)) {
  }

  ~cuda_device_pages() override {
    cudaSetDevice(ordinal());
    if (stream_ != nullptr) {
      cudaStreamSynchronize(stream_);
      cudaStreamDestroy(stream_);
    }
    if (staging_ != nullptr)
      cudaFreeHost(staging_);
    cudaGetLastError();
  }

  caf::error init() {
    if (auto err = call("cudaSetDevice", cudaSetDevice(ordinal())))
      return err;
    void* host = nullptr;
    if (auto err = call("cudaHostAlloc",
                        cudaHostAlloc(&host, size(), cudaHostAllocPortable)))
      return err;
    staging_ = static_cast<std::byte*>(host);
    if (auto err =
            call("cudaStreamCreateWithFlags",
                 cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking)))
      return err;
    // RDMA writes into the pages need a flush before device work reads
    // them unless the device orders them for their owner itself.
    int ordering = 0;
    if (cudaDeviceGetAttribute(
            &ordering, cudaDevAttrGPUDirectRDMAWritesOrdering, ordinal())
        != cudaSuccess)
      cudaGetLastError();
    flush_remote_writes_ = ordering < cudaGPUDirectRDMAWritesOrderingOwner;
    return caf::none;
  }

  caf::expected<dmabuf> export_dmabuf() const override {
    auto page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
    if (reinterpret_cast<uintptr_t>(base()) % page != 0 || size() % page != 0)
      return caf::make_error(gpu_errc::unsupported,
                             "device pages at " + address_text(base()) + " of "
                                 + std::to_string(size())
                                 + " bytes are not aligned to the host page "
                                   "size ("
                                 + std::to_string(page)
                                 + "), which dma-buf export needs");
    auto lib = cuda_driver::library::load();
    if (!lib)
      return std::move(lib.error());
    if (auto err = (*lib)->dmabuf_supported(ordinal()))
      return err;
    auto fd = (*lib)->export_dmabuf(base(), size());
    if (!fd)
      return std::move(fd.error());
    return dmabuf{*fd, static_cast<std::byte*>(base()), size()};
  }

  caf::error order_remote_writes() override {
    if (!flush_remote_writes_)
      return caf::none;
    std::lock_guard<std::mutex> guard{mtx_};
    if (auto err = call("cudaSetDevice", cudaSetDevice(ordinal())))
      return err;
    return call("cudaDeviceFlushGPUDirectRDMAWrites",
                cudaDeviceFlushGPUDirectRDMAWrites(
                    cudaFlushGPUDirectRDMAWritesTargetCurrentDevice,
                    cudaFlushGPUDirectRDMAWritesToOwner));
  }

  std::byte* staging() const override {
    return staging_;
  }

  caf::error to_device(const std::vector<copy_chunk>& chunks) override {
    if (auto err = check_chunks("to_device", chunks))
      return err;
    return run(chunks, cudaMemcpyHostToDevice);
  }

  caf::error to_host(const std::vector<copy_chunk>& chunks) override {
    if (auto err = check_chunks("to_host", chunks))
      return err;
    return run(chunks, cudaMemcpyDeviceToHost);
  }

  std::string describe() const override {
    return "cuda device " + std::to_string(ordinal()) + " (" + name_ + ")";
  }

private:
  caf::error run(const std::vector<copy_chunk>& chunks, cudaMemcpyKind kind) {
    std::lock_guard<std::mutex> guard{mtx_};
    if (auto err = call("cudaSetDevice", cudaSetDevice(ordinal())))
      return err;
    auto* dev = static_cast<std::byte*>(base());
    for (auto& c : chunks) {
      void* dst = kind == cudaMemcpyHostToDevice
                      ? static_cast<void*>(dev + c.dst_offset)
                      : static_cast<void*>(staging_ + c.dst_offset);
      const void* src = kind == cudaMemcpyHostToDevice
                            ? static_cast<const void*>(staging_ + c.src_offset)
                            : static_cast<const void*>(dev + c.src_offset);
      if (auto err = call("cudaMemcpyAsync",
                          cudaMemcpyAsync(dst, src, c.length, kind, stream_)))
        return err;
    }
    return call("cudaStreamSynchronize", cudaStreamSynchronize(stream_));
  }

  std::string name_;
  std::byte* staging_ = nullptr;
  cudaStream_t stream_ = nullptr;
  bool flush_remote_writes_ = false;
  std::mutex mtx_;
};

} // namespace

caf::expected<std::unique_ptr<device_pages>> device_pages::make(void* base,
                                                                size_t bytes) {
  if (base == nullptr || bytes == 0)
    return caf::make_error(gpu_errc::invalid_argument,
                           "device pages need a base address and a size");
  // No device: "no CUDA device: <the driver's reason>", nothing registered.
  auto count = probe_cuda();
  if (!count)
    return std::move(count.error());
  auto first = device_of(base, "address");
  if (!first)
    return std::move(first.error());
  // The whole range in the one allocation that holds its first byte: a
  // range reaching into unmapped memory, or into a neighbouring allocation
  // (which may lie on another device or be freed on its own), is refused.
  auto lib = cuda_driver::library::load();
  if (!lib)
    return std::move(lib.error());
  auto alloc = (*lib)->allocation_of(base);
  if (!alloc)
    return caf::make_error(gpu_errc::invalid_argument,
                           "address " + address_text(base) + ": "
                               + gpu::describe(alloc.error()));
  auto offset =
      static_cast<size_t>(static_cast<const std::byte*>(base)
                          - static_cast<const std::byte*>(alloc->base));
  if (offset > alloc->size || bytes > alloc->size - offset)
    return caf::make_error(
        gpu_errc::invalid_argument,
        "device pages at " + address_text(base) + " of " + std::to_string(bytes)
            + " bytes run past the allocation that holds them ("
            + address_text(alloc->base) + ", " + std::to_string(alloc->size)
            + " bytes) by " + std::to_string(offset + bytes - alloc->size)
            + " bytes: KV pages must lie in one device allocation");
  cudaDeviceProp prop{};
  if (auto err = call("cudaGetDeviceProperties",
                      cudaGetDeviceProperties(&prop, *first)))
    return err;
  auto pages =
      std::make_unique<cuda_device_pages>(base, bytes, *first, prop.name);
  if (auto err = pages->init())
    return err;
  return std::unique_ptr<device_pages>{std::move(pages)};
}

} // namespace dualpath::gpu
