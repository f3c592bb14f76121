#include "config/settings.hpp"

#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <sstream>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <toml++/toml.h>

#include "config/capacity.hpp"
#include "config/profiles.hpp"

namespace dualpath::config {

namespace {

[[noreturn]] void programmer_error(const std::string& what) {
  std::fprintf(stderr, "dualpath: programmer error: %s\n", what.c_str());
  std::abort();
}

caf::error fail(config_errc code, std::string msg) {
  return caf::make_error(code, std::move(msg));
}

std::string quoted(std::string_view key) {
  return "'" + std::string{key} + "'";
}

std::string from_where(value_source from, const std::string& origin) {
  switch (from) {
    case value_source::schema_default:
      return "default";
    case value_source::command_default:
      return "default of " + origin;
    case value_source::profile:
      return "profile " + origin;
    case value_source::file:
      return "file " + origin;
    case value_source::override_value:
      return origin;
  }
  return origin;
}

caf::error unknown_key_error(std::string_view key, const std::string& where) {
  auto msg = "unknown configuration key " + quoted(key) + " (" + where + ")";
  auto guess = suggest_key(key);
  if (!guess.empty())
    msg += "; did you mean " + quoted(guess) + "?";
  else
    msg += "; `dualpath config --reference` lists every key";
  return fail(config_errc::unknown_key, std::move(msg));
}

// Word-wraps `text` into comment lines of at most 80 columns.
void comment(std::ostream& out, const std::string& text,
             const std::string& indent = "") {
  std::istringstream words{text};
  std::string word;
  std::string line = "#" + indent;
  bool empty = true;
  while (words >> word) {
    if (!empty && line.size() + 1 + word.size() > 80) {
      out << line << '\n';
      line = "#" + indent;
      empty = true;
    }
    line += ' ';
    line += word;
    empty = false;
  }
  if (!empty)
    out << line << '\n';
}

// A value of the TOML node `node`, or nullopt for arrays, tables, dates.
std::optional<value> from_toml(const toml::node& node) {
  if (auto x = node.as_boolean())
    return value{x->get()};
  if (auto x = node.as_integer())
    return value{static_cast<int64_t>(x->get())};
  if (auto x = node.as_floating_point())
    return value{x->get()};
  if (auto x = node.as_string())
    return value{x->get()};
  return std::nullopt;
}

std::string toml_type_name(const toml::node& node) {
  switch (node.type()) {
    case toml::node_type::table:
      return "table";
    case toml::node_type::array:
      return "array";
    case toml::node_type::date:
    case toml::node_type::time:
    case toml::node_type::date_time:
      return "date/time";
    default:
      return "value";
  }
}

struct file_entry {
  std::string key;
  value x;
  std::string where; // "file x.toml, line 3"
};

caf::expected<std::vector<file_entry>> read_file(const std::string& path) {
  auto text = read_config_text(path, "configuration file");
  if (!text)
    return std::move(text.error());
  toml::table root;
  try {
    root = toml::parse(*text, path);
  } catch (const toml::parse_error& err) {
    auto& pos = err.source().begin;
    return fail(config_errc::parse_error,
                "configuration file " + quoted(path)
                    + " is not valid TOML: " + std::string{err.description()}
                    + " (line " + std::to_string(pos.line) + ", column "
                    + std::to_string(pos.column) + ")");
  }
  std::vector<file_entry> out;
  caf::error err;
  auto where = [&](const toml::node& node) {
    return "file " + path + ", line "
           + std::to_string(node.source().begin.line);
  };
  auto add = [&](std::string key, const toml::node& node) -> caf::error {
    auto spec = find_key(key);
    if (spec == nullptr)
      return unknown_key_error(key, where(node));
    auto x = from_toml(node);
    if (!x)
      return fail(config_errc::wrong_type,
                  "configuration key " + quoted(key) + " has the wrong type ("
                      + where(node) + "): got a " + toml_type_name(node)
                      + ", allowed " + spec->allowed());
    out.push_back(file_entry{std::move(key), std::move(*x), where(node)});
    return {};
  };
  for (auto& [name, node] : root) {
    auto section = std::string{name.str()};
    if (auto tbl = node.as_table()) {
      for (auto& [sub, child] : *tbl) {
        auto key = section + "." + std::string{sub.str()};
        if (child.is_table() && find_key(key) == nullptr) {
          // A nested table: report its first key with the full path.
          auto& inner = *child.as_table();
          if (!inner.empty())
            key += "." + std::string{inner.begin()->first.str()};
        }
        if (auto e = add(key, child))
          return e;
      }
    } else if (auto e = add(section, node)) {
      return e;
    }
  }
  return out;
}

} // namespace

// A regular file or a pipe (such as `--config <(...)`); a directory, a
// socket or a device is refused before reading, and so is a file larger than
// any configuration could be.
caf::expected<std::string> read_config_text(const std::string& path,
                                            const std::string& what) {
  constexpr size_t max_bytes = size_t{16} << 20;
  auto cannot = [&](const std::string& why) {
    return fail(config_errc::missing_file,
                what + " " + quoted(path) + " " + why);
  };
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0)
    return cannot(errno == ENOENT ? std::string{"does not exist"}
                                  : "cannot be read: stat: "
                                        + std::string{std::strerror(errno)});
  if (S_ISDIR(st.st_mode))
    return cannot("is a directory, not a file");
  if (!S_ISREG(st.st_mode) && !S_ISFIFO(st.st_mode))
    return cannot("is not a regular file");
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return cannot("cannot be read: open: " + std::string{std::strerror(errno)});
  std::string text;
  char buf[65536];
  for (;;) {
    auto n = ::read(fd, buf, sizeof(buf));
    if (n < 0 && errno == EINTR)
      continue;
    if (n < 0) {
      auto e = errno;
      ::close(fd);
      return cannot("cannot be read: read: " + std::string{std::strerror(e)});
    }
    if (n == 0)
      break;
    text.append(buf, static_cast<size_t>(n));
    if (text.size() > max_bytes) {
      ::close(fd);
      return cannot("is larger than " + std::to_string(max_bytes >> 20)
                    + " MiB");
    }
  }
  ::close(fd);
  return text;
}

