#include "cmd/commands.hpp"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>

#include <fcntl.h>
#include <unistd.h>

#include <caf/sec.hpp>

#include "cmd/command.hpp"
#include "config/errors.hpp"
#include "config/schema.hpp"

namespace dualpath::cmd {

// -- key_flags ----------------------------------------------------------------

CLI::Option* key_flags::add(CLI::App& app, const std::string& flag,
                            const std::string& key) {
  auto spec = config::find_key(key);
  if (spec == nullptr) {
    std::cerr << "dualpath: programmer error: flag " << flag
              << " names unknown configuration key '" << key << "'\n";
    std::abort();
  }
  auto help = spec->meaning;
  if (!spec->unit.empty())
    help += " Unit: " + spec->unit + ".";
  auto def = config::to_toml(spec->default_value);
  for (auto& d : defaults_)
    if (d.assignment.compare(0, key.size() + 1, key + "=") == 0)
      def = d.assignment.substr(key.size() + 1) + " in " + d.origin
            + "; the schema's " + def;
  help += " Sets " + key + " (default " + def + ").";
  auto b = std::make_unique<binding>();
  b->flag = flag;
  b->key = key;
  b->option = app.add_option(flag, b->text, help);
  switch (spec->type) {
    case config::value_type::integer:
      b->option->type_name("INT");
      break;
    case config::value_type::real:
      b->option->type_name("NUM");
      break;
    case config::value_type::boolean:
      b->option->type_name("BOOL");
      break;
    case config::value_type::string:
      b->option->type_name(spec->selects_profile ? "NAME" : "TEXT");
      break;
  }
  auto opt = b->option;
  bindings_.push_back(std::move(b));
  return opt;
}

std::vector<config::override_entry> key_flags::given() const {
  std::vector<config::override_entry> out;
  for (auto& b : bindings_)
    if (b->option->count() > 0)
      out.emplace_back(b->key + "=" + b->text, b->flag);
  return out;
}

// -- invocation ---------------------------------------------------------------

int invocation::emit_json(const nlohmann::json& doc) const {
  auto text = doc.dump(2) + "\n";
  if (!json_file || json_on_stdout()) {
    out << text;
    out.flush();
    return exit_ok;
  }
  std::ofstream file{*json_file, std::ios::binary | std::ios::trunc};
  file << text;
  file.close();
  if (!file) {
    err << "dualpath: cannot write JSON output to '" << *json_file << "'\n";
    return exit_failure;
  }
  return exit_ok;
}

int invocation::fail(const std::string& command, const std::string& message,
                     int status) const {
  err << "dualpath " << command << ": " << message << '\n';
  return status;
}

// -- output paths -------------------------------------------------------------

namespace {

caf::error bad_output(const std::string& what, const std::string& path,
                      const std::string& why) {
  return caf::make_error(caf::sec::invalid_argument,
                         what + ": cannot write '" + path + "': " + why);
}

} // namespace

caf::error check_output_file(const std::string& what, const std::string& path) {
  namespace fs = std::filesystem;
  if (path.empty() || path == "-")
    return {};
  std::error_code ec;
  auto st = fs::status(path, ec);
  if (st.type() == fs::file_type::directory)
    return bad_output(what, path, "it is a directory");
  auto existed = fs::exists(st);
  auto parent = fs::path{path}.parent_path();
  if (parent.empty())
    parent = ".";
  auto pst = fs::status(parent, ec);
  if (!fs::exists(pst))
    return bad_output(what, path,
                      "directory '" + parent.string() + "' does not exist");
  if (pst.type() != fs::file_type::directory)
    return bad_output(what, path,
                      "'" + parent.string() + "' is not a directory");
  // Opening without O_TRUNC leaves an existing file as it was; a file this
  // probe created goes again, so a failed run leaves nothing behind.
  auto fd =
      ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0)
    return bad_output(what, path, std::string{"open: "} + std::strerror(errno));
  ::close(fd);
  if (!existed)
    ::unlink(path.c_str());
  return {};
}

