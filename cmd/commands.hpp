// Entry point of the `dualpath` command, split out of main.cpp so tests can run
// subcommands in-process.
#pragma once

namespace dualpath::cmd {

/// Runs the `dualpath` command line; returns the process exit status
/// (0 success, 1 run failure, 2 bad usage or configuration).
int main(int argc, char** argv);

} // namespace dualpath::cmd
