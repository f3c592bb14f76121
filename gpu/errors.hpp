// Errors of the gpu module (device memory, copies, streams, events) as CAF
// error codes: every fallible gpu call returns caf::error / caf::expected<T>
// carrying a gpu_errc and a context string naming the failed call.
#pragma once

#include <cstdint>
#include <string>

#include <caf/error.hpp>
#include <caf/fwd.hpp>
#include <caf/make_message.hpp>
#include <caf/message.hpp>

namespace dualpath::gpu {

/// Errors of the gpu module.
enum class gpu_errc : uint8_t {
  /// Not an error.
  none = 0,
  /// No usable device for the requested backend (no GPU, no driver, or the
  /// binary was built without CUDA); the context says why.
  no_device,
  /// An allocation would exceed the configured HBM budget of the device.
  budget_exceeded,
  /// The device (or host stand-in) could not provide the memory although the
  /// budget allowed it.
  out_of_memory,
  /// An offset/length pair falls outside a buffer or registration.
  out_of_bounds,
  /// A buffer, registration, stream or event is empty (moved-from) or belongs
  /// to another device.
  invalid_handle,
  /// A parameter is out of its domain (zero size, unknown backend name, ...).
  invalid_argument,
  /// The backend cannot do this (see device::capabilities()).
  unsupported,
  /// A CUDA runtime call failed; the context names the call and the CUDA
  /// error string.
  cuda_error,
  /// A host system call failed; the context names the call and errno.
  system_error,
  /// A CUDA driver API call (loaded with dlopen) failed; the context names
  /// the call and the driver's error name.
  driver_error,
  /// A CUDA driver is present but older than the CUDA runtime the binary
  /// was built with (a device exists, it cannot be used); the context names
  /// both versions.
  driver_too_old,
};

std::string to_string(gpu_errc x);

/// Registers the error category with an actor system config so that
/// `actor_system::render` prints the code's name.
void add_error_category(caf::actor_system_config& cfg);

} // namespace dualpath::gpu

CAF_ERROR_CODE_ENUM(dualpath::gpu::gpu_errc, "dp_gpu")
