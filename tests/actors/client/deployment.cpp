// ctest-label: integration
// kv_client over a real deployment on 127.0.0.1: a scheduler node and a
// decode node run as `dualpath node` processes, the engine's own node lives
// in the client. The DE path reads on the remote decode node and writes over
// the deployment's bulk transport (tcp here, authenticated with the
// cluster's secret) into the engine's registered pages: byte-exact, like
// the PE path and a split; a saved block reloads byte-exact over it; a
// damaged file is a per-block error there too. A decode node killed
// (SIGKILL) during a load fails the load well within its deadline, nothing
// hangs, and the client keeps serving loads on the PE path; when the node
// comes back the DE path works again.
#include <doctest/doctest.h>

#include <signal.h>

#include <chrono>
#include <cstring>
#include <fstream>
#include <numeric>
#include <thread>

#include "actors/client/kv_client.hpp"
#include "actors/protocol/register.hpp"
#include "tests/actors/client/client_support.hpp"
#include "tests/actors/node/deployment.hpp"
#include "tests/support/support.hpp"
#include "transport/errors.hpp"
#include "transport/storage/backend.hpp"
#include "transport/storage/block_store.hpp"
#include "transport/storage/errors.hpp"
#include "transport/storage/kv_content.hpp"

using namespace dualpath;
using namespace dualpath::actors::client;
using namespace dualpath::transport::storage;
using namespace std::chrono_literals;

namespace {

constexpr uint32_t pages = 16;

std::vector<uint32_t> prompt(uint32_t blocks, uint32_t block_tokens,
                             uint32_t salt = 0) {
  return test::client_prompt(blocks, block_tokens, salt);
}

// The settings every process of the deployment and the client share: a
// small model (3 layers, 64 B per token and layer, blocks of 4 tokens) on
// one-GPU nodes, real bytes (byte scale 1) in real time, storage NICs of
// 60 kb/s: a 768-byte block reads in ~0.1 s, a six-block load in ~0.6 s,
// so the loads of the kill test are still reading when the node dies.
std::vector<std::string> settings() {
  return {"--set", "hardware.profile=paper-hopper",
          "--set", "model.profile=ds-27b",
          "--set", "model.layers=3",
          "--set", "model.kv_bytes_per_token_layer=64",
          "--set", "storage.block_tokens=4",
          "--set", "hardware.gpus_per_node=1",
          "--set", "hardware.hbm_gib=0.0625",
          "--set", "hardware.dram_buffer_gib=0.0625",
          "--set", "model.total_params=1e6",
          "--set", "model.active_params=1e6",
          "--set", "engines.activation_reserve_gib=0.01",
          "--set", "run.byte_scale=1",
          "--set", "run.time_scale=1",
          "--set", "run.modes=dualpath",
          "--set", "hardware.snic_gbps=0.00006",
          "--set", "transport.backend=tcp"};
}

std::vector<std::string> sets_of(const std::vector<std::string>& argv) {
  std::vector<std::string> out;
  for (size_t i = 0; i + 1 < argv.size(); i += 2)
    out.push_back(argv[i + 1]);
  return out;
}

// A scheduler node, the engine's node (no process: the client) and one
// decode node.
struct deployment_env {
  test::temp_dir dir{"dp-client-dep"};
  uint16_t caf = test::free_port();
  uint16_t bulk_engine = test::free_port();
  uint16_t bulk_de0 = test::free_port();
  std::string file = dir.file("cluster.toml");
  std::unique_ptr<test::background_process> sched;
  std::unique_ptr<test::background_process> de0;
  int de0_starts = 0;
  deployment_config dep;
  store_config store;

  deployment_env() {
    test::no_leak_check_in_children();
    std::ostringstream toml;
    toml << "[cluster]\nscheduler = \"sched\"\nstorage = \""
         << dir.file("store")
         << "\"\nbulk_secret = \"client-test-secret-0123456789\"\n\n"
         << "[tls]\nmode = \"plaintext\"\n\n"
         << "[[node]]\nname = \"sched\"\nrole = \"scheduler\"\nhost = "
            "\"127.0.0.1\"\nport = "
         << caf << "\n\n"
         << "[[node]]\nname = \"engine0\"\nrole = \"prefill\"\nhost = "
            "\"127.0.0.1\"\nbulk_port = "
         << bulk_engine << "\n\n"
         << "[[node]]\nname = \"de0\"\nrole = \"decode\"\nhost = "
            "\"127.0.0.1\"\nbulk_port = "
         << bulk_de0 << "\n";
    test::write_file(file, toml.str());
    dep.cluster_file = file;
    dep.node = "engine0";
    dep.sets = sets_of(settings());
    dep.patience = 30s;
    auto sc = deployment_store(dep);
    REQUIRE_MESSAGE(sc, (sc ? "" : actors::render(sc.error())));
    store = *sc;
    // The store holds a previous run's blocks before any node starts.
    auto be = make_backend(backend_config{});
    REQUIRE(be);
    auto s = block_store::open(store, *be);
    REQUIRE(s);
    REQUIRE(populate(**s, {prompt(6, bt()), prompt(6, bt(), 1)}));
    sched = start("sched");
    REQUIRE_MESSAGE(sched->wait_err("listening on", 20s), sched->err());
    start_de0();
  }

