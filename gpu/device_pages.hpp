// device_pages: device memory a caller owns (an inference engine's KV pages
// in GPU memory, e.g. a torch CUDA tensor), registered for staged copies
// without copying or moving the pages themselves.
//
// make() checks that [base, base + bytes) is device memory
// (cudaPointerGetAttributes) lying wholly in the one allocation that holds
// its first byte (cuMemGetAddressRange), and sets up a
// pinned host staging area of the same size (cudaHostAlloc, portable) and a
// non-blocking stream on that device. Host-side transports write into and
// read from staging(); to_device() and to_host() copy ranges between the
// staging area and the pages on the stream and return once the copies
// completed (cudaStreamSynchronize), so a caller that waits on them knows
// the pages hold the bytes.
//
// Failure: without a usable CUDA device (built without CUDA, no driver, no
// GPU) make() fails with gpu_errc::no_device, "no CUDA device: " and the
// driver's or runtime's reason; a range that is not device memory (host
// memory, an address CUDA does not know, a range spilling past its
// allocation, even into a neighbouring one) with gpu_errc::invalid_argument
// naming the address and what CUDA says it is. Nothing is registered or
// allocated on failure.
//
// Ownership: the caller owns the device memory; it must outlive the
// device_pages. device_pages owns its staging area and stream (RAII).
// For zero-copy transports, export_dmabuf() hands the pages to an RDMA NIC
// (the NIC then writes and reads the device memory itself) and
// order_remote_writes() makes its writes visible before the pages are used.
//
// Thread safety: to_device and to_host may be called from several threads;
// their copies are serialised on one stream (a mutex).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <caf/error.hpp>
#include <caf/expected.hpp>

#include "gpu/device.hpp"

namespace dualpath::gpu {

class device_pages {
public:
  /// Registers [base, base + bytes) (bytes > 0) of device memory.
  static caf::expected<std::unique_ptr<device_pages>> make(void* base,
                                                           size_t bytes);

  virtual ~device_pages();
  device_pages(const device_pages&) = delete;
  device_pages& operator=(const device_pages&) = delete;

  /// The device pages (device addresses; not host-addressable).
  void* base() const {
    return base_;
  }

  size_t size() const {
    return size_;
  }

  /// The CUDA device ordinal the pages live on.
  int ordinal() const {
    return ordinal_;
  }

  /// The pinned host staging area, size() bytes; offset o stages byte o of
  /// the pages.
  virtual std::byte* staging() const = 0;

  /// Copies each chunk (src_offset: staging, dst_offset: pages) host ->
  /// device and waits for the copies; invalid_argument for a chunk outside
  /// the pages.
  virtual caf::error to_device(const std::vector<copy_chunk>& chunks) = 0;

  /// Copies each chunk (src_offset: pages, dst_offset: staging) device ->
  /// host and waits for the copies.
  virtual caf::error to_host(const std::vector<copy_chunk>& chunks) = 0;

  /// "cuda device 0 (NVIDIA H200)".
  virtual std::string describe() const = 0;

  /// A dma-buf exporting the pages for an RDMA NIC (ibv_reg_dmabuf_mr; the
  /// registration keeps its own reference, the fd may be closed after).
  /// gpu_errc::unsupported saying why not: base or size not host-page
  /// aligned, a driver without cuMemGetHandleForAddressRange, a device
  /// without dma-buf support; driver_error when the export fails.
  virtual caf::expected<dmabuf> export_dmabuf() const = 0;

  /// Makes RDMA writes the NIC made into the pages visible to later device
  /// work and copies: cudaDeviceFlushGPUDirectRDMAWrites where the device
  /// does not order such writes itself, else nothing.
  virtual caf::error order_remote_writes() = 0;

protected:
  device_pages(void* base, size_t size, int ordinal)
      : base_(base), size_(size), ordinal_(ordinal) {
  }

  /// invalid_argument unless every chunk lies inside [0, size()) on both
  /// sides.
  caf::error check_chunks(const char* what,
                          const std::vector<copy_chunk>& chunks) const;

private:
  void* base_;
  size_t size_;
  int ordinal_;
};

} // namespace dualpath::gpu
