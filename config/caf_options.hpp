// CAF's own configuration, taken the way CAF 0.17 applications take it: a
// CAF config file (INI: `caf-application.ini` in the working directory when
// it exists, or the one named by `--config-file=FILE`) with `[category]`
// sections of `name=value`, and CAF's command-line options
// `--<category>.<name>=VALUE` (e.g. `--scheduler.max-threads=4`,
// `--scheduler.policy=stealing`, `--middleman.heartbeat-interval=5s`), both
// parsed by `caf::actor_system_config::parse`. They apply on top of what
// dualpath sets from its own `caf.*` keys (the application's defaults, as a
// CAF application sets them in its config's constructor): file < command
// line, both above the caf.* keys.
//
// The categories taken are scheduler, work-stealing, middleman, stream and
// logger; openssl comes from the cluster file only (actors/node/), never from
// here. CAF itself ignores unknown keys and badly typed values in its file
// and accepts any scheduler policy (falling back to another one at run
// time): check() is strict where CAF is lenient, so a wrong CAF option
// exits 2 naming it like every dualpath key.
//
// Thread safety: pure functions of their arguments.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <caf/actor_system_config.hpp>
#include <caf/error.hpp>

namespace dualpath::config {

/// CAF options of one command line.
struct caf_options {
  /// `--<category>.<name>[=VALUE]` arguments, in order.
  std::vector<std::string> args;
  /// The CAF config file: from `--config-file=FILE`, else
  /// `caf-application.ini` when it exists in the working directory.
  std::optional<std::string> file;
};

/// Whether `arg` is a CAF command-line option (`--scheduler.*`,
/// `--work-stealing.*`, `--middleman.*`, `--stream.*`, `--logger.*` or
/// `--config-file=FILE`).
bool is_caf_argument(std::string_view arg);

/// Splits the CAF arguments out of `args` (removing them) into options; the
/// default config file is looked up here.
caf_options take_caf_arguments(std::vector<std::string>& args);

/// Validates `opts`: the file exists and parses, every key and argument
/// names a CAF option of an allowed category with a value of its type, and
/// the values CAF does not check (scheduler policy and thread count,
/// network backend) are allowed. Errors are config_errc values with one
/// message naming the option.
caf::error check(const caf_options& opts);

/// Parses `opts` into `cfg` with actor_system_config::parse (after check()).
caf::error apply(caf::actor_system_config& cfg, const caf_options& opts);

/// The CAF options, with their types and meanings, as comment lines for
/// config/reference.toml.
std::string caf_reference();

} // namespace dualpath::config
