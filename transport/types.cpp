#include "transport/types.hpp"

#include "config/caf_support.hpp"

#include "transport/errors.hpp"

namespace dualpath::transport {

std::string to_string(traffic_class x) {
  switch (x) {
    case traffic_class::control:
      return "control";
    case traffic_class::kv:
      return "kv";
  }
  return "traffic_class(" + std::to_string(static_cast<int>(x)) + ")";
}

bool from_string(std::string_view str, traffic_class& x) {
  if (str == "control") {
    x = traffic_class::control;
    return true;
  }
  if (str == "kv") {
    x = traffic_class::kv;
    return true;
  }
  return false;
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

std::string to_string(transport_errc x) {
  switch (x) {
    case transport_errc::none:
      return "none";
    case transport_errc::out_of_bounds:
      return "out_of_bounds";
    case transport_errc::unknown_region:
      return "unknown_region";
    case transport_errc::wrong_key:
      return "wrong_key";
    case transport_errc::bad_frame:
      return "bad_frame";
    case transport_errc::unauthenticated:
      return "unauthenticated";
    case transport_errc::peer_lost:
      return "peer_lost";
    case transport_errc::deadline_exceeded:
      return "deadline_exceeded";
    case transport_errc::queue_full:
      return "queue_full";
    case transport_errc::unsupported:
      return "unsupported";
    case transport_errc::no_device:
      return "no_device";
    case transport_errc::system_error:
      return "system_error";
    case transport_errc::injected_fault:
      return "injected_fault";
    case transport_errc::bad_config:
      return "bad_config";
  }
  return "transport_errc(" + std::to_string(static_cast<int>(x)) + ")";
}

void add_error_category(caf::actor_system_config& cfg) {
  config::add_error_category<transport_errc>(cfg, caf::atom("dp_transp"),
                                             "transport");
}

} // namespace dualpath::transport
