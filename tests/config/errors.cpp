// ctest-label: foundation
// Every class of configuration error: its code and one message naming the
// key, the value and what is allowed.
#include "config/settings.hpp"

#include <doctest/doctest.h>

#include "tests/support/support.hpp"

using namespace dualpath::config;
using dualpath::test::temp_dir;
using dualpath::test::write_file;

namespace {

struct failure {
  config_errc code;
  std::string message;
};

failure fails(const load_request& req) {
  auto res = load(req);
  REQUIRE_FALSE(static_cast<bool>(res));
  auto& err = res.error();
  REQUIRE(err.category() == caf::atom("dp_config"));
  return failure{static_cast<config_errc>(err.code()), message_of(err)};
}

failure fails_override(std::string assignment) {
  load_request req;
  req.overrides = {std::move(assignment)};
  return fails(req);
}

failure fails_file(const std::string& content) {
  temp_dir dir;
  auto path = dir.file("bad.toml");
  write_file(path, content);
  load_request req;
  req.file = path;
  return fails(req);
}

bool has(const std::string& str, const std::string& part) {
  return str.find(part) != std::string::npos;
}

} // namespace

TEST_CASE("unknown key, with a did-you-mean suggestion") {
  auto f = fails_override("storage.block_token=64");
  CHECK(f.code == config_errc::unknown_key);
  CHECK(has(f.message, "'storage.block_token'"));
  CHECK(has(f.message, "did you mean 'storage.block_tokens'?"));
  f = fails_file("[hardware]\ncnic_gpbs = 400\n");
  CHECK(f.code == config_errc::unknown_key);
  CHECK(has(f.message, "did you mean 'hardware.cnic_gbps'?"));
  CHECK(has(f.message, "line 2"));
  f = fails_file("layers = 30\n"); // a key outside its section
  CHECK(f.code == config_errc::unknown_key);
  CHECK(has(f.message, "did you mean 'model.layers'?"));
  f = fails_override("nothing.like.this=1");
  CHECK(f.code == config_errc::unknown_key);
  CHECK_FALSE(has(f.message, "did you mean"));
  CHECK(has(f.message, "dualpath config --reference"));
}

TEST_CASE("wrong type") {
  auto f = fails_file("[model]\nlayers = \"sixty\"\n");
  CHECK(f.code == config_errc::wrong_type);
  CHECK(has(f.message, "'model.layers'"));
  CHECK(has(f.message, "\"sixty\""));
  CHECK(has(f.message, "allowed an integer >= 1"));
  f = fails_file("[storage]\nblock_tokens = 64.5\n");
  CHECK(f.code == config_errc::wrong_type);
  f = fails_file("[storage]\no_direct = 1\n");
  CHECK(f.code == config_errc::wrong_type);
  CHECK(has(f.message, "true or false"));
  f = fails_file("[storage]\ndir = [1, 2]\n");
  CHECK(f.code == config_errc::wrong_type);
  f = fails_override("model.layers=abc");
  CHECK(f.code == config_errc::wrong_type);
  CHECK(has(f.message, "'abc'"));
  f = fails_override("hardware.dram_gbs=fast");
  CHECK(f.code == config_errc::wrong_type);
  f = fails_override("storage.fsync=yes");
  CHECK(f.code == config_errc::wrong_type);
}

