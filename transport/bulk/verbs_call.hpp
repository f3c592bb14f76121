// The one way the verbs backend calls C: every ibv_* call and every system
// call of its handshake goes through `vcall`/`vptr`/`scall`, which keep the
// call's name and errno in the returned caf::error; every verbs object is
// held by a unique_ptr whose deleter is its ibv_* destroy call.
//
// Thread safety: pure functions and value types.
#pragma once

#include <infiniband/verbs.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <memory>
#include <string>

#include <caf/error.hpp>
#include <caf/expected.hpp>

#include "transport/bulk/unique_fd.hpp"
#include "transport/errors.hpp"

namespace dualpath::transport::bulk::verbs {

/// "call: strerror (errno)" as an error of category `code`.
inline caf::error call_error(const char* call, int err,
                             transport_errc code = transport_errc::system_error,
                             const std::string& context = "") {
  return caf::make_error(code, std::string{call} + ": " + std::strerror(err)
                                   + " (" + std::to_string(err) + ")"
                                   + (context.empty() ? "" : ", " + context));
}

/// Checks an int-returning ibv_* call (0 = success; else the errno value
/// itself, or -1 with errno set).
inline caf::error vcall(const char* call, int rc, const std::string& ctx = "") {
  if (rc == 0)
    return caf::none;
  return call_error(call, rc > 0 ? rc : (errno != 0 ? errno : EIO),
                    transport_errc::system_error, ctx);
}

/// Checks a pointer-returning ibv_* call (nullptr = failure, errno set).
template <class T>
caf::expected<T*> vptr(const char* call, T* ptr, const std::string& ctx = "") {
  if (ptr != nullptr)
    return ptr;
  return call_error(call, errno != 0 ? errno : EINVAL,
                    transport_errc::system_error, ctx);
}

/// Checks a system call returning -1 with errno on failure; `code` is the
/// category a failure files under (peer_lost for a peer's socket).
inline caf::error scall(const char* call, long rc,
                        transport_errc code = transport_errc::system_error,
                        const std::string& ctx = "") {
  if (rc >= 0)
    return caf::none;
  return call_error(call, errno, code, ctx);
}

struct device_list_deleter {
  void operator()(ibv_device** p) const {
    ibv_free_device_list(p);
  }
};
struct context_deleter {
  void operator()(ibv_context* p) const {
    ibv_close_device(p);
  }
};
struct pd_deleter {
  void operator()(ibv_pd* p) const {
    ibv_dealloc_pd(p);
  }
};
struct channel_deleter {
  void operator()(ibv_comp_channel* p) const {
    ibv_destroy_comp_channel(p);
  }
};
struct cq_deleter {
  void operator()(ibv_cq* p) const {
    ibv_destroy_cq(p);
  }
};
struct mr_deleter {
  void operator()(ibv_mr* p) const {
    ibv_dereg_mr(p);
  }
};
struct qp_deleter {
  void operator()(ibv_qp* p) const {
    ibv_destroy_qp(p);
  }
};

using device_list_ptr = std::unique_ptr<ibv_device*, device_list_deleter>;
using context_ptr = std::unique_ptr<ibv_context, context_deleter>;
using pd_ptr = std::unique_ptr<ibv_pd, pd_deleter>;
using channel_ptr = std::unique_ptr<ibv_comp_channel, channel_deleter>;
using cq_ptr = std::unique_ptr<ibv_cq, cq_deleter>;
using mr_ptr = std::unique_ptr<ibv_mr, mr_deleter>;
using qp_ptr = std::unique_ptr<ibv_qp, qp_deleter>;

/// The bulk transport's descriptor owner (unique_fd.hpp).
using bulk::unique_fd;

} // namespace dualpath::transport::bulk::verbs