std::string to_string(value_source x) {
  switch (x) {
    case value_source::schema_default:
      return "default";
    case value_source::command_default:
      return "command default";
    case value_source::profile:
      return "profile";
    case value_source::file:
      return "file";
    case value_source::override_value:
      return "override";
  }
  return "value_source(" + std::to_string(static_cast<int>(x)) + ")";
}

settings::settings() {
  for (auto& spec : schema())
    entries_.push_back(
        entry{spec.default_value, value_source::schema_default, std::string{}});
}

size_t settings::index_of(std::string_view key) const {
  auto& table = schema();
  for (size_t i = 0; i < table.size(); ++i)
    if (table[i].name == key)
      return i;
  programmer_error("configuration key " + quoted(key)
                   + " is not in the schema (config/keys_*.cpp)");
}

const value& settings::typed(std::string_view key, value_type type) const {
  auto i = index_of(key);
  auto& spec = schema()[i];
  if (spec.type != type)
    programmer_error("configuration key " + quoted(key) + " is a "
                     + to_string(spec.type) + ", read as a " + to_string(type));
  return entries_[i].current;
}

bool settings::boolean(std::string_view key) const {
  return std::get<bool>(typed(key, value_type::boolean));
}

int64_t settings::integer(std::string_view key) const {
  return std::get<int64_t>(typed(key, value_type::integer));
}

double settings::real(std::string_view key) const {
  return std::get<double>(typed(key, value_type::real));
}

const std::string& settings::string(std::string_view key) const {
  return std::get<std::string>(typed(key, value_type::string));
}

