// ctest-label: foundation
// The bottleneck-free P/D analysis (brief section 2.2): the paper's range and
// the brief's link-load table, exactly.
#include "scheduler/plan.hpp"

#include <doctest/doctest.h>

#include <map>

using namespace dualpath::scheduler;

namespace {

plan_result plan_for(plan_inputs in) {
  auto res = compute_plan(in);
  if (auto err = std::get_if<plan_error>(&res))
    FAIL("unexpected plan error: " << err->message);
  return std::get<plan_result>(res);
}

std::string error_for(plan_inputs in) {
  auto res = compute_plan(in);
  REQUIRE(std::holds_alternative<plan_error>(res));
  return std::get<plan_error>(res).message;
}

std::map<std::string, fraction> loads(int64_t p, int64_t d) {
  plan_inputs in; // paper-hopper: g = 8, B = Bs = 50 GB/s, M = 500 GB/s
  in.prefill_nodes = p;
  in.decode_nodes = d;
  auto r = plan_for(in);
  std::map<std::string, fraction> out;
  for (auto& l : r.links)
    out[l.name] = l.load_gbs;
  return out;
}

fraction frac(int64_t n, int64_t d) {
  return fraction{n, d};
}

} // namespace

TEST_CASE("fractions are exact and reduced") {
  CHECK((fraction{1} / fraction{7}).to_string() == "1/7");
  CHECK(frac(14, 4).to_string() == "7/2");
  CHECK(frac(3, -6).to_string() == "-1/2");
  CHECK(frac(1, 3) + frac(1, 6) == frac(1, 2));
  CHECK(frac(1, 3) < frac(1, 2));
  CHECK(fraction::from_decimal(12.5) == frac(25, 2));
  CHECK(fraction::from_decimal(0.1) == frac(1, 10));
  CHECK(fraction::from_decimal(400) == fraction{400});
  CHECK_FALSE(fraction::from_decimal(1.0 / 3.0).has_value());
}

TEST_CASE("the paper's hardware gives 1/7 <= P/D <= 7/2") {
  auto r = plan_for(plan_inputs{});
  CHECK(r.s == fraction{1});
  CHECK(r.cnic_gbs == fraction{50});
  CHECK(r.snic_gbs == fraction{50});
  CHECK(r.pd_min.value == frac(1, 7));
  CHECK(r.pd_max.value == frac(7, 2));
  CHECK(r.pd_min.binding_names() == "pe_cnic_write");
  // Two constraints tie at 7/2 on the paper's numbers.
  CHECK(r.pd_max.binding_names() == "de_cnic_write,de_dram");
  CHECK(r.links.empty());
  CHECK_FALSE(r.bottleneck_free.has_value());
}

TEST_CASE("the brief's link-load table is reproduced") {
  SUBCASE("1P1D") {
    auto l = loads(1, 1);
    CHECK(l["pe_cnic_read"] == frac(25, 2));
    CHECK(l["pe_cnic_write"] == frac(25, 2));
    CHECK(l["de_cnic_read"] == frac(75, 4));
    CHECK(l["de_cnic_write"] == frac(75, 4));
    CHECK(l["pe_dram"] == fraction{100});
    CHECK(l["de_dram"] == fraction{250});
  }
  SUBCASE("2P4D") {
    auto l = loads(2, 4);
    CHECK(l["pe_cnic_read"] == frac(25, 2));
    CHECK(l["pe_cnic_write"] == frac(75, 4));
    CHECK(l["de_cnic_read"] == frac(125, 8)); // 15.6 in the brief
    CHECK(l["de_cnic_write"] == frac(25, 2));
    CHECK(l["pe_dram"] == fraction{100});
    CHECK(l["de_dram"] == fraction{200});
    // 2P4D = 1P2D = 48P96D: only P/D matters.
    CHECK(loads(1, 2) == l);
    CHECK(loads(48, 96) == l);
  }
  SUBCASE("2P1D") {
    auto l = loads(2, 1);
    CHECK(l["pe_cnic_read"] == frac(25, 2));
    CHECK(l["pe_cnic_write"] == frac(75, 8)); // 9.4 in the brief
    CHECK(l["de_cnic_read"] == fraction{25});
    CHECK(l["de_cnic_write"] == frac(125, 4));
    CHECK(l["pe_dram"] == fraction{100});
    CHECK(l["de_dram"] == fraction{350});
  }
}