  ~deployment_env() {
    for (auto* p : {&de0, &sched})
      if (*p) {
        (*p)->signal(SIGTERM);
        (*p)->wait_for(10s);
      }
  }

  uint32_t bt() const {
    return store.geometry.block_tokens;
  }

  std::unique_ptr<test::background_process> start(const std::string& name) {
    auto suffix = name == "de0" ? std::to_string(de0_starts++) : "";
    auto argv = test::with(
        {test::dualpath_binary(), "node", "--cluster", file, "--name", name},
        settings());
    return std::make_unique<test::background_process>(
        argv, dir.file(name + suffix + ".out"),
        dir.file(name + suffix + ".err"));
  }

  void start_de0() {
    de0 = start("de0");
    REQUIRE_MESSAGE(de0->wait_err("joined", 30s), de0->err());
  }

  std::string logs() const {
    return "--- sched ---\n" + sched->err() + "\n--- de0 ---\n"
           + (de0 ? de0->err() : std::string{});
  }
};

struct engine {
  kv_geometry geo;
  std::vector<std::vector<std::byte>> memory;
  std::unique_ptr<kv_client> client;

  explicit engine(const deployment_config& dep) {
    client_config cfg;
    cfg.deployment = dep;
    cfg.buffer_blocks = 16;
    auto c = kv_client::make(cfg);
    REQUIRE_MESSAGE(c, (c ? "" : actors::render(c.error())));
    client = std::move(*c);
    geo = client->geometry();
    memory.assign(geo.layers,
                  std::vector<std::byte>(pages * geo.layer_bytes()));
    std::vector<kv_layer_memory> mem;
    for (auto& m : memory)
      mem.push_back(kv_layer_memory{m.data(), m.size()});
    REQUIRE(!client->register_kv(mem));
  }

  prefix_hit lookup(const std::vector<uint32_t>& tokens) {
    return test::lookup_hit(*client, tokens);
  }

  // A load of `blocks` into pages 0.. forced onto the DE path.
  load_request de_load(const std::vector<block_hash>& blocks) const {
    load_request r;
    r.blocks = blocks;
    for (uint32_t i = 0; i < blocks.size(); ++i)
      r.pages.push_back(i);
    r.path = load_path::de;
    return r;
  }

  const std::byte* page(uint32_t layer, uint32_t p) const {
    return memory[layer].data() + p * geo.layer_bytes();
  }

  void clear() {
    for (auto& m : memory)
      std::fill(m.begin(), m.end(), std::byte{0});
  }

  // Loads `blocks` into pages 0.. on `path`; checks every layer byte-exact
  // against the store's deterministic content.
  finished_op load_exact(const std::vector<block_hash>& blocks,
                         load_path path) {
    clear();
    load_request r;
    r.request_id = 11;
    r.blocks = blocks;
    for (uint32_t i = 0; i < blocks.size(); ++i)
      r.pages.push_back(static_cast<uint32_t>(blocks.size()) - 1 - i);
    r.path = path;
    r.deadline = 20s;
    auto t = client->start_load(r);
    REQUIRE(t);
    for (uint32_t l = 0; l < geo.layers; ++l) {
      auto err = client->wait_for_layer(*t, l);
      REQUIRE_MESSAGE(!err, actors::render(err));
      for (size_t b = 0; b < blocks.size(); ++b)
        CHECK(kv_check_layer(blocks[b], l, geo.block_tokens,
                             geo.bytes_per_token_layer, page(l, r.pages[b])));
    }
    auto done = client->wait(*t);
    REQUIRE(done);
    CHECK(!done->error);
    CHECK(done->blocks_ok == blocks.size());
    CHECK(client->load_errors(*t).empty());
    client->finished();
    return *done;
  }
};

} // namespace

