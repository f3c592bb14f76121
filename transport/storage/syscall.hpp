// The one helper through which the storage module reports failed system and
// io_uring calls: it keeps the call's name, its argument (usually a path) and
// errno, and maps errno to a storage_errc (ENOENT -> missing_block,
// ENOSPC/EDQUOT -> disk_full, everything else -> io_error).
//
// Thread safety: pure functions.
#pragma once

#include <cerrno>
#include <string>

#include <caf/error.hpp>

#include "transport/storage/errors.hpp"

namespace dualpath::transport::storage {

/// The error for call `call` on `what` that failed with `err` (an errno).
caf::error sys_error(const char* call, const std::string& what, int err);

/// Checks the result `ret` of a POSIX call that returns -1 and sets errno on
/// failure; on failure stores the error in `err`. Returns `ret` unchanged.
/// Usage: `auto fd = sys_call("open", path, ::open(...), err);`.
template <class T>
T sys_call(const char* call, const std::string& what, T ret, caf::error& err) {
  if (ret < 0)
    err = sys_error(call, what, errno);
  return ret;
}

/// Like sys_call for liburing functions, which return -errno on failure.
template <class T>
T uring_call(const char* call, const std::string& what, T ret,
             caf::error& err) {
  if (ret < 0)
    err = sys_error(call, what, static_cast<int>(-ret));
  return ret;
}

} // namespace dualpath::transport::storage
