#include "gpu/cuda_driver.hpp"

// Types and constants only: no symbol of libcuda is referenced at link time.
#include <cuda.h>

#include <dlfcn.h>

#include <mutex>

#include "gpu/errors.hpp"

namespace dualpath::gpu::cuda_driver {

struct library::entry_points {
  CUresult (*init)(unsigned int) = nullptr;
  CUresult (*driver_get_version)(int*) = nullptr;
  CUresult (*device_get)(CUdevice*, int) = nullptr;
  CUresult (*device_get_attribute)(int*, CUdevice_attribute,
                                   CUdevice) = nullptr;
  CUresult (*get_error_name)(CUresult, const char**) = nullptr;
  // cuMemGetAddressRange is a macro for the _v2 entry point (64-bit sizes).
  CUresult (*mem_get_address_range)(CUdeviceptr*, size_t*,
                                    CUdeviceptr) = nullptr;
  // Absent from drivers before CUDA 11.7: then no dma-buf export.
  CUresult (*mem_get_handle_for_address_range)(void*, CUdeviceptr, size_t,
                                               CUmemRangeHandleType,
                                               unsigned long long) = nullptr;
};

namespace {

/// "cuMemGetHandleForAddressRange -> CUDA_ERROR_NOT_SUPPORTED" as an error
/// value; none for CUDA_SUCCESS.
/// "cuMemGetAddressRange -> CUDA_ERROR_INVALID_VALUE (1)".
std::string result_text(const library::entry_points& fn, const char* call,
                        CUresult rc) {
  const char* name = nullptr;
  if (fn.get_error_name == nullptr || fn.get_error_name(rc, &name) != 0
      || name == nullptr)
    name = "unknown CUresult";
  return std::string{call} + " -> " + name + " ("
         + std::to_string(static_cast<int>(rc)) + ")";
}

caf::error driver_call(const library::entry_points& fn, const char* call,
                       CUresult rc) {
  if (rc == CUDA_SUCCESS)
    return caf::none;
  auto what = result_text(fn, call, rc);
  if (rc == CUDA_ERROR_NO_DEVICE)
    return caf::make_error(gpu_errc::no_device, "no CUDA device: " + what);
  if (rc == CUDA_ERROR_NOT_SUPPORTED)
    return caf::make_error(gpu_errc::unsupported, std::move(what));
  return caf::make_error(gpu_errc::driver_error, std::move(what));
}

template <class F>
bool find(void* lib, const char* name, F& out) {
  out = reinterpret_cast<F>(dlsym(lib, name));
  return out != nullptr;
}

} // namespace

caf::expected<const library*> library::load() {
  static std::once_flag once;
  static library lib;
  static library::entry_points fn;
  static caf::error failure;
  std::call_once(once, [] {
    // RTLD_NOW: a broken install fails here, not at the first call.
    void* handle = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (handle == nullptr) {
      const char* why = dlerror();
      failure =
          caf::make_error(gpu_errc::no_device,
                          std::string{"no CUDA driver ("}
                              + (why ? why : "libcuda.so.1 not found") + ")");
      return;
    }
    // Never dlclose'd: the runtime uses the same library for the whole
    // process lifetime.
    if (!find(handle, "cuInit", fn.init)
        || !find(handle, "cuDriverGetVersion", fn.driver_get_version)
        || !find(handle, "cuDeviceGet", fn.device_get)
        || !find(handle, "cuDeviceGetAttribute", fn.device_get_attribute)
        || !find(handle, "cuGetErrorName", fn.get_error_name)
        || !find(handle, "cuMemGetAddressRange_v2", fn.mem_get_address_range)) {
      failure = caf::make_error(gpu_errc::driver_error,
                                "libcuda.so.1 lacks a basic driver API entry "
                                "point (cuInit, cuDriverGetVersion, "
                                "cuDeviceGet, cuDeviceGetAttribute, "
                                "cuGetErrorName, cuMemGetAddressRange_v2)");
      return;
    }
    find(handle, "cuMemGetHandleForAddressRange",
         fn.mem_get_handle_for_address_range);
    if (auto err = driver_call(fn, "cuDriverGetVersion",
                               fn.driver_get_version(&lib.version_))) {
      failure = std::move(err);
      return;
    }
    if (auto err = driver_call(fn, "cuInit", fn.init(0))) {
      failure = std::move(err);
      return;
    }
    lib.fn_ = &fn;
  });
  if (lib.fn_ == nullptr)
    return failure;
  return &lib;
}

caf::error library::dmabuf_supported(int ordinal) const {
  if (fn_->mem_get_handle_for_address_range == nullptr)
    return caf::make_error(gpu_errc::unsupported,
                           "the CUDA driver (" + version_text(version_)
                               + ") has no cuMemGetHandleForAddressRange");
  CUdevice dev = 0;
  if (auto err =
          driver_call(*fn_, "cuDeviceGet", fn_->device_get(&dev, ordinal)))
    return err;
  int supported = 0;
  if (auto err = driver_call(
          *fn_, "cuDeviceGetAttribute",
          fn_->device_get_attribute(
              &supported, CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED, dev)))
    return err;
  if (supported == 0)
    return caf::make_error(gpu_errc::unsupported,
                           "device " + std::to_string(ordinal)
                               + " reports no dma-buf support "
                                 "(CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED = 0; "
                                 "the open kernel module is needed)");
  return caf::none;
}

caf::expected<int> library::export_dmabuf(const void* base, size_t size) const {
  if (fn_->mem_get_handle_for_address_range == nullptr)
    return caf::make_error(gpu_errc::unsupported,
                           "no cuMemGetHandleForAddressRange in the driver");
  int fd = -1;
  if (auto err = driver_call(*fn_, "cuMemGetHandleForAddressRange",
                             fn_->mem_get_handle_for_address_range(
                                 &fd, reinterpret_cast<CUdeviceptr>(base), size,
                                 CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0)))
    return err;
  if (fd < 0)
    return caf::make_error(gpu_errc::driver_error,
                           "cuMemGetHandleForAddressRange returned no fd");
  return fd;
}

caf::expected<library::allocation> library::allocation_of(const void* p) const {
  CUdeviceptr base = 0;
  size_t size = 0;
  auto rc = fn_->mem_get_address_range(&base, &size,
                                       reinterpret_cast<CUdeviceptr>(p));
  if (rc != CUDA_SUCCESS)
    return caf::make_error(gpu_errc::invalid_argument,
                           "no device-memory allocation holds it ("
                               + result_text(*fn_, "cuMemGetAddressRange", rc)
                               + ")");
  return allocation{reinterpret_cast<const void*>(base), size};
}

std::string version_text(int version) {
  return std::to_string(version / 1000) + "."
         + std::to_string((version % 1000) / 10);
}

} // namespace dualpath::gpu::cuda_driver
