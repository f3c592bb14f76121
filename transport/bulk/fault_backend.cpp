// Fault injection as a decorator (LevelDB's EnvWrapper habit): forwards every
// call to the wrapped backend and injects the deterministic faults of a
// fault_plan. Completions that it injects or delays are delivered from its
// own timer thread, so callers see the same asynchronous completion semantics
// as from a real backend.
#include <condition_variable>
#include <map>
#include <mutex>
#include <thread>

#include "transport/bulk/backend.hpp"

namespace dualpath::transport::bulk {

namespace {

class fault_backend final : public backend {
public:
  fault_backend(std::unique_ptr<backend> inner, fault_plan plan)
      : inner_(std::move(inner)), plan_(std::move(plan)) {
    timer_ = std::thread{[this] { run(); }};
  }

  ~fault_backend() override {
    // Drain the inner backend first: its destructor completes every pending
    // batch, and those completions may still pass through our timer.
    inner_.reset();
    {
      std::lock_guard<std::mutex> guard{mtx_};
      stop_ = true;
    }
    cv_.notify_all();
    timer_.join();
  }

  capabilities caps() const override {
    return inner_->caps();
  }

  const std::string& node() const override {
    return inner_->node();
  }

  caf::expected<local_registration> register_region(void* ptr, uint64_t len,
                                                    memory_kind kind,
                                                    int dmabuf_fd) override {
    // The registration belongs to the inner backend (it deregisters there).
    return inner_->register_region(ptr, len, kind, dmabuf_fd);
  }

  caf::expected<std::vector<uint8_t>>
  details_for(const std::string& peer) override {
    return inner_->details_for(peer);
  }

  caf::error connect(const std::string& peer,
                     const std::vector<uint8_t>& details) override {
    if (plan_.connect_delay.count() > 0)
      std::this_thread::sleep_for(plan_.connect_delay);
    return inner_->connect(peer, details);
  }

  void post(batch b, completion_sink sink) override {
    uint64_t n;
    {
      std::lock_guard<std::mutex> guard{mtx_};
      n = posts_++;
    }
    auto fail = [&](transport_errc code, std::string why) {
      schedule(std::move(sink),
               completion{b.tag, 0, static_cast<uint32_t>(b.writes.size()),
                          caf::make_error(code, std::move(why))},
               plan_.fail_at_once);
    };
    if (plan_.fail_after >= 0 && n >= static_cast<uint64_t>(plan_.fail_after))
      return fail(transport_errc::injected_fault,
                  "injected: fail after " + std::to_string(plan_.fail_after));
    if (!b.writes.empty() && !plan_.drop_peer.empty()
        && b.writes.front().destination.node == plan_.drop_peer) {
      inner_->drop_peer(plan_.drop_peer);
      return fail(transport_errc::peer_lost,
                  "injected: dropped peer " + plan_.drop_peer);
    }
    uint8_t* flipped = nullptr;
    if (plan_.corrupt_byte && !b.writes.empty() && b.writes.front().source
        && b.writes.front().destination.length > 0) {
      auto& w = b.writes.front();
      flipped = static_cast<uint8_t*>(w.source->data()) + w.source_offset;
      *flipped ^= 0xFF;
    }
    inner_->post(std::move(b), [this, flipped,
                                sink = std::move(sink)](completion c) mutable {
      if (flipped)
        *flipped ^= 0xFF; // the caller's buffer is restored; the wire was not
      if (plan_.delay.count() > 0)
        schedule(std::move(sink), std::move(c));
      else if (sink)
        sink(std::move(c));
    });
  }

  void on_immediate(immediate_handler f) override {
    inner_->on_immediate(std::move(f));
  }

  counters stats() const override {
    return inner_->stats();
  }

  void drop_peer(const std::string& peer) override {
    inner_->drop_peer(peer);
  }

protected:
  void deregister(uint32_t) override {
    // Registrations are made by (and return to) the inner backend.
  }

private:
  void schedule(completion_sink sink, completion c, bool at_once = false) {
    {
      std::lock_guard<std::mutex> guard{mtx_};
      due_.emplace(clock_type::now()
                       + (at_once ? clock_type::duration{0}
                                  : clock_type::duration{plan_.delay}),
                   std::make_pair(std::move(sink), std::move(c)));
    }
    cv_.notify_all();
  }

  void run() {
    std::unique_lock<std::mutex> guard{mtx_};
    for (;;) {
      if (due_.empty()) {
        if (stop_)
          return;
        cv_.wait(guard);
        continue;
      }
      auto first = due_.begin();
      if (first->first > clock_type::now() && !stop_) {
        cv_.wait_until(guard, first->first);
        continue;
      }
      auto item = std::move(first->second);
      due_.erase(first);
      guard.unlock();
      if (item.first)
        item.first(std::move(item.second));
      guard.lock();
    }
  }

  std::unique_ptr<backend> inner_;
  fault_plan plan_;
  std::mutex mtx_;
  std::condition_variable cv_;
  std::multimap<clock_type::time_point, std::pair<completion_sink, completion>>
      due_;
  uint64_t posts_ = 0;
  bool stop_ = false;
  std::thread timer_;
};

} // namespace

std::unique_ptr<backend> make_fault_backend(std::unique_ptr<backend> inner,
                                            fault_plan plan) {
  return std::make_unique<fault_backend>(std::move(inner), std::move(plan));
}

} // namespace dualpath::transport::bulk
