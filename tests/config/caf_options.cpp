// ctest-label: foundation
// CAF's own configuration: its command-line options and its config file are
// split from dualpath's, parsed by actor_system_config, strictly checked
// (unknown options, wrong types, values CAF accepts but cannot run), and
// reach a real actor system's scheduler.
#include "config/caf_options.hpp"

#include <doctest/doctest.h>

#include <caf/actor_system.hpp>
#include <caf/scheduler/abstract_coordinator.hpp>

#include "config/errors.hpp"
#include "config/settings.hpp"
#include "tests/support/support.hpp"

using namespace dualpath::config;
using dualpath::test::temp_dir;
using dualpath::test::write_file;

namespace {

std::string refusal(const caf_options& opts, config_errc code) {
  CAPTURE(opts.args.empty() ? std::string{} : opts.args.front());
  CAPTURE(opts.file.value_or(""));
  auto err = check(opts);
  REQUIRE(err);
  CHECK(err.code() == static_cast<uint8_t>(code));
  return message_of(err);
}

bool has(const std::string& str, const std::string& part) {
  return str.find(part) != std::string::npos;
}

} // namespace

TEST_CASE("CAF arguments are split from dualpath's") {
  std::vector<std::string> args{"run",
                                "--scheduler.max-threads=3",
                                "--set",
                                "storage.block_tokens=32",
                                "--middleman.heartbeat-interval=2s",
                                "--config-file=x.ini",
                                "--config",
                                "y.toml",
                                "--openssl.certificate=evil.pem"};
  auto opts = take_caf_arguments(args);
  CHECK(opts.args
        == std::vector<std::string>{"--scheduler.max-threads=3",
                                    "--middleman.heartbeat-interval=2s"});
  CHECK(opts.file == std::optional<std::string>{"x.ini"});
  // openssl is not CAF's to take from here: CLI11 refuses it as unknown.
  CHECK(args
        == std::vector<std::string>{"run", "--set", "storage.block_tokens=32",
                                    "--config", "y.toml",
                                    "--openssl.certificate=evil.pem"});
}

TEST_CASE("bad CAF options are refused naming the option") {
  auto m =
      refusal({{"--scheduler.max-thread=3"}, {}}, config_errc::unknown_key);
  CHECK(has(m, "unknown CAF option 'scheduler.max-thread'"));
  CHECK(has(m, "did you mean 'scheduler.max-threads'?"));
  m = refusal({{"--scheduler.max-threads=x"}, {}}, config_errc::wrong_type);
  CHECK(has(m, "'scheduler.max-threads' has the wrong type"));
  m = refusal({{"--scheduler.max-threads=0"}, {}}, config_errc::out_of_range);
  CHECK(has(m, "'scheduler.max-threads' = 0"));
  m = refusal({{"--scheduler.policy=bogus"}, {}}, config_errc::invalid_choice);
  CHECK(has(m, "'scheduler.policy' = bogus"));
  m = refusal({{"--middleman.heartbeat-interval=zz"}, {}},
              config_errc::wrong_type);
  CHECK(has(m, "middleman.heartbeat-interval"));
  m = refusal({{"--middleman.network-backend=asio"}, {}},
              config_errc::invalid_choice);
  CHECK(has(m, "middleman.network-backend"));
  m = refusal({{"--scheduler.max-threads"}, {}}, config_errc::wrong_type);
  CHECK(has(m, "needs a value"));
  CHECK_FALSE(
      check({{"--scheduler.max-threads=2", "--scheduler.policy=stealing",
              "--middleman.heartbeat-interval=5s"},
             {}}));
}

TEST_CASE("the CAF config file is checked strictly") {
  temp_dir dir;
  auto file = [&](const std::string& name, const std::string& text) {
    auto path = dir.file(name);
    write_file(path, text);
    return caf_options{{}, path};
  };
  CHECK_FALSE(check(file("ok.ini", "[scheduler]\nmax-threads=2\n")));
  // CAF alone would ignore these three.
  auto m = refusal(file("typo.ini", "[scheduler]\nmax-threadz=2\n"),
                   config_errc::unknown_key);
  CHECK(has(m, "unknown CAF option 'scheduler.max-threadz'"));
  CHECK(has(m, "typo.ini"));
  m = refusal(file("type.ini", "[scheduler]\nmax-threads=\"x\"\n"),
              config_errc::wrong_type);
  CHECK(has(m, "'scheduler.max-threads' has the wrong type"));
  m = refusal(file("ssl.ini", "[openssl]\ncertificate=\"evil.pem\"\n"),
              config_errc::unknown_key);
  CHECK(has(m, "openssl.certificate"));
  m = refusal(file("bad.ini", "garbage[[\n"), config_errc::parse_error);
  CHECK(has(m, "is not valid CAF INI"));
  m = refusal(caf_options{{}, dir.path()}, config_errc::missing_file);
  CHECK(has(m, "is a directory"));
  m = refusal(caf_options{{}, dir.file("none.ini")}, config_errc::missing_file);
  CHECK(has(m, "does not exist"));
}

TEST_CASE("the file, then the command line, reach the actor system") {
  temp_dir dir;
  auto ini = dir.file("caf.ini");
  write_file(ini, "[scheduler]\nmax-threads=5\npolicy='stealing'\n");
  {
    caf::actor_system_config cfg;
    cfg.set("scheduler.policy", caf::atom("sharing")); // as dualpath does
    REQUIRE_FALSE(apply(cfg, {{}, ini}));
    caf::actor_system sys{cfg};
    CHECK(sys.scheduler().num_workers() == 5);
    CHECK(caf::get_or(cfg, "scheduler.policy", caf::atom(""))
          == caf::atom("stealing"));
  }
  {
    caf::actor_system_config cfg;
    REQUIRE_FALSE(apply(cfg, {{"--scheduler.max-threads=3"}, ini}));
    caf::actor_system sys{cfg};
    CHECK(sys.scheduler().num_workers() == 3); // the command line wins
  }
  // Through load(), as every command does.
  load_request req;
  req.caf = {{"--scheduler.max-threads=3"}, {}};
  auto s = load(req);
  REQUIRE(s);
  CHECK(s->caf().args == req.caf.args);
  req.caf = {{"--scheduler.max-threads=x"}, {}};
  CHECK_FALSE(load(req));
}

TEST_CASE("the reference lists CAF's options") {
  auto ref = caf_reference();
  CHECK(has(ref, "scheduler.max-threads"));
  CHECK(has(ref, "scheduler.policy"));
  CHECK(has(ref, "middleman.heartbeat-interval"));
  CHECK_FALSE(has(ref, "openssl."));
  CHECK(has(reference_toml(), ref));
}
