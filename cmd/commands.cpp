#include "cmd/commands.hpp"

#include <iostream>

namespace dualpath::cmd {

int main(int, char**) {
  std::cout << "dualpath: no subcommands yet\n";
  return 0;
}

} // namespace dualpath::cmd
