// The auto backend: verbs towards every peer whose verbs handshake succeeds,
// tcp towards the others (every peer when this node has no working RDMA
// device). The choice is made per peer in connect() and kept until the peer
// is dropped; each tcp peer is reported through options::notice and counted
// in counters::tcp_fallbacks.
//
// Both halves hold every region under one descriptor: the tcp half chooses
// the region id and key, the verbs half registers the same memory under them
// (verbs_backend::register_as), so a descriptor handed to any peer is valid
// whichever path that peer's writes take. Details carry both endpoints:
// "tcp=host:port;verbs=host:port/incarnation".
//
// Thread safety: as backend; the halves are thread-safe, the route table and
// registrations are guarded by one mutex.
#include <map>
#include <mutex>
#include <unordered_map>

#include "config/errors.hpp"
#include "transport/bulk/backend.hpp"
#include "transport/bulk/verbs_backend.hpp"

namespace dualpath::transport::bulk {

namespace {

enum class route : uint8_t { verbs, tcp };

struct auto_details {
  std::string tcp;    ///< host:port, empty if none
  bool verbs = false; ///< a verbs= field is present
};

auto_details parse(const std::vector<uint8_t>& details) {
  std::string s{details.begin(), details.end()};
  auto_details d;
  if (s.find('=') == std::string::npos) { // a plain tcp peer
    d.tcp = s;
    return d;
  }
  size_t pos = 0;
  while (pos <= s.size()) {
    auto end = std::min(s.find(';', pos), s.size());
    auto part = s.substr(pos, end - pos);
    if (part.rfind("tcp=", 0) == 0)
      d.tcp = part.substr(4);
    else if (part.rfind("verbs=", 0) == 0)
      d.verbs = true;
    pos = end + 1;
  }
  return d;
}

class auto_backend final : public backend {
public:
  auto_backend(const options& opts, std::unique_ptr<backend> tcp,
               std::unique_ptr<verbs_backend> verbs, std::string verbs_why)
      : opts_(opts),
        tcp_(std::move(tcp)),
        verbs_(std::move(verbs)),
        verbs_why_(std::move(verbs_why)) {
    // nop
  }

  ~auto_backend() override {
    // Registrations before the halves that own them.
    std::unordered_map<uint32_t, halves> regs;
    {
      std::lock_guard<std::mutex> guard{mtx_};
      regs.swap(regs_);
    }
  }

  capabilities caps() const override {
    capabilities c;
    c.name = "auto";
    c.immediate = true;
    c.device_memory = false; // refused: tcp peers could not reach it
    c.cross_process = true;
    return c;
  }

  const std::string& node() const override {
    return opts_.node;
  }

  caf::expected<local_registration> register_region(void* ptr, uint64_t len,
                                                    memory_kind kind,
                                                    int dmabuf_fd) override {
    if (kind == memory_kind::device)
      return caf::make_error(transport_errc::unsupported,
                             "transport.backend = auto cannot register GPU "
                             "memory (tcp peers cannot reach it): use verbs");
    auto t = tcp_->register_region(ptr, len, kind, dmabuf_fd);
    if (!t)
      return t.error();
    halves h;
    h.tcp = std::move(*t);
    if (verbs_) {
      auto v = verbs_->register_as(ptr, len, kind, dmabuf_fd, h.tcp.id(),
                                   h.tcp.describe().key);
      if (!v)
        return v.error();
      h.verbs = std::move(*v);
    }
    local_registration reg{this, ptr, len, kind, h.tcp.describe()};
    reg.lkey = h.verbs ? h.verbs.lkey : 0;
    std::lock_guard<std::mutex> guard{mtx_};
    regs_.emplace(reg.id(), std::move(h));
    return reg;
  }

  caf::expected<std::vector<uint8_t>>
  details_for(const std::string& peer) override {
    auto t = tcp_->details_for(peer);
    if (!t)
      return t.error();
    std::string s = "tcp=" + std::string{t->begin(), t->end()};
    if (verbs_) {
      auto v = verbs_->details_for(peer);
      if (!v)
        return v.error();
      s += ";" + std::string{v->begin(), v->end()};
    }
    return std::vector<uint8_t>{s.begin(), s.end()};
  }

