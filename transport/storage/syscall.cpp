#include "transport/storage/syscall.hpp"

#include <cerrno>
#include <cstring>

namespace dualpath::transport::storage {

caf::error sys_error(const char* call, const std::string& what, int err) {
  auto ctx = std::string{call} + "(" + what + "): " + std::strerror(err)
             + " [errno " + std::to_string(err) + "]";
  switch (err) {
    case ENOENT:
      return caf::make_error(storage_errc::missing_block, std::move(ctx));
    case ENOSPC:
    case EDQUOT:
      return caf::make_error(storage_errc::disk_full, std::move(ctx));
    default:
      return caf::make_error(storage_errc::io_error, std::move(ctx));
  }
}

} // namespace dualpath::transport::storage
