#include "transport/types.hpp"

#include "config/caf_support.hpp"
#include "config/enum_names.hpp"

#include "transport/errors.hpp"

namespace dualpath::transport {

constexpr std::string_view traffic_class_names[] = {"control", "kv"};

std::string to_string(traffic_class x) {
  return config::name_of(x, traffic_class_names, "traffic_class");
}

bool from_string(std::string_view str, traffic_class& x) {
  return config::parse_name(str, traffic_class_names, x);
}

caf::expected<remote_region> remote_region::subrange(uint64_t off,
                                                     uint64_t len) const {
  // Written so that no addition can overflow: off <= length, then len fits in
  // what remains.
  if (off > length || len > length - off)
    return caf::make_error(transport_errc::out_of_bounds,
                           "subrange [" + std::to_string(off) + ", +"
                               + std::to_string(len) + ") of a view of "
                               + std::to_string(length) + " bytes");
  auto result = *this;
  result.offset = offset + off;
  result.length = len;
  return result;
}

constexpr std::string_view transport_errc_names[] = {
    "none",           "out_of_bounds",   "unknown_region", "wrong_key",
    "bad_frame",      "unauthenticated", "peer_lost",      "deadline_exceeded",
    "queue_full",     "unsupported",     "no_device",      "system_error",
    "injected_fault", "bad_config"};

std::string to_string(transport_errc x) {
  return config::name_of(x, transport_errc_names, "transport_errc");
}

void add_error_category(caf::actor_system_config& cfg) {
  config::add_error_category<transport_errc>(cfg, caf::atom("dp_transp"),
                                             "transport");
}

} // namespace dualpath::transport