  caf::error connect(const std::string& peer,
                     const std::vector<uint8_t>& details) override {
    auto d = parse(details);
    std::string why;
    if (!verbs_) {
      why = verbs_why_;
    } else if (!d.verbs) {
      why = "the peer offers no verbs endpoint";
    } else {
      auto err = verbs_->connect(peer, details);
      if (!err) {
        set_route(peer, route::verbs);
        say("bulk transport to " + peer + ": verbs");
        return caf::none;
      }
      why = "verbs handshake failed: " + config::message_of(err);
    }
    if (d.tcp.empty())
      return caf::make_error(transport_errc::peer_lost,
                             "cannot reach " + peer + " (" + why
                                 + ") and it offers no tcp endpoint");
    if (auto err = tcp_->connect(peer, {d.tcp.begin(), d.tcp.end()}))
      return err;
    uint64_t n = 0;
    {
      std::lock_guard<std::mutex> guard{mtx_};
      auto& r = routes_[peer];
      r = route::tcp;
      n = ++fallbacks_;
    }
    say("bulk transport to " + peer + ": tcp fallback (" + why
        + "); dualpath_bulk_tcp_fallback_total " + std::to_string(n));
    return caf::none;
  }

  void post(batch b, completion_sink sink) override {
    route r = route::tcp;
    if (!b.writes.empty()) {
      std::lock_guard<std::mutex> guard{mtx_};
      auto i = routes_.find(b.writes.front().destination.node);
      if (i != routes_.end())
        r = i->second;
    }
    // The composite registration carries the verbs lkey and the shared id,
    // so both halves take it as the source as it is.
    if (r == route::verbs)
      verbs_->post(std::move(b), std::move(sink));
    else
      tcp_->post(std::move(b), std::move(sink));
  }

  void on_immediate(immediate_handler f) override {
    if (verbs_)
      verbs_->on_immediate(f);
    tcp_->on_immediate(std::move(f));
  }

  counters stats() const override {
    auto c = tcp_->stats();
    if (verbs_) {
      auto v = verbs_->stats();
      c.batches_posted += v.batches_posted;
      c.batches_completed += v.batches_completed;
      c.batches_failed += v.batches_failed;
      for (size_t k = 0; k < traffic_class_count; ++k) {
        c.bytes_sent[k] += v.bytes_sent[k];
        c.contended_bytes[k] += v.contended_bytes[k];
      }
      c.bytes_received += v.bytes_received;
      c.rejected_unknown_region += v.rejected_unknown_region;
      c.rejected_wrong_key += v.rejected_wrong_key;
      c.rejected_out_of_bounds += v.rejected_out_of_bounds;
      c.rejected_bad_frame += v.rejected_bad_frame;
      c.rejected_unauthenticated += v.rejected_unauthenticated;
      c.dropped_half_open += v.dropped_half_open;
      c.deadline_exceeded += v.deadline_exceeded;
      c.peer_lost += v.peer_lost;
      c.connections_accepted += v.connections_accepted;
      c.connects += v.connects;
    }
    std::lock_guard<std::mutex> guard{mtx_};
    c.tcp_fallbacks = fallbacks_;
    return c;
  }

  void drop_peer(const std::string& peer) override {
    {
      std::lock_guard<std::mutex> guard{mtx_};
      routes_.erase(peer);
    }
    if (verbs_)
      verbs_->drop_peer(peer);
    tcp_->drop_peer(peer);
  }

protected:
  void deregister(uint32_t region_id) override {
    halves h;
    {
      std::lock_guard<std::mutex> guard{mtx_};
      auto i = regs_.find(region_id);
      if (i == regs_.end())
        return;
      h = std::move(i->second);
      regs_.erase(i);
    }
    // h's registrations end here, each waiting for its own half.
  }

private:
  struct halves {
    local_registration tcp;
    local_registration verbs;
  };

  void set_route(const std::string& peer, route r) {
    std::lock_guard<std::mutex> guard{mtx_};
    routes_[peer] = r;
  }

  void say(const std::string& what) const {
    if (opts_.notice)
      opts_.notice(what);
  }

  options opts_;
  std::unique_ptr<backend> tcp_;
  std::unique_ptr<verbs_backend> verbs_;
  std::string verbs_why_;
  mutable std::mutex mtx_;
  std::map<std::string, route> routes_;
  std::unordered_map<uint32_t, halves> regs_;
  uint64_t fallbacks_ = 0;
};

} // namespace

caf::expected<backend_choice> make_auto_backend(const options& opts) {
  auto tcp = make_tcp_backend(opts);
  if (!tcp)
    return tcp.error();
  auto verbs = verbs_backend::open(opts);
  backend_choice out;
  std::string why;
  if (verbs) {
    out.reason = "auto: verbs on " + (*verbs)->description()
                 + " towards every peer whose handshake succeeds, else tcp";
  } else {
    why = "no verbs: " + config::message_of(verbs.error());
    out.reason = "auto: tcp towards every peer (" + why + ")";
  }
  out.chosen = std::make_unique<auto_backend>(
      opts, std::move(*tcp),
      verbs ? std::move(*verbs) : std::unique_ptr<verbs_backend>{}, why);
  return out;
}

} // namespace dualpath::transport::bulk
