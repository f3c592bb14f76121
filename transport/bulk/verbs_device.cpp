// Device, port and GID selection of the verbs backend (see verbs_device.hpp).
#include "transport/bulk/verbs_device.hpp"

#include <arpa/inet.h>

#include <cstdio>
#include <vector>

namespace dualpath::transport::bulk::verbs {

namespace {

caf::error bad_key(const std::string& what) {
  return caf::make_error(transport_errc::unsupported, what);
}

bool ipv4_mapped(const uint8_t g[16]) {
  for (int i = 0; i < 10; ++i)
    if (g[i] != 0)
      return false;
  return g[10] == 0xff && g[11] == 0xff;
}

bool is_zero(const uint8_t g[16]) {
  for (int i = 0; i < 16; ++i)
    if (g[i] != 0)
      return false;
  return true;
}

const char* gid_type_name(uint32_t t) {
  switch (t) {
    case IBV_GID_TYPE_IB:
      return "IB";
    case IBV_GID_TYPE_ROCE_V1:
      return "RoCE v1";
    case IBV_GID_TYPE_ROCE_V2:
      return "RoCE v2";
    default:
      return "unknown";
  }
}

/// The GID table entries of `port` that hold an address.
std::vector<ibv_gid_entry> gid_table(ibv_context* ctx, uint8_t port,
                                     int table_len) {
  std::vector<ibv_gid_entry> out;
  for (int i = 0; i < table_len; ++i) {
    ibv_gid_entry e{};
    // An empty slot fails (ENODATA); that is no error, just no entry.
    if (ibv_query_gid_ex(ctx, port, static_cast<uint32_t>(i), &e, 0) != 0)
      continue;
    if (!is_zero(e.gid.raw))
      out.push_back(e);
  }
  return out;
}

std::string table_text(const std::vector<ibv_gid_entry>& t) {
  std::string s;
  for (auto& e : t)
    s += (s.empty() ? "" : "; ") + std::to_string(e.gid_index) + " = "
         + gid_text(e.gid.raw) + " (" + gid_type_name(e.gid_type) + ")";
  return s.empty() ? "empty" : s;
}

/// Picks the GID of a RoCE port (see the header's rule).
caf::expected<ibv_gid_entry> pick_roce_gid(const std::vector<ibv_gid_entry>& t,
                                           const std::string& listen_host,
                                           const std::string& where) {
  in_addr want{};
  bool have_ip = ::inet_pton(AF_INET, listen_host.c_str(), &want) == 1;
  const ibv_gid_entry* first_v4 = nullptr;
  const ibv_gid_entry* first_v2 = nullptr;
  for (auto& e : t) {
    if (e.gid_type != IBV_GID_TYPE_ROCE_V2)
      continue;
    if (first_v2 == nullptr)
      first_v2 = &e;
    if (!ipv4_mapped(e.gid.raw))
      continue;
    if (first_v4 == nullptr)
      first_v4 = &e;
    if (have_ip && std::memcmp(e.gid.raw + 12, &want, 4) == 0)
      return e;
  }
  if (first_v4 != nullptr)
    return *first_v4;
  if (first_v2 != nullptr)
    return *first_v2;
  return bad_key("transport.verbs_gid_index = -1: " + where
                 + " has no RoCE v2 GID (GID table: " + table_text(t)
                 + "); give the index of a RoCE GID in "
                   "transport.verbs_gid_index (or the node's gid_index)");
}

} // namespace

std::string gid_text(const uint8_t g[16]) {
  char buf[INET6_ADDRSTRLEN] = {};
  if (::inet_ntop(AF_INET6, g, buf, sizeof(buf)) == nullptr)
    return "?";
  return buf;
}

caf::expected<path_settings> validate_path(const options& opts) {
  path_settings p;
  auto sl = [&](int v, const char* key) -> caf::error {
    if (v < 0 || v > 15)
      return bad_key(std::string{key} + " must be 0..15, not "
                     + std::to_string(v));
    return caf::none;
  };
  if (auto err = sl(opts.verbs_sl_control, "transport.verbs_sl_control"))
    return err;
  if (auto err = sl(opts.verbs_sl_kv, "transport.verbs_sl_kv"))
    return err;
  if (opts.verbs_kv_queue_pairs < 1 || opts.verbs_kv_queue_pairs > max_kv_lanes)
    return bad_key("transport.verbs_kv_queue_pairs must be 1.."
                   + std::to_string(max_kv_lanes) + ", not "
                   + std::to_string(opts.verbs_kv_queue_pairs));
  if (opts.verbs_hop_limit < 1 || opts.verbs_hop_limit > 255)
    return bad_key("transport.verbs_hop_limit must be 1..255, not "
                   + std::to_string(opts.verbs_hop_limit));
  auto tc = [&](int v, const char* key) -> caf::error {
    if (v < 0 || v > 255)
      return bad_key(std::string{key} + " must be 0..255, not "
                     + std::to_string(v));
    return caf::none;
  };
  if (auto err = tc(opts.verbs_traffic_class_control,
                    "transport.verbs_traffic_class_control"))
    return err;
  if (auto err =
          tc(opts.verbs_traffic_class_kv, "transport.verbs_traffic_class_kv"))
    return err;
  if (opts.verbs_gid_index < -1 || opts.verbs_gid_index > 255)
    return bad_key("transport.verbs_gid_index must be -1..255, not "
                   + std::to_string(opts.verbs_gid_index));
  p.service_level[0] = static_cast<uint8_t>(opts.verbs_sl_control);
  p.service_level[1] = static_cast<uint8_t>(opts.verbs_sl_kv);
  p.traffic_class[0] = static_cast<uint8_t>(opts.verbs_traffic_class_control);
  p.traffic_class[1] = static_cast<uint8_t>(opts.verbs_traffic_class_kv);
  p.hop_limit = static_cast<uint8_t>(opts.verbs_hop_limit);
  return p;
}

caf::expected<device> device::open(const options& opts) {
  auto path = validate_path(opts);
  if (!path)
    return path.error();
  int n = 0;
  errno = 0;
  device_list_ptr list{ibv_get_device_list(&n)};
  if (!list || n == 0)
    return call_error("ibv_get_device_list", errno != 0 ? errno : ENODEV,
                      transport_errc::no_device, "no RDMA device");
  ibv_device* dev = nullptr;
  std::string names;
  for (int i = 0; i < n; ++i) {
    std::string name = ibv_get_device_name(list.get()[i]);
    names += (names.empty() ? "" : ", ") + name;
    if (dev == nullptr
        && (opts.verbs_device.empty() || opts.verbs_device == name))
      dev = list.get()[i];
  }
  if (dev == nullptr)
    return caf::make_error(transport_errc::no_device,
                           "transport.verbs_device (or the node's "
                           "rdma_device): no RDMA device named "
                               + opts.verbs_device + " (devices: " + names
                               + ")");
  device d;
  d.name_ = ibv_get_device_name(dev);
  d.port_ = opts.verbs_port;
  d.path_ = *path;
  auto ctx = vptr("ibv_open_device", ibv_open_device(dev), d.name_);
  if (!ctx)
    return ctx.error();
  d.ctx_.reset(*ctx);
  ibv_device_attr dattr{};
  if (auto err = vcall("ibv_query_device",
                       ibv_query_device(d.ctx_.get(), &dattr), d.name_))
    return err;
  if (d.port_ < 1 || d.port_ > dattr.phys_port_cnt)
    return bad_key("transport.verbs_port = " + std::to_string(d.port_) + ": "
                   + d.name_ + " has ports 1.."
                   + std::to_string(dattr.phys_port_cnt));
  d.max_cqe_ = dattr.max_cqe;
  d.max_qp_wr_ = dattr.max_qp_wr;
  ibv_port_attr pattr{};
  if (auto err =
          vcall("ibv_query_port", ibv_query_port(d.ctx_.get(), d.port_, &pattr),
                d.name_ + " port " + std::to_string(d.port_)))
    return err;
  auto where = d.name_ + " port " + std::to_string(d.port_);
  if (pattr.state != IBV_PORT_ACTIVE)
    return caf::make_error(transport_errc::no_device,
                           where + " is not active ("
                               + ibv_port_state_str(pattr.state) + ")");
  d.address_.lid = pattr.lid;
  d.address_.mtu = static_cast<uint8_t>(pattr.active_mtu);
  bool roce = pattr.link_layer == IBV_LINK_LAYER_ETHERNET;
  auto table = gid_table(d.ctx_.get(), d.port_, pattr.gid_tbl_len);
  if (opts.verbs_gid_index >= 0) {
    const ibv_gid_entry* hit = nullptr;
    for (auto& e : table)
      if (static_cast<int>(e.gid_index) == opts.verbs_gid_index)
        hit = &e;
    if (hit == nullptr)
      return bad_key("transport.verbs_gid_index = "
                     + std::to_string(opts.verbs_gid_index) + ": " + where
                     + " has no such GID (GID table: " + table_text(table)
                     + ")");
    if (roce && hit->gid_type == IBV_GID_TYPE_IB)
      return bad_key("transport.verbs_gid_index = "
                     + std::to_string(opts.verbs_gid_index) + ": " + where
                     + " is RoCE but that GID is not");
    std::memcpy(d.address_.gid, hit->gid.raw, 16);
    d.address_.global = true;
    d.path_.gid_index = static_cast<uint8_t>(hit->gid_index);
    d.description_ = where + " (" + (roce ? "RoCE" : "InfiniBand")
                     + ", GID index " + std::to_string(hit->gid_index) + " "
                     + gid_text(hit->gid.raw) + " "
                     + gid_type_name(hit->gid_type) + ")";
  } else if (roce) {
    auto e = pick_roce_gid(table, opts.listen_host, where);
    if (!e)
      return e.error();
    std::memcpy(d.address_.gid, e->gid.raw, 16);
    d.address_.global = true;
    d.path_.gid_index = static_cast<uint8_t>(e->gid_index);
    d.description_ = where + " (RoCE, GID index " + std::to_string(e->gid_index)
                     + " " + gid_text(e->gid.raw) + " "
                     + gid_type_name(e->gid_type) + ")";
  } else {
    if (pattr.lid == 0)
      return caf::make_error(transport_errc::no_device,
                             where
                                 + " is InfiniBand but has no LID (is a "
                                   "subnet manager running?); or set "
                                   "transport.verbs_gid_index for GID "
                                   "routing");
    d.description_ =
        where + " (InfiniBand, LID " + std::to_string(pattr.lid) + ")";
  }
  auto pd = vptr("ibv_alloc_pd", ibv_alloc_pd(d.ctx_.get()), d.name_);
  if (!pd)
    return pd.error();
  d.pd_.reset(*pd);
  return d;
}

} // namespace dualpath::transport::bulk::verbs
