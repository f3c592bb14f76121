// A bulk peer played by hand on a raw socket, for the suites that check what
// the tcp backend accepts from the network (tests/transport/bulk/tcp_backend,
// tests/actors/node/hostile).
#pragma once

#include <cstring>
#include <string>

#include <sys/socket.h>

#include "transport/bulk/tcp_wire.hpp"

namespace dualpath::test {

/// The client side of the bulk handshake on `fd` as node `node` with
/// `secret`, declaring traffic class `tclass` (0 control, 1 kv); true if the
/// listener welcomed it.
inline bool raw_bulk_auth(int fd, const std::string& secret, const char* node,
                          uint8_t tclass = 0) {
  namespace wire = transport::bulk::wire;
  wire::challenge ch{};
  if (::recv(fd, &ch, sizeof(ch), MSG_WAITALL) != sizeof(ch))
    return false;
  wire::hello h{};
  h.magic = wire::auth_magic;
  h.version = wire::version;
  h.tclass = tclass;
  std::strncpy(h.node, node, sizeof(h.node) - 1);
  wire::client_mac(secret, ch.nonce, h);
  if (::send(fd, &h, sizeof(h), MSG_NOSIGNAL) != sizeof(h))
    return false;
  wire::welcome w{};
  return ::recv(fd, &w, sizeof(w), MSG_WAITALL) == sizeof(w) && w.status == 0;
}

} // namespace dualpath::test
