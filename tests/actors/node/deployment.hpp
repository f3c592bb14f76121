// Test helpers for multi-process deployments on 127.0.0.1 (background
// processes and free ports are in tests/support/support.hpp): a cluster file
// with a scheduler node, one prefill node and two decode nodes, and a
// throw-away CA made with the openssl command.
#pragma once

#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <doctest/doctest.h>

#include <nlohmann/json.hpp>

#include "tests/sanitizers.hpp"
#include "tests/support/support.hpp"

namespace dualpath::test {

/// `a` followed by `b` (argument lists).
inline std::vector<std::string> with(std::vector<std::string> a,
                                     const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

/// The report `dualpath run --json` printed (the test fails without one).
inline nlohmann::json parse_report(const std::string& text) {
  auto doc = nlohmann::json::parse(text, nullptr, false);
  REQUIRE_MESSAGE(!doc.is_discarded(), text);
  return doc;
}

/// Under ASan: CAF 0.17.6's middleman keeps reference cycles among its
/// brokers after a peer vanished (kill -9), which LeakSanitizer reports as
/// indirect leaks inside libcaf_io when a surviving process exits (seen in
/// the ASan CI stage for `dualpath run --cluster` after a node restart).
/// Leak detection is switched off for the processes these tests start;
/// ASan still catches every memory error in them.
inline void no_leak_check_in_children() {
#if defined(DUALPATH_TEST_ASAN)
  ::setenv("ASAN_OPTIONS", "detect_leaks=0", 1);
#endif
}

/// Runs a shell command; true on exit status 0.
inline bool shell(const std::string& cmd) {
  return std::system(cmd.c_str()) == 0;
}

/// Makes a throw-away CA and one node certificate signed by it in `dir`
/// (ca.pem, node.pem, node.key); false when openssl is missing or fails.
inline bool make_test_ca(const std::string& dir) {
  auto q = "'" + dir + "'";
  return shell("cd " + q
               + " && openssl req -x509 -newkey ec -pkeyopt "
                 "ec_paramgen_curve:prime256v1 -nodes -keyout ca.key -out "
                 "ca.pem -days 1 -subj /CN=dualpath-test-ca >/dev/null 2>&1"
                 " && openssl req -newkey ec -pkeyopt "
                 "ec_paramgen_curve:prime256v1 -nodes -keyout node.key -out "
                 "node.csr -subj /CN=dualpath-node >/dev/null 2>&1"
                 " && openssl x509 -req -in node.csr -CA ca.pem -CAkey ca.key "
                 "-CAcreateserial -out node.pem -days 1 >/dev/null 2>&1");
}

/// The ports of a four-node loopback deployment.
struct deployment_ports {
  uint16_t caf = free_port();
  uint16_t bulk_pe0 = free_port();
  uint16_t bulk_de0 = free_port();
  uint16_t bulk_de1 = free_port();
};

/// A cluster file: scheduler "sched", prefill "pe0", decode "de0" and "de1",
/// storage `store_dir`; `tls` selects [tls] with the files of make_test_ca;
/// `rdma_devices` (if given) names the RDMA device of pe0, de0 and de1 (an
/// empty name: none in the file).
inline std::string
cluster_toml(const deployment_ports& p, const std::string& store_dir, bool tls,
             const std::vector<std::string>& rdma_devices = {}) {
  auto device = [&](size_t i) {
    return i < rdma_devices.size() && !rdma_devices[i].empty()
               ? "rdma_device = \"" + rdma_devices[i] + "\"\n"
               : std::string{};
  };
  std::ostringstream out;
  out << "[cluster]\nscheduler = \"sched\"\nstorage = \"" << store_dir
      << "\"\nbulk_secret = \"test-secret-0123456789abcdef\"\n\n";
  if (tls)
    out << "[tls]\nmode = \"tls\"\nca = \"ca.pem\"\ncert = \"node.pem\"\n"
           "key = \"node.key\"\n\n";
  else
    out << "[tls]\nmode = \"plaintext\"\n\n";
  out << "[[node]]\nname = \"sched\"\nrole = \"scheduler\"\nhost = "
         "\"127.0.0.1\"\nport = "
      << p.caf << "\n\n";
  out << "[[node]]\nname = \"pe0\"\nrole = \"prefill\"\nhost = "
         "\"127.0.0.1\"\nbulk_port = "
      << p.bulk_pe0 << "\ngpus = [0, 1]\n"
      << device(0) << "\n";
  out << "[[node]]\nname = \"de0\"\nrole = \"decode\"\nhost = "
         "\"127.0.0.1\"\nbulk_port = "
      << p.bulk_de0 << "\ngpus = [0, 1]\n"
      << device(1) << "\n";
  out << "[[node]]\nname = \"de1\"\nrole = \"decode\"\nhost = "
         "\"127.0.0.1\"\nbulk_port = "
      << p.bulk_de1 << "\ngpus = [0, 1]\n"
      << device(2);
  return out.str();
}

/// A temporary directory with the cluster file of a four-node loopback
/// deployment on free ports, plaintext links, its store inside.
struct loopback_cluster {
  temp_dir dir;
  deployment_ports ports;
  std::string file = dir.file("cluster.toml");

  loopback_cluster() {
    write_file(file, cluster_toml(ports, dir.file("store"), false));
  }
};

/// Settings shared by every process of a test deployment and the embedded
/// run it is compared with (1 prefill node, 2 decode nodes, 2 GPUs each).
inline std::vector<std::string>
deployment_settings(uint32_t agents, uint32_t turns, double time_scale,
                    const std::string& backend = "tcp") {
  // The profiles named (not `dualpath run`'s main job), so that the
  // embedded run and the nodes run the same cluster. A two-GPU node holds a
  // 37e9-parameter model's weights, not DS-660B's.
  return {"--set", "hardware.profile=paper-hopper",
          "--set", "model.profile=ds-660b",
          "--set", "hardware.gpus_per_node=2",
          "--set", "model.total_params=37e9",
          "--set", "run.byte_scale=656",
          "--set", "run.time_scale=" + std::to_string(time_scale),
          "--set", "run.modes=dualpath",
          "--set", "run.prefill_nodes=1",
          "--set", "run.decode_nodes=2",
          "--set", "workload.agents=" + std::to_string(agents),
          "--set", "run.turns=" + std::to_string(turns),
          "--set", "transport.backend=" + backend};
}

/// The four node processes of a test deployment.
class deployment {
public:
  /// Per node name, arguments only that node gets (e.g. its own
  /// observe.metrics_port).
  using node_args = std::map<std::string, std::vector<std::string>>;

  deployment(const temp_dir& dir, const std::string& cluster_file,
             const std::vector<std::string>& settings, node_args own = {})
      : dir_(dir),
        cluster_file_(cluster_file),
        settings_(settings),
        own_(std::move(own)) {
    no_leak_check_in_children();
    for (size_t i = 0; i < 4; ++i) {
      nodes_.emplace_back(start(i, ""));
      if (i == 0)
        nodes_.back()->wait_err("listening on", std::chrono::seconds(20));
    }
  }

  /// Starts node `i` again (after it died); its output goes to new files.
  void restart(size_t i) {
    nodes_[i] = start(i, ".restarted");
  }

  ~deployment() {
    for (auto& n : nodes_)
      n->signal(SIGTERM);
    for (auto& n : nodes_)
      n->wait_for(std::chrono::seconds(10));
    // In the sanitizer builds a node's report (a race, a memory error)
    // reaches only its stderr: a test fails on it.
    for (auto& n : nodes_)
      CHECK_MESSAGE(n->err().find("Sanitizer") == std::string::npos, n->err());
  }

  background_process& node(size_t i) {
    return *nodes_[i];
  }

  /// Waits until every engine node printed that it joined.
  bool wait_joined(std::chrono::seconds limit) {
    for (size_t i = 1; i < nodes_.size(); ++i)
      if (!nodes_[i]->wait_err("joined", limit))
        return false;
    return true;
  }

  std::string logs() const {
    std::string out;
    const char* names[] = {"sched", "pe0", "de0", "de1"};
    for (size_t i = 0; i < nodes_.size(); ++i)
      out += std::string{"--- "} + names[i] + " ---\n" + nodes_[i]->err()
             + nodes_[i]->out();
    return out;
  }

private:
  std::unique_ptr<background_process> start(size_t i,
                                            const std::string& suffix) {
    const char* names[] = {"sched", "pe0", "de0", "de1"};
    std::string name = names[i];
    std::vector<std::string> argv{dualpath_binary(), "node",   "--cluster",
                                  cluster_file_,     "--name", name};
    argv.insert(argv.end(), settings_.begin(), settings_.end());
    if (auto o = own_.find(name); o != own_.end())
      argv.insert(argv.end(), o->second.begin(), o->second.end());
    return std::make_unique<background_process>(
        argv, dir_.file(name + suffix + ".out"),
        dir_.file(name + suffix + ".err"));
  }

  const temp_dir& dir_;
  std::string cluster_file_;
  std::vector<std::string> settings_;
  node_args own_;
  std::vector<std::unique_ptr<background_process>> nodes_;
};

} // namespace dualpath::test
