// The list of subcommands: adding one is a new cmd/<name>_command.cpp with a
// make_<name>_command() factory (declared in cmd/command.hpp) plus one line
// here.
#include "cmd/command.hpp"

namespace dualpath::cmd {

std::vector<std::unique_ptr<command>> make_commands() {
  std::vector<std::unique_ptr<command>> out;
  out.push_back(make_run_command());
  out.push_back(make_node_command());
  out.push_back(make_sim_command());
  out.push_back(make_plan_command());
  out.push_back(make_config_command());
  return out;
}

} // namespace dualpath::cmd