caf::error check_output_dir(const std::string& what, const std::string& dir) {
  namespace fs = std::filesystem;
  if (dir.empty())
    return {};
  std::error_code ec;
  auto st = fs::status(dir, ec);
  if (fs::exists(st) && st.type() != fs::file_type::directory)
    return bad_output(what, dir, "it exists and is not a directory");
  if (!fs::exists(st) && !fs::create_directories(dir, ec) && ec)
    return bad_output(what, dir, "cannot create it: " + ec.message());
  auto probe = dir + "/.dualpath-write-probe-XXXXXX";
  auto fd = ::mkstemp(probe.data());
  if (fd < 0)
    return bad_output(what, dir,
                      std::string{"cannot create a file in it: "}
                          + std::strerror(errno));
  ::close(fd);
  ::unlink(probe.c_str());
  return {};
}

// -- main ---------------------------------------------------------------------

namespace {

// Options every subcommand has.
struct common_options {
  std::string config_file;
  std::vector<std::string> sets;
  bool print_config = false;
  std::string json_file;
  CLI::Option* config_opt = nullptr;
  CLI::Option* json_opt = nullptr;
  key_flags flags;
};

void add_common_options(CLI::App& app, common_options& opts) {
  opts.config_opt = app.add_option("--config", opts.config_file,
                                   "TOML configuration file (keys as in "
                                   "config/reference.toml).")
                        ->type_name("FILE");
  app.add_option("--set", opts.sets,
                 "Set one configuration key, e.g. --set "
                 "storage.block_tokens=128 (repeatable; applied after the "
                 "file).")
      ->type_name("KEY=VALUE")
      ->allow_extra_args(false);
  app.add_flag("--print-config", opts.print_config,
               "Print the effective configuration as TOML and exit.");
  opts.json_opt = app.add_option("--json", opts.json_file,
                                 "Machine-readable output as JSON, to stdout "
                                 "or to FILE.")
                      ->type_name("[FILE]")
                      ->expected(0, 1);
  opts.flags.add(app, "--hardware", "hardware.profile");
  opts.flags.add(app, "--model", "model.profile");
  opts.flags.add(app, "--workload", "workload.profile");
}

// "unknown option '--agent'; did you mean '--agents'?" for the first
// unexpected argument that looks like an option ("" when none does).
std::string unknown_option_hint(const CLI::App& sub,
                                const std::vector<std::string>& extras) {
  std::vector<std::string> names;
  for (auto* opt : sub.get_options())
    for (auto& n : opt->get_lnames())
      names.push_back("--" + n);
  for (auto& arg : extras) {
    if (arg.size() < 2 || arg[0] != '-')
      continue;
    auto flag = arg.substr(0, arg.find('='));
    auto msg = "unknown option '" + flag + "'";
    if (auto guess = config::suggest(flag, names); !guess.empty())
      return msg + "; did you mean '" + guess + "'?";
    return msg + " (see dualpath " + sub.get_name() + " --help)";
  }
  if (!extras.empty())
    return "unexpected argument '" + extras.front() + "' (see dualpath "
           + sub.get_name() + " --help)";
  return {};
}

} // namespace