TEST_CASE("out of range: negative bandwidth, zero layers, block size 0") {
  auto f = fails_override("hardware.cnic_gbps=-400");
  CHECK(f.code == config_errc::out_of_range);
  CHECK(has(f.message, "'hardware.cnic_gbps' = -400.0"));
  CHECK(has(f.message, "allowed a number > 0"));
  f = fails_file("[hardware]\nsnic_gbps = 0\n");
  CHECK(f.code == config_errc::out_of_range);
  f = fails_override("model.layers=0");
  CHECK(f.code == config_errc::out_of_range);
  CHECK(has(f.message, "'model.layers' = 0"));
  CHECK(has(f.message, "allowed an integer >= 1"));
  f = fails_file("[storage]\nblock_tokens = 0\n");
  CHECK(f.code == config_errc::out_of_range);
  CHECK(has(f.message, "'storage.block_tokens' = 0"));
  f = fails_override("hardware.gpu_efficiency=1.5");
  CHECK(f.code == config_errc::out_of_range);
  CHECK(has(f.message, "allowed a number > 0 and <= 1"));
  f = fails_override("transport.verbs_sl_kv=16");
  CHECK(f.code == config_errc::out_of_range);
  CHECK(has(f.message, "allowed an integer in 0 .. 15"));
  f = fails_override("workload.agents=99999999999999999999");
  CHECK(f.code == config_errc::out_of_range);
  f = fails_override("transport.tcp_kv_connections=0");
  CHECK(f.code == config_errc::out_of_range);
  CHECK(has(f.message, "'transport.tcp_kv_connections' = 0"));
  CHECK(has(f.message, "allowed an integer in 1 .. 16"));
  f = fails_override("transport.tcp_kv_spin_us=-1");
  CHECK(f.code == config_errc::out_of_range);
  CHECK(has(f.message, "'transport.tcp_kv_spin_us' = -1"));
  CHECK(has(f.message, "allowed an integer in 0 .. 10000"));
  f = fails_override("transport.tcp_control_cpu=-2");
  CHECK(f.code == config_errc::out_of_range);
  CHECK(has(f.message, "'transport.tcp_control_cpu' = -2"));
  CHECK(has(f.message, "allowed an integer in -1 .. 4095"));
}

TEST_CASE("invalid choice") {
  auto f = fails_override("storage.backend=spdk");
  CHECK(f.code == config_errc::invalid_choice);
  CHECK(has(f.message, "\"spdk\""));
  CHECK(has(f.message, "one of auto, io_uring, pread"));
  f = fails_file("[storage]\nreader = \"fast\"\n");
  CHECK(f.code == config_errc::invalid_choice);
}

TEST_CASE("missing file") {
  load_request req;
  req.file = "/nonexistent/dualpath.toml";
  auto f = fails(req);
  CHECK(f.code == config_errc::missing_file);
  CHECK(has(f.message, "'/nonexistent/dualpath.toml'"));
}

TEST_CASE("parse error") {
  auto f = fails_file("[hardware\ncnic_gbps = 400\n");
  CHECK(f.code == config_errc::parse_error);
  CHECK(has(f.message, "is not valid TOML"));
  CHECK(has(f.message, "line 1"));
}

TEST_CASE("unknown profile") {
  auto f = fails_override("model.profile=ds-999");
  CHECK(f.code == config_errc::unknown_profile);
  CHECK(has(f.message, "'ds-999'"));
  CHECK(has(f.message, "one of ds-660b, ds-27b, qwen-32b"));
  CHECK(has(f.message, "did you mean"));
  f = fails_file("[hardware]\nprofile = \"blackwell\"\n");
  CHECK(f.code == config_errc::unknown_profile);
  CHECK(has(f.message, "paper-hopper"));
}

TEST_CASE("malformed override") {
  auto f = fails_override("storage.block_tokens");
  CHECK(f.code == config_errc::malformed_override);
  CHECK(has(f.message, "key=value"));
  f = fails_override("=3");
  CHECK(f.code == config_errc::malformed_override);
}

TEST_CASE("an empty error's message says so (a check's message may render "
          "one)") {
  // doctest renders the message of a passing check too (-s), so
  // REQUIRE_MESSAGE(!err, message_of(err)) renders an empty error.
  CHECK(message_of(caf::error{}) == "no error");
  CHECK(message_of(caf::make_error(config_errc::missing_file,
                                   std::string{"no such file x"}))
        == "no such file x");
}
