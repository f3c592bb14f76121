// Reading the bulk transport's settings from the configuration schema.
#include <cstdio>

#include "transport/bulk/backend.hpp"
#include "transport/bulk/region_table.hpp"

namespace dualpath::transport::bulk {

caf::expected<options> options_from(const config::settings& cfg,
                                    std::string node) {
  options o;
  o.node = std::move(node);
  o.backend = cfg.string("transport.backend");
  o.secret = cfg.string("transport.secret");
  if (o.secret.empty()) {
    char buf[40];
    std::snprintf(buf, sizeof(buf), "%016llx%016llx",
                  static_cast<unsigned long long>(random_u64()),
                  static_cast<unsigned long long>(random_u64()));
    o.secret = buf;
  }
  o.weight_control =
      static_cast<uint32_t>(cfg.integer("transport.weight_control"));
  o.weight_kv = static_cast<uint32_t>(cfg.integer("transport.weight_kv"));
  o.default_deadline =
      std::chrono::milliseconds{cfg.integer("transport.deadline_ms")};
  o.verbs_max_outstanding =
      static_cast<uint32_t>(cfg.integer("transport.max_outstanding"));
  o.slice_kib = static_cast<uint64_t>(cfg.integer("transport.slice_kib"));
  o.max_frame_mib =
      static_cast<uint64_t>(cfg.integer("transport.max_frame_mib"));
  o.verbs_device = cfg.string("transport.verbs_device");
  o.verbs_port = static_cast<uint8_t>(cfg.integer("transport.verbs_port"));
  o.verbs_gid_index =
      static_cast<int>(cfg.integer("transport.verbs_gid_index"));
  o.verbs_sl_control =
      static_cast<int>(cfg.integer("transport.verbs_sl_control"));
  o.verbs_sl_kv = static_cast<int>(cfg.integer("transport.verbs_sl_kv"));
  o.verbs_traffic_class_control =
      static_cast<int>(cfg.integer("transport.verbs_traffic_class_control"));
  o.verbs_traffic_class_kv =
      static_cast<int>(cfg.integer("transport.verbs_traffic_class_kv"));
  o.verbs_hop_limit =
      static_cast<int>(cfg.integer("transport.verbs_hop_limit"));
  o.verbs_handshake_port =
      static_cast<uint16_t>(cfg.integer("transport.verbs_handshake_port"));
  const auto& listen = cfg.string("transport.tcp_listen");
  auto colon = listen.rfind(':');
  if (colon == std::string::npos)
    return caf::make_error(transport_errc::bad_frame,
                           "transport.tcp_listen must be host:port, got "
                               + listen);
  o.listen_host = listen.substr(0, colon);
  auto port = std::strtoul(listen.c_str() + colon + 1, nullptr, 10);
  if (port > 65535)
    return caf::make_error(transport_errc::bad_frame,
                           "transport.tcp_listen port out of range: " + listen);
  o.listen_port = static_cast<uint16_t>(port);
  return o;
}

} // namespace dualpath::transport::bulk
