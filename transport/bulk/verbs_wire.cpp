// The verbs backend's side channel: framing, encoding, MACs and sockets (see
// verbs_wire.hpp).
#include "transport/bulk/verbs_wire.hpp"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <poll.h>
#include <sys/socket.h>

#include <cstring>
#include <memory>

namespace dualpath::transport::bulk::verbs {

namespace {

using std::chrono::milliseconds;
using std::chrono::steady_clock;

caf::error lost(const std::string& what) {
  return caf::make_error(transport_errc::peer_lost, what);
}

caf::error set_nonblocking(int fd) {
  int flags = ::fcntl(fd, F_GETFL, 0);
  if (auto err = scall("fcntl(F_GETFL)", flags))
    return err;
  if (auto err =
          scall("fcntl(F_SETFL)", ::fcntl(fd, F_SETFL, flags | O_NONBLOCK)))
    return err;
  int one = 1;
  return scall("setsockopt(TCP_NODELAY)",
               ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one)));
}

caf::expected<addrinfo*> resolve(const std::string& host, uint16_t port,
                                 bool passive) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = passive ? AI_PASSIVE : 0;
  addrinfo* res = nullptr;
  auto service = std::to_string(port);
  int rc = ::getaddrinfo(host.empty() ? nullptr : host.c_str(), service.c_str(),
                         &hints, &res);
  if (rc != 0 || res == nullptr)
    return caf::make_error(transport_errc::peer_lost,
                           "getaddrinfo(" + host + "): " + ::gai_strerror(rc));
  return res;
}

} // namespace

void wire_writer::raw(const void* p, size_t n) {
  auto b = static_cast<const uint8_t*>(p);
  buf_.insert(buf_.end(), b, b + n);
}

void wire_writer::text(const std::string& s) {
  auto n = static_cast<uint16_t>(std::min<size_t>(s.size(), 0xffff));
  u16(n);
  raw(s.data(), n);
}

void wire_writer::endpoint(const qp_endpoint& e) {
  u16(e.address.lid);
  u8(e.address.mtu);
  u8(e.address.global ? 1 : 0);
  raw(e.address.gid, 16);
  u8(e.lanes);
  for (size_t l = 0; l < e.lanes && l < max_lanes; ++l) {
    u32(e.qpn[l]);
    u32(e.psn[l]);
  }
}

void wire_writer::table(const std::vector<region_entry>& t) {
  u32(static_cast<uint32_t>(t.size()));
  for (auto& r : t) {
    u32(r.id);
    u32(r.rkey);
    u64(r.key);
    u64(r.base);
    u64(r.length);
  }
}

void wire_writer::seal(const std::string& secret, char label,
                       const uint8_t nonce[32]) {
  uint8_t mac[32];
  mac_of(secret, label, nonce, buf_.data(), buf_.size(), mac);
  raw(mac, 32);
}

void wire_reader::raw(void* p, size_t n) {
  if (failed_ || buf_.size() - pos_ < n) {
    failed_ = true;
    std::memset(p, 0, n);
    return;
  }
  std::memcpy(p, buf_.data() + pos_, n);
  pos_ += n;
}

uint8_t wire_reader::u8() {
  uint8_t x = 0;
  raw(&x, 1);
  return x;
}

uint16_t wire_reader::u16() {
  uint16_t x = 0;
  raw(&x, sizeof(x));
  return x;
}

uint32_t wire_reader::u32() {
  uint32_t x = 0;
  raw(&x, sizeof(x));
  return x;
}

uint64_t wire_reader::u64() {
  uint64_t x = 0;
  raw(&x, sizeof(x));
  return x;
}

std::string wire_reader::text(size_t max_len) {
  auto n = u16();
  if (n > max_len || failed_ || buf_.size() - pos_ < n) {
    failed_ = true;
    return {};
  }
  std::string s(reinterpret_cast<const char*>(buf_.data() + pos_), n);
  pos_ += n;
  return s;
}

qp_endpoint wire_reader::endpoint() {
  qp_endpoint e;
  e.address.lid = u16();
  e.address.mtu = u8();
  e.address.global = u8() != 0;
  raw(e.address.gid, 16);
  e.lanes = u8();
  // A control lane and 1..max_kv_lanes KV lanes; anything else is refused
  // before a queue pair is made for it.
  if (e.lanes < 2 || e.lanes > max_lanes) {
    failed_ = true;
    e.lanes = 0;
    return e;
  }
  for (size_t l = 0; l < e.lanes; ++l) {
    e.qpn[l] = u32();
    e.psn[l] = u32();
  }
  if (e.address.mtu < IBV_MTU_256 || e.address.mtu > IBV_MTU_4096)
    failed_ = true;
  return e;
}

