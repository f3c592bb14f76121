#include "config/caf_options.hpp"

#include <algorithm>
#include <sstream>

#include <sys/stat.h>

#include <caf/config_option.hpp>
#include <caf/config_option_set.hpp>
#include <caf/config_value.hpp>
#include <caf/settings.hpp>

#include "config/errors.hpp"
#include "config/schema.hpp"
#include "config/settings.hpp"

namespace dualpath::config {

namespace {

constexpr std::string_view categories[] = {"scheduler", "work-stealing",
                                           "middleman", "stream", "logger"};

constexpr std::string_view file_flag = "--config-file=";

// CAF's option set is a protected member of every config.
struct option_view : caf::actor_system_config {
  const caf::config_option_set& options() const {
    return custom_options_;
  }
};

bool allowed_category(std::string_view cat) {
  return std::find(std::begin(categories), std::end(categories), cat)
         != std::end(categories);
}

caf::error fail(config_errc code, std::string msg) {
  return caf::make_error(code, std::move(msg));
}

// The CAF option closest to `name` ("category.name"), or "".
std::string closest(const caf::config_option_set& opts, std::string_view name) {
  std::string best;
  size_t best_d = 4; // farther: not a plausible typo
  for (auto& opt : opts) {
    if (!allowed_category(
            std::string_view{opt.category().data(), opt.category().size()}))
      continue;
    std::string full{opt.full_name().data(), opt.full_name().size()};
    auto d = edit_distance(full, name);
    if (d < best_d) {
      best_d = d;
      best = full;
    }
  }
  return best;
}

caf::error unknown(const caf::config_option_set& opts, const std::string& name,
                   const std::string& where) {
  auto msg = "unknown CAF option '" + name + "' (" + where + ")";
  if (auto hint = closest(opts, name); !hint.empty())
    msg += "; did you mean '" + hint + "'?";
  else
    msg += "; CAF options are taken from the categories scheduler, "
           "work-stealing, middleman, stream and logger (dualpath config "
           "--reference lists them)";
  return fail(config_errc::unknown_key, msg);
}

std::string type_of(const caf::config_option& opt) {
  return {opt.type_name().data(), opt.type_name().size()};
}

// The values CAF takes as any atom or number although only some work.
caf::error check_values(const caf::actor_system_config& cfg,
                        const std::string& where) {
  auto policy = caf::to_string(
      caf::get_or(cfg, "scheduler.policy", caf::atom("stealing")));
  if (policy != "stealing" && policy != "sharing" && policy != "testing")
    return fail(config_errc::invalid_choice,
                "CAF option 'scheduler.policy' = " + policy + " (" + where
                    + ") is not allowed: allowed one of sharing, stealing");
  auto threads = caf::get_or(cfg, "scheduler.max-threads", size_t{1});
  if (threads < 1 || threads > 4096)
    return fail(config_errc::out_of_range,
                "CAF option 'scheduler.max-threads' = "
                    + std::to_string(threads) + " (" + where
                    + ") is out of range: allowed an integer in 1 .. 4096");
  auto backend = caf::to_string(
      caf::get_or(cfg, "middleman.network-backend", caf::atom("default")));
  if (backend != "default")
    return fail(config_errc::invalid_choice,
                "CAF option 'middleman.network-backend' = " + backend + " ("
                    + where + ") is not allowed: allowed default");
  return caf::none;
}

caf::expected<std::string> file_text(const caf_options& opts) {
  if (!opts.file)
    return std::string{};
  return read_config_text(*opts.file, "CAF config file");
}

} // namespace

bool is_caf_argument(std::string_view arg) {
  if (arg.substr(0, file_flag.size()) == file_flag)
    return true;
  if (arg.substr(0, 2) != "--")
    return false;
  auto name = arg.substr(2);
  auto dot = name.find('.');
  return dot != std::string_view::npos && allowed_category(name.substr(0, dot));
}

caf_options take_caf_arguments(std::vector<std::string>& args) {
  caf_options out;
  std::vector<std::string> rest;
  for (auto& a : args) {
    if (!is_caf_argument(a)) {
      rest.push_back(a);
    } else if (a.compare(0, file_flag.size(), file_flag) == 0) {
      out.file = a.substr(file_flag.size());
    } else {
      out.args.push_back(a);
    }
  }
  args = std::move(rest);
  // CAF's default file, as actor_system_config::parse() looks for it.
  struct stat st {};
  if (!out.file && ::stat("caf-application.ini", &st) == 0)
    out.file = "caf-application.ini";
  return out;
}

caf::error check(const caf_options& opts) {
  option_view probe;
  auto& set = probe.options();
  // The file: CAF's parser, then every key against the option set (CAF
  // itself drops unknown keys and badly typed values silently).
  auto text = file_text(opts);
  if (!text)
    return std::move(text.error());
  if (opts.file) {
    auto where = "CAF config file " + *opts.file;
    std::istringstream in{*text};
    // Without the option set: every key with its value as written.
    auto parsed = caf::actor_system_config::parse_config(in);
    if (!parsed)
      return fail(
          config_errc::parse_error,
          where + " is not valid CAF INI: " + caf::to_string(parsed.error()));
    for (auto& [cat, section] : *parsed) {
      if (!caf::holds_alternative<caf::config_value::dictionary>(section))
        return unknown(set, cat, where);
      for (auto& [name, x] : caf::get<caf::config_value::dictionary>(section)) {
        auto full = cat + "." + name;
        auto opt = set.qualified_name_lookup(cat, name);
        if (opt == nullptr || !allowed_category(cat))
          return unknown(set, full, where);
        if (opt->check(x))
          return fail(config_errc::wrong_type,
                      "CAF option '" + full + "' has the wrong type (" + where
                          + "): got " + caf::to_string(x) + ", allowed a "
                          + type_of(*opt));
      }
    }
  }
  // The command line: each argument names an option and parses as its type.
  for (auto& a : opts.args) {
    auto body = a.substr(2);
    auto eq = body.find('=');
    auto name = body.substr(0, eq);
    auto opt = set.qualified_name_lookup(name);
    if (opt == nullptr)
      return unknown(set, name, "command line " + a);
    if (eq == std::string::npos) {
      if (!opt->is_flag())
        return fail(config_errc::wrong_type, "CAF option '" + name
                                                 + "' (command line " + a
                                                 + ") needs a value: --" + name
                                                 + "=<" + type_of(*opt) + ">");
      continue;
    }
    if (!opt->parse(body.substr(eq + 1)))
      return fail(config_errc::wrong_type,
                  "CAF option '" + name + "' has the wrong type (command line "
                      + a + "): allowed a " + type_of(*opt));
  }
  // Then CAF's own parse, and the values it does not check.
  option_view cfg;
  if (auto err = apply(cfg, opts))
    return err;
  return check_values(cfg, opts.args.empty() && opts.file
                               ? "CAF config file " + *opts.file
                               : std::string{"CAF options"});
}

caf::error apply(caf::actor_system_config& cfg, const caf_options& opts) {
  auto text = file_text(opts);
  if (!text)
    return std::move(text.error());
  std::istringstream in{*text};
  if (auto err = cfg.parse(opts.args, in))
    return fail(config_errc::parse_error,
                "CAF options: " + caf::to_string(err));
  return caf::none;
}

std::string caf_reference() {
  option_view probe;
  std::vector<const caf::config_option*> opts;
  for (auto& opt : probe.options())
    if (allowed_category(
            std::string_view{opt.category().data(), opt.category().size()}))
      opts.push_back(&opt);
  std::sort(opts.begin(), opts.end(),
            [](auto x, auto y) { return x->full_name() < y->full_name(); });
  std::ostringstream out;
  for (auto opt : opts) {
    std::string line =
        "#   " + std::string{opt->full_name().data(), opt->full_name().size()}
        + " (" + type_of(*opt) + "): "
        + std::string{opt->description().data(), opt->description().size()};
    out << line << '\n';
  }
  return out.str();
}

} // namespace dualpath::config
