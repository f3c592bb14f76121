#include "scheduler/plan.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>

namespace dualpath::scheduler {

namespace {

int128_t abs128(int128_t x) {
  return x < 0 ? -x : x;
}

int128_t gcd128(int128_t x, int128_t y) {
  x = abs128(x);
  y = abs128(y);
  while (y != 0) {
    auto r = x % y;
    x = y;
    y = r;
  }
  return x;
}

std::string to_string128(int128_t x) {
  if (x == 0)
    return "0";
  bool neg = x < 0;
  std::string out;
  while (x != 0) {
    auto digit = static_cast<int>(x % 10);
    out += static_cast<char>('0' + (digit < 0 ? -digit : digit));
    x /= 10;
  }
  if (neg)
    out += '-';
  std::reverse(out.begin(), out.end());
  return out;
}

} // namespace

// -- fraction -----------------------------------------------------------------

fraction::fraction(int64_t num) : num_(num), den_(1) {
}

fraction::fraction(int128_t num, int128_t den) {
  if (den == 0) {
    std::fprintf(stderr, "dualpath: programmer error: fraction with "
                         "denominator 0\n");
    std::abort();
  }
  if (den < 0) {
    num = -num;
    den = -den;
  }
  auto g = gcd128(num, den);
  if (g > 1) {
    num /= g;
    den /= g;
  }
  num_ = num;
  den_ = den;
}

std::optional<fraction> fraction::from_decimal(double x) {
  if (!std::isfinite(x) || std::fabs(x) > 1e15)
    return std::nullopt;
  double scale = 1;
  for (int places = 0; places <= 9; ++places, scale *= 10) {
    double scaled = x * scale;
    double rounded = std::nearbyint(scaled);
    // The decimal with `places` digits nearest to x must round-trip to x.
    if (std::fabs(scaled - rounded) <= std::fabs(scaled) * 1e-15
        && rounded / scale == x)
      return fraction{static_cast<int128_t>(rounded),
                      static_cast<int128_t>(scale)};
  }
  return std::nullopt;
}

double fraction::to_double() const {
  return static_cast<double>(num_) / static_cast<double>(den_);
}

std::string fraction::to_string() const {
  if (den_ == 1)
    return to_string128(num_);
  return to_string128(num_) + "/" + to_string128(den_);
}

fraction operator+(const fraction& x, const fraction& y) {
  return fraction{x.num_ * y.den_ + y.num_ * x.den_, x.den_ * y.den_};
}

fraction operator-(const fraction& x, const fraction& y) {
  return fraction{x.num_ * y.den_ - y.num_ * x.den_, x.den_ * y.den_};
}

fraction operator*(const fraction& x, const fraction& y) {
  return fraction{x.num_ * y.num_, x.den_ * y.den_};
}

fraction operator/(const fraction& x, const fraction& y) {
  return fraction{x.num_ * y.den_, x.den_ * y.num_};
}

bool operator==(const fraction& x, const fraction& y) {
  return x.num_ == y.num_ && x.den_ == y.den_;
}

bool operator!=(const fraction& x, const fraction& y) {
  return !(x == y);
}

bool operator<(const fraction& x, const fraction& y) {
  return x.num_ * y.den_ < y.num_ * x.den_;
}

bool operator<=(const fraction& x, const fraction& y) {
  return !(y < x);
}

bool operator>(const fraction& x, const fraction& y) {
  return y < x;
}

bool operator>=(const fraction& x, const fraction& y) {
  return !(x < y);
}

// -- analysis -----------------------------------------------------------------

std::string range_end::binding_names() const {
  std::string out;
  for (auto& name : binding) {
    if (!out.empty())
      out += ',';
    out += name;
  }
  return out;
}

std::variant<plan_inputs, plan_error>
make_plan_inputs(double gpus_per_node, double cnic_gbps, double snic_node_gbps,
                 double dram_gbs, std::optional<int64_t> prefill_nodes,
                 std::optional<int64_t> decode_nodes) {
  plan_inputs in;
  struct field {
    const char* name;
    double x;
    fraction* out;
  };
  field fields[] = {{"GPUs per node", gpus_per_node, &in.gpus_per_node},
                    {"compute-NIC bandwidth", cnic_gbps, &in.cnic_gbps},
                    {"storage bandwidth", snic_node_gbps, &in.snic_node_gbps},
                    {"DRAM bandwidth", dram_gbs, &in.dram_gbs}};
  for (auto& f : fields) {
    auto exact = fraction::from_decimal(f.x);
    if (!exact)
      return plan_error{std::string{f.name} + " " + std::to_string(f.x)
                        + " is not a decimal number with at most 9 places"};
    *f.out = *exact;
  }
  in.prefill_nodes = prefill_nodes;
  in.decode_nodes = decode_nodes;
  return in;
}

std::vector<link_load> link_loads(const fraction& g, const fraction& cnic_gbs,
                                  const fraction& snic_gbs,
                                  const fraction& dram_gbs, int64_t p,
                                  int64_t d) {
  fraction one = 1;
  fraction two = 2;
  fraction pd = fraction{p} / fraction{d};
  fraction dp = fraction{d} / fraction{p};
  fraction per_gpu = snic_gbs / g; // Bs/g
  return {
      link_load{"pe_cnic_read", "per GPU", two * per_gpu, cnic_gbs},
      link_load{"pe_cnic_write", "per GPU", per_gpu * (one + dp), cnic_gbs},
      link_load{"de_cnic_read", "per GPU", per_gpu * (two + pd), cnic_gbs},
      link_load{"de_cnic_write", "per GPU", per_gpu * (one + two * pd),
                cnic_gbs},
      link_load{"pe_dram", "per node", two * snic_gbs, dram_gbs},
      link_load{"de_dram", "per node", (fraction{3} + two * pd) * snic_gbs,
                dram_gbs},
  };
}

std::variant<plan_result, plan_error> compute_plan(const plan_inputs& in) {
  fraction zero = 0;
  if (in.gpus_per_node <= zero || in.gpus_per_node.den() != 1)
    return plan_error{"GPUs per node must be a positive integer, not "
                      + in.gpus_per_node.to_string()};
  if (in.cnic_gbps <= zero)
    return plan_error{"compute-NIC bandwidth must be positive, not "
                      + in.cnic_gbps.to_string() + " Gb/s"};
  if (in.snic_node_gbps <= zero)
    return plan_error{"storage bandwidth must be positive, not "
                      + in.snic_node_gbps.to_string() + " Gb/s"};
  if (in.dram_gbs <= zero)
    return plan_error{"DRAM bandwidth must be positive, not "
                      + in.dram_gbs.to_string() + " GB/s"};
  if (in.prefill_nodes.has_value() != in.decode_nodes.has_value())
    return plan_error{"give both the prefill and the decode node count, or "
                      "neither"};
  if (in.prefill_nodes && (*in.prefill_nodes <= 0 || *in.decode_nodes <= 0))
    return plan_error{"node counts must be positive, not P = "
                      + std::to_string(*in.prefill_nodes)
                      + ", D = " + std::to_string(*in.decode_nodes)};
  plan_result r;
  r.g = in.gpus_per_node;
  r.cnic_gbs = in.cnic_gbps / fraction{8};
  r.snic_gbs = in.snic_node_gbps / fraction{8};
  r.dram_gbs = in.dram_gbs;
  r.s = r.snic_gbs / r.cnic_gbs;
  auto& g = r.g;
  auto& s = r.s;
  fraction two = 2;
  if (s > g / two)
    return plan_error{
        "storage bandwidth per node (" + in.snic_node_gbps.to_string()
        + " Gb/s, s = " + s.to_string() + ") exceeds half the node's "
        + "compute-NIC bandwidth (g*B/2 = "
        + (g * in.cnic_gbps / two).to_string()
        + " Gb/s): a prefill GPU's compute NIC would have to read 2*s*B/g > B, "
          "so no P/D is bottleneck-free"};
  r.pd_min = range_end{s / (g - s), {"pe_cnic_write"}};
  r.upper_bounds = {
      pd_bound{"de_cnic_read", "(g-2s)/s", (g - two * s) / s},
      pd_bound{"de_cnic_write", "(g-s)/(2s)", (g - s) / (two * s)},
      pd_bound{"de_dram", "(M/Bs-3)/2",
               (r.dram_gbs / r.snic_gbs - fraction{3}) / two},
  };
  r.pd_max.value = r.upper_bounds.front().value;
  for (auto& b : r.upper_bounds)
    r.pd_max.value = std::min(r.pd_max.value, b.value);
  for (auto& b : r.upper_bounds)
    if (b.value == r.pd_max.value)
      r.pd_max.binding.push_back(b.link);
  if (r.pd_max.value < r.pd_min.value)
    return plan_error{"no bottleneck-free P/D exists: the lower bound "
                      + r.pd_min.value.to_string()
                      + " (pe_cnic_write) exceeds the upper bound "
                      + r.pd_max.value.to_string() + " ("
                      + r.pd_max.binding_names()
                      + "); with M = " + r.dram_gbs.to_string()
                      + " GB/s and Bs = " + r.snic_gbs.to_string()
                      + " GB/s the decode DRAM needs M >= (3 + " + "2 P/D) Bs"};
  if (in.prefill_nodes) {
    r.prefill_nodes = in.prefill_nodes;
    r.decode_nodes = in.decode_nodes;
    r.links = link_loads(g, r.cnic_gbs, r.snic_gbs, r.dram_gbs,
                         *in.prefill_nodes, *in.decode_nodes);
    r.bottleneck_free =
        std::all_of(r.links.begin(), r.links.end(),
                    [](const link_load& l) { return l.within_capacity(); });
  }
  return r;
}

} // namespace dualpath::scheduler
