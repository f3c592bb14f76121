#include "actors/node/node_system.hpp"

#include <dlfcn.h>
#include <openssl/err.h>
#include <openssl/ssl.h>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <map>
#include <ostream>
#include <set>
#include <sstream>
#include <thread>
#include <vector>

#include <caf/all.hpp>
#include <caf/io/all.hpp>
#include <caf/openssl/all.hpp>

#include "actors/protocol/register.hpp"

// CAF 0.17's openssl sessions call SSL_get_error() without clearing the
// thread's OpenSSL error queue first. All sessions of a node share the
// middleman's thread, so one peer failing its handshake (garbage bytes, no
// certificate, a certificate of another CA) left an error in the queue that
// made the next SSL_read of every healthy session report SSL_ERROR_SSL: the
// node dropped all its links (measured: one garbage connection on the
// scheduler's port disconnected every node). OpenSSL asks callers to clear
// the queue before each I/O call; these definitions interpose the calls
// libcaf_openssl makes (the executable's definitions come first in symbol
// lookup), clear the queue and forward to libssl.
namespace {

template <class F>
F real_ssl(const char* name) {
  void* p = dlvsym(RTLD_NEXT, name, "OPENSSL_3.0.0");
  if (p == nullptr)
    p = dlsym(RTLD_NEXT, name);
  return reinterpret_cast<F>(p);
}

} // namespace

extern "C" {

int SSL_read(SSL* ssl, void* buf, int num) {
  static auto f = real_ssl<int (*)(SSL*, void*, int)>("SSL_read");
  ERR_clear_error();
  return f(ssl, buf, num);
}

int SSL_write(SSL* ssl, const void* buf, int num) {
  static auto f = real_ssl<int (*)(SSL*, const void*, int)>("SSL_write");
  ERR_clear_error();
  return f(ssl, buf, num);
}

int SSL_accept(SSL* ssl) {
  static auto f = real_ssl<int (*)(SSL*)>("SSL_accept");
  ERR_clear_error();
  return f(ssl);
}

int SSL_connect(SSL* ssl) {
  static auto f = real_ssl<int (*)(SSL*)>("SSL_connect");
  ERR_clear_error();
  return f(ssl);
}

} // extern "C"