const value& settings::get(std::string_view key) const {
  return entries_[index_of(key)].current;
}

value_source settings::source_of(std::string_view key) const {
  return entries_[index_of(key)].from;
}

const std::string& settings::origin_of(std::string_view key) const {
  return entries_[index_of(key)].origin;
}

std::string settings::describe_source(std::string_view key) const {
  auto& e = entries_[index_of(key)];
  return from_where(e.from, e.origin);
}

caf::error settings::set(std::string_view key, value x, value_source from,
                         std::string origin) {
  auto spec = find_key(key);
  auto where = from_where(from, origin);
  if (spec == nullptr)
    return unknown_key_error(key, where);
  if (spec->type == value_type::real && type_of(x) == value_type::integer)
    x = static_cast<double>(std::get<int64_t>(x));
  if (type_of(x) != spec->type)
    return fail(config_errc::wrong_type,
                "configuration key " + quoted(key) + " has the wrong type ("
                    + where + "): got " + to_string(type_of(x)) + " "
                    + to_string(x) + ", allowed " + spec->allowed());
  switch (spec->type) {
    case value_type::integer:
    case value_type::real: {
      auto num = spec->type == value_type::integer
                     ? static_cast<double>(std::get<int64_t>(x))
                     : std::get<double>(x);
      if (!std::isfinite(num) || !spec->limits.contains(num))
        return fail(config_errc::out_of_range,
                    "configuration key " + quoted(key) + " = " + to_string(x)
                        + " is out of range (" + where + "): allowed "
                        + spec->allowed());
      break;
    }
    case value_type::string: {
      auto& str = std::get<std::string>(x);
      if (spec->choices.empty())
        break;
      for (auto& choice : spec->choices)
        if (choice == str)
          return store(spec, std::move(x), from, std::move(origin));
      if (spec->selects_profile) {
        auto msg = "unknown " + spec->section() + " profile " + quoted(str)
                   + " (" + spec->name + ", " + where + "): allowed "
                   + spec->allowed();
        std::string best;
        size_t best_dist = 4;
        for (auto& choice : spec->choices) {
          auto dist = edit_distance(str, choice);
          if (dist < best_dist) {
            best = choice;
            best_dist = dist;
          }
        }
        if (!best.empty())
          msg += "; did you mean " + quoted(best) + "?";
        return fail(config_errc::unknown_profile, std::move(msg));
      }
      auto msg = "configuration key " + quoted(key) + " = " + to_string(x)
                 + " is not allowed (" + where + "): allowed "
                 + spec->allowed();
      if (auto guess = suggest(str, spec->choices); !guess.empty())
        msg += "; did you mean " + quoted(guess) + "?";
      return fail(config_errc::invalid_choice, std::move(msg));
    }
    case value_type::boolean:
      break;
  }
  return store(spec, std::move(x), from, std::move(origin));
}

caf::error settings::store(const key_spec* spec, value x, value_source from,
                           std::string origin) {
  auto& e = entries_[index_of(spec->name)];
  e.current = std::move(x);
  e.from = from;
  e.origin = std::move(origin);
  return {};
}

