// ctest-label: foundation
// Loading the configuration: defaults, profiles, file and overrides in order
// of precedence, typed getters and --print-config round trips.
#include "config/settings.hpp"

#include <doctest/doctest.h>

#include <csignal>
#include <sys/wait.h>
#include <unistd.h>

#include "config/capacity.hpp"
#include "config/profiles.hpp"
#include "tests/support/support.hpp"

using namespace dualpath::config;
using dualpath::test::temp_dir;
using dualpath::test::write_file;

namespace {

settings load_ok(const load_request& req) {
  auto res = load(req);
  if (!res)
    FAIL("load failed: " << message_of(res.error()));
  return std::move(*res);
}

// Runs `fn` in a child process; true if it died of SIGABRT.
template <class F>
bool aborts(F fn) {
  auto pid = fork();
  if (pid == 0) {
    std::signal(SIGABRT, SIG_DFL); // not doctest's crash handler
    if (std::freopen("/dev/null", "w", stderr) == nullptr)
      _exit(3);
    fn();
    _exit(0);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFSIGNALED(status) && WTERMSIG(status) == SIGABRT;
}

} // namespace

TEST_CASE("schema defaults equal the default profiles") {
  settings defaults;
  for (auto& spec : schema()) {
    if (!spec.selects_profile)
      continue;
    auto prof =
        find_profile(spec.section(), std::get<std::string>(spec.default_value));
    REQUIRE_MESSAGE(prof != nullptr, spec.name);
    for (auto& kv : prof->values) {
      // Not structured bindings: doctest's message macros capture them in
      // a lambda, which C++17 does not allow (clang).
      const auto& key = kv.first;
      CHECK_MESSAGE(to_toml(defaults.get(key)) == to_toml(kv.second), key);
    }
  }
}

TEST_CASE("every profile sets valid keys of its own section") {
  for (auto& prof : profiles()) {
    settings s;
    for (auto& kv : prof.values) {
      const auto& key = kv.first; // not a binding: the macros capture it
      const auto& x = kv.second;
      auto spec = find_key(key);
      REQUIRE_MESSAGE(spec != nullptr, key);
      CHECK_MESSAGE(spec->section() == prof.section, key);
      CHECK_MESSAGE(!s.set(key, x, value_source::profile, prof.name), key);
    }
  }
  CHECK(profile_names("model")
        == std::vector<std::string>{"ds-660b", "ds-27b", "qwen-32b"});
  CHECK(profile_names("workload")
        == std::vector<std::string>{"trace-32k", "trace-48k", "trace-64k"});
}

TEST_CASE("defaults: the paper's hardware, ds-660b and trace-64k") {
  auto s = load_ok(load_request{});
  CHECK(s.integer("hardware.gpus_per_node") == 8);
  CHECK(s.real("hardware.cnic_gbps") == 400.0);
  CHECK(s.real("hardware.snic_gbps") == 400.0);
  CHECK(s.real("hardware.dram_gbs") == 500.0);
  CHECK(s.real("hardware.gpu_tflops") == 989.0);
  CHECK(s.integer("model.layers") == 61);
  CHECK(s.integer("model.kv_bytes_per_token_layer") == 656);
  CHECK(s.string("model.attention") == "dsa");
  CHECK(s.integer("workload.turns") == 157);
  CHECK(s.integer("workload.context_tokens") == 32721);
  CHECK(s.integer("storage.block_tokens") == 64);
  CHECK(s.boolean("scheduler.split_reads"));
  CHECK(s.string("caf.scheduler_policy") == "sharing");
  CHECK(s.source_of("hardware.profile") == value_source::schema_default);
  CHECK(s.source_of("model.layers") == value_source::profile);
  CHECK(s.origin_of("model.layers") == "ds-660b");
  CHECK(s.source_of("storage.block_tokens") == value_source::schema_default);
}

TEST_CASE("a profile sets its section; explicit keys override it") {
  temp_dir dir;
  auto file = dir.file("c.toml");
  write_file(file, "[model]\nprofile = \"qwen-32b\"\nattn_heads = 48\n"
                   "[storage]\nblock_tokens = 128\n");
  load_request req;
  req.file = file;
  auto s = load_ok(req);
  CHECK(s.integer("model.layers") == 64);
  CHECK(s.integer("model.kv_bytes_per_token_layer") == 4096);
  CHECK(s.string("model.attention") == "gqa");
  CHECK(s.integer("model.attn_heads") == 48); // the file beats the profile
  CHECK(s.source_of("model.attn_heads") == value_source::file);
  CHECK(s.origin_of("model.attn_heads") == file);
  CHECK(s.source_of("model.layers") == value_source::profile);
  CHECK(s.integer("storage.block_tokens") == 128);
  // Overrides beat the file, also for the profile choice.
  req.overrides = {"model.profile=ds-27b", "storage.block_tokens=32",
                   "storage.block_tokens=16"};
  s = load_ok(req);
  CHECK(s.integer("model.layers") == 30);
  CHECK(s.integer("model.attn_heads") == 48);     // still the file's
  CHECK(s.integer("storage.block_tokens") == 16); // the last override wins
  CHECK(s.source_of("storage.block_tokens") == value_source::override_value);
  CHECK(s.describe_source("storage.block_tokens") == "--set");
  CHECK(s.describe_source("model.layers") == "profile ds-27b");
}

TEST_CASE("a command's defaults: over the schema's, under all else") {
  temp_dir dir;
  auto file = dir.file("c.toml");
  write_file(file, "[workload]\nagents = 5\n");
  load_request req;
  req.defaults = {{"hardware.profile=paper-hopper-slice8", "dualpath run"},
                  {"workload.agents=96", "dualpath run"},
                  {"run.prefill_nodes=1", "dualpath run"}};
  auto s = load_ok(req);
  // The default profile is applied like a chosen one.
  CHECK(s.integer("hardware.gpus_per_node") == 1);
  CHECK(s.integer("hardware.slice") == 8);
  CHECK(s.describe_source("hardware.profile") == "default of dualpath run");
  CHECK(s.describe_source("hardware.slice") == "profile paper-hopper-slice8");
  CHECK(s.integer("workload.agents") == 96);
  CHECK(s.source_of("workload.agents") == value_source::command_default);
  // The file, a --set and a chosen profile each replace them.
  req.file = file;
  req.overrides = {"run.prefill_nodes=3", "hardware.profile=paper-hopper"};
  s = load_ok(req);
  CHECK(s.integer("workload.agents") == 5);
  CHECK(s.integer("run.prefill_nodes") == 3);
  CHECK(s.integer("hardware.gpus_per_node") == 8);
  CHECK(s.integer("hardware.slice") == 1);
  // A bad default names itself like any override.
  load_request bad;
  bad.defaults = {{"workload.agentz=1", "dualpath run"}};
  auto err = load(bad);
  REQUIRE(!err);
  CHECK(message_of(err.error()).find("agentz") != std::string::npos);
}

TEST_CASE("overrides parse every type") {
  load_request req;
  req.overrides = {
      "storage.o_direct=true",        "hardware.cnic_gbps=12.5",
      "hardware.gpu_tflops=1000", // an integer for a real key
      "transport.verbs_gid_index=-1", {"storage.dir=\"/tmp/x y\"", "--dir"},
      "transport.secret=abc=def",     "workload.profile=trace-32k"};
  auto s = load_ok(req);
  CHECK(s.boolean("storage.o_direct"));
  CHECK(s.real("hardware.cnic_gbps") == 12.5);
  CHECK(s.real("hardware.gpu_tflops") == 1000.0);
  CHECK(s.integer("transport.verbs_gid_index") == -1);
  CHECK(s.string("storage.dir") == "/tmp/x y");
  CHECK(s.describe_source("storage.dir") == "--dir");
  CHECK(s.string("transport.secret") == "abc=def");
  CHECK(s.integer("workload.turns") == 60);
  CHECK(s.integer("workload.max_len") == 32768);
}

TEST_CASE("--print-config output loads back to the same values") {
  load_request req;
  req.overrides = {"model.profile=qwen-32b", "storage.dir=/tmp/a\"b\\c",
                   "hardware.gpu_efficiency=0.3", "model.active_params=1e11"};
  auto s = load_ok(req);
  temp_dir dir;
  auto file = dir.file("printed.toml");
  write_file(file, s.to_toml());
  load_request again;
  again.file = file;
  auto t = load_ok(again);
  for (auto& spec : schema()) {
    CHECK_MESSAGE(to_toml(t.get(spec.name)) == to_toml(s.get(spec.name)),
                  spec.name);
    CHECK(t.source_of(spec.name) == value_source::file);
  }
  CHECK(s.to_toml().find("dram_gbs = 500.0  # profile paper-hopper")
        != std::string::npos);
}

TEST_CASE("getters with an unknown key or the wrong type abort") {
  settings s;
  CHECK(aborts([&] { (void)s.integer("storage.block_size"); }));
  CHECK(aborts([&] { (void)s.real("storage.block_tokens"); }));
  CHECK(aborts([&] { (void)s.string("storage.o_direct"); }));
  CHECK_FALSE(aborts([&] { (void)s.integer("storage.block_tokens"); }));
}

TEST_CASE("suggestions find plausible typos only") {
  CHECK(suggest_key("storage.block_token") == "storage.block_tokens");
  CHECK(suggest_key("hardware.cnic_gpbs") == "hardware.cnic_gbps");
  CHECK(suggest_key("block_tokens") == "storage.block_tokens");
  CHECK(suggest_key("model.layer") == "model.layers");
  CHECK(suggest_key("completely.unrelated") == "");
  CHECK(edit_distance("kitten", "sitting") == 3);
}

TEST_CASE("sizes are checked against what the process can hold") {
  auto message = [](std::vector<override_entry> overrides) {
    load_request req;
    req.overrides = std::move(overrides);
    auto res = load(req);
    REQUIRE_FALSE(res);
    CHECK(res.error().code()
          == static_cast<uint8_t>(config_errc::out_of_range));
    return message_of(res.error());
  };
  // Larger than a 32-bit field: refused by range, naming the key.
  auto m = message({"storage.block_tokens=2147483648"});
  CHECK(m.find("'storage.block_tokens' = 2147483648") != std::string::npos);
  CHECK(m.find("at most 2147483647") != std::string::npos);
  // In range, but one block file is larger than memory (61 layers x 2^31
  // tokens x 1 byte = 122 GiB here; no host running this suite has that).
  m = message({"storage.block_tokens=2147483647"});
  CHECK(m.find("'storage.block_tokens' = 2147483647 (--set) asks for one KV "
               "block file of 122.0 GiB")
        != std::string::npos);
  // Fits alone (12.2 GB), but a node's buffer must hold four of them (two
  // longest prompts of one block each, plus two).
  m = message({"storage.block_tokens=200000000"});
  CHECK(m.find("'storage.block_tokens'") != std::string::npos);
  CHECK(m.find("a node's DRAM buffer") != std::string::npos);
  m = message({"hardware.dram_buffer_gib=99999999"});
  CHECK(m.find("'hardware.dram_buffer_gib'") != std::string::npos);
  m = message({"transport.max_frame_mib=99999999999"});
  CHECK(m.find("'transport.max_frame_mib'") != std::string::npos);
  m = message({"workload.agents=2000000000"});
  CHECK(m.find("'workload.agents'") != std::string::npos);
  // The check itself, against a given amount of memory: the defaults fit in
  // 1 GiB, not in 1 MiB.
  settings defaults;
  CHECK_FALSE(check_capacity(defaults, uint64_t{1} << 30));
  auto small = check_capacity(defaults, uint64_t{1} << 20);
  REQUIRE(small);
  CHECK(message_of(small).find("more than this process can hold (1.0 MiB")
        != std::string::npos);
  CHECK_GT(host_memory_bytes(), uint64_t{0});
}
