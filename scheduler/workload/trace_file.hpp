// The trace file format (JSON lines) and its writer and validating loader.
//
// One trajectory per line, as a JSON object:
//   {"agent": 0, "seed": 1, "turns": [{"append": 6120, "gen": 211}, ...]}
// with optional "history": k (leading turns already in storage, not replayed)
// and optional "source": {"agent": a, "offset": o} (positions >= o carry agent
// a's tokens; made by add_agents). docs/workload.md is the full reference.
//
// The loader rejects, with a workload_errc and a message naming the file, the
// line (record) number and the field: bad JSON, missing, unknown or
// wrong-typed fields, zero or negative lengths, a trajectory whose context
// exceeds max_len, duplicate agent ids, and a file without records.
//
// Thread safety: pure functions over the given streams.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <string>

#include <caf/error.hpp>
#include <caf/expected.hpp>

#include "scheduler/workload/trajectory.hpp"

namespace dualpath::scheduler::workload {

/// Writes `xs` as JSON lines (one trajectory per line, fields in the order
/// agent, seed, turns, history, source; optional fields only when set).
void write_trace(std::ostream& out, const trace& xs);

/// write_trace() into the file `path` (created or truncated); io_error on
/// failure.
caf::error save_trace(const std::string& path, const trace& xs);

/// Reads and validates a trace from `in`. `max_len` caps every trajectory's
/// context (0: no cap); `name` prefixes every message (the file's path).
/// Blank lines are skipped but counted in line numbers.
caf::expected<trace> parse_trace(std::istream& in, uint64_t max_len,
                                 const std::string& name = "trace");

/// parse_trace() of the file `path`; io_error when it cannot be opened.
caf::expected<trace> load_trace(const std::string& path, uint64_t max_len);

} // namespace dualpath::scheduler::workload
