// The few CUDA driver API calls the cuda backend needs beyond the runtime
// (the driver's version, dma-buf support and export, the allocation that
// holds an address), loaded at run time with
// dlopen("libcuda.so.1") and never linked: programs built with CUDA still
// start, and choose the host backend, on machines without a driver. The
// runtime (cudart, linked statically) loads the same library itself.
//
// Every call goes through one helper that keeps the call's name and the
// driver's error name (gpu_errc::driver_error).
//
// Thread safety: load() is safe to call from any thread (the library is
// loaded once per process and stays loaded); the calls are thread-safe as
// the driver's are. For the cuda backend only (gpu/cuda_*.cpp).
#pragma once

#include <cstddef>
#include <string>

#include <caf/expected.hpp>

namespace dualpath::gpu::cuda_driver {

/// The loaded driver library and the entry points found in it.
class library {
public:
  /// The driver's CUDA version as cuDriverGetVersion reports it (e.g. 13000
  /// for 13.0).
  int version() const {
    return version_;
  }

  /// Whether device `ordinal` can export memory as dma-buf (the driver has
  /// cuMemGetHandleForAddressRange and the device reports
  /// CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED); gpu_errc::unsupported saying
  /// why not.
  caf::error dmabuf_supported(int ordinal) const;

  /// A dma-buf file descriptor for [base, base + size) of device memory
  /// (cudaMalloc'd; both page-aligned). The caller owns the fd.
  caf::expected<int> export_dmabuf(const void* base, size_t size) const;

  /// The device-memory allocation that holds `p` (cuMemGetAddressRange: the
  /// cudaMalloc / cuMemAlloc it came from, or the mapped range of a virtual
  /// memory reservation). gpu_errc::invalid_argument when `p` lies in none.
  struct allocation {
    const void* base = nullptr;
    size_t size = 0;
  };
  caf::expected<allocation> allocation_of(const void* p) const;

  /// Loads the driver once per process; gpu_errc::no_device naming dlerror()
  /// when there is none, gpu_errc::driver_error when cuInit fails.
  static caf::expected<const library*> load();

  struct entry_points;

private:
  library() = default;
  const entry_points* fn_ = nullptr;
  int version_ = 0;
};

/// "13.0" for 13000.
std::string version_text(int version);

} // namespace dualpath::gpu::cuda_driver
