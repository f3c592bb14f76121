// ctest-label: distribution
// The cluster file: a complete file parses with relative paths resolved;
// every mistake is refused with a message naming the key (and the node); the
// settings digest that nodes compare covers what shapes the actors.
#include <doctest/doctest.h>

#include "actors/node/cluster_file.hpp"
#include "actors/node/node_system.hpp"
#include "config/errors.hpp"
#include "tests/support/settings.hpp"
#include "tests/support/support.hpp"

using namespace dualpath::actors::node;

namespace {

const char* base = R"(
[cluster]
scheduler = "sched"
storage = "store"
bulk_secret = "0123456789abcdef0123"

[tls]
mode = "plaintext"

[[node]]
name = "sched"
role = "scheduler"
host = "10.0.0.1"
port = 4300

[[node]]
name = "pe0"
role = "prefill"
host = "10.0.0.2"
bulk_port = 4301
gpus = [0, 1]
nics = ["mlx5_0", "mlx5_1"]
rdma_device = "mlx5_0"
gid_index = 3

[[node]]
name = "de0"
role = "decode"
host = "10.0.0.3"
storage = "/mnt/other"
)";

std::string message(const caf::error& err) {
  return dualpath::config::message_of(err);
}

// `base` with `from` replaced by `to`; the parse must fail mentioning
// `expect`.
void refused(const std::string& from, const std::string& to,
             const std::string& expect) {
  std::string text = base;
  auto pos = text.find(from);
  REQUIRE_MESSAGE(pos != std::string::npos, from);
  text.replace(pos, from.size(), to);
  auto res = parse_cluster(text, "/etc/dp/cluster.toml");
  REQUIRE_FALSE(res);
  CAPTURE(message(res.error()));
  CHECK(message(res.error()).find(expect) != std::string::npos);
  CHECK(res.error().category() == caf::atom("dp_config"));
}

} // namespace

TEST_CASE("a complete cluster file parses") {
  auto res = parse_cluster(base, "/etc/dp/cluster.toml");
  REQUIRE_MESSAGE(res, (res ? "" : message(res.error())));
  CHECK(res->scheduler == "sched");
  CHECK(res->storage == "/etc/dp/store");
  CHECK(res->tls.mode == link_security::plaintext);
  REQUIRE(res->nodes.size() == 3);
  CHECK(res->scheduler_node().port == 4300);
  auto pe = res->find("pe0");
  REQUIRE(pe != nullptr);
  CHECK(pe->role == node_role::prefill);
  CHECK(pe->bulk_port == 4301);
  CHECK(pe->gpus == std::vector<uint32_t>{0, 1});
  CHECK(pe->nics.size() == 2);
  CHECK(pe->rdma_device == "mlx5_0");
  CHECK(pe->gid_index == 3);
  CHECK(res->storage_of("de0") == "/mnt/other");
  CHECK(res->storage_of("pe0") == "/etc/dp/store");
  CHECK(res->names_of(node_role::decode) == std::vector<std::string>{"de0"});
}

TEST_CASE("mistakes are refused naming the key") {
  refused("scheduler = \"sched\"", "scheduler = \"nobody\"",
          "cluster.scheduler = 'nobody' names no [[node]]");
  refused("role = \"decode\"", "role = \"gpu\"", "node 'de0' role = 'gpu'");
  refused("port = 4300", "port = 70000", "node 'sched' port = 70000");
  refused("port = 4300", "", "node 'sched' port is required");
  refused("gid_index = 3", "gid_index = \"x\"", "node 'pe0' gid_index");
  refused("nics = [\"mlx5_0\", \"mlx5_1\"]", "nics = [\"mlx5_0\"]",
          "node 'pe0' nics has 1 entries but gpus has 2");
  refused("host = \"10.0.0.3\"", "host = \"10.0.0.3\"\ncolour = \"red\"",
          "unknown key node[2].colour");
  refused("name = \"de0\"", "name = \"pe0\"", "node 'pe0' appears twice");
  refused("bulk_secret = \"0123456789abcdef0123\"", "bulk_secret = \"short\"",
          "cluster.bulk_secret");
  refused("mode = \"plaintext\"", "mode = \"ssl\"", "tls.mode = 'ssl'");
  refused("mode = \"plaintext\"", "mode = \"tls\"", "missing key tls.ca");
  refused("[cluster]", "[cluster\n", "not valid TOML");
}

TEST_CASE("TLS files must exist; a missing file is named") {
  dualpath::test::temp_dir dir;
  std::string text = base;
  text.replace(text.find("mode = \"plaintext\""), 18,
               "ca = \"ca.pem\"\ncert = \"node.pem\"\nkey = \"node.key\"");
  auto path = dir.file("cluster.toml");
  dualpath::test::write_file(path, text);
  auto res = load_cluster(path);
  REQUIRE_FALSE(res);
  CHECK(message(res.error()).find("key tls.ca: no file " + dir.file("ca.pem"))
        != std::string::npos);
  for (auto f : {"ca.pem", "node.pem", "node.key"})
    dualpath::test::write_file(dir.file(f), "x");
  res = load_cluster(path);
  REQUIRE_MESSAGE(res, (res ? "" : message(res.error())));
  CHECK(res->tls.mode == link_security::tls);
  CHECK(res->tls.cert == dir.file("node.pem"));
  CHECK_FALSE(load_cluster(dir.file("absent.toml")));
}

TEST_CASE("the settings digest covers what shapes the actors, not the "
          "workload") {
  auto digest = [](std::vector<dualpath::config::override_entry> ovs) {
    return settings_digest(dualpath::test::settings_with(std::move(ovs)));
  };
  auto base_digest = digest({});
  CHECK(base_digest.size() == 16);
  CHECK(digest({"workload.agents=7", "run.turns=5"}) == base_digest);
  CHECK(digest({"run.time_scale=3"}) != base_digest);
  CHECK(digest({"hardware.gpus_per_node=2"}) != base_digest);
  CHECK(digest({"model.profile=ds-27b"}) != base_digest);
}

TEST_CASE("a settings mismatch names each differing key with both values") {
  auto text = [](std::vector<dualpath::config::override_entry> ovs) {
    return deployment_settings(dualpath::test::settings_with(std::move(ovs)));
  };
  auto base = text({});
  CHECK(settings_difference(base, text({"workload.agents=7"}), "here", "there")
            .empty());
  auto diff = settings_difference(
      text({"hardware.gpus_per_node=2", "run.time_scale=3"}), base,
      "on this node", "on the scheduler node");
  CHECK(diff
        == "hardware.gpus_per_node = 2 on this node but 8 on the scheduler "
           "node; run.time_scale = 3.0 on this node but 1.0 on the "
           "scheduler node");
  // A whole profile differs in many keys: eight are named, then a count.
  auto many = settings_difference(
      text({"model.profile=ds-27b", "hardware.gpus_per_node=2",
            "run.time_scale=3"}),
      base, "a", "b");
  CAPTURE(many);
  CHECK(many.find("model.profile = \"ds-27b\" a but \"ds-660b\" b")
        != std::string::npos);
  CHECK(many.find("run.time_scale") == std::string::npos);
  CHECK(many.find("; and 1 more") != std::string::npos);
}
