// The bottleneck-free P/D analysis of brief section 2.2: for P prefill and D
// decode nodes of g GPUs, each GPU with one compute NIC of bandwidth B, a
// node storage bandwidth Bs = s*B and a node DRAM bandwidth M, the range of
// P/D in which no compute NIC and no DRAM saturates before the storage NICs
// do, which constraint binds at each end, and every link's load when all
// storage NICs read at full rate.
//
// Arithmetic is exact: inputs are turned into fractions (a decimal input
// such as 12.5 becomes 25/2 exactly; at most 9 decimal places) and all
// results are fractions over 128-bit integers, so 1/7 is 1/7, not 0.142857.
//
// Link loads at saturation (per GPU for compute NICs, per node for DRAM),
// derived from the data flows of both read paths with hit tokens dominating
// (miss KV is negligible, as in the paper's model):
//   PE CNIC read  = 2 Bs/g            (H2D from own buffer + PE->DE transfer)
//   PE CNIC write = (Bs/g)(1 + D/P)   (H2D into HBM + DE-path KV arriving)
//   DE CNIC read  = (Bs/g)(2 + P/D)   (DE buffer -> PE + final H2D)
//   DE CNIC write = (Bs/g)(1 + 2P/D)  (PE -> DE KV + final H2D into HBM)
//   PE DRAM       = 2 Bs              (storage write + H2D read)
//   DE DRAM       = (3 + 2P/D) Bs     (half duplex: storage write, reads to
//                                      PE, PE KV written in, H2D read)
// Bounds: PE CNIC write <= B gives P/D >= s/(g-s); DE CNIC read, DE CNIC
// write and DE DRAM give the upper bounds (g-2s)/s, (g-s)/(2s) and
// (M/Bs-3)/2; PE CNIC read needs s <= g/2.
//
// Thread safety: pure functions over values. No CAF.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <variant>
#include <vector>

namespace dualpath::scheduler {

__extension__ typedef __int128 int128_t;

/// An exact fraction num/den in lowest terms with den > 0.
class fraction {
public:
  constexpr fraction() = default;
  fraction(int64_t num); // NOLINT: integers convert implicitly
  fraction(int128_t num, int128_t den);

  /// The exact value of a decimal number with at most 9 decimal places
  /// (12.5 -> 25/2); nullopt for NaN, infinities or finer inputs.
  static std::optional<fraction> from_decimal(double x);

  int128_t num() const {
    return num_;
  }
  int128_t den() const {
    return den_;
  }
  double to_double() const;
  /// "7/2", "8", "-1/3".
  std::string to_string() const;

  friend fraction operator+(const fraction& x, const fraction& y);
  friend fraction operator-(const fraction& x, const fraction& y);
  friend fraction operator*(const fraction& x, const fraction& y);
  friend fraction operator/(const fraction& x, const fraction& y);
  friend bool operator==(const fraction& x, const fraction& y);
  friend bool operator!=(const fraction& x, const fraction& y);
  friend bool operator<(const fraction& x, const fraction& y);
  friend bool operator<=(const fraction& x, const fraction& y);
  friend bool operator>(const fraction& x, const fraction& y);
  friend bool operator>=(const fraction& x, const fraction& y);

private:
  int128_t num_ = 0;
  int128_t den_ = 1;
};

/// Inputs of the analysis, in the units of the configuration.
struct plan_inputs {
  fraction gpus_per_node = 8;           ///< g.
  fraction cnic_gbps = 400;             ///< B per GPU, Gb/s.
  fraction snic_node_gbps = 400;        ///< Storage bandwidth per node, Gb/s.
  fraction dram_gbs = 500;              ///< M per node, GB/s.
  std::optional<int64_t> prefill_nodes; ///< P (with D: link loads).
  std::optional<int64_t> decode_nodes;  ///< D.
};

/// One candidate bound on P/D and the link it protects.
struct pd_bound {
  std::string link;    ///< "pe_cnic_write", "de_cnic_read", ...
  std::string formula; ///< "s/(g-s)", ...
  fraction value;
};

/// One end of the range: its value and every constraint that binds there.
struct range_end {
  fraction value;
  std::vector<std::string> binding; ///< Link names, brief order.
  /// The names joined by ",": "de_cnic_write,de_dram".
  std::string binding_names() const;
};

/// Load of one link when every storage NIC reads at full rate.
struct link_load {
  std::string name;      ///< pe_cnic_read ... de_dram.
  std::string scope;     ///< "per GPU" or "per node".
  fraction load_gbs;     ///< GB/s.
  fraction capacity_gbs; ///< GB/s.
  fraction utilisation() const {
    return load_gbs / capacity_gbs;
  }
  bool within_capacity() const {
    return load_gbs <= capacity_gbs;
  }
};

/// Result of the analysis.
struct plan_result {
  fraction g;
  fraction cnic_gbs; ///< B in GB/s.
  fraction snic_gbs; ///< Bs in GB/s.
  fraction dram_gbs; ///< M in GB/s.
  fraction s;        ///< Bs / B.
  range_end pd_min;
  range_end pd_max;
  std::vector<pd_bound> upper_bounds; ///< Every upper bound candidate.
  std::optional<int64_t> prefill_nodes;
  std::optional<int64_t> decode_nodes;
  std::vector<link_load> links; ///< Empty unless P and D were given.
  /// With P and D: whether every link is within capacity.
  std::optional<bool> bottleneck_free;
};

/// Why no bottleneck-free configuration exists or the inputs are invalid.
struct plan_error {
  std::string message;
};

/// Converts the configuration's numbers (Gb/s, GB/s) into plan inputs;
/// plan_error when one is not a decimal with at most 9 places.
std::variant<plan_inputs, plan_error>
make_plan_inputs(double gpus_per_node, double cnic_gbps, double snic_node_gbps,
                 double dram_gbs, std::optional<int64_t> prefill_nodes,
                 std::optional<int64_t> decode_nodes);

/// Runs the analysis. Errors: non-positive inputs, only one of P and D,
/// s > g/2 (the PE compute NICs cannot carry the storage traffic), and an
/// empty range.
std::variant<plan_result, plan_error> compute_plan(const plan_inputs& in);

/// Link loads for a given P and D (no feasibility check); B, Bs, M in GB/s.
std::vector<link_load> link_loads(const fraction& g, const fraction& cnic_gbs,
                                  const fraction& snic_gbs,
                                  const fraction& dram_gbs, int64_t p,
                                  int64_t d);

} // namespace dualpath::scheduler
