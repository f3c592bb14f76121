// The effective configuration of one command: the value of every schema key
// and where it came from, loaded from (lowest precedence first) schema
// defaults < the selected named profiles < a TOML file < command-line
// overrides ("key=value", applied in order, the last one wins).
//
// Profiles: `hardware.profile`, `model.profile` and `workload.profile` each
// select a named set of values for their section (config/profiles.hpp). They
// can be chosen in the file or by override; a profile's values sit below the
// file and the overrides, so any key set explicitly overrides it key by key.
//
// Thread safety: a loaded settings object is immutable and may be read from
// any number of threads; set() is not synchronised.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <caf/error.hpp>
#include <caf/expected.hpp>

#include "config/caf_options.hpp"
#include "config/errors.hpp"
#include "config/schema.hpp"
#include "config/value.hpp"

namespace dualpath::config {

/// Where a key's effective value came from.
enum class value_source : uint8_t {
  /// The schema default.
  schema_default,
  /// The subcommand's own default (origin: "dualpath <command>"), e.g. the
  /// main job of `dualpath run`.
  command_default,
  /// A named profile (origin: its name).
  profile,
  /// The configuration file (origin: its path).
  file,
  /// A command-line override (origin: "--set" or the flag's name).
  override_value,
};

std::string to_string(value_source x);

/// Values of every schema key.
class settings {
public:
  /// Every key at its schema default.
  settings();

  // Typed getters. A key missing from the schema, or read as the wrong type,
  // is a programmer error: the process aborts naming the key.
  bool boolean(std::string_view key) const;
  int64_t integer(std::string_view key) const;
  double real(std::string_view key) const;
  const std::string& string(std::string_view key) const;
  const value& get(std::string_view key) const;

  value_source source_of(std::string_view key) const;
  /// The profile name, file path or flag that set the key ("" for defaults).
  const std::string& origin_of(std::string_view key) const;
  /// "default", "profile ds-27b", "file x.toml", "--set".
  std::string describe_source(std::string_view key) const;

  /// Validates `x` against the key (type, range, choices) and stores it;
  /// integers are accepted for real keys. Errors name the key, the value, what
  /// is allowed and `origin`.
  caf::error set(std::string_view key, value x, value_source from,
                 std::string origin);

  /// Like set(), parsing `text` as the key's type (overrides from the command
  /// line: true/false, integers, reals, strings with optional quotes).
  caf::error set_text(std::string_view key, std::string_view text,
                      value_source from, std::string origin);

  /// The effective configuration as TOML, one `# source` comment per value;
  /// loading it back as a file gives the same values.
  std::string to_toml() const;

  /// CAF's own options of this command line (config/caf_options.hpp),
  /// validated by load(); actor system configs apply them.
  const caf_options& caf() const {
    return caf_;
  }

  void set_caf(caf_options x) {
    caf_ = std::move(x);
  }

private:
  struct entry {
    value current;
    value_source from = value_source::schema_default;
    std::string origin;
  };

  size_t index_of(std::string_view key) const; // aborts on unknown keys
  caf::error store(const key_spec* spec, value x, value_source from,
                   std::string origin);
  const value& typed(std::string_view key, value_type type) const;

  std::vector<entry> entries_; // parallel to schema()
  caf_options caf_;
};

/// One command-line override: "section.key=value" and what gave it
/// ("--set", or a shortcut flag such as "--cnic-gbps"), for messages and
/// --print-config.
struct override_entry {
  std::string assignment;
  std::string origin = "--set";

  override_entry(std::string assignment_text, std::string origin_name = "--set")
      : assignment(std::move(assignment_text)), origin(std::move(origin_name)) {
  }
  override_entry(const char* assignment_text)
      : override_entry(std::string{assignment_text}) {
  }
};

/// What to load.
struct load_request {
  /// The subcommand's own defaults ("section.key=value", origin
  /// "dualpath <command>"): over the schema defaults, under everything
  /// else (profiles, the file, the overrides).
  std::vector<override_entry> defaults;
  /// A TOML file with [section] tables of keys; absent: no file.
  std::optional<std::string> file;
  /// Overrides, applied in order after the file (the last one wins).
  std::vector<override_entry> overrides;
  /// CAF's own options (its config file and command-line options).
  caf_options caf;
};

/// Loads defaults, profiles, the file and the overrides, then checks the
/// sizes they ask for against what the process can hold
/// (config/capacity.hpp). Errors are config_errc values with one message
/// naming the key, value and what is allowed. The file must be a regular
/// file or a pipe: a directory, socket or device, or a file that cannot be
/// read to its end, is config_errc::missing_file.
caf::expected<settings> load(const load_request& req);

/// The whole text of the configuration file `path` (`what` names it in
/// messages: "configuration file"); config_errc::missing_file when it is
/// missing, a directory, socket or device, larger than 16 MiB or unreadable.
caf::expected<std::string> read_config_text(const std::string& path,
                                            const std::string& what);

/// The reference configuration: every key with its default, unit, allowed
/// values and meaning as TOML comments, plus the profiles. This is the text
/// of config/reference.toml (`dualpath config --reference`).
std::string reference_toml();

} // namespace dualpath::config
