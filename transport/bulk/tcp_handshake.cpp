#include "transport/bulk/tcp_handshake.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <cstring>

#include "transport/bulk/region_table.hpp"

namespace dualpath::transport::bulk {

caf::expected<unique_fd> dial(const dial_request& req) {
  auto fd = tcp_socket();
  if (!fd)
    return fd;
  if (auto err = set_io_timeout(fd->get(), req.io_timeout))
    return err;
  if (auto err = set_nodelay(fd->get()))
    return err;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(req.port);
  if (::inet_pton(AF_INET, req.host.c_str(), &addr.sin_addr) != 1)
    return caf::make_error(transport_errc::bad_config,
                           "peer host is not an IPv4 address: " + req.host);
  auto where = req.host + ":" + std::to_string(req.port);
  if (::connect(fd->get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr))
      != 0)
    return caf::make_error(transport_errc::peer_lost,
                           "connect to " + where + ": " + std::strerror(errno));
  wire::challenge ch{};
  if (recv_all(fd->get(), &ch, sizeof(ch), "challenge")
      || ch.magic != wire::auth_magic)
    return caf::make_error(transport_errc::peer_lost,
                           "no challenge from " + req.host);
  wire::hello h{};
  h.magic = wire::auth_magic;
  h.version = wire::version;
  h.tclass = static_cast<uint8_t>(req.tclass);
  auto name = req.node.substr(0, sizeof(h.node) - 1);
  std::memcpy(h.node, name.data(), name.size());
  for (auto& x : h.nonce)
    x = static_cast<uint8_t>(random_u64());
  wire::client_mac(req.secret, ch.nonce, h);
  if (auto err = send_all(fd->get(), &h, sizeof(h), "hello"))
    return err;
  wire::welcome w{};
  // Closed or silent is not a refusal: the peer may have dropped us for
  // a hello later than its io timeout (a starved sender), or died.
  if (recv_all(fd->get(), &w, sizeof(w), "welcome"))
    return caf::make_error(transport_errc::peer_lost,
                           "no answer to our hello from " + where
                               + ": closed, or none within the io timeout");
  if (w.magic != wire::auth_magic || w.status != 0)
    return caf::make_error(transport_errc::unauthenticated,
                           "peer " + where + " refused our credentials");
  if (!wire::server_mac_ok(req.secret, h.nonce, w))
    return caf::make_error(transport_errc::unauthenticated,
                           "peer " + where + " failed to prove the secret");
  if (auto err = set_io_timeout(fd->get(), std::chrono::milliseconds{0}))
    return err;
  if (auto err = set_nonblocking(fd->get()))
    return err;
  return fd;
}

wire::challenge make_challenge(nonce& out) {
  wire::challenge ch{};
  ch.magic = wire::auth_magic;
  ch.version = wire::version;
  for (auto& x : ch.nonce)
    x = static_cast<uint8_t>(random_u64());
  std::memcpy(out.data(), ch.nonce, sizeof(ch.nonce));
  return ch;
}

caf::expected<authenticated_peer> check_hello(const std::string& secret,
                                              const nonce& sent,
                                              const wire::hello& h) {
  // The same check the fuzz target exercises (fuzz/tcp_frames.cpp).
  auto parsed = wire::parse_hello(reinterpret_cast<const uint8_t*>(&h),
                                  sizeof(h), secret, sent);
  if (!parsed)
    return caf::make_error(transport_errc::unauthenticated,
                           "hello failed authentication");
  authenticated_peer p;
  p.node = parsed->node; // NUL-terminated by parse_hello
  p.tclass = static_cast<traffic_class>(parsed->tclass);
  p.reply.magic = wire::auth_magic;
  wire::server_mac(secret, parsed->nonce, p.reply);
  return p;
}

wire::welcome refusal() {
  wire::welcome w{};
  w.magic = wire::auth_magic;
  w.status = static_cast<uint8_t>(transport_errc::unauthenticated);
  return w;
}

} // namespace dualpath::transport::bulk
