#include "cmd/commands.hpp"

#include <fstream>
#include <iostream>

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
  help += " Sets " + key + " (default " + config::to_toml(spec->default_value)
          + ").";
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
  if (!json_file || json_file->empty() || *json_file == "-") {
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

} // namespace

int main(int argc, char** argv) {
  CLI::App app{"dualpath: KV-cache loading for agentic LLM inference over "
               "two paths (storage -> prefill node and storage -> decode "
               "node), as CAF actors.",
               "dualpath"};
  app.require_subcommand(1);
  app.footer("Configuration: every subcommand takes --config FILE, --set "
             "KEY=VALUE, --print-config and --json [FILE]. Precedence, lowest "
             "first: defaults < profiles (--hardware/--model/--workload) < "
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
  try {
    app.parse(static_cast<int>(rest.size()), rest.data());
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
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
    if (opts.json_opt->count() > 0)
      inv.json_file = opts.json_file;
    return commands[i]->run(inv);
  }
  std::cerr << "dualpath: no subcommand given (see dualpath --help)\n";
  return exit_usage;
}

} // namespace dualpath::cmd
