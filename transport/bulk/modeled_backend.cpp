#include "transport/bulk/modeled_backend.hpp"

#include <map>
#include <mutex>

namespace dualpath::transport::bulk {

class modeled_fabric {
public:
  std::mutex mtx;
  /// node -> region id -> region length.
  std::map<std::string, std::map<uint32_t, uint64_t>> regions;
};

std::shared_ptr<modeled_fabric> make_modeled_fabric() {
  return std::make_shared<modeled_fabric>();
}

namespace {

class modeled_backend final : public backend {
public:
  modeled_backend(const options& opts, std::shared_ptr<modeled_fabric> fabric)
      : opts_(opts), fabric_(std::move(fabric)) {
    // nop
  }

  ~modeled_backend() override {
    std::lock_guard<std::mutex> guard{fabric_->mtx};
    fabric_->regions.erase(opts_.node);
  }

  caf::error join() {
    std::lock_guard<std::mutex> guard{fabric_->mtx};
    if (fabric_->regions.count(opts_.node))
      return caf::make_error(transport_errc::bad_frame,
                             "modeled fabric already has node " + opts_.node);
    fabric_->regions[opts_.node];
    return caf::none;
  }

  capabilities caps() const override {
    capabilities c;
    c.name = "modeled";
    return c;
  }

  const std::string& node() const override {
    return opts_.node;
  }

  caf::expected<local_registration>
  register_region(void* ptr, uint64_t len, memory_kind kind, int) override {
    if (auto err = check_host_region("modeled", ptr, len, kind))
      return err;
    std::lock_guard<std::mutex> guard{fabric_->mtx};
    auto id = next_id_++;
    fabric_->regions[opts_.node][id] = len;
    // The key is the id: deterministic, and checked like a real key.
    remote_region desc{opts_.node, id, id, reinterpret_cast<uint64_t>(ptr),
                       0,          len};
    return local_registration{this, ptr, len, kind, std::move(desc)};
  }

  caf::expected<std::vector<uint8_t>> details_for(const std::string&) override {
    return std::vector<uint8_t>{opts_.node.begin(), opts_.node.end()};
  }

  caf::error connect(const std::string& peer,
                     const std::vector<uint8_t>&) override {
    std::lock_guard<std::mutex> guard{fabric_->mtx};
    if (!fabric_->regions.count(peer))
      return caf::make_error(transport_errc::peer_lost,
                             "no modeled node " + peer);
    return caf::none;
  }

  void post(batch b, completion_sink sink) override {
    auto res = execute(b);
    {
      std::lock_guard<std::mutex> guard{mtx_};
      ++stats_.batches_posted;
      if (res.error) {
        ++stats_.batches_failed;
      } else {
        ++stats_.batches_completed;
        stats_.bytes_sent[static_cast<size_t>(b.tclass)] += res.bytes;
      }
    }
    if (sink)
      sink(std::move(res));
  }

  void on_immediate(immediate_handler) override {
    // caps().immediate is false: no immediate is ever signalled.
  }

  counters stats() const override {
    std::lock_guard<std::mutex> guard{mtx_};
    return stats_;
  }

  void drop_peer(const std::string&) override {
    // No connections.
  }

protected:
  void deregister(uint32_t region_id) override {
    std::lock_guard<std::mutex> guard{fabric_->mtx};
    auto i = fabric_->regions.find(opts_.node);
    if (i != fabric_->regions.end())
      i->second.erase(region_id);
  }

private:
  completion execute(const batch& b) {
    completion res;
    res.tag = b.tag;
    auto fail = [&](caf::error err) {
      res.error = std::move(err);
      res.failed_ops = static_cast<uint32_t>(b.writes.size());
      res.bytes = 0;
      return res;
    };
    if (auto err = validate(b))
      return fail(std::move(err));
    std::lock_guard<std::mutex> guard{fabric_->mtx};
    const auto& target = b.writes.front().destination.node;
    auto node = fabric_->regions.find(target);
    if (node == fabric_->regions.end())
      return fail(caf::make_error(transport_errc::peer_lost,
                                  "no modeled node " + target));
    for (const auto& w : b.writes) {
      const auto& d = w.destination;
      auto r = node->second.find(d.region_id);
      if (r == node->second.end())
        return fail(
            caf::make_error(transport_errc::unknown_region,
                            "modeled write to an unknown region of " + target));
      if (d.key != d.region_id)
        return fail(caf::make_error(transport_errc::wrong_key,
                                    "modeled write with a wrong key"));
      if (d.offset > r->second || d.length > r->second - d.offset)
        return fail(caf::make_error(transport_errc::out_of_bounds,
                                    "modeled write outside its region"));
      res.bytes += d.length;
    }
    return res;
  }

  options opts_;
  std::shared_ptr<modeled_fabric> fabric_;
  uint32_t next_id_ = 1; // guarded by fabric_->mtx
  mutable std::mutex mtx_;
  counters stats_;
};

} // namespace

caf::expected<std::unique_ptr<backend>>
make_modeled_backend(const options& opts,
                     std::shared_ptr<modeled_fabric> fabric) {
  if (!fabric)
    return caf::make_error(transport_errc::bad_frame,
                           "modeled backend needs a fabric");
  auto b = std::make_unique<modeled_backend>(opts, std::move(fabric));
  if (auto err = b->join())
    return err;
  return std::unique_ptr<backend>{std::move(b)};
}

} // namespace dualpath::transport::bulk
