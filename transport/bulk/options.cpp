// Reading the bulk transport's settings from the configuration schema.
#include <cstdio>

#include "transport/bulk/backend.hpp"
#include "transport/bulk/region_table.hpp"

namespace dualpath::transport::bulk {

caf::expected<tcp_cpu_sched> kv_sched_from(const config::settings& cfg) {
  const auto& sched = cfg.string("transport.tcp_kv_sched");
  tcp_cpu_sched x;
  if (!from_string(sched, x))
    return caf::make_error(transport_errc::bad_config,
                           "transport.tcp_kv_sched must be idle, batch or "
                           "normal, got "
                               + sched);
  return x;
}

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
  o.verbs_kv_queue_pairs =
      static_cast<uint32_t>(cfg.integer("transport.verbs_kv_queue_pairs"));
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
  if (auto sched = kv_sched_from(cfg))
    o.tcp_kv_sched = *sched;
  else
    return sched.error();
  o.tcp_kv_nice = static_cast<int>(cfg.integer("transport.tcp_kv_nice"));
  o.tcp_control_nice =
      static_cast<int>(cfg.integer("transport.tcp_control_nice"));
  o.tcp_control_cpu =
      static_cast<int>(cfg.integer("transport.tcp_control_cpu"));
  o.tcp_priority_control =
      static_cast<int>(cfg.integer("transport.tcp_priority_control"));
  o.tcp_priority_kv =
      static_cast<int>(cfg.integer("transport.tcp_priority_kv"));
  o.tcp_tos_control =
      static_cast<int>(cfg.integer("transport.tcp_tos_control"));
  o.tcp_tos_kv = static_cast<int>(cfg.integer("transport.tcp_tos_kv"));
  o.tcp_kv_chunk_kib =
      static_cast<uint32_t>(cfg.integer("transport.tcp_kv_chunk_kib"));
  o.tcp_kv_yield_chunk_kib =
      static_cast<uint32_t>(cfg.integer("transport.tcp_kv_yield_chunk_kib"));
  o.tcp_kv_yield =
      std::chrono::milliseconds{cfg.integer("transport.tcp_kv_yield_ms")};
  o.tcp_kv_connections =
      static_cast<uint32_t>(cfg.integer("transport.tcp_kv_connections"));
  o.tcp_kv_spin =
      std::chrono::microseconds{cfg.integer("transport.tcp_kv_spin_us")};
  const auto& listen = cfg.string("transport.tcp_listen");
  auto colon = listen.rfind(':');
  if (colon == std::string::npos)
    return caf::make_error(transport_errc::bad_config,
                           "transport.tcp_listen must be host:port, got "
                               + listen);
  o.listen_host = listen.substr(0, colon);
  auto digits = listen.substr(colon + 1);
  auto port = std::strtoul(digits.c_str(), nullptr, 10);
  if (digits.empty()
      || digits.find_first_not_of("0123456789") != std::string::npos
      || port > 65535)
    return caf::make_error(transport_errc::bad_config,
                           "transport.tcp_listen port out of range: " + listen);
  o.listen_port = static_cast<uint16_t>(port);
  return o;
}

} // namespace dualpath::transport::bulk