namespace dualpath::actors::node {

node_system_config::node_system_config(const config::settings& cfg,
                                       const cluster_file& cluster,
                                       std::ostream& warn)
    : security_(cluster.tls.mode) {
  dualpath::actors::add_message_types(*this);
  load<caf::io::middleman>();
  // Two processes on one host: the work-sharing scheduler has a much lower
  // cross-process round trip than work stealing (platform notes).
  set("scheduler.policy",
      caf::atom_from_string(cfg.string("caf.scheduler_policy")));
  // A node that stops answering (a host powered off, not a killed process
  // whose kernel closes the socket) is noticed by the heartbeats.
  set("middleman.heartbeat-interval", caf::timespan{std::chrono::seconds(1)});
  set("middleman.connection-timeout", caf::timespan{std::chrono::seconds(5)});
  // CAF's own options (its config file, --scheduler.* and the like) over
  // the settings above; load() has checked them. The TLS files come from
  // the cluster file only, after them.
  caf_error_ = config::apply(*this, cfg.caf());
  if (security_ == link_security::tls) {
    load<caf::openssl::manager>();
    openssl_certificate = cluster.tls.cert;
    openssl_key = cluster.tls.key;
    openssl_cafile = cluster.tls.ca;
    openssl_passphrase = cluster.tls.passphrase;
  } else {
    warn << "dualpath: WARNING: tls.mode = \"plaintext\" in " << cluster.path
         << ": links between nodes are neither encrypted nor authenticated; "
            "anyone who reaches the CAF port can talk to this node. Use it "
            "only on a trusted, isolated network.\n";
  }
}

caf::expected<uint16_t> publish_actor(caf::actor_system& sys,
                                      link_security security,
                                      const caf::actor& hdl,
                                      const std::string& host, uint16_t port) {
  const char* in = host.empty() ? nullptr : host.c_str();
  if (security == link_security::tls)
    return caf::openssl::publish(hdl, port, in, true);
  return sys.middleman().publish(hdl, port, in, true);
}

caf::expected<caf::actor> connect_actor(caf::actor_system& sys,
                                        link_security security,
                                        const std::string& host, uint16_t port,
                                        std::chrono::milliseconds patience) {
  auto until = std::chrono::steady_clock::now() + patience;
  for (;;) {
    auto res = security == link_security::tls
                   ? caf::openssl::remote_actor<caf::actor>(sys, host, port)
                   : sys.middleman().remote_actor<caf::actor>(host, port);
    if (res || std::chrono::steady_clock::now() >= until)
      return res;
    // Not an actor: the caller's thread waits for a peer still starting.
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

std::string deployment_settings(const config::settings& cfg) {
  // The sections that shape the engines, the scheduler and the store's
  // geometry; the workload, the replay and where files go may differ
  // between processes (the driver generates the trace, not the nodes).
  auto text = cfg.to_toml();
  const std::vector<std::string> whole{"model", "hardware", "engines",
                                       "scheduler"};
  const std::vector<std::string> keys{"run.byte_scale", "run.time_scale",
                                      "run.modes", "storage.block_tokens"};
  std::string section;
  std::string kept;
  size_t start = 0;
  while (start < text.size()) {
    auto end = text.find('\n', start);
    if (end == std::string::npos)
      end = text.size();
    auto line = text.substr(start, end - start);
    start = end + 1;
    if (line.empty() || line[0] == '#')
      continue;
    if (line[0] == '[') {
      section = line.substr(1, line.find(']') - 1);
      continue;
    }
    auto hash = line.find(" #");
    if (hash != std::string::npos)
      line = line.substr(0, hash);
    auto key = section + "." + line.substr(0, line.find(' '));
    if (std::find(whole.begin(), whole.end(), section) != whole.end()
        || std::find(keys.begin(), keys.end(), key) != keys.end())
      kept += key + line.substr(line.find(' ')) + "\n";
  }
  return kept;
}

std::string settings_digest(const config::settings& cfg) {
  auto kept = deployment_settings(cfg);
  // FNV-1a, 64 bits: a consistency check, not a security boundary.
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : kept) {
    h ^= c;
    h *= 1099511628211ull;
  }
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016llx",
                static_cast<unsigned long long>(h));
  return buf;
}

namespace {

// "key = value" lines by key.
std::map<std::string, std::string> settings_by_key(const std::string& text) {
  std::map<std::string, std::string> out;
  std::istringstream in{text};
  std::string line;
  while (std::getline(in, line)) {
    auto eq = line.find(" = ");
    if (eq == std::string::npos)
      continue;
    auto value = line.substr(eq + 3);
    while (!value.empty() && value.back() == ' ')
      value.pop_back();
    out[line.substr(0, eq)] = value;
  }
  return out;
}

} // namespace

std::string settings_difference(const std::string& ours,
                                const std::string& theirs,
                                const std::string& our_side,
                                const std::string& their_side) {
  auto a = settings_by_key(ours);
  auto b = settings_by_key(theirs);
  std::set<std::string> keys;
  for (auto& kv : a)
    keys.insert(kv.first);
  for (auto& kv : b)
    keys.insert(kv.first);
  std::string out;
  size_t listed = 0;
  size_t differing = 0;
  for (auto& key : keys) {
    auto x = a.count(key) ? a[key] : std::string{"(not set)"};
    auto y = b.count(key) ? b[key] : std::string{"(not set)"};
    if (x == y)
      continue;
    ++differing;
    if (listed == 8)
      continue;
    ++listed;
    out += (out.empty() ? "" : "; ") + key + " = " + x + " " + our_side
           + " but " + y + " " + their_side;
  }
  if (differing > listed)
    out += "; and " + std::to_string(differing - listed) + " more";
  return out;
}

} // namespace dualpath::actors::node
