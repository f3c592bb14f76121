// The `dualpath` command: dispatches to one subcommand per file in cmd/.
#include "cmd/commands.hpp"

int main(int argc, char** argv) {
  return dualpath::cmd::main(argc, argv);
}
