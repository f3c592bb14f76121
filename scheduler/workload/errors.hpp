// Errors of the workload module (trace generation, trace files) as CAF error
// codes. Every error carries one human-readable message as its context; for
// trace files it names the record (line) number and the field.
//
// Thread safety: free functions, no shared state.
#pragma once

#include <cstdint>
#include <string>

#include <caf/error.hpp>
#include <caf/fwd.hpp>
#include <caf/make_message.hpp> // needed by CAF_ERROR_CODE_ENUM

namespace dualpath::scheduler::workload {

/// Why a trace could not be generated, read or transformed.
enum class workload_errc : uint8_t {
  /// Not an error.
  none = 0,
  /// The trace file cannot be opened, read or written.
  io_error,
  /// A record is not valid JSON or not a JSON object.
  bad_json,
  /// A required field is missing from a record.
  missing_field,
  /// A record holds a field the format does not define.
  unknown_field,
  /// A field holds a value of the wrong JSON type.
  wrong_type,
  /// A length (append, gen, offset) is zero, negative or out of range.
  bad_length,
  /// A trajectory's context (all appends and generations) exceeds MaxLen.
  too_long,
  /// Two records carry the same agent id.
  duplicate_agent,
  /// The file holds no record.
  empty_trace,
  /// Generator parameters or a transformation's arguments are invalid.
  bad_parameter,
};

std::string to_string(workload_errc x);

/// The message of a workload error (its context string), or the rendered
/// code for errors without one.
std::string message_of(const caf::error& err);

/// Registers the error category with an actor system config so that
/// `actor_system::render` prints the code's name and message.
void add_error_category(caf::actor_system_config& cfg);

} // namespace dualpath::scheduler::workload

CAF_ERROR_CODE_ENUM(dualpath::scheduler::workload::workload_errc, "dp_wkload")
