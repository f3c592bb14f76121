#include "actors/observe/http_server.hpp"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <map>
#include <vector>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <microhttpd.h>

#include <caf/error.hpp>
#include <caf/make_message.hpp>
#include <caf/sec.hpp>

namespace dualpath::actors::observe {

namespace {

using clock_type = std::chrono::steady_clock;

// Every socket call goes through here: the call's name and errno's text.
caf::error sys_error(const std::string& call) {
  return caf::make_error(caf::sec::cannot_open_port,
                         call + ": " + std::strerror(errno));
}

// RAII for a file descriptor.
struct fd_guard {
  int fd = -1;
  ~fd_guard() {
    if (fd >= 0)
      ::close(fd);
  }
  int release() {
    auto x = fd;
    fd = -1;
    return x;
  }
};

struct daemon_deleter {
  void operator()(MHD_Daemon* d) const {
    MHD_stop_daemon(d); // closes the listening socket and every connection
  }
};

// Where a connection is in its life; the server's loop moves it on.
enum class conn_phase : uint8_t {
  /// The request head is still arriving (the head deadline runs).
  reading_head,
  /// The head arrived and the handler answered (the library sends it).
  answered,
  /// The head deadline passed: 408 sent, the write side shut down.
  expired,
  /// The connection outlived its hard deadline: both sides shut down, the
  /// library closes it on its next turn.
  killed,
};

struct conn_state {
  int fd = -1;
  clock_type::time_point head_deadline;
  clock_type::time_point hard_deadline;
  conn_phase phase = conn_phase::reading_head;
};

const char* reason_phrase(int status) {
  switch (status) {
    case 400:
      return "Bad Request";
    case 404:
      return "Not Found";
    case 405:
      return "Method Not Allowed";
    case 408:
      return "Request Timeout";
    case 413:
      return "Content Too Large";
    case 414:
      return "URI Too Long";
    case 431:
      return "Request Header Fields Too Large";
    case 501:
      return "Not Implemented";
    case 505:
      return "HTTP Version Not Supported";
    default:
      return "Error";
  }
}

// What the handler learns from the library's parsed head.
struct head_facts {
  size_t bytes = 0; // header names and values, with ": " and CRLF
  int hosts = 0;
  bool transfer_coding = false;
  const char* content_length = nullptr;
};

MHD_Result collect(void* cls, MHD_ValueKind, const char* key,
                   const char* value) {
  auto& f = *static_cast<head_facts*>(cls);
  f.bytes += std::strlen(key) + (value ? std::strlen(value) : 0) + 4;
  if (strcasecmp(key, "host") == 0)
    ++f.hosts;
  else if (strcasecmp(key, "transfer-encoding") == 0)
    f.transfer_coding = true;
  else if (strcasecmp(key, "content-length") == 0)
    f.content_length = value;
  return MHD_YES;
}

bool all_digits(const char* x) {
  if (x == nullptr || *x == '\0')
    return false;
  for (; *x != '\0'; ++x)
    if (!std::isdigit(static_cast<unsigned char>(*x)))
      return false;
  return true;
}

} // namespace

struct http_server::impl {
  std::unique_ptr<MHD_Daemon, daemon_deleter> daemon;
  std::map<std::string, route> routes;
  http_limits limits;
  http_server* owner = nullptr;
  // Only the server's thread touches these (every callback runs there).
  std::map<MHD_Connection*, conn_state> conns;

  void count(int status) {
    ++owner->served_;
    if (status >= 400)
      ++owner->refused_;
  }

  MHD_Result reply(MHD_Connection* c, const http_response& r,
                   const char* allow = nullptr) {
    count(r.status);
    std::unique_ptr<MHD_Response, decltype(&MHD_destroy_response)> resp{
        MHD_create_response_from_buffer(r.body.size(),
                                        const_cast<char*>(r.body.data()),
                                        MHD_RESPMEM_MUST_COPY),
        &MHD_destroy_response};
    if (!resp)
      return MHD_NO;
    MHD_add_response_header(resp.get(), MHD_HTTP_HEADER_CONTENT_TYPE,
                            r.content_type.c_str());
    MHD_add_response_header(resp.get(), MHD_HTTP_HEADER_CONNECTION, "close");
    if (allow != nullptr)
      MHD_add_response_header(resp.get(), MHD_HTTP_HEADER_ALLOW, allow);
    return MHD_queue_response(c, static_cast<unsigned>(r.status), resp.get());
  }

  MHD_Result refuse(MHD_Connection* c, int status, const std::string& why,
                    const char* allow = nullptr) {
    return reply(c,
                 http_response{status, "text/plain; charset=utf-8", why + "\n"},
                 allow);
  }