std::vector<region_entry> wire_reader::table() {
  auto n = u32();
  std::vector<region_entry> t;
  if (n > max_regions || failed_ || (buf_.size() - pos_) / 32 < n) {
    failed_ = true;
    return t;
  }
  t.resize(n);
  for (auto& r : t) {
    r.id = u32();
    r.rkey = u32();
    r.key = u64();
    r.base = u64();
    r.length = u64();
    if (r.base + r.length < r.base) // wraps: no such region
      failed_ = true;
  }
  return t;
}

void mac_of(const std::string& secret, char label, const uint8_t nonce[32],
            const uint8_t* body, size_t len, uint8_t out[32]) {
  // label | nonce | body, in one buffer of its final size (a vector grown
  // by push_back trips GCC 12's -Wfree-nonheap-object at -O3).
  const size_t size = 1 + 32 + len;
  auto msg = std::make_unique<uint8_t[]>(size);
  msg[0] = static_cast<uint8_t>(label);
  std::memcpy(msg.get() + 1, nonce, 32);
  if (len > 0)
    std::memcpy(msg.get() + 33, body, len);
  unsigned int out_len = 32;
  HMAC(EVP_sha256(), secret.data(), static_cast<int>(secret.size()), msg.get(),
       size, out, &out_len);
}

bool mac_ok(const std::string& secret, char label, const uint8_t nonce[32],
            const std::vector<uint8_t>& body) {
  if (body.size() < 32)
    return false;
  uint8_t expected[32];
  mac_of(secret, label, nonce, body.data(), body.size() - 32, expected);
  return CRYPTO_memcmp(expected, body.data() + body.size() - 32, 32) == 0;
}

caf::expected<channel> channel::dial(const std::string& host, uint16_t port,
                                     milliseconds timeout) {
  auto where = host + ":" + std::to_string(port);
  auto res = resolve(host, port, false);
  if (!res)
    return res.error();
  std::unique_ptr<addrinfo, void (*)(addrinfo*)> guard{*res, ::freeaddrinfo};
  caf::error last = lost("no address for " + where);
  for (auto* ai = *res; ai != nullptr; ai = ai->ai_next) {
    unique_fd fd{::socket(ai->ai_family, ai->ai_socktype, ai->ai_protocol)};
    if (auto err = scall("socket", fd.get()))
      return err;
    if (auto err = set_nonblocking(fd.get()))
      return err;
    int rc = ::connect(fd.get(), ai->ai_addr, ai->ai_addrlen);
    if (rc != 0 && errno != EINPROGRESS) {
      last = call_error("connect", errno, transport_errc::peer_lost, where);
      continue;
    }
    if (rc != 0) {
      pollfd p{fd.get(), POLLOUT, 0};
      int n = ::poll(&p, 1, static_cast<int>(timeout.count()));
      if (n == 0) {
        last = lost("connect to " + where + ": no answer within "
                    + std::to_string(timeout.count()) + " ms");
        continue;
      }
      if (auto err = scall("poll", n))
        return err;
      int so = 0;
      socklen_t len = sizeof(so);
      if (auto err =
              scall("getsockopt(SO_ERROR)",
                    ::getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &so, &len)))
        return err;
      if (so != 0) {
        last = call_error("connect", so, transport_errc::peer_lost, where);
        continue;
      }
    }
    return channel{std::move(fd)};
  }
  return last;
}

caf::error channel::io(bool write, uint8_t* p, size_t n,
                       steady_clock::time_point until) {
  while (n > 0) {
    long rc = write ? ::send(fd_.get(), p, n, MSG_NOSIGNAL)
                    : ::recv(fd_.get(), p, n, 0);
    if (rc > 0) {
      p += rc;
      n -= static_cast<size_t>(rc);
      continue;
    }
    if (rc == 0)
      return lost("side channel closed by the peer");
    if (errno == EINTR)
      continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK)
      return call_error(write ? "send" : "recv", errno,
                        transport_errc::peer_lost, "side channel");
    auto left =
        std::chrono::duration_cast<milliseconds>(until - steady_clock::now());
    if (left.count() <= 0)
      return lost("side channel: no progress before the timeout");
    pollfd pfd{fd_.get(), static_cast<short>(write ? POLLOUT : POLLIN), 0};
    int k = ::poll(&pfd, 1, static_cast<int>(left.count()));
    if (k < 0 && errno != EINTR)
      return scall("poll", k);
  }
  return caf::none;
}

