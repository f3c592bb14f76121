#include "scheduler/workload/trajectory.hpp"

#include <algorithm>

#include "scheduler/workload/errors.hpp"

namespace dualpath::scheduler::workload {

namespace {

// SplitMix64's finaliser: a bijective 64-bit mixer with full avalanche, so
// (seed, agent, position) triples that differ anywhere give unrelated ids.
uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// The part of a token's id that depends on (seed, agent) only.
uint64_t token_base(uint64_t seed, uint64_t agent) {
  return mix(mix(seed) ^ agent);
}

uint32_t token_of(uint64_t base, uint64_t pos) {
  return static_cast<uint32_t>(mix(base ^ pos) >> 32);
}

uint32_t raw_token(uint64_t seed, uint64_t agent, uint64_t pos) {
  return token_of(token_base(seed, agent), pos);
}

} // namespace

uint32_t token_at(const trajectory& traj, uint64_t pos) {
  if (traj.source_offset > 0 && pos >= traj.source_offset)
    return raw_token(traj.seed, traj.source_agent, pos - traj.source_offset);
  return raw_token(traj.seed, traj.agent, pos);
}

uint64_t prompt_length(const trajectory& traj, size_t turn_index) {
  uint64_t len = 0;
  for (size_t i = 0; i < turn_index; ++i)
    len += uint64_t{traj.turns[i].append} + traj.turns[i].gen;
  return len + traj.turns[turn_index].append;
}

void tokens_into(const trajectory& traj, uint64_t first, uint64_t count,
                 uint32_t* out) {
  // token_at() for every position, with the per-agent part hoisted out of
  // the loop (a prompt is tens of thousands of tokens).
  const uint64_t own = token_base(traj.seed, traj.agent);
  const uint64_t src = token_base(traj.seed, traj.source_agent);
  const uint64_t split = traj.source_offset > 0 ? traj.source_offset : ~0ull;
  for (uint64_t k = 0; k < count; ++k) {
    uint64_t p = first + k;
    out[k] = p >= split ? token_of(src, p - split) : token_of(own, p);
  }
}

std::vector<uint32_t> tokens(const trajectory& traj, uint64_t first,
                             uint64_t count) {
  std::vector<uint32_t> out(count);
  tokens_into(traj, first, count, out.data());
  return out;
}

std::vector<uint32_t> prompt_tokens(const trajectory& traj, size_t turn_index) {
  return tokens(traj, 0, prompt_length(traj, turn_index));
}

uint64_t final_length(const trajectory& traj) {
  uint64_t len = 0;
  for (auto& t : traj.turns)
    len += uint64_t{t.append} + t.gen;
  return len;
}

uint64_t history_length(const trajectory& traj) {
  uint64_t len = 0;
  auto n = std::min<size_t>(traj.history_turns, traj.turns.size());
  for (size_t i = 0; i < n; ++i)
    len += uint64_t{traj.turns[i].append} + traj.turns[i].gen;
  return len;
}

caf::expected<trace> limit_turns(const trace& xs, size_t first_turn, size_t n) {
  if (n == 0)
    return caf::make_error(workload_errc::bad_parameter,
                           "limit_turns: the window must hold at least one "
                           "turn (n = 0)");
  trace out;
  for (auto& x : xs) {
    if (x.turns.size() <= first_turn)
      continue;
    auto y = x;
    y.turns.resize(std::min(x.turns.size(), first_turn + n));
    y.history_turns =
        static_cast<uint32_t>(std::max<size_t>(x.history_turns, first_turn));
    if (y.history_turns >= y.turns.size())
      continue;
    out.push_back(std::move(y));
  }
  return out;
}

} // namespace dualpath::scheduler::workload