TEST_CASE("over a deployment: the remote DE path is byte-exact, a killed "
          "decode node fails its load within the deadline") {
  deployment_env d;
  engine e{d.dep};
  CHECK(e.geo.layers == 3);
  CHECK(e.geo.block_tokens == 4);
  CHECK(e.geo.bytes_per_token_layer == 64);
  auto hit = e.lookup(prompt(6, d.bt()));
  REQUIRE(hit.blocks.size() == 6);

  // Each path, byte-exact.
  for (auto path : {load_path::de, load_path::pe, load_path::split}) {
    CAPTURE(to_string(path));
    auto done = e.load_exact(hit.blocks, path);
    if (path == load_path::de)
      CHECK(done.de_blocks == 6);
    if (path == load_path::pe)
      CHECK(done.pe_blocks == 6);
    if (path == load_path::split) {
      CHECK(done.pe_blocks > 0);
      CHECK(done.de_blocks > 0);
    }
  }

  // A save (engine-computed bytes) reloads byte-exact over the DE path.
  {
    auto tokens = prompt(6, d.bt());
    tokens.resize(8 * d.bt() + 1);
    std::iota(tokens.begin() + 6 * d.bt() + 1, tokens.end(), 70000u);
    auto lb = e.geo.layer_bytes();
    for (uint32_t l = 0; l < e.geo.layers; ++l)
      for (uint32_t p = 10; p < 12; ++p)
        for (size_t i = 0; i < lb; ++i)
          e.memory[l][p * lb + i] =
              static_cast<std::byte>((l * 31 + p * 7 + i * 3) & 0xff);
    save_request s;
    s.tokens = tokens;
    s.first_block = 6;
    s.pages = {10, 11};
    auto st = e.client->start_save(s);
    REQUIRE(st);
    auto sd = e.client->wait(*st);
    REQUIRE(sd);
    CHECK(!sd->error);
    auto h2 = e.lookup(tokens);
    REQUIRE(h2.blocks.size() == 8);
    load_request r;
    r.blocks.assign(h2.blocks.begin() + 6, h2.blocks.end());
    r.pages = {0, 1};
    r.path = load_path::de;
    auto lt = e.client->start_load(r);
    REQUIRE(lt);
    auto ld = e.client->wait(*lt);
    REQUIRE(ld);
    CHECK_MESSAGE(!ld->error, actors::render(ld->error));
    CHECK(ld->blocks_ok == 2);
    for (uint32_t l = 0; l < e.geo.layers; ++l)
      for (uint32_t b = 0; b < 2; ++b)
        CHECK(std::memcmp(e.page(l, b), e.page(l, 10 + b), lb) == 0);
    e.client->finished();
  }

  // A block damaged in storage: a per-block error on the remote path.
  auto other = e.lookup(prompt(6, d.bt(), 1));
  REQUIRE(other.blocks.size() == 6);
  test::flip_byte(e.client->block_file(other.blocks[3]),
                  static_cast<std::streamoff>(e.geo.layer_offset(2) + 9), 0x33);
  {
    auto t = e.client->start_load(e.de_load(other.blocks));
    REQUIRE(t);
    auto done = e.client->wait(*t);
    REQUIRE(done);
    CHECK(!done->error);
    CHECK(done->blocks_ok == 3);
    auto errs = e.client->load_errors(*t);
    REQUIRE(errs.size() == 1);
    CHECK(errs[0].index == 3);
    CHECK(errs[0].error == storage_errc::layer_checksum);
    e.client->finished();
  }

  // The decode node killed during a DE load: the load fails long before
  // its deadline (the client sees the node leave the deployment), wait()
  // returns, nothing hangs.
  {
    auto r = e.de_load(hit.blocks);
    r.deadline = 20s;
    // Two loads queued on the remote reader (~1.2 s of its NIC's time), so
    // that reads are running when the node dies.
    std::vector<uint64_t> tickets;
    for (uint32_t i = 0; i < 2; ++i) {
      load_request ri = r;
      ri.pages = {i * 6u,     i * 6u + 1, i * 6u + 2,
                  i * 6u + 3, i * 6u + 4, i * 6u + 5};
      auto t = e.client->start_load(ri);
      REQUIRE(t);
      tickets.push_back(*t);
    }
    auto t0 = std::chrono::steady_clock::now();
    d.de0->signal(SIGKILL);
    d.de0->wait_for(5s);
    size_t failed = 0;
    for (auto t : tickets) {
      auto err = e.client->wait_for_layer(t, 0);
      auto done = e.client->wait(t);
      REQUIRE(done);
      // A load that had finished before the kill landed whole; the others
      // failed, nothing of them counted as loaded.
      if (done->error) {
        ++failed;
        CHECK(err == transport::transport_errc::peer_lost);
        CHECK(done->error == transport::transport_errc::peer_lost);
        CHECK(done->blocks_ok == 0);
      }
    }
    auto waited = std::chrono::steady_clock::now() - t0;
    CHECK(failed == tickets.size()); // ~1.2 s of reads, killed at once
    CHECK(waited < 5s);              // the deadline was 20 s
    MESSAGE(
        "killed decode node: loads failed after "
        << std::chrono::duration_cast<std::chrono::milliseconds>(waited).count()
        << " ms");
    CHECK(e.client->finished().size() == tickets.size());

    // The client stays usable: a PE load succeeds, byte-exact; a forced DE
    // load fails at once naming the lost node; an automatic one reads on
    // the PE side.
    auto done = e.load_exact(hit.blocks, load_path::pe);
    CHECK(done.pe_blocks == 6);
    auto t = e.client->start_load(r);
    REQUIRE(t);
    auto fast = e.client->wait(*t);
    REQUIRE(fast);
    CHECK(fast->error == transport::transport_errc::peer_lost);
    e.client->finished();
    done = e.load_exact(hit.blocks, load_path::automatic);
    CHECK(done.pe_blocks == 6);
  }

  // The node comes back: the DE path works again.
  d.start_de0();
  auto back = std::chrono::steady_clock::now() + 10s;
  for (;;) {
    auto t = e.client->start_load(e.de_load(hit.blocks));
    REQUIRE(t);
    auto done = e.client->wait(*t);
    REQUIRE(done);
    e.client->finished();
    if (!done->error || std::chrono::steady_clock::now() > back)
      break;
    std::this_thread::sleep_for(100ms);
  }
  auto done = e.load_exact(hit.blocks, load_path::de);
  CHECK(done.de_blocks == 6);
  INFO(d.logs());
}

