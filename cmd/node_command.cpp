// `dualpath node --cluster FILE --name NAME`: runs one node of a deployment
// (actors/node/node_runtime.hpp) until SIGINT or SIGTERM, or until the
// scheduler node is lost. With observe.metrics_port it serves its process's
// metrics; with observe.trace_file it writes its timeline (on a clean stop
// and after each job). Every node and `dualpath run --cluster` take the
// same cluster file and the same --config/--set settings.
#include <atomic>
#include <csignal>
#include <iostream>

#include "actors/node/cluster_file.hpp"
#include "actors/node/node_runtime.hpp"
#include "actors/protocol/register.hpp"
#include "cmd/command.hpp"

namespace dualpath::cmd {

namespace {

std::atomic<bool> stop_requested{false};

extern "C" void on_stop_signal(int) {
  stop_requested.store(true);
}

class node_command : public command {
public:
  node_command()
      : command(
          "node",
          "Run one node of a multi-process deployment (scheduler, prefill "
          "or decode node of a cluster file) until SIGINT/SIGTERM.") {
  }

  void add_options(CLI::App& app, key_flags&) override {
    app.add_option("--cluster", cluster_file_,
                   "The cluster file (docs/deployment.md): nodes, hosts, "
                   "ports, roles, GPUs, NICs, storage mount, TLS files, "
                   "bulk secret.")
        ->type_name("FILE")
        ->required();
    app.add_option("--name", name_, "This node's name in the cluster file.")
        ->type_name("NAME")
        ->required();
  }

  int run(const invocation& inv) override {
    auto cluster = actors::node::load_cluster(cluster_file_);
    if (!cluster)
      return inv.fail(name(), message(cluster.error()), exit_usage);
    // The node's timeline is written when it stops: a path it cannot write
    // is found now, not after the node ran.
    if (auto err = check_output_file("observe.trace_file",
                                     inv.cfg.string("observe.trace_file")))
      return inv.fail(name(), message(err), exit_usage);
    std::signal(SIGINT, on_stop_signal);
    std::signal(SIGTERM, on_stop_signal);
    auto err = actors::node::run_node(inv.cfg, *cluster, name_, stop_requested,
                                      inv.err);
    if (!err)
      return exit_ok;
    auto usage =
        err.category() == caf::atom("dp_config")
        || (err.category() == caf::atom("system")
            && err.code() == static_cast<uint8_t>(caf::sec::invalid_argument));
    return inv.fail(name(), message(err), usage ? exit_usage : exit_failure);
  }

private:
  static std::string message(const caf::error& err) {
    auto& ctx = err.context();
    if (!ctx.empty() && ctx.match_element<std::string>(0))
      return ctx.get_as<std::string>(0);
    return actors::render(err);
  }

  std::string cluster_file_;
  std::string name_;
};

} // namespace

std::unique_ptr<command> make_node_command() {
  return std::make_unique<node_command>();
}

} // namespace dualpath::cmd