TEST_CASE("bottleneck-free exactly inside the range, ends included") {
  auto check = [](int64_t p, int64_t d, bool expected) {
    plan_inputs in;
    in.prefill_nodes = p;
    in.decode_nodes = d;
    auto r = plan_for(in);
    REQUIRE(r.bottleneck_free.has_value());
    CHECK_MESSAGE(*r.bottleneck_free == expected, p << "P" << d << "D");
  };
  check(2, 4, true);
  check(1, 7, true);  // P/D = 1/7: PE CNIC write exactly at capacity
  check(1, 8, false); // below the range: PE CNIC write over capacity
  check(7, 2, true);  // the upper end: DE CNIC write and DE DRAM at capacity
  check(4, 1, false); // above the range
  plan_inputs in;
  in.prefill_nodes = 1;
  in.decode_nodes = 8;
  auto r = plan_for(in);
  for (auto& l : r.links)
    CHECK_MESSAGE(l.within_capacity() == (l.name != "pe_cnic_write"), l.name);
  CHECK(r.links[1].utilisation() == frac(9, 8));
}

TEST_CASE("other hardware moves the binding constraints") {
  plan_inputs in;
  in.snic_node_gbps = 800; // s = 2
  in.dram_gbs = 2000;      // DRAM no longer binds
  auto r = plan_for(in);
  CHECK(r.s == fraction{2});
  CHECK(r.pd_min.value == frac(1, 3));
  CHECK(r.pd_max.value == frac(3, 2)); // (g-s)/(2s) = 6/4 < (g-2s)/s = 2
  CHECK(r.pd_max.binding_names() == "de_cnic_write");
  in.dram_gbs = 500; // (M/Bs - 3)/2 = (5 - 3)/2 = 1
  r = plan_for(in);
  CHECK(r.pd_max.value == fraction{1});
  CHECK(r.pd_max.binding_names() == "de_dram");
}

TEST_CASE("infeasible inputs are errors with a reason") {
  plan_inputs in;
  in.snic_node_gbps = 1700; // s = 4.25 > g/2 = 4
  CHECK(error_for(in).find("exceeds half the node's compute-NIC bandwidth")
        != std::string::npos);
  in = plan_inputs{};
  in.dram_gbs = 100; // M < 3 Bs: decode DRAM saturates for any P/D
  CHECK(error_for(in).find("no bottleneck-free P/D exists")
        != std::string::npos);
  in = plan_inputs{};
  in.cnic_gbps = 0;
  CHECK(error_for(in).find("compute-NIC bandwidth must be positive")
        != std::string::npos);
  in = plan_inputs{};
  in.gpus_per_node = -8;
  CHECK(error_for(in).find("GPUs per node") != std::string::npos);
  in = plan_inputs{};
  in.prefill_nodes = 2;
  CHECK(error_for(in).find("both") != std::string::npos);
  in.decode_nodes = 0;
  CHECK(error_for(in).find("positive") != std::string::npos);
}

TEST_CASE("configuration numbers become exact inputs") {
  auto res = make_plan_inputs(8, 400, 100, 500.5, 2, 4);
  REQUIRE(std::holds_alternative<plan_inputs>(res));
  auto& in = std::get<plan_inputs>(res);
  CHECK(in.snic_node_gbps == fraction{100});
  CHECK(in.dram_gbs == frac(1001, 2));
  CHECK(std::holds_alternative<plan_error>(
      make_plan_inputs(8, 1.0 / 3.0, 400, 500, {}, {})));
}
