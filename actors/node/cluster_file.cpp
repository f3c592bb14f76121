// Parsing the cluster file. Errors are config_errc values (the file is part
// of the configuration): `dualpath node` and `dualpath run --cluster` print
// the message and exit with status 2.
#include "actors/node/cluster_file.hpp"

#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include <toml++/toml.h>

#include "config/enum_names.hpp"
#include "config/errors.hpp"

namespace dualpath::actors::node {

namespace {

constexpr std::string_view node_role_names[] = {"scheduler", "prefill",
                                                "decode"};

using config::config_errc;

caf::error fail(config_errc code, const std::string& path,
                const std::string& msg) {
  return caf::make_error(code, "cluster file " + path + ": " + msg);
}

std::string line_of(const toml::node& n) {
  return " (line " + std::to_string(n.source().begin.line) + ")";
}

// Resolves `p` against the directory of the cluster file.
std::string resolve(const std::string& file, const std::string& p) {
  if (p.empty())
    return p;
  std::filesystem::path x{p};
  if (x.is_absolute())
    return p;
  auto dir = std::filesystem::path{file}.parent_path();
  return (dir / x).lexically_normal().string();
}

// Reads the string `key` of `tbl` (named `where` in messages) into `out`.
caf::error get_string(const toml::table& tbl, const std::string& key,
                      const std::string& where, const std::string& path,
                      std::string& out, bool required) {
  auto n = tbl.get(key);
  if (n == nullptr) {
    if (required)
      return fail(config_errc::unknown_key, path, "missing key " + where + key);
    return {};
  }
  auto s = n->as_string();
  if (s == nullptr)
    return fail(config_errc::wrong_type, path,
                "key " + where + key + " must be a string" + line_of(*n));
  out = s->get();
  return {};
}

caf::error get_port(const toml::table& tbl, const std::string& key,
                    const std::string& where, const std::string& path,
                    uint16_t& out) {
  auto n = tbl.get(key);
  if (n == nullptr)
    return {};
  auto i = n->as_integer();
  if (i == nullptr)
    return fail(config_errc::wrong_type, path,
                "key " + where + key + " must be an integer" + line_of(*n));
  if (i->get() < 0 || i->get() > 65535)
    return fail(config_errc::out_of_range, path,
                "key " + where + key + " = " + std::to_string(i->get())
                    + " is not a port (0..65535)" + line_of(*n));
  out = static_cast<uint16_t>(i->get());
  return {};
}

// Only the keys in `known` may appear in `tbl`.
caf::error check_keys(const toml::table& tbl,
                      const std::set<std::string>& known,
                      const std::string& where, const std::string& path) {
  for (auto& [k, v] : tbl) {
    auto name = std::string{k.str()};
    if (known.count(name) == 0) {
      std::string allowed;
      for (auto& x : known)
        allowed += (allowed.empty() ? "" : ", ") + x;
      return fail(config_errc::unknown_key, path,
                  "unknown key " + where + name + line_of(v)
                      + " (allowed: " + allowed + ")");
    }
  }
  return {};
}

caf::error parse_node(const toml::table& tbl, size_t index,
                      const std::string& path, node_entry& out) {
  auto where = "node[" + std::to_string(index) + "].";
  if (auto err =
          check_keys(tbl,
                     {"name", "role", "host", "port", "bulk_port", "gpus",
                      "nics", "rdma_device", "gid_index", "storage"},
                     where, path))
    return err;
  if (auto err = get_string(tbl, "name", where, path, out.name, true))
    return err;
  where = "node '" + out.name + "' ";
  if (out.name.empty())
    return fail(config_errc::out_of_range, path,
                "key node[" + std::to_string(index) + "].name is empty");
  std::string role;
  if (auto err = get_string(tbl, "role", where, path, role, true))
    return err;
  if (!config::parse_name(role, node_role_names, out.role))
    return fail(config_errc::invalid_choice, path,
                "key " + where + "role = '" + role
                    + "' (allowed: scheduler, prefill, decode)");
  if (auto err = get_string(tbl, "host", where, path, out.host, true))
    return err;
  if (auto err = get_port(tbl, "port", where, path, out.port))
    return err;
  if (auto err = get_port(tbl, "bulk_port", where, path, out.bulk_port))
    return err;
  if (out.role == node_role::scheduler && out.port == 0)
    return fail(config_errc::out_of_range, path,
                "key " + where
                    + "port is required for the scheduler node (the CAF "
                      "middleman port every node connects to)");
  if (auto n = tbl.get("gpus")) {
    auto arr = n->as_array();
    if (arr == nullptr)
      return fail(config_errc::wrong_type, path,
                  "key " + where + "gpus must be an array of GPU indices"
                      + line_of(*n));
    for (auto& x : *arr) {
      auto i = x.as_integer();
      if (i == nullptr || i->get() < 0)
        return fail(config_errc::wrong_type, path,
                    "key " + where + "gpus must hold non-negative integers"
                        + line_of(x));
      out.gpus.push_back(static_cast<uint32_t>(i->get()));
    }
  }
  if (auto n = tbl.get("nics")) {
    auto arr = n->as_array();
    if (arr == nullptr)
      return fail(config_errc::wrong_type, path,
                  "key " + where + "nics must be an array of device names"
                      + line_of(*n));
    for (auto& x : *arr) {
      auto s = x.as_string();
      if (s == nullptr)
        return fail(config_errc::wrong_type, path,
                    "key " + where + "nics must hold strings" + line_of(x));
      out.nics.push_back(s->get());
    }
    if (!out.gpus.empty() && out.nics.size() != out.gpus.size())
      return fail(config_errc::out_of_range, path,
                  "key " + where + "nics has " + std::to_string(out.nics.size())
                      + " entries but gpus has "
                      + std::to_string(out.gpus.size())
                      + " (one compute NIC per GPU)");
  }
  if (auto err =
          get_string(tbl, "rdma_device", where, path, out.rdma_device, false))
    return err;
  if (auto n = tbl.get("gid_index")) {
    auto i = n->as_integer();
    if (i == nullptr || i->get() < -1 || i->get() > 255)
      return fail(config_errc::out_of_range, path,
                  "key " + where + "gid_index must be an integer in -1..255"
                      + line_of(*n));
    out.gid_index = static_cast<int>(i->get());
  }
  if (auto err = get_string(tbl, "storage", where, path, out.storage, false))
    return err;
  out.storage = resolve(path, out.storage);
  return {};
}

} // namespace

std::string to_string(node_role x) {
  return config::name_of(x, node_role_names, "node_role");
}

std::string to_string(link_security x) {
  return x == link_security::tls ? "tls" : "plaintext";
}

const node_entry* cluster_file::find(const std::string& name) const {
  for (auto& n : nodes)
    if (n.name == name)
      return &n;
  return nullptr;
}

const node_entry& cluster_file::scheduler_node() const {
  return *find(scheduler);
}

std::vector<std::string> cluster_file::names_of(node_role role) const {
  std::vector<std::string> out;
  for (auto& n : nodes)
    if (n.role == role)
      out.push_back(n.name);
  return out;
}

std::string cluster_file::storage_of(const std::string& name) const {
  auto n = find(name);
  if (n != nullptr && !n->storage.empty())
    return n->storage;
  return storage;
}

caf::expected<cluster_file> parse_cluster(const std::string& text,
                                          const std::string& path) {
  toml::table root;
  try {
    root = toml::parse(text, path);
  } catch (const toml::parse_error& err) {
    return fail(config_errc::parse_error, path,
                "not valid TOML: " + std::string{err.description()} + " (line "
                    + std::to_string(err.source().begin.line) + ")");
  }
  cluster_file out;
  out.path = path;
  if (auto err = check_keys(root, {"cluster", "tls", "node"}, "", path))
    return err;
  // [cluster]
  auto ct = root["cluster"].as_table();
  if (ct == nullptr)
    return fail(config_errc::unknown_key, path, "missing table [cluster]");
  if (auto err = check_keys(
          *ct, {"scheduler", "storage", "bulk_secret", "bulk_secret_file"},
          "cluster.", path))
    return err;
  if (auto err =
          get_string(*ct, "scheduler", "cluster.", path, out.scheduler, true))
    return err;
  if (auto err =
          get_string(*ct, "storage", "cluster.", path, out.storage, true))
    return err;
  out.storage = resolve(path, out.storage);
  std::string secret_file;
  if (auto err = get_string(*ct, "bulk_secret", "cluster.", path,
                            out.bulk_secret, false))
    return err;
  if (auto err = get_string(*ct, "bulk_secret_file", "cluster.", path,
                            secret_file, false))
    return err;
  if (!secret_file.empty()) {
    secret_file = resolve(path, secret_file);
    std::ifstream in{secret_file};
    if (!in)
      return fail(config_errc::missing_file, path,
                  "key cluster.bulk_secret_file: cannot read " + secret_file);
    std::getline(in, out.bulk_secret);
  }
  if (out.bulk_secret.size() < 16)
    return fail(config_errc::out_of_range, path,
                "key cluster.bulk_secret (or bulk_secret_file) must hold at "
                "least 16 characters: every node authenticates its bulk "
                "transport peers with it");
  // [tls]
  if (auto tt = root["tls"].as_table()) {
    if (auto err = check_keys(*tt, {"mode", "ca", "cert", "key", "passphrase"},
                              "tls.", path))
      return err;
    std::string mode = "tls";
    if (auto err = get_string(*tt, "mode", "tls.", path, mode, false))
      return err;
    if (mode == "tls")
      out.tls.mode = link_security::tls;
    else if (mode == "plaintext")
      out.tls.mode = link_security::plaintext;
    else
      return fail(config_errc::invalid_choice, path,
                  "key tls.mode = '" + mode + "' (allowed: tls, plaintext)");
    for (auto [key, dst] :
         {std::pair{"ca", &out.tls.ca}, std::pair{"cert", &out.tls.cert},
          std::pair{"key", &out.tls.key},
          std::pair{"passphrase", &out.tls.passphrase}}) {
      if (auto err = get_string(*tt, key, "tls.", path, *dst, false))
        return err;
    }
  } else if (root.contains("tls")) {
    return fail(config_errc::wrong_type, path, "key tls must be a table");
  }
  if (out.tls.mode == link_security::tls) {
    for (auto [key, val] :
         {std::pair{"ca", &out.tls.ca}, std::pair{"cert", &out.tls.cert},
          std::pair{"key", &out.tls.key}}) {
      if (val->empty())
        return fail(config_errc::unknown_key, path,
                    std::string{"missing key tls."} + key
                        + " (TLS is the default; set tls.mode = \"plaintext\" "
                          "to run unencrypted)");
      *val = resolve(path, *val);
      if (!std::filesystem::exists(*val))
        return fail(config_errc::missing_file, path,
                    std::string{"key tls."} + key + ": no file " + *val);
    }
  }
  // [[node]]
  auto arr = root["node"].as_array();
  if (arr == nullptr || arr->empty())
    return fail(config_errc::unknown_key, path,
                "no [[node]] entries (one per node of the deployment)");
  std::set<std::string> names;
  for (size_t i = 0; i < arr->size(); ++i) {
    auto tbl = (*arr)[i].as_table();
    if (tbl == nullptr)
      return fail(config_errc::wrong_type, path,
                  "node[" + std::to_string(i) + "] must be a table");
    node_entry n;
    if (auto err = parse_node(*tbl, i, path, n))
      return err;
    if (!names.insert(n.name).second)
      return fail(config_errc::out_of_range, path,
                  "key node[" + std::to_string(i) + "].name: node '" + n.name
                      + "' appears twice");
    out.nodes.push_back(std::move(n));
  }
  auto sched = out.find(out.scheduler);
  if (sched == nullptr)
    return fail(config_errc::out_of_range, path,
                "key cluster.scheduler = '" + out.scheduler
                    + "' names no [[node]]");
  if (sched->role != node_role::scheduler)
    return fail(config_errc::out_of_range, path,
                "key cluster.scheduler: node '" + out.scheduler + "' has role "
                    + to_string(sched->role) + ", not scheduler");
  if (out.names_of(node_role::scheduler).size() != 1)
    return fail(config_errc::out_of_range, path,
                "exactly one node may have role = \"scheduler\"");
  if (out.names_of(node_role::prefill).empty()
      || out.names_of(node_role::decode).empty())
    return fail(config_errc::out_of_range, path,
                "a cluster needs at least one prefill and one decode node");
  return out;
}

caf::expected<cluster_file> load_cluster(const std::string& path) {
  std::ifstream in{path, std::ios::binary};
  if (!in)
    return caf::make_error(config::config_errc::missing_file,
                           "cluster file " + path
                               + " does not exist or cannot be read");
  std::stringstream buf;
  buf << in.rdbuf();
  return parse_cluster(buf.str(), path);
}

} // namespace dualpath::actors::node