caf::error settings::set_text(std::string_view key, std::string_view text,
                              value_source from, std::string origin) {
  auto spec = find_key(key);
  if (spec == nullptr)
    return unknown_key_error(key, from_where(from, origin));
  auto wrong = [&] {
    return fail(config_errc::wrong_type,
                "configuration key " + quoted(key) + " has the wrong type ("
                    + from_where(from, origin) + "): got '" + std::string{text}
                    + "', allowed " + spec->allowed());
  };
  switch (spec->type) {
    case value_type::boolean:
      if (text == "true")
        return set(key, true, from, std::move(origin));
      if (text == "false")
        return set(key, false, from, std::move(origin));
      return wrong();
    case value_type::integer: {
      int64_t x = 0;
      auto first = text.data();
      auto last = first + text.size();
      if (!text.empty() && *first == '+')
        ++first;
      auto res = std::from_chars(first, last, x);
      if (res.ec == std::errc::result_out_of_range && res.ptr == last)
        return fail(config_errc::out_of_range,
                    "configuration key " + quoted(key) + " = "
                        + std::string{text} + " is out of range ("
                        + from_where(from, origin) + "): allowed "
                        + spec->allowed());
      if (res.ec != std::errc{} || res.ptr != last || first == last)
        return wrong();
      return set(key, x, from, std::move(origin));
    }
    case value_type::real: {
      std::string str{text};
      char* end = nullptr;
      errno = 0;
      double x = str.empty() ? 0.0 : std::strtod(str.c_str(), &end);
      if (str.empty() || end != str.c_str() + str.size())
        return wrong();
      if (!std::isfinite(x) || errno == ERANGE)
        return fail(config_errc::out_of_range,
                    "configuration key " + quoted(key) + " = " + str
                        + " is out of range (" + from_where(from, origin)
                        + "): allowed " + spec->allowed());
      return set(key, x, from, std::move(origin));
    }
    case value_type::string: {
      std::string str{text};
      if (str.size() >= 2 && str.front() == '"' && str.back() == '"')
        str = str.substr(1, str.size() - 2);
      return set(key, std::move(str), from, std::move(origin));
    }
  }
  return wrong();
}

std::string settings::to_toml() const {
  std::ostringstream out;
  out << "# dualpath effective configuration (--print-config). After each "
         "value: where it\n# came from (default, profile NAME, file PATH, "
         "or the command-line flag).\n";
  std::string section;
  auto& table = schema();
  for (size_t i = 0; i < table.size(); ++i) {
    auto& spec = table[i];
    if (spec.section() != section) {
      section = spec.section();
      out << "\n[" << section << "]\n";
    }
    out << spec.short_name() << " = " << config::to_toml(entries_[i].current)
        << "  # " << from_where(entries_[i].from, entries_[i].origin) << '\n';
  }
  return out.str();
}

caf::expected<settings> load(const load_request& req) {
  settings result;
  // 1. Read the file and parse the overrides (unknown keys fail here).
  std::vector<file_entry> file_values;
  if (req.file) {
    auto entries = read_file(*req.file);
    if (!entries)
      return std::move(entries.error());
    file_values = std::move(*entries);
  }
  struct parsed_override {
    std::string key;
    std::string text;
    std::string origin;
  };
  std::vector<parsed_override> defaults;
  std::vector<parsed_override> overrides;
  for (auto* list : {&req.defaults, &req.overrides})
    for (auto& ov : *list) {
      auto eq = ov.assignment.find('=');
      if (eq == std::string::npos || eq == 0)
        return fail(config_errc::malformed_override,
                    "override " + quoted(ov.assignment) + " (" + ov.origin
                        + ") is not of the form section.key=value");
      auto key = ov.assignment.substr(0, eq);
      while (!key.empty() && key.back() == ' ')
        key.pop_back();
      auto text = ov.assignment.substr(eq + 1);
      if (find_key(key) == nullptr)
        return unknown_key_error(key, ov.origin);
      auto& into = list == &req.defaults ? defaults : overrides;
      into.push_back(parsed_override{key, text, ov.origin});
    }
  // The command's defaults first: profiles, the file and the overrides
  // replace them.
  for (auto& dv : defaults)
    if (auto e = result.set_text(dv.key, dv.text, value_source::command_default,
                                 dv.origin))
      return e;
  // 2. Select and apply the profiles: the last override wins, then the file,
  //    then the schema default.
  for (auto& spec : schema()) {
    if (!spec.selects_profile)
      continue;
    settings probe; // validates the selection with the right source
    caf::error err;
    for (auto& dv : defaults)
      if (dv.key == spec.name)
        err = probe.set_text(spec.name, dv.text, value_source::command_default,
                             dv.origin);
    if (err)
      return err;
    for (auto& fv : file_values)
      if (fv.key == spec.name)
        err = probe.set(spec.name, fv.x, value_source::file, *req.file);
    if (err)
      return err;
    for (auto& ov : overrides)
      if (ov.key == spec.name)
        if (auto e = probe.set_text(spec.name, ov.text,
                                    value_source::override_value, ov.origin))
          return e;
    auto name = probe.string(spec.name);
    auto prof = find_profile(spec.section(), name);
    if (prof == nullptr) // unreachable: the choices are the profile names
      return fail(config_errc::unknown_profile,
                  "unknown " + spec.section() + " profile " + quoted(name));
    for (auto& [key, x] : prof->values)
      if (auto e = result.set(key, x, value_source::profile, prof->name))
        return e;
  }
  // 3. The file, then the overrides in order.
  for (auto& fv : file_values)
    if (auto e = result.set(fv.key, fv.x, value_source::file, *req.file))
      return e;
  for (auto& ov : overrides)
    if (auto e = result.set_text(ov.key, ov.text, value_source::override_value,
                                 ov.origin))
      return e;
  // 4. Sizes against what the process can hold, before anyone allocates.
  if (auto e = check_capacity(result, host_memory_bytes()))
    return e;
  // 5. CAF's own options.
  if (auto e = check(req.caf))
    return e;
  result.set_caf(req.caf);
  return result;
}

