// ctest-label: distribution
// transport.backend = auto in a deployment of real processes: de1 names an
// RDMA device that does not exist, so it has no verbs; every peer of de1 is
// a tcp fallback, logged with the running dualpath_bulk_tcp_fallback_total
// on both sides, and the run still verifies every block. Where the host has
// RDMA devices (the rdma-vm guest), pe0 and de0 reach each other over verbs
// at the same time (verbs per peer); without devices every peer is tcp.
#include <doctest/doctest.h>

#include <infiniband/verbs.h>

#include <nlohmann/json.hpp>

#include "tests/actors/node/deployment.hpp"

using namespace dualpath::test;
using nlohmann::json;

namespace {

std::string first_device() {
  int n = 0;
  auto list = ibv_get_device_list(&n);
  std::string out =
      list != nullptr && n > 0 ? ibv_get_device_name(list[0]) : "";
  if (list != nullptr)
    ibv_free_device_list(list);
  return out;
}

} // namespace

TEST_CASE("auto: verbs per peer where both ends have it, tcp fallback "
          "(logged and counted) for a node without") {
  auto device = first_device();
  MESSAGE("RDMA device: " << (device.empty() ? std::string{"none"} : device));
  temp_dir dir;
  deployment_ports ports;
  auto cluster = dir.file("cluster.toml");
  // pe0 and de0 on the host's device (if any), de1 on none that exists.
  auto toml = cluster_toml(ports, dir.file("store"), false,
                           {device, device, "no-such-rdma-device"});
  write_file(cluster, toml);
  auto settings = deployment_settings(2, 2, 20, "auto");
  deployment d{dir, cluster, settings};
  REQUIRE_MESSAGE(d.wait_joined(std::chrono::seconds(120)), d.logs());
  auto res = run_process(with(
      {dualpath_binary(), "run", "--quiet", "--json", "--cluster", cluster},
      settings));
  REQUIRE_MESSAGE(res.status == 0, (res.err + d.logs()));
  auto doc = json::parse(res.out, nullptr, false);
  REQUIRE_MESSAGE(!doc.is_discarded(), res.out);
  auto got = doc["modes"]["dualpath"];
  CHECK(got["failed_requests"] == 0);
  CHECK(got["verify_failures"] == 0);
  CHECK(got["blocks_verified"].get<uint64_t>() > 0);
  auto pe0 = d.node(1).err();
  auto de1 = d.node(3).err();
  CHECK(de1.find("auto: tcp towards every peer (no verbs")
        != std::string::npos);
  CHECK(de1.find("bulk transport to pe0: tcp fallback") != std::string::npos);
  CHECK(de1.find("dualpath_bulk_tcp_fallback_total 2") != std::string::npos);
  CHECK(pe0.find("bulk transport to de1: tcp fallback") != std::string::npos);
  if (!device.empty()) {
    CHECK(pe0.find("bulk transport to de0: verbs") != std::string::npos);
    CHECK(pe0.find("dualpath_bulk_tcp_fallback_total 1") != std::string::npos);
    CHECK(pe0.find("dualpath_bulk_tcp_fallback_total 2") == std::string::npos);
  } else {
    CHECK(pe0.find("bulk transport to de0: tcp fallback") != std::string::npos);
  }
}
