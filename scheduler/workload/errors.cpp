#include "scheduler/workload/errors.hpp"

#include <caf/actor_system_config.hpp>

#include "config/caf_support.hpp"

namespace dualpath::scheduler::workload {

std::string to_string(workload_errc x) {
  switch (x) {
    case workload_errc::none:
      return "none";
    case workload_errc::io_error:
      return "io_error";
    case workload_errc::bad_json:
      return "bad_json";
    case workload_errc::missing_field:
      return "missing_field";
    case workload_errc::unknown_field:
      return "unknown_field";
    case workload_errc::wrong_type:
      return "wrong_type";
    case workload_errc::bad_length:
      return "bad_length";
    case workload_errc::too_long:
      return "too_long";
    case workload_errc::duplicate_agent:
      return "duplicate_agent";
    case workload_errc::empty_trace:
      return "empty_trace";
    case workload_errc::bad_parameter:
      return "bad_parameter";
  }
  return "workload_errc(" + std::to_string(static_cast<int>(x)) + ")";
}

std::string message_of(const caf::error& err) {
  auto& ctx = err.context();
  if (!ctx.empty() && ctx.match_element<std::string>(0))
    return ctx.get_as<std::string>(0);
  if (err.category() == caf::atom("dp_wkload"))
    return to_string(static_cast<workload_errc>(err.code()));
  return caf::to_string(err);
}

void add_error_category(caf::actor_system_config& cfg) {
  config::add_error_category<workload_errc>(cfg, caf::atom("dp_wkload"),
                                            "workload");
}

} // namespace dualpath::scheduler::workload
