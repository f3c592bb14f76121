#include "scheduler/workload/errors.hpp"

#include <caf/actor_system_config.hpp>

#include "config/caf_support.hpp"
#include "config/enum_names.hpp"

namespace dualpath::scheduler::workload {

constexpr std::string_view workload_errc_names[] = {
    "none",          "io_error",      "bad_json",
    "missing_field", "unknown_field", "wrong_type",
    "bad_length",    "too_long",      "duplicate_agent",
    "empty_trace",   "bad_parameter"};

std::string to_string(workload_errc x) {
  return config::name_of(x, workload_errc_names, "workload_errc");
}

std::string message_of(const caf::error& err) {
  return config::error_message<workload_errc>(err, caf::atom("dp_wkload"));
}

void add_error_category(caf::actor_system_config& cfg) {
  config::add_error_category<workload_errc>(cfg, caf::atom("dp_wkload"),
                                            "workload");
}

} // namespace dualpath::scheduler::workload
