// `dualpath plan`: the bottleneck-free P/D analysis (brief section 2.2) for
// the configured hardware, with link loads for a given P and D.
#include <cstdio>
#include <iostream>

#include "cmd/command.hpp"
#include "scheduler/plan.hpp"

namespace dualpath::cmd {

namespace {

using scheduler::fraction;

std::string decimal(const fraction& x) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.6g", x.to_double());
  return buf;
}

// "7/2 (3.5)", or just "8" for integers.
std::string both(const fraction& x) {
  if (x.den() == 1)
    return x.to_string();
  return x.to_string() + " (" + decimal(x) + ")";
}

std::string percent(const fraction& x) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.1f%%", x.to_double() * 100);
  return buf;
}

std::string pad(std::string str, size_t width) {
  if (str.size() < width)
    str.append(width - str.size(), ' ');
  return str;
}

class plan_command : public command {
public:
  plan_command()
      : command(
          "plan",
          "Bottleneck-free P/D range and link loads (brief section 2.2).") {
  }

  void add_options(CLI::App& app, key_flags& flags) override {
    flags.add(app, "--gpus-per-node", "hardware.gpus_per_node");
    flags.add(app, "--cnic-gbps", "hardware.cnic_gbps");
    flags.add(app, "--snic-gbps", "hardware.snic_gbps");
    flags.add(app, "--dram-gbs", "hardware.dram_gbs");
    prefill_opt_ = app.add_option("--prefill-nodes", prefill_,
                                  "Prefill nodes P: also print every link's "
                                  "load at saturation (needs --decode-nodes).")
                       ->type_name("P");
    decode_opt_ = app.add_option("--decode-nodes", decode_,
                                 "Decode nodes D (needs --prefill-nodes).")
                      ->type_name("D");
    app.footer("The node's storage bandwidth is snic_gbps x "
               "hardware.snic_per_node. Exit status 2 when no P/D is "
               "bottleneck-free or an input is invalid.");
  }

  int run(const invocation& inv) override {
    auto& cfg = inv.cfg;
    std::optional<int64_t> p;
    std::optional<int64_t> d;
    if (prefill_opt_->count() > 0)
      p = prefill_;
    if (decode_opt_->count() > 0)
      d = decode_;
    auto snic_node =
        cfg.real("hardware.snic_gbps")
        * static_cast<double>(cfg.integer("hardware.snic_per_node"));
    auto inputs = scheduler::make_plan_inputs(
        static_cast<double>(cfg.integer("hardware.gpus_per_node")),
        cfg.real("hardware.cnic_gbps"), snic_node,
        cfg.real("hardware.dram_gbs"), p, d);
    if (auto err = std::get_if<scheduler::plan_error>(&inputs))
      return inv.fail(name(), err->message, exit_usage);
    auto res =
        scheduler::compute_plan(std::get<scheduler::plan_inputs>(inputs));
    if (auto err = std::get_if<scheduler::plan_error>(&res))
      return inv.fail(name(), err->message, exit_usage);
    auto& r = std::get<scheduler::plan_result>(res);
    if (inv.json())
      return inv.emit_json(to_json(r));
    print(inv.out, r);
    return exit_ok;
  }

private:
  static nlohmann::json to_json(const scheduler::plan_result& r) {
    nlohmann::json doc;
    doc["inputs"] = {{"gpus_per_node", r.g.to_double()},
                     {"cnic_gbs", r.cnic_gbs.to_double()},
                     {"snic_node_gbs", r.snic_gbs.to_double()},
                     {"dram_gbs", r.dram_gbs.to_double()},
                     {"s", r.s.to_double()},
                     {"s_fraction", r.s.to_string()}};
    doc["pd_min"] = r.pd_min.value.to_double();
    doc["pd_max"] = r.pd_max.value.to_double();
    doc["pd_min_fraction"] = r.pd_min.value.to_string();
    doc["pd_max_fraction"] = r.pd_max.value.to_string();
    doc["binding_min"] = r.pd_min.binding_names();
    doc["binding_max"] = r.pd_max.binding_names();
    auto& bounds = doc["upper_bounds"] = nlohmann::json::object();
    for (auto& b : r.upper_bounds)
      bounds[b.link] = {{"formula", b.formula},
                        {"value", b.value.to_double()},
                        {"fraction", b.value.to_string()}};
    if (r.prefill_nodes) {
      doc["prefill_nodes"] = *r.prefill_nodes;
      doc["decode_nodes"] = *r.decode_nodes;
      auto& links = doc["links"] = nlohmann::json::object();
      for (auto& l : r.links)
        links[l.name] = {{"load_gbs", l.load_gbs.to_double()},
                         {"capacity_gbs", l.capacity_gbs.to_double()},
                         {"utilisation", l.utilisation().to_double()},
                         {"scope", l.scope}};
      doc["bottleneck_free"] = *r.bottleneck_free;
    }
    return doc;
  }

  static void print(std::ostream& out, const scheduler::plan_result& r) {
    out << "Bottleneck-free P/D analysis (brief section 2.2)\n"
        << "  g = " << r.g.to_string()
        << " GPUs per node, B = " << both(r.cnic_gbs)
        << " GB/s compute NIC per GPU,\n"
        << "  Bs = " << both(r.snic_gbs)
        << " GB/s storage per node (s = " << both(r.s)
        << "), M = " << both(r.dram_gbs) << " GB/s DRAM per node\n\n"
        << "P/D range: " << r.pd_min.value.to_string()
        << " <= P/D <= " << r.pd_max.value.to_string() << "   ("
        << decimal(r.pd_min.value) << " <= P/D <= " << decimal(r.pd_max.value)
        << ")\n"
        << "  lower end binds: " << r.pd_min.binding_names()
        << "  (P/D >= s/(g-s))\n"
        << "  upper end binds: " << r.pd_max.binding_names() << '\n'
        << "  upper bounds:";
    for (auto& b : r.upper_bounds)
      out << "  " << b.link << " " << b.formula << " = " << both(b.value);
    out << '\n';
    if (!r.prefill_nodes)
      return;
    auto pd = fraction{*r.prefill_nodes} / fraction{*r.decode_nodes};
    out << "\n"
        << *r.prefill_nodes << "P" << *r.decode_nodes << "D (P/D = " << both(pd)
        << "): "
        << (*r.bottleneck_free ? "bottleneck-free" : "NOT bottleneck-free")
        << "\n"
        << "  " << pad("link", 15) << pad("scope", 10) << pad("load GB/s", 18)
        << pad("capacity GB/s", 15) << "utilisation\n";
    for (auto& l : r.links)
      out << "  " << pad(l.name, 15) << pad(l.scope, 10)
          << pad(both(l.load_gbs), 18) << pad(decimal(l.capacity_gbs), 15)
          << percent(l.utilisation())
          << (l.within_capacity() ? "" : "  OVER CAPACITY") << '\n';
  }

  int64_t prefill_ = 0;
  int64_t decode_ = 0;
  CLI::Option* prefill_opt_ = nullptr;
  CLI::Option* decode_opt_ = nullptr;
};

} // namespace

std::unique_ptr<command> make_plan_command() {
  return std::make_unique<plan_command>();
}

} // namespace dualpath::cmd