int main(int argc, char** argv) {
  CLI::App app{"dualpath: KV-cache loading for agentic LLM inference over "
               "two paths (storage -> prefill node and storage -> decode "
               "node), as CAF actors.",
               "dualpath"};
  app.require_subcommand(1);
  app.footer("Configuration: every subcommand takes --config FILE, --set "
             "KEY=VALUE, --print-config and --json [FILE]. Precedence, lowest "
             "first: defaults (the schema's, then the subcommand's own: `dualpath "
             "run` defaults to its main job) < profiles "
             "(--hardware/--model/--workload) < "
             "FILE < --set < subcommand flags. Every key: `dualpath config "
             "--reference`.\nCAF's own options are taken as CAF takes them: "
             "--scheduler.max-threads=4 and the like on the command line, a "
             "CAF config file (caf-application.ini, or --config-file=FILE); "
             "`dualpath config --reference` lists them.\nExit status: 0 "
             "success, 1 run failure, 2 bad "
             "usage or configuration.");
  auto commands = make_commands();
  std::vector<std::unique_ptr<common_options>> options;
  std::vector<CLI::App*> subs;
  for (auto& cmd : commands) {
    auto sub = app.add_subcommand(cmd->name(), cmd->description());
    options.push_back(std::make_unique<common_options>());
    options.back()->flags.use_defaults(cmd->defaults());
    add_common_options(*sub, *options.back());
    cmd->add_options(*sub, options.back()->flags);
    subs.push_back(sub);
  }
  // CAF's own options (--scheduler.max-threads=4, --config-file=FILE, ...)
  // are CAF's to parse (config/caf_options.hpp), not CLI11's.
  std::vector<std::string> args(argv + 1, argv + argc);
  auto caf_opts = config::take_caf_arguments(args);
  std::vector<char*> rest{argv[0]};
  for (auto& a : args)
    rest.push_back(a.data());
  // The first word names the subcommand; a typo gets a suggestion rather
  // than CLI11's "A subcommand is required".
  if (!args.empty() && !args.front().empty() && args.front()[0] != '-') {
    std::vector<std::string> names;
    for (auto& cmd : commands)
      names.push_back(cmd->name());
    if (std::find(names.begin(), names.end(), args.front()) == names.end()) {
      std::cerr << "dualpath: unknown subcommand '" << args.front() << "'";
      if (auto guess = config::suggest(args.front(), names); !guess.empty())
        std::cerr << "; did you mean '" << guess << "'?";
      else
        std::cerr << " (see dualpath --help)";
      std::cerr << '\n';
      return exit_usage;
    }
  }
  try {
    app.parse(static_cast<int>(rest.size()), rest.data());
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::ExtrasError& e) {
    for (size_t i = 0; i < commands.size(); ++i)
      if (subs[i]->parsed()) {
        if (auto hint = unknown_option_hint(*subs[i], subs[i]->remaining());
            !hint.empty()) {
          std::cerr << "dualpath " << commands[i]->name() << ": " << hint
                    << '\n';
          return exit_usage;
        }
      }
    app.exit(e);
    return exit_usage;
  } catch (const CLI::ParseError& e) {
    app.exit(e);
    return exit_usage;
  }
  for (size_t i = 0; i < commands.size(); ++i) {
    if (!subs[i]->parsed())
      continue;
    auto& opts = *options[i];
    // The subcommand's own key flags come after the shortcuts in `flags`, so
    // given() lists the profile shortcuts first.
    config::load_request req;
    req.defaults = commands[i]->defaults();
    req.caf = caf_opts;
    if (opts.config_opt->count() > 0)
      req.file = opts.config_file;
    auto flag_overrides = opts.flags.given();
    for (auto& ov : flag_overrides)
      if (ov.origin == "--hardware" || ov.origin == "--model"
          || ov.origin == "--workload")
        req.overrides.push_back(ov);
    for (auto& text : opts.sets)
      req.overrides.emplace_back(text, "--set");
    for (auto& ov : flag_overrides)
      if (ov.origin != "--hardware" && ov.origin != "--model"
          && ov.origin != "--workload")
        req.overrides.push_back(ov);
    auto cfg = config::load(req);
    if (!cfg) {
      std::cerr << "dualpath " << commands[i]->name() << ": "
                << config::message_of(cfg.error()) << '\n';
      return exit_usage;
    }
    if (opts.print_config) {
      std::cout << cfg->to_toml();
      return exit_ok;
    }
    invocation inv{*cfg, std::nullopt, std::cout, std::cerr};
    if (opts.json_opt->count() > 0) {
      inv.json_file = opts.json_file;
      if (auto err = check_output_file("--json", opts.json_file)) {
        std::cerr << "dualpath " << commands[i]->name() << ": "
                  << err.context().get_as<std::string>(0) << '\n';
        return exit_usage;
      }
    }
    return commands[i]->run(inv);
  }
  std::cerr << "dualpath: no subcommand given (see dualpath --help)\n";
  return exit_usage;
}

} // namespace dualpath::cmd