  // Called by the library once per request when its head is complete (and
  // again per piece of body, which is never read: the first call answers).
  MHD_Result handle(MHD_Connection* c, const char* url, const char* method,
                    const char* version, void** request_ctx) {
    if (*request_ctx != nullptr)
      return MHD_NO; // a second call: the answer is already queued
    *request_ctx = this;
    auto st = conns.find(c);
    if (st == conns.end() || st->second.phase != conn_phase::reading_head)
      return MHD_NO; // expired or killed: close without another answer
    st->second.phase = conn_phase::answered;
    std::string target{url};
    std::string ver{version};
    std::string meth{method};
    if (meth.size() + target.size() + ver.size() + 4 > limits.max_request_line)
      return refuse(c, 414,
                    "request line longer than "
                        + std::to_string(limits.max_request_line) + " bytes");
    head_facts facts;
    facts.bytes = meth.size() + target.size() + ver.size() + 4;
    MHD_get_connection_values(c, MHD_HEADER_KIND, collect, &facts);
    if (facts.bytes > limits.max_header_bytes)
      return refuse(c, 431,
                    "request header block larger than "
                        + std::to_string(limits.max_header_bytes) + " bytes");
    if (target.empty() || target.front() != '/')
      return refuse(c, 400, "request target must be an absolute path");
    if (ver != MHD_HTTP_VERSION_1_1 && ver != MHD_HTTP_VERSION_1_0)
      return refuse(c, 505, "only HTTP/1.0 and HTTP/1.1 are served");
    if (ver == MHD_HTTP_VERSION_1_1 && facts.hosts != 1)
      return refuse(c, 400,
                    facts.hosts == 0 ? "HTTP/1.1 request without a Host header"
                                     : "more than one Host header");
    if (facts.transfer_coding)
      return refuse(c, 501,
                    "request bodies with a transfer coding are not accepted");
    if (facts.content_length != nullptr) {
      std::string cl{facts.content_length};
      if (!all_digits(cl.c_str()) || cl.size() > 18)
        return refuse(c, 400, "invalid Content-Length");
      if (std::stoull(cl) > limits.max_body_bytes)
        return refuse(c, 413,
                      "request body larger than "
                          + std::to_string(limits.max_body_bytes) + " bytes");
    }
    auto route = routes.find(target);
    if (route == routes.end())
      return refuse(c, 404, "no such path: " + target);
    if (meth != MHD_HTTP_METHOD_GET && meth != MHD_HTTP_METHOD_HEAD)
      return refuse(c, 405, "only GET and HEAD", "GET, HEAD");
    // The library sends headers only for HEAD.
    return reply(c, route->second());
  }

  void notify(MHD_Connection* c, MHD_ConnectionNotificationCode code) {
    if (code == MHD_CONNECTION_NOTIFY_CLOSED) {
      conns.erase(c);
      return;
    }
    conn_state st;
    if (auto info =
            MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD))
      st.fd = info->connect_fd;
    auto now = clock_type::now();
    st.head_deadline = now + limits.read_timeout;
    st.hard_deadline = st.head_deadline + std::chrono::seconds(1);
    conns[c] = st;
  }

