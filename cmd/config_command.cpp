// `dualpath config`: prints the effective configuration (TOML, or JSON with
// --json), or with --reference the reference file config/reference.toml is
// generated from.
#include <iostream>

#include "cmd/command.hpp"
#include "config/schema.hpp"

namespace dualpath::cmd {

namespace {

nlohmann::json to_json(const config::value& x) {
  return std::visit([](const auto& v) { return nlohmann::json(v); }, x);
}

class config_command : public command {
public:
  config_command()
      : command("config",
                "Print the effective configuration, or every key with "
                "--reference.") {
  }

  void add_options(CLI::App& app, key_flags&) override {
    app.add_flag("--reference", reference_,
                 "Print the reference configuration (every key with its "
                 "default, unit and meaning): the text of "
                 "config/reference.toml.");
  }

  int run(const invocation& inv) override {
    if (reference_) {
      inv.out << config::reference_toml();
      return exit_ok;
    }
    if (!inv.json()) {
      inv.out << inv.cfg.to_toml();
      return exit_ok;
    }
    nlohmann::json doc = nlohmann::json::object();
    for (auto& spec : config::schema())
      doc[spec.name] = {{"value", to_json(inv.cfg.get(spec.name))},
                        {"source", inv.cfg.describe_source(spec.name)},
                        {"type", config::to_string(spec.type)},
                        {"unit", spec.unit}};
    return inv.emit_json(doc);
  }

private:
  bool reference_ = false;
};

} // namespace

std::unique_ptr<command> make_config_command() {
  return std::make_unique<config_command>();
}

} // namespace dualpath::cmd
