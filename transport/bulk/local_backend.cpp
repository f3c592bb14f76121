// The local backend: peers in one process. A write is a bounds- and
// key-checked memcpy into the target's registered region, executed in order on
// one worker thread per backend so that post() never blocks the caller and
// completions arrive asynchronously, exactly as with the network backends.
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>
#include <unordered_map>

#include "transport/bulk/backend.hpp"
#include "transport/bulk/region_table.hpp"

namespace dualpath::transport::bulk {

namespace {

struct local_node {
  region_table* regions = nullptr;
  std::mutex* handler_mtx = nullptr;
  immediate_handler* handler = nullptr;
};

} // namespace

class local_fabric {
public:
  std::mutex mtx;
  std::unordered_map<std::string, local_node> nodes;
  /// Writers into a node currently running; a node leaves only at zero.
  std::unordered_map<std::string, int> busy;
  std::condition_variable cv;
};

std::shared_ptr<local_fabric> make_local_fabric() {
  return std::make_shared<local_fabric>();
}

namespace {

class local_backend final : public backend {
public:
  local_backend(const options& opts, std::shared_ptr<local_fabric> fabric)
      : opts_(opts), fabric_(std::move(fabric)) {
    worker_ = std::thread{[this] { run(); }};
  }

  caf::error join() {
    std::lock_guard<std::mutex> guard{fabric_->mtx};
    if (fabric_->nodes.count(opts_.node))
      return caf::make_error(transport_errc::bad_frame,
                             "local fabric already has node " + opts_.node);
    fabric_->nodes[opts_.node] =
        local_node{&regions_, &handler_mtx_, &handler_};
    return caf::none;
  }

  ~local_backend() override {
    {
      std::unique_lock<std::mutex> guard{fabric_->mtx};
      fabric_->nodes.erase(opts_.node);
      fabric_->cv.wait(guard, [&] { return fabric_->busy[opts_.node] == 0; });
    }
    {
      std::lock_guard<std::mutex> guard{mtx_};
      stop_ = true;
    }
    cv_.notify_all();
    worker_.join();
  }

  capabilities caps() const override {
    capabilities c;
    c.name = "local";
    c.immediate = true;
    return c;
  }

  const std::string& node() const override {
    return opts_.node;
  }

  caf::expected<local_registration>
  register_region(void* ptr, uint64_t len, memory_kind kind, int) override {
    if (auto err = check_host_region("local", ptr, len, kind))
      return err;
    auto desc = regions_.add(opts_.node, ptr, len);
    return local_registration{this, ptr, len, kind, std::move(desc)};
  }

  caf::expected<std::vector<uint8_t>> details_for(const std::string&) override {
    return std::vector<uint8_t>{opts_.node.begin(), opts_.node.end()};
  }

  caf::error connect(const std::string& peer,
                     const std::vector<uint8_t>&) override {
    std::lock_guard<std::mutex> guard{fabric_->mtx};
    if (!fabric_->nodes.count(peer))
      return caf::make_error(transport_errc::peer_lost,
                             "no local node " + peer);
    return caf::none;
  }

  void post(batch b, completion_sink sink) override {
    post_defaults(b, opts_);
    // Its sources stay registered (and so allocated) until it has run.
    std::vector<region_table::pin> held;
    auto err = validate(b);
    if (!err) {
      auto h = hold_sources(regions_, b);
      if (h)
        held = std::move(*h);
      else
        err = std::move(h.error());
    }
    if (err) {
      {
        std::lock_guard<std::mutex> guard{mtx_};
        ++stats_.batches_posted;
        ++stats_.batches_failed;
      }
      if (sink)
        sink(completion{b.tag, 0, static_cast<uint32_t>(b.writes.size()),
                        std::move(err)});
      return;
    }
    {
      std::lock_guard<std::mutex> guard{mtx_};
      ++stats_.batches_posted;
      queue_.push_back(queued{std::move(b), std::move(sink), std::move(held)});
    }
    cv_.notify_one();
  }

  void on_immediate(immediate_handler f) override {
    std::lock_guard<std::mutex> guard{handler_mtx_};
    handler_ = std::move(f);
  }

