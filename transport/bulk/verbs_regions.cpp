// The verbs backend's memory registrations: host memory (ibv_reg_mr) and GPU
// memory exported as dma-buf (ibv_reg_dmabuf_mr), deregistration once no
// posted work request reads a region any more, and the region table peers
// see (verbs_backend.hpp has the design).
#include <cerrno>
#include <mutex>

#include "transport/bulk/region_table.hpp"
#include "transport/bulk/verbs_backend.hpp"

namespace dualpath::transport::bulk {

namespace {

/// Registers GPU memory exported as dma-buf `fd`, the fd covering exactly
/// [ptr, ptr + len) (offset 0 in it; the iova is the device address). A NIC,
/// driver or kernel without dma-buf support answers EOPNOTSUPP (or ENOSYS,
/// EPROTONOSUPPORT): that is transport_errc::unsupported, so the caller
/// stages through registered host memory instead; anything else is the
/// call's system error.
caf::expected<ibv_mr*> reg_dmabuf_mr(ibv_pd* pd, void* ptr, uint64_t len,
                                     int fd, int access) {
  errno = 0;
  auto mr = ibv_reg_dmabuf_mr(pd, 0, len, reinterpret_cast<uint64_t>(ptr), fd,
                              access);
  if (mr != nullptr)
    return mr;
  const int err = errno != 0 ? errno : EINVAL;
  if (err == EOPNOTSUPP || err == ENOSYS || err == EPROTONOSUPPORT)
    return verbs::call_error("ibv_reg_dmabuf_mr", err,
                             transport_errc::unsupported,
                             "this NIC, driver or kernel cannot register GPU "
                             "memory");
  return verbs::call_error("ibv_reg_dmabuf_mr", err);
}

} // namespace

caf::expected<local_registration>
verbs_backend::register_region(void* ptr, uint64_t len, memory_kind kind,
                               int dmabuf_fd) {
  uint32_t id = 0;
  {
    std::lock_guard<std::mutex> guard{mtx_};
    id = next_region_++;
  }
  return add_region(ptr, len, kind, dmabuf_fd, id, random_u64());
}

caf::expected<local_registration>
verbs_backend::register_as(void* ptr, uint64_t len, memory_kind kind,
                           int dmabuf_fd, uint32_t region_id, uint64_t key) {
  return add_region(ptr, len, kind, dmabuf_fd, region_id, key);
}

caf::expected<local_registration>
verbs_backend::add_region(void* ptr, uint64_t len, memory_kind kind,
                          int dmabuf_fd, uint32_t id, uint64_t key) {
  if (ptr == nullptr || len == 0)
    return caf::make_error(transport_errc::out_of_bounds, "empty region");
  const int access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;
  caf::expected<ibv_mr*> mr{nullptr};
  if (kind == memory_kind::device) {
    if (dmabuf_fd < 0)
      return caf::make_error(transport_errc::unsupported,
                             "GPU memory needs a dmabuf fd");
    mr = reg_dmabuf_mr(dev_.pd(), ptr, len, dmabuf_fd, access);
  } else {
    mr = verbs::vptr("ibv_reg_mr", ibv_reg_mr(dev_.pd(), ptr, len, access),
                     std::to_string(len) + " bytes");
  }
  if (!mr)
    return mr.error();
  verbs::mr_ptr owned{*mr};
  remote_region desc;
  desc.node = opts_.node;
  desc.region_id = id;
  desc.key = key;
  desc.base = reinterpret_cast<uint64_t>(ptr);
  desc.length = len;
  uint32_t lkey = owned->lkey;
  {
    std::lock_guard<std::mutex> guard{mtx_};
    if (mrs_.count(id) != 0)
      return caf::make_error(transport_errc::bad_frame,
                             "region id " + std::to_string(id)
                                 + " is registered already");
    auto& m = mrs_[id];
    m.mr = std::move(owned);
    m.key = key;
    m.base = desc.base;
    m.length = len;
  }
  local_registration reg{this, ptr, len, kind, std::move(desc)};
  reg.lkey = lkey;
  return reg;
}

void verbs_backend::deregister(uint32_t region_id) {
  std::unique_lock<std::mutex> guard{mtx_};
  auto i = mrs_.find(region_id);
  if (i == mrs_.end())
    return;
  i->second.removing = true;
  // Senders stop writing to it (they refuse such writes locally from now).
  verbs::wire_writer w;
  w.u32(region_id);
  for (auto& [conn, in] : in_) {
    side_command c;
    c.kind = side_command::send;
    c.conn = conn;
    c.type = verbs::frame_type::region_gone;
    c.body = w.bytes();
    command_side(std::move(c));
  }
  wake();
  // No posted work request may still read it (each batch ends by its
  // deadline, at worst io_timeout later when its connection is stopped).
  cv_.wait(guard, [&] { return mrs_.at(region_id).uses == 0; });
  mrs_.erase(region_id);
}

std::vector<verbs::region_entry> verbs_backend::table_snapshot() const {
  std::vector<verbs::region_entry> t;
  for (auto& [id, m] : mrs_)
    if (!m.removing)
      t.push_back(verbs::region_entry{id, m.mr->rkey, m.key, m.base, m.length});
  return t;
}

} // namespace dualpath::transport::bulk