TEST_CASE("joining a deployment: bad input is refused naming what was wrong") {
  // A cluster file whose nodes do not run (no process is started).
  test::temp_dir dir{"dp-client-dep-bad"};
  auto file = dir.file("cluster.toml");
  std::ostringstream toml;
  toml << "[cluster]\nscheduler = \"sched\"\nstorage = \"" << dir.file("store")
       << "\"\nbulk_secret = \"client-test-secret-0123456789\"\n\n"
       << "[tls]\nmode = \"plaintext\"\n\n"
       << "[[node]]\nname = \"sched\"\nrole = \"scheduler\"\nhost = "
          "\"127.0.0.1\"\nport = "
       << test::free_port() << "\n\n"
       << "[[node]]\nname = \"engine0\"\nrole = \"prefill\"\nhost = "
          "\"127.0.0.1\"\nbulk_port = "
       << test::free_port() << "\n\n"
       << "[[node]]\nname = \"de0\"\nrole = \"decode\"\nhost = "
          "\"127.0.0.1\"\nbulk_port = "
       << test::free_port() << "\n";
  test::write_file(file, toml.str());
  deployment_config dep;
  dep.cluster_file = file;
  dep.node = "engine0";
  dep.sets = sets_of(settings());
  dep.patience = 300ms;
  auto refused = [&](client_config cfg, const std::string& names) {
    CAPTURE(names);
    auto t0 = std::chrono::steady_clock::now();
    auto c = kv_client::make(std::move(cfg));
    auto took = std::chrono::steady_clock::now() - t0;
    REQUIRE(!c);
    auto text = actors::render(c.error());
    CAPTURE(text);
    CHECK(text.find(names) != std::string::npos);
    CHECK(took < 3s);
    return c.error();
  };
  auto with = [&](auto change) {
    client_config cfg;
    cfg.deployment = dep;
    change(cfg);
    return cfg;
  };
  // The engine's node must be a prefill node; the decode node a decode one.
  CHECK(refused(with([](client_config& c) { c.deployment->node = "de0"; }),
                "deployment.node")
        == caf::sec::invalid_argument);
  CHECK(refused(
            with([](client_config& c) { c.deployment->decode_node = "nope"; }),
            "deployment.decode_node")
        == caf::sec::invalid_argument);
  // A transport that reaches no other process.
  refused(with([](client_config& c) {
            c.deployment->sets.push_back("transport.backend=local");
          }),
          "transport.backend");
  // A geometry given in part must still be the deployment's (4 tokens per
  // block), field by field.
  CHECK(refused(with([](client_config& c) { c.geometry.block_tokens = 8; }),
                "geometry.block_tokens")
        == caf::sec::invalid_argument);
  CHECK(refused(with([](client_config& c) { c.geometry.layers = 5; }),
                "geometry.layers")
        == caf::sec::invalid_argument);
  CHECK(refused(with([](client_config& c) {
                  c.geometry.bytes_per_token_layer = 32;
                }),
                "geometry.bytes_per_token_layer")
        == caf::sec::invalid_argument);
  // Faults apply to the embedded decode node only.
  CHECK(refused(with([](client_config& c) { c.decode_faults.fail_after = 0; }),
                "decode_faults")
        == caf::sec::invalid_argument);
  CHECK(refused(with([](client_config& c) { c.deployment->patience = -1ms; }),
                "deployment.patience")
        == caf::sec::invalid_argument);
  // The geometry matching in full is no error: the scheduler node is not
  // running, make() gives up after the patience.
  refused(with([](client_config& c) {
            c.geometry = kv_geometry{3, 4, 64};
          }),
          "cannot reach the scheduler node sched");
}