caf::error channel::send(frame_type type, const std::vector<uint8_t>& body,
                         milliseconds timeout) {
  if (body.size() + 1 > max_frame_bytes)
    return caf::make_error(transport_errc::bad_frame,
                           "side-channel frame too large");
  std::vector<uint8_t> out(5 + body.size());
  uint32_t len = static_cast<uint32_t>(body.size() + 1);
  std::memcpy(out.data(), &len, 4);
  out[4] = static_cast<uint8_t>(type);
  if (!body.empty())
    std::memcpy(out.data() + 5, body.data(), body.size());
  return io(true, out.data(), out.size(), steady_clock::now() + timeout);
}

caf::expected<frame> channel::receive(milliseconds timeout) {
  auto until = steady_clock::now() + timeout;
  uint8_t head[5];
  if (auto err = io(false, head, sizeof(head), until))
    return err;
  uint32_t len = 0;
  std::memcpy(&len, head, 4);
  if (len < 1 || len > max_frame_bytes || head[4] < 1
      || head[4] > static_cast<uint8_t>(frame_type::region_gone))
    return caf::make_error(transport_errc::bad_frame,
                           "side-channel frame of bad length or type");
  frame f;
  f.type = static_cast<frame_type>(head[4]);
  f.body.resize(len - 1);
  if (!f.body.empty())
    if (auto err = io(false, f.body.data(), f.body.size(), until))
      return err;
  return f;
}

caf::expected<listener> listener::open(const std::string& host, uint16_t port) {
  auto res = resolve(host, port, true);
  if (!res)
    return res.error();
  std::unique_ptr<addrinfo, void (*)(addrinfo*)> guard{*res, ::freeaddrinfo};
  auto* ai = *res;
  auto where = host + ":" + std::to_string(port);
  listener l;
  l.fd.reset(::socket(ai->ai_family, ai->ai_socktype, ai->ai_protocol));
  if (auto err = scall("socket", l.fd.get()))
    return err;
  int one = 1;
  if (auto err = scall("setsockopt(SO_REUSEADDR)",
                       ::setsockopt(l.fd.get(), SOL_SOCKET, SO_REUSEADDR, &one,
                                    sizeof(one))))
    return err;
  if (auto err = scall("bind", ::bind(l.fd.get(), ai->ai_addr, ai->ai_addrlen),
                       transport_errc::system_error, where))
    return err;
  if (auto err = scall("listen", ::listen(l.fd.get(), 64)))
    return err;
  if (auto err = set_nonblocking(l.fd.get()))
    return err;
  sockaddr_storage ss{};
  socklen_t len = sizeof(ss);
  if (auto err = scall(
          "getsockname",
          ::getsockname(l.fd.get(), reinterpret_cast<sockaddr*>(&ss), &len)))
    return err;
  l.port = ntohs(ss.ss_family == AF_INET6
                     ? reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port
                     : reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
  return l;
}

caf::expected<channel> listener::accept() {
  int fd = ::accept4(this->fd.get(), nullptr, nullptr, SOCK_CLOEXEC);
  if (fd < 0) {
    if (errno == EAGAIN || errno == EWOULDBLOCK || errno == ECONNABORTED
        || errno == EINTR)
      return channel{};
    return call_error("accept4", errno);
  }
  unique_fd owned{fd};
  if (auto err = set_nonblocking(fd))
    return err;
  return channel{std::move(owned)};
}

caf::expected<host_port> parse_host_port(const std::string& s,
                                         const std::string& what) {
  auto colon = s.rfind(':');
  if (colon == std::string::npos || colon == 0)
    return caf::make_error(transport_errc::bad_frame,
                           what + " must be host:port, got '" + s + "'");
  char* end = nullptr;
  auto port = std::strtoul(s.c_str() + colon + 1, &end, 10);
  if (end == s.c_str() + colon + 1 || *end != '\0' || port == 0 || port > 65535)
    return caf::make_error(transport_errc::bad_frame,
                           what + ": bad port in '" + s + "'");
  host_port hp;
  hp.host = s.substr(0, colon);
  if (hp.host.size() > 2 && hp.host.front() == '[' && hp.host.back() == ']')
    hp.host = hp.host.substr(1, hp.host.size() - 2);
  hp.port = static_cast<uint16_t>(port);
  return hp;
}

} // namespace dualpath::transport::bulk::verbs