std::string reference_toml() {
  std::ostringstream out;
  out << "# dualpath reference configuration: every key with its default, "
         "unit, allowed\n"
         "# values and meaning.\n"
         "#\n"
         "# GENERATED by `dualpath config --reference > "
         "config/reference.toml`; do not edit\n"
         "# by hand (the test config.reference fails when this file differs "
         "from the\n"
         "# generated text). The key tables live in config/keys_*.cpp, the "
         "profiles in\n"
         "# config/profiles.cpp.\n"
         "#\n"
         "# Use: dualpath COMMAND --config FILE --set section.key=value ... "
         "Precedence,\n"
         "# lowest first: defaults < selected profiles < FILE < --set and "
         "command-line\n"
         "# flags. `--print-config` on any command prints the effective "
         "configuration.\n"
         "#\n"
         "# Profiles (select with <section>.profile; explicit keys override "
         "them):\n";
  for (auto& prof : profiles()) {
    out << "#\n";
    comment(out, prof.section + " " + prof.name + ": " + prof.description, "");
    std::string values;
    for (auto& [key, x] : prof.values) {
      if (!values.empty())
        values += ", ";
      values += key.substr(key.find('.') + 1) + " = " + config::to_toml(x);
    }
    comment(out, values, "  ");
  }
  std::string section;
  for (auto& spec : schema()) {
    if (spec.section() != section) {
      section = spec.section();
      out << "\n[" << section << "]\n";
    }
    out << '\n';
    comment(out, spec.meaning);
    std::string facts;
    if (!spec.unit.empty())
      facts = "Unit: " + spec.unit + ". ";
    facts += "Allowed: " + spec.allowed() + ".";
    comment(out, facts);
    out << spec.short_name() << " = " << config::to_toml(spec.default_value)
        << '\n';
  }
  out << "\n# CAF's own options (CAF 0.17.6), taken the way CAF applications "
         "take "
         "them\n"
         "# (config/caf_options.hpp): in a CAF config file, INI "
         "`[category]` sections of\n"
         "# `name=value` (caf-application.ini in the working directory, or "
         "--config-file=FILE),\n"
         "# or on the command line as --category.name=VALUE, e.g. "
         "--scheduler.max-threads=4.\n"
         "# They apply on top of the caf.* keys above (file < command "
         "line). Unknown options,\n"
         "# wrong types, a policy other than sharing or stealing and a "
         "thread count outside\n"
         "# 1 .. 4096 exit 2.\n"
      << caf_reference();
  return out.str();
}

} // namespace dualpath::config