TEST_CASE("over a deployment: a stopped scheduler node loses nothing; a "
          "stopped decode node fails its load by the deadline and writes "
          "nothing after") {
  deployment_env d;
  engine e{d.dep};
  auto hit = e.lookup(prompt(6, d.bt()));
  REQUIRE(hit.blocks.size() == 6);
  e.load_exact(hit.blocks, load_path::de);

  // The scheduler node stopped (SIGSTOP) past the view request's timeout
  // (2 s): the decode node is not lost (messages to it are routed through
  // the scheduler node, so a DE load waits), and once the scheduler node
  // continues, the load completes byte-exact.
  d.sched->signal(SIGSTOP);
  std::this_thread::sleep_for(3s);
  {
    e.clear();
    auto r = e.de_load(hit.blocks);
    r.deadline = 20s;
    auto t = e.client->start_load(r);
    REQUIRE(t);
    std::this_thread::sleep_for(500ms);
    d.sched->signal(SIGCONT);
    auto done = e.client->wait(*t);
    REQUIRE(done);
    CHECK_MESSAGE(!done->error, actors::render(done->error));
    CHECK(done->de_blocks == 6);
    for (uint32_t l = 0; l < e.geo.layers; ++l)
      for (size_t b = 0; b < hit.blocks.size(); ++b)
        CHECK(kv_check_layer(hit.blocks[b], l, e.geo.block_tokens,
                             e.geo.bytes_per_token_layer,
                             e.page(l, r.pages[b])));
    e.client->finished();
  }

  // The decode node stopped during a DE load: the load fails by its
  // deadline and the remote grace (1 s); after it continues, no byte of
  // the pages changes.
  e.clear();
  auto r = e.de_load(hit.blocks);
  r.deadline = 1500ms;
  auto t0 = std::chrono::steady_clock::now();
  auto t = e.client->start_load(r);
  REQUIRE(t);
  std::this_thread::sleep_for(300ms); // reads running (~0.6 s of NIC time)
  d.de0->signal(SIGSTOP);
  auto done = e.client->wait(*t);
  auto waited = std::chrono::steady_clock::now() - t0;
  REQUIRE(done);
  CHECK(done->error);
  CHECK(done->blocks_ok == 0);
  CHECK(waited < 1500ms + 1s + 1s);
  e.client->finished();
  auto before = e.memory;
  d.de0->signal(SIGCONT);
  std::this_thread::sleep_for(2s);
  CHECK(e.memory == before);

  // The node continues: the client takes it back, the DE path works.
  auto back = std::chrono::steady_clock::now() + 15s;
  for (;;) {
    auto ti = e.client->start_load(e.de_load(hit.blocks));
    REQUIRE(ti);
    auto di = e.client->wait(*ti);
    REQUIRE(di);
    e.client->finished();
    if (!di->error || std::chrono::steady_clock::now() > back)
      break;
    std::this_thread::sleep_for(200ms);
  }
  auto again = e.load_exact(hit.blocks, load_path::de);
  CHECK(again.de_blocks == 6);
  INFO(d.logs());
}
