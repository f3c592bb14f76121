// The subcommand interface of the `dualpath` command. Each subcommand is one
// class in its own file (cmd/<name>_command.cpp) registered in
// cmd/registry.cpp; cmd/commands.cpp parses the command line, loads the
// configuration and runs the chosen subcommand.
//
// Every subcommand gets the common options: --config FILE, --set KEY=VALUE
// (repeatable), --print-config, --json [FILE], and the profile shortcuts
// --hardware/--model/--workload NAME. A subcommand adds its own flags; flags
// that stand for configuration keys go through key_flags so they take part in
// validation and --print-config like --set.
//
// Thread safety: used from the main thread only.
#pragma once

#include <iosfwd>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <caf/error.hpp>
#include <nlohmann/json.hpp>

#include "config/settings.hpp"

namespace dualpath::cmd {

/// Exit statuses of every subcommand.
enum exit_status : int {
  exit_ok = 0,
  /// The run itself failed.
  exit_failure = 1,
  /// Bad usage or bad configuration (one message on stderr).
  exit_usage = 2,
};

/// Flags that set configuration keys (`--cnic-gbps 100` is
/// `--set hardware.cnic_gbps=100`). Owns its bindings; outlives parsing.
class key_flags {
public:
  /// Adds `flag VALUE` to `app`, setting `key`. The help text is the key's
  /// meaning, unit and default from the schema.
  CLI::Option* add(CLI::App& app, const std::string& flag,
                   const std::string& key);

  /// The overrides given on the command line, in declaration order.
  std::vector<config::override_entry> given() const;

  /// The subcommand's own defaults: add() names them in the help text.
  void use_defaults(std::vector<config::override_entry> defaults) {
    defaults_ = std::move(defaults);
  }

private:
  struct binding {
    std::string flag;
    std::string key;
    std::string text;
    CLI::Option* option = nullptr;
  };
  std::vector<std::unique_ptr<binding>> bindings_; // stable addresses
  std::vector<config::override_entry> defaults_;
};

/// What a subcommand runs with.
struct invocation {
  const config::settings& cfg;
  /// Set when --json was given: "" means stdout, else a file path.
  std::optional<std::string> json_file;
  std::ostream& out;
  std::ostream& err;

  bool json() const {
    return json_file.has_value();
  }

  /// Whether the JSON goes to stdout (--json, --json -): then it is all
  /// that goes there.
  bool json_on_stdout() const {
    return json_file && (json_file->empty() || *json_file == "-");
  }

  /// Writes `doc` (pretty, with a trailing newline) to stdout or the --json
  /// file; exit_failure with a message when the file cannot be written.
  int emit_json(const nlohmann::json& doc) const;

  /// Prints "dualpath <command>: <message>" on stderr; returns `status`.
  int fail(const std::string& command, const std::string& message,
           int status) const;
};

/// Checks, before any work, that `path` can be written as the output file
/// `what` ("--json", "--trace") names: not a directory, in a directory that
/// exists, openable for writing (it is left as it was). Fails with
/// caf::sec::invalid_argument and a message naming the flag and the path.
caf::error check_output_file(const std::string& what, const std::string& path);

/// Checks, before any work, that files can be written into directory `dir`
/// (created when missing) for `what`; errors as check_output_file.
caf::error check_output_dir(const std::string& what, const std::string& dir);

/// One subcommand.
class command {
public:
  virtual ~command() = default;

  virtual std::string name() const = 0;

  /// One line for `dualpath --help`.
  virtual std::string description() const = 0;

  /// Adds the subcommand's own options to `app` (its CLI11 subcommand).
  virtual void add_options(CLI::App& app, key_flags& flags) = 0;

  /// The subcommand's own defaults ("section.key=value", origin "dualpath
  /// <name>"), over the schema's and under profiles, the file and the
  /// command line. Called before parsing (for the help text) and after it
  /// (to load the configuration): the answer may depend on parsed options.
  virtual std::vector<config::override_entry> defaults() const {
    return {};
  }

  /// Runs after the configuration loaded; returns an exit_status.
  virtual int run(const invocation& inv) = 0;
};

/// Every subcommand, in `--help` order (cmd/registry.cpp).
std::vector<std::unique_ptr<command>> make_commands();

// One factory per subcommand file.
std::unique_ptr<command> make_plan_command();
std::unique_ptr<command> make_config_command();
std::unique_ptr<command> make_run_command();
std::unique_ptr<command> make_node_command();
std::unique_ptr<command> make_sim_command();

} // namespace dualpath::cmd