  counters stats() const override {
    std::lock_guard<std::mutex> guard{mtx_};
    return stats_;
  }

  void drop_peer(const std::string&) override {
    // No connections to drop: every write is a memcpy.
  }

protected:
  void deregister(uint32_t region_id) override {
    regions_.remove(region_id);
  }

private:
  void run() {
    for (;;) {
      queued item;
      {
        std::unique_lock<std::mutex> guard{mtx_};
        cv_.wait(guard, [&] { return stop_ || !queue_.empty(); });
        if (queue_.empty())
          return;
        item = std::move(queue_.front());
        queue_.pop_front();
      }
      auto res = execute(item.b);
      item.sources.clear(); // read no more: they may be deregistered
      {
        std::lock_guard<std::mutex> guard{mtx_};
        if (res.error) {
          ++stats_.batches_failed;
          if (res.error.code()
              == static_cast<uint8_t>(transport_errc::deadline_exceeded))
            ++stats_.deadline_exceeded;
        } else {
          ++stats_.batches_completed;
          stats_.bytes_sent[static_cast<size_t>(item.b.tclass)] += res.bytes;
        }
      }
      if (item.sink)
        item.sink(std::move(res));
    }
  }

  completion execute(const batch& b) {
    completion res;
    res.tag = b.tag;
    auto fail = [&](caf::error err) {
      res.error = std::move(err);
      res.failed_ops = static_cast<uint32_t>(b.writes.size());
      return res;
    };
    // post() validated it and holds its sources.
    const auto& target = b.writes.front().destination.node;
    local_node dst;
    {
      std::lock_guard<std::mutex> guard{fabric_->mtx};
      auto i = fabric_->nodes.find(target);
      if (i == fabric_->nodes.end()) {
        std::lock_guard<std::mutex> g2{mtx_};
        ++stats_.peer_lost;
        return fail(caf::make_error(transport_errc::peer_lost,
                                    "no local node " + target));
      }
      dst = i->second;
      ++fabric_->busy[target];
    }
    auto leave = [&] {
      std::lock_guard<std::mutex> guard{fabric_->mtx};
      if (--fabric_->busy[target] == 0)
        fabric_->cv.notify_all();
    };
    for (const auto& w : b.writes) {
      if (clock_type::now() > b.deadline) {
        leave();
        return fail(caf::make_error(transport_errc::deadline_exceeded,
                                    "local batch past its deadline"));
      }
      const auto& d = w.destination;
      region_table::pin pin;
      auto rc =
          dst.regions->acquire(d.region_id, d.key, d.offset, d.length, pin);
      if (rc != transport_errc::none) {
        leave();
        return fail(caf::make_error(rc, "local write rejected by " + target));
      }
      std::memcpy(pin.ptr(),
                  static_cast<uint8_t*>(w.source->data()) + w.source_offset,
                  d.length);
      res.bytes += d.length;
    }
    if (b.immediate) {
      std::lock_guard<std::mutex> guard{*dst.handler_mtx};
      if (*dst.handler)
        (*dst.handler)(incoming_immediate{
            opts_.node, b.writes.back().destination.region_id, *b.immediate});
    }
    leave();
    return res;
  }

  options opts_;
  std::shared_ptr<local_fabric> fabric_;
  region_table regions_;
  std::mutex handler_mtx_;
  immediate_handler handler_;
  mutable std::mutex mtx_;
  std::condition_variable cv_;
  /// A posted batch, its sink and its held sources.
  struct queued {
    batch b;
    completion_sink sink;
    std::vector<region_table::pin> sources;
  };
  std::deque<queued> queue_;
  counters stats_;
  bool stop_ = false;
  std::thread worker_;
};

} // namespace

caf::expected<std::unique_ptr<backend>>
make_local_backend(const options& opts, std::shared_ptr<local_fabric> fabric) {
  if (!fabric)
    return caf::make_error(transport_errc::unsupported,
                           "the local backend needs a local_fabric");
  auto ptr = std::make_unique<local_backend>(opts, std::move(fabric));
  if (auto err = ptr->join())
    return err;
  return std::unique_ptr<backend>{std::move(ptr)};
}

} // namespace dualpath::transport::bulk