  // Applies the head and hard deadlines; returns the time until the next
  // one (or -1: none).
  int expire(clock_type::time_point now) {
    auto next = clock_type::time_point::max();
    for (auto& [c, st] : conns) {
      if (st.phase == conn_phase::reading_head && st.head_deadline <= now) {
        // The library has no answer for this: write it on the socket,
        // which carries nothing else yet, and shut the write side so the
        // client reads it to the end; the library drops the connection on
        // its own timeout or when the client closes.
        auto body = std::string{"request header not received in time\n"};
        auto msg = "HTTP/1.1 408 " + std::string{reason_phrase(408)}
                   + "\r\nContent-Type: text/plain; charset=utf-8\r\n"
                     "Content-Length: "
                   + std::to_string(body.size())
                   + "\r\nConnection: close\r\n\r\n" + body;
        [[maybe_unused]] auto n =
            ::send(st.fd, msg.data(), msg.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
        ::shutdown(st.fd, SHUT_WR);
        count(408);
        st.phase = conn_phase::expired;
      }
      if (st.phase != conn_phase::killed && st.hard_deadline <= now) {
        // The library's own timeout counts idle time only: a client that
        // reads the answer a byte at a time would stay.
        ::shutdown(st.fd, SHUT_RDWR);
        st.phase = conn_phase::killed;
      }
      if (st.phase == conn_phase::reading_head)
        next = std::min(next, st.head_deadline);
      else if (st.phase != conn_phase::killed)
        next = std::min(next, st.hard_deadline);
    }
    if (next == clock_type::time_point::max())
      return -1;
    auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(next - now)
                  .count();
    return static_cast<int>(std::clamp<int64_t>(ms + 1, 0, 60000));
  }
};

namespace {

MHD_Result on_request(void* cls, MHD_Connection* c, const char* url,
                      const char* method, const char* version, const char*,
                      size_t* upload_size, void** request_ctx) {
  auto self = static_cast<http_server::impl*>(cls);
  if (upload_size != nullptr)
    *upload_size = 0; // a body is never read
  return self->handle(c, url, method, version, request_ctx);
}

void on_connection(void* cls, MHD_Connection* c, void**,
                   MHD_ConnectionNotificationCode code) {
  static_cast<http_server::impl*>(cls)->notify(c, code);
}

} // namespace

caf::expected<std::unique_ptr<http_server>>
http_server::make(const std::string& address, uint16_t port,
                  std::map<std::string, route> routes, http_limits limits) {
  if (limits.read_timeout.count() < 1 || limits.max_connections < 1)
    return caf::make_error(caf::sec::invalid_argument,
                           "metrics endpoint: read timeout and connection "
                           "limit must be positive");
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  if (::inet_pton(AF_INET, address.c_str(), &addr.sin_addr) != 1)
    return caf::make_error(caf::sec::invalid_argument,
                           "metrics endpoint: '" + address
                               + "' is not an IPv4 address");
  // The listening socket is ours until the daemon takes it, so that a
  // failure names the call and errno (the library reports neither).
  fd_guard sock{::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0)};
  if (sock.fd < 0)
    return sys_error("socket");
  int one = 1;
  if (::setsockopt(sock.fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) != 0)
    return sys_error("setsockopt(SO_REUSEADDR)");
  if (::bind(sock.fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0)
    return sys_error("bind(" + address + ":" + std::to_string(port) + ")");
  if (::listen(sock.fd, 128) != 0)
    return sys_error("listen");
  socklen_t len = sizeof(addr);
  if (::getsockname(sock.fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0)
    return sys_error("getsockname");
  fd_guard wake{::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)};
  if (wake.fd < 0)
    return sys_error("eventfd");
  auto state = std::make_unique<impl>();
  state->routes = std::move(routes);
  state->limits = limits;
  // The library's timeout is whole seconds of inactivity: the head deadline
  // (ours, in ms) comes first; this one ends connections the hard deadline
  // shut down.
  auto idle_s = static_cast<unsigned>(
      std::chrono::ceil<std::chrono::seconds>(limits.read_timeout).count() + 1);
  // The pool holds the request head and the answer's headers.
  auto pool = static_cast<size_t>(limits.max_header_bytes + 8192);
  auto listen_fd = sock.release();
  state->daemon.reset(MHD_start_daemon(
      MHD_USE_EPOLL, 0, nullptr, nullptr, on_request, state.get(),
      MHD_OPTION_LISTEN_SOCKET, listen_fd, MHD_OPTION_CONNECTION_LIMIT,
      limits.max_connections, MHD_OPTION_CONNECTION_TIMEOUT, idle_s,
      MHD_OPTION_CONNECTION_MEMORY_LIMIT, pool, MHD_OPTION_NOTIFY_CONNECTION,
      on_connection, state.get(), MHD_OPTION_END));
  if (!state->daemon) {
    ::close(listen_fd);
    return caf::make_error(caf::sec::cannot_open_port,
                           "MHD_start_daemon: the HTTP library refused to "
                           "start on "
                               + address + ":" + std::to_string(port));
  }
  std::unique_ptr<http_server> srv{
      new http_server(std::move(state), ntohs(addr.sin_port), wake.release())};
  return srv;
}

http_server::http_server(std::unique_ptr<impl> state, uint16_t port,
                         int wake_fd)
    : impl_(std::move(state)), port_(port), wake_fd_(wake_fd) {
  impl_->owner = this;
  thread_ = std::thread([this] { loop(); });
}

http_server::~http_server() {
  uint64_t one = 1;
  [[maybe_unused]] auto n = ::write(wake_fd_, &one, sizeof(one));
  thread_.join();
  impl_->daemon.reset(); // on this thread now that the loop has ended
  ::close(wake_fd_);
}

void http_server::loop() {
  auto d = impl_->daemon.get();
  auto info = MHD_get_daemon_info(d, MHD_DAEMON_INFO_EPOLL_FD);
  if (info == nullptr)
    return;
  int epoll_fd = info->epoll_fd;
  for (;;) {
    int timeout = impl_->expire(clock_type::now());
    MHD_UNSIGNED_LONG_LONG lib_ms = 0;
    if (MHD_get_timeout(d, &lib_ms) == MHD_YES) {
      auto t =
          static_cast<int>(std::min<MHD_UNSIGNED_LONG_LONG>(lib_ms, 60000));
      timeout = timeout < 0 ? t : std::min(timeout, t);
    }
    pollfd fds[2] = {{epoll_fd, POLLIN, 0}, {wake_fd_, POLLIN, 0}};
    auto n = ::poll(fds, 2, timeout);
    if (n < 0 && errno != EINTR)
      return; // cannot wait any more: stop serving
    if (fds[1].revents & POLLIN)
      return;
    MHD_run(d);
  }
}

} // namespace dualpath::actors::observe
