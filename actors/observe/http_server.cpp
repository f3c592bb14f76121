#include "actors/observe/http_server.hpp"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <sstream>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <caf/error.hpp>
#include <caf/make_message.hpp>
#include <caf/sec.hpp>

namespace dualpath::actors::observe {

namespace {

// Every socket call goes through here: the call's name and errno's text.
caf::error sys_error(const char* call) {
  return caf::make_error(caf::sec::cannot_open_port,
                         std::string{call} + ": " + std::strerror(errno));
}

// RFC 9110 token characters.
bool is_tchar(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) != 0
         || std::strchr("!#$%&'*+-.^_`|~", c) != nullptr;
}

bool is_token(const std::string& x) {
  return !x.empty() && std::all_of(x.begin(), x.end(), is_tchar);
}

std::string lowered(std::string x) {
  for (auto& c : x)
    c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return x;
}

std::string trimmed(const std::string& x) {
  auto b = x.find_first_not_of(" \t");
  if (b == std::string::npos)
    return {};
  auto e = x.find_last_not_of(" \t");
  return x.substr(b, e - b + 1);
}

const char* reason_phrase(int status) {
  switch (status) {
    case 200:
      return "OK";
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
    case 500:
      return "Internal Server Error";
    case 501:
      return "Not Implemented";
    case 505:
      return "HTTP Version Not Supported";
    default:
      return "Error";
  }
}

http_parse_result refuse(int status, std::string why) {
  http_parse_result r;
  r.status = status;
  r.reason = std::move(why);
  return r;
}

// Sends all of `data`; false when the peer went away.
bool send_all(int fd, const std::string& data) {
  size_t off = 0;
  while (off < data.size()) {
    auto n = ::send(fd, data.data() + off, data.size() - off, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0)
      return false;
    off += static_cast<size_t>(n);
  }
  return true;
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

} // namespace

http_parse_result parse_request(const std::string& head,
                                const http_limits& limits) {
  if (head.size() > limits.max_header_bytes)
    return refuse(431, "request header block larger than "
                           + std::to_string(limits.max_header_bytes)
                           + " bytes");
  auto eol = head.find("\r\n");
  auto line = head.substr(0, eol);
  if (line.size() > limits.max_request_line)
    return refuse(414, "request line longer than "
                           + std::to_string(limits.max_request_line)
                           + " bytes");
  http_parse_result out;
  auto& req = out.request;
  // request-line = method SP request-target SP HTTP-version
  auto sp1 = line.find(' ');
  auto sp2 = sp1 == std::string::npos ? sp1 : line.find(' ', sp1 + 1);
  if (sp1 == std::string::npos || sp2 == std::string::npos
      || line.find(' ', sp2 + 1) != std::string::npos)
    return refuse(400, "malformed request line");
  req.method = line.substr(0, sp1);
  req.target = line.substr(sp1 + 1, sp2 - sp1 - 1);
  req.version = line.substr(sp2 + 1);
  if (!is_token(req.method))
    return refuse(400, "malformed method");
  if (req.target.empty() || req.target.front() != '/')
    return refuse(400, "request target must be an absolute path");
  for (auto c : req.target)
    if (static_cast<unsigned char>(c) <= 0x20
        || static_cast<unsigned char>(c) >= 0x7f)
      return refuse(400, "invalid character in request target");
  if (req.version.size() != 8 || req.version.compare(0, 5, "HTTP/") != 0
      || !std::isdigit(static_cast<unsigned char>(req.version[5]))
      || req.version[6] != '.'
      || !std::isdigit(static_cast<unsigned char>(req.version[7])))
    return refuse(400, "malformed HTTP version");
  if (req.version != "HTTP/1.1" && req.version != "HTTP/1.0")
    return refuse(505, "only HTTP/1.0 and HTTP/1.1 are served");
  req.path = req.target.substr(0, req.target.find('?'));
  // header-field = field-name ":" OWS field-value OWS
  size_t pos = eol == std::string::npos ? head.size() : eol + 2;
  bool has_host = false;
  bool has_length = false;
  while (pos < head.size()) {
    auto end = head.find("\r\n", pos);
    if (end == std::string::npos)
      end = head.size();
    auto field = head.substr(pos, end - pos);
    pos = end + 2;
    if (field.empty())
      break;
    if (field.front() == ' ' || field.front() == '\t')
      return refuse(400, "obsolete header line folding");
    auto colon = field.find(':');
    if (colon == std::string::npos)
      return refuse(400, "header line without a colon");
    auto name = field.substr(0, colon);
    if (!is_token(name))
      return refuse(400, "malformed header name");
    auto value = trimmed(field.substr(colon + 1));
    for (auto c : value)
      if ((static_cast<unsigned char>(c) < 0x20 && c != '\t') || c == 0x7f)
        return refuse(400, "control character in header value");
    name = lowered(name);
    if (name == "host") {
      if (has_host)
        return refuse(400, "more than one Host header");
      has_host = true;
    } else if (name == "content-length") {
      if (has_length || value.empty() || value.size() > 18
          || !std::all_of(value.begin(), value.end(), [](char c) {
               return std::isdigit(static_cast<unsigned char>(c)) != 0;
             }))
        return refuse(400, "invalid Content-Length");
      has_length = true;
      req.content_length = std::stoull(value);
    } else if (name == "transfer-encoding") {
      return refuse(501, "request bodies with a transfer coding are not "
                         "accepted");
    }
    req.headers.emplace_back(std::move(name), std::move(value));
  }
  if (req.version == "HTTP/1.1" && !has_host)
    return refuse(400, "HTTP/1.1 request without a Host header");
  if (req.content_length > limits.max_body_bytes)
    return refuse(413, "request body larger than "
                           + std::to_string(limits.max_body_bytes) + " bytes");
  return out;
}

std::string render_response(const http_response& r, bool head_only,
                            const std::string& extra_headers) {
  std::ostringstream out;
  out << "HTTP/1.1 " << r.status << ' ' << reason_phrase(r.status) << "\r\n"
      << "Content-Type: " << r.content_type << "\r\n"
      << "Content-Length: " << r.body.size() << "\r\n"
      << "Connection: close\r\n"
      << extra_headers << "\r\n";
  if (!head_only)
    out << r.body;
  return out.str();
}

caf::expected<std::unique_ptr<http_server>>
http_server::make(const std::string& address, uint16_t port,
                  std::map<std::string, route> routes, http_limits limits) {
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  if (::inet_pton(AF_INET, address.c_str(), &addr.sin_addr) != 1)
    return caf::make_error(caf::sec::invalid_argument,
                           "metrics endpoint: '" + address
                               + "' is not an IPv4 address");
  fd_guard sock{::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0)};
  if (sock.fd < 0)
    return sys_error("socket");
  int one = 1;
  if (::setsockopt(sock.fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) != 0)
    return sys_error("setsockopt(SO_REUSEADDR)");
  if (::bind(sock.fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0)
    return sys_error(
        ("bind(" + address + ":" + std::to_string(port) + ")").c_str());
  if (::listen(sock.fd, 16) != 0)
    return sys_error("listen");
  socklen_t len = sizeof(addr);
  if (::getsockname(sock.fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0)
    return sys_error("getsockname");
  fd_guard wake{::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)};
  if (wake.fd < 0)
    return sys_error("eventfd");
  std::unique_ptr<http_server> srv{
      new http_server(sock.release(), wake.release(), ntohs(addr.sin_port),
                      std::move(routes), limits)};
  return srv;
}

http_server::http_server(int listen_fd, int wake_fd, uint16_t port,
                         std::map<std::string, route> routes,
                         http_limits limits)
    : listen_fd_(listen_fd),
      wake_fd_(wake_fd),
      port_(port),
      routes_(std::move(routes)),
      limits_(limits) {
  thread_ = std::thread([this] { loop(); });
}

http_server::~http_server() {
  stop_ = true;
  uint64_t one = 1;
  [[maybe_unused]] auto n = ::write(wake_fd_, &one, sizeof(one));
  thread_.join();
  ::close(listen_fd_);
  ::close(wake_fd_);
}

void http_server::loop() {
  while (!stop_) {
    pollfd fds[2] = {{listen_fd_, POLLIN, 0}, {wake_fd_, POLLIN, 0}};
    auto n = ::poll(fds, 2, -1);
    if (n < 0) {
      if (errno == EINTR)
        continue;
      return; // the listening socket is unusable: stop serving
    }
    if (stop_ || (fds[1].revents & POLLIN))
      return;
    if (!(fds[0].revents & POLLIN))
      continue;
    fd_guard conn{::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC)};
    if (conn.fd < 0)
      continue;
    serve(conn.fd);
  }
}

void http_server::serve(int fd) {
  // Read the header block within the deadline and the size limits.
  auto deadline = std::chrono::steady_clock::now() + limits_.read_timeout;
  std::string buf;
  size_t head_end = std::string::npos;
  auto answer = [&](const http_response& r, bool head_only,
                    const std::string& extra = {}) {
    ++served_;
    if (r.status >= 400)
      ++refused_;
    if (!send_all(fd, render_response(r, head_only, extra)))
      return;
    // Closing with unread input would reset the connection before the
    // client reads the answer: finish sending, then drain briefly.
    ::shutdown(fd, SHUT_WR);
    auto drain_until =
        std::chrono::steady_clock::now() + std::chrono::milliseconds(200);
    size_t drained = 0;
    while (drained < limits_.max_header_bytes * 4) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                      drain_until - std::chrono::steady_clock::now())
                      .count();
      pollfd p{fd, POLLIN, 0};
      if (left <= 0 || ::poll(&p, 1, static_cast<int>(left)) <= 0)
        break;
      char sink[2048];
      auto n = ::recv(fd, sink, sizeof(sink), 0);
      if (n <= 0)
        break;
      drained += static_cast<size_t>(n);
    }
  };
  auto error = [&](int status, const std::string& why) {
    answer(http_response{status, "text/plain; charset=utf-8", why + "\n"},
           false);
  };
  char chunk[2048];
  while (head_end == std::string::npos) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                    deadline - std::chrono::steady_clock::now())
                    .count();
    if (left <= 0) {
      error(408, "request header not received in time");
      return;
    }
    pollfd p{fd, POLLIN, 0};
    auto ready = ::poll(&p, 1, static_cast<int>(left));
    if (ready < 0 && errno == EINTR)
      continue;
    if (ready <= 0)
      continue; // re-checks the deadline
    auto n = ::recv(fd, chunk, sizeof(chunk), 0);
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0)
      return; // the client went away
    buf.append(chunk, static_cast<size_t>(n));
    head_end = buf.find("\r\n\r\n");
    if (head_end == std::string::npos) {
      auto first_eol = buf.find("\r\n");
      if (first_eol == std::string::npos
          && buf.size() > limits_.max_request_line) {
        error(414, "request line longer than "
                       + std::to_string(limits_.max_request_line) + " bytes");
        return;
      }
      if (buf.size() > limits_.max_header_bytes) {
        error(431, "request header block larger than "
                       + std::to_string(limits_.max_header_bytes) + " bytes");
        return;
      }
    }
  }
  auto parsed = parse_request(buf.substr(0, head_end + 2), limits_);
  if (parsed.status != 0) {
    error(parsed.status, parsed.reason);
    return;
  }
  auto& req = parsed.request;
  auto route = routes_.find(req.path);
  if (route == routes_.end()) {
    error(404, "no such path: " + req.path);
    return;
  }
  if (req.method != "GET" && req.method != "HEAD") {
    answer(
        http_response{405, "text/plain; charset=utf-8", "only GET and HEAD\n"},
        false, "Allow: GET, HEAD\r\n");
    return;
  }
  // A small body (allowed by the limits) is drained unread by answer().
  answer(route->second(), req.method == "HEAD");
}

} // namespace dualpath::actors::observe
