// The verbs backend's connections: details, connect(), the handshake and the
// side channels. The connector
// thread runs the sending side's handshakes, the side-channel thread accepts
// and serves the receiving side's and owns every side channel afterwards
// (region tables, removed regions, and noticing that a peer is gone). Wire
// format: verbs_wire.hpp. Two threads, so that two nodes connecting to each
// other at the same time each serve the other's handshake while waiting for
// their own.
#include <poll.h>

#include <algorithm>
#include <cinttypes>
#include <cstdio>

#include "config/errors.hpp"
#include "transport/bulk/region_table.hpp"
#include "transport/bulk/verbs_backend.hpp"

namespace dualpath::transport::bulk {

namespace {

using verbs::frame_type;

caf::error lost(const std::string& why) {
  return caf::make_error(transport_errc::peer_lost, why);
}

caf::error refused(transport_errc code, const std::string& why) {
  return caf::make_error(code, why);
}

void random_nonce(uint8_t out[32]) {
  for (int i = 0; i < 4; ++i) {
    auto x = random_u64();
    std::memcpy(out + 8 * i, &x, 8);
  }
}

std::string hex(uint64_t x) {
  char buf[20];
  std::snprintf(buf, sizeof(buf), "%016" PRIx64, x);
  return buf;
}

/// The `verbs=` field of details (alone or among auto's fields).
caf::expected<std::pair<verbs::host_port, uint64_t>>
parse_details(const std::vector<uint8_t>& details) {
  std::string s{details.begin(), details.end()};
  std::string field;
  size_t pos = 0;
  while (pos <= s.size()) {
    auto end = std::min(s.find(';', pos), s.size());
    auto part = s.substr(pos, end - pos);
    if (part.rfind("verbs=", 0) == 0)
      field = part.substr(6);
    pos = end + 1;
  }
  auto slash = field.rfind('/');
  if (field.empty() || slash == std::string::npos)
    return caf::make_error(transport_errc::bad_frame,
                           "verbs details must hold verbs=host:port/"
                           "incarnation, got '"
                               + s + "'");
  auto hp = verbs::parse_host_port(field.substr(0, slash), "verbs details");
  if (!hp)
    return hp.error();
  char* end = nullptr;
  auto inc = std::strtoull(field.c_str() + slash + 1, &end, 16);
  if (end == field.c_str() + slash + 1 || *end != '\0')
    return caf::make_error(transport_errc::bad_frame,
                           "verbs details: bad incarnation in '" + s + "'");
  return std::make_pair(std::move(*hp), static_cast<uint64_t>(inc));
}

/// The body of a MAC'd frame without its trailing 32-byte MAC.
std::vector<uint8_t> content_of(const std::vector<uint8_t>& body) {
  return {body.begin(), body.end() - std::min<size_t>(body.size(), 32)};
}

} // namespace

caf::expected<std::vector<uint8_t>>
verbs_backend::details_for(const std::string&) {
  auto s = "verbs=" + address_ + "/" + hex(incarnation_);
  return std::vector<uint8_t>{s.begin(), s.end()};
}

caf::error verbs_backend::connect(const std::string& peer,
                                  const std::vector<uint8_t>& details) {
  auto parsed = parse_details(details);
  if (!parsed)
    return parsed.error();
  done_list done;
  std::unique_lock<std::mutex> guard{mtx_};
  auto& o = out_[peer];
  o.peer = peer;
  bool moved = o.address.host != parsed->first.host
               || o.address.port != parsed->first.port
               || o.incarnation != parsed->second;
  if (moved && o.state == link_state::connected)
    break_outgoing(o, transport_errc::peer_lost, peer + " restarted", done);
  o.address = parsed->first;
  o.incarnation = parsed->second;
  if (o.state == link_state::connected) {
    guard.unlock();
    deliver(done);
    return caf::none;
  }
  // A handshake in flight towards the old details is superseded.
  if (o.state != link_state::connecting || moved)
    start_attempt(o);
  auto attempt = o.attempt;
  auto limit = handshake_timeout() * 3 + std::chrono::seconds{1};
  // find(), not operator[]: a drop_peer() while we wait erases the entry,
  // and must not have it re-created here as an idle peer with no address.
  cv_.wait_for(guard, limit, [&] {
    auto x = out_.find(peer);
    return stop_ || x == out_.end() || x->second.attempt != attempt
           || x->second.state != link_state::connecting;
  });
  auto x = out_.find(peer);
  caf::error result;
  if (x == out_.end())
    result = lost("verbs connection to " + peer
                  + " was dropped while its handshake ran");
  else if (x->second.state != link_state::connected)
    result =
        x->second.last_error
            ? x->second.last_error
            : lost("verbs handshake with " + peer + " did not finish in time");
  guard.unlock();
  deliver(done);
  return result;
}

void verbs_backend::start_attempt(outgoing& o) {
  o.state = link_state::connecting;
  o.attempt = next_attempt_++; // unique: a stale attempt never matches
  connect_jobs_.emplace_back(o.peer, o.attempt);
  jobs_cv_.notify_one();
  cv_.notify_all(); // a connect() waiting for a superseded attempt
}

void verbs_backend::connector_loop() {
  std::unique_lock<std::mutex> guard{mtx_};
  for (;;) {
    jobs_cv_.wait(guard, [&] { return stop_ || !connect_jobs_.empty(); });
    if (stop_)
      return;
    auto [peer, attempt] = connect_jobs_.front();
    connect_jobs_.pop_front();
    auto i = out_.find(peer);
    if (i == out_.end() || i->second.attempt != attempt
        || i->second.state != link_state::connecting)
      continue;
    auto address = i->second.address;
    auto incarnation = i->second.incarnation;
    ++i->second.fetches; // the handshake brings the peer's table
    guard.unlock();
    auto res = client_handshake(peer, address, incarnation);
    done_list done;
    guard.lock();
    finish_attempt(peer, attempt, std::move(res), done);
    cv_.notify_all();
    guard.unlock();
    deliver(done);
    guard.lock();
  }
}

caf::expected<verbs_backend::client_result> verbs_backend::client_handshake(
    const std::string& peer, verbs::host_port address, uint64_t incarnation) {
  auto where =
      peer + " at " + address.host + ":" + std::to_string(address.port);
  auto ch = verbs::channel::dial(address.host, address.port, opts_.io_timeout);
  if (!ch)
    return ch.error();
  auto f = ch->receive(handshake_timeout());
  if (!f)
    return f.error();
  if (f->type != frame_type::challenge)
    return refused(transport_errc::bad_frame, where + " sent no challenge");
  verbs::wire_reader r{f->body};
  auto version = r.u16();
  uint8_t nonce_s[32];
  r.raw(nonce_s, 32);
  auto node_s = r.text(255);
  auto inc_s = r.u64();
  if (!r.done())
    return refused(transport_errc::bad_frame, where + ": malformed challenge");
  if (version != verbs::wire_version)
    return refused(transport_errc::unsupported,
                   where + " speaks verbs handshake version "
                       + std::to_string(version) + ", this node "
                       + std::to_string(verbs::wire_version));
  if (node_s != peer)
    return refused(transport_errc::peer_lost,
                   where + " is node '" + node_s + "', not '" + peer + "'");
  if (incarnation != 0 && inc_s != incarnation)
    return refused(transport_errc::peer_lost,
                   peer + " restarted (connect again with its new details)");
  client_result out;
  out.lanes = 1 + kv_lanes_.size();
  {
    std::lock_guard<std::mutex> guard{mtx_};
    if (auto err = reserve_outgoing())
      return err;
    // Lane 0 completes on the main CQ, KV lane k on its lane's CQ; every
    // receive queue (never used by a sender) on the main one.
    for (size_t l = 0; l < out.lanes; ++l) {
      auto* send_cq = l == 0 ? cq_.get() : kv_lanes_[l - 1]->cq.get();
      auto made = verbs::queue_pair::make(dev_, send_cq, cq_.get(),
                                          opts_.verbs_max_outstanding, 1);
      if (!made) {
        for (auto& q : out.qps)
          q.reset();
        unreserve_outgoing();
        return made.error();
      }
      out.qps[l] = std::make_shared<verbs::queue_pair>(std::move(*made));
    }
  }
  // From here on the queue pairs count against the CQs until installed.
  auto give_back = [&](caf::error err) -> caf::expected<client_result> {
    std::lock_guard<std::mutex> guard{mtx_};
    for (auto& q : out.qps)
      q.reset();
    unreserve_outgoing();
    return err;
  };
  verbs::qp_endpoint mine;
  mine.address = dev_.address();
  mine.lanes = static_cast<uint8_t>(out.lanes);
  for (size_t l = 0; l < out.lanes; ++l) {
    mine.qpn[l] = out.qps[l]->num();
    mine.psn[l] = out.qps[l]->psn();
  }
  uint8_t nonce_c[32];
  random_nonce(nonce_c);
  verbs::wire_writer w;
  w.raw(nonce_c, 32);
  w.text(opts_.node);
  w.u64(incarnation_);
  w.endpoint(mine);
  w.seal(opts_.secret, 'c', nonce_s);
  if (auto err = ch->send(frame_type::hello, w.bytes(), opts_.io_timeout))
    return give_back(std::move(err));
  // The peer answers after its queue pairs reached RTR, which resolves our
  // address first (ARP on RoCE): allow for that.
  auto g = ch->receive(handshake_timeout());
  if (!g)
    return give_back(g.error());
  if (g->type == frame_type::refused) {
    verbs::wire_reader rr{g->body};
    return give_back(
        refused(transport_errc::unauthenticated,
                where + " refused the verbs handshake: " + rr.text(1024)));
  }
  if (g->type != frame_type::welcome)
    return give_back(refused(transport_errc::bad_frame,
                             where + " answered the hello with frame type "
                                 + std::to_string(static_cast<int>(g->type))));
  if (!verbs::mac_ok(opts_.secret, 's', nonce_c, g->body)) {
    {
      std::lock_guard<std::mutex> guard{mtx_};
      ++stats_.rejected_unauthenticated;
    }
    return give_back(refused(transport_errc::unauthenticated,
                             where + " does not hold transport.secret"));
  }
  auto content = content_of(g->body);
  verbs::wire_reader r2{content};
  auto theirs = r2.endpoint();
  out.table = r2.table();
  if (!r2.done())
    return give_back(
        refused(transport_errc::bad_frame, where + ": malformed welcome"));
  if (theirs.lanes != out.lanes)
    return give_back(refused(
        transport_errc::bad_frame,
        where + " answered with " + std::to_string(theirs.lanes)
            + " queue pairs for " + std::to_string(out.lanes) + " lanes"));
  for (size_t l = 0; l < out.lanes; ++l) {
    if (auto err = out.qps[l]->to_rtr(dev_, theirs, l))
      return give_back(std::move(err));
    if (auto err = out.qps[l]->to_rts())
      return give_back(std::move(err));
  }
  out.ch = std::move(*ch);
  return out;
}

void verbs_backend::finish_attempt(const std::string& peer, uint64_t attempt,
                                   caf::expected<client_result> res,
                                   done_list& done) {
  auto i = out_.find(peer);
  bool wanted = i != out_.end() && i->second.attempt == attempt
                && i->second.state == link_state::connecting && !stop_;
  if (!wanted || !res) {
    if (res) { // nobody waits for it any more
      for (auto& q : res->qps)
        q.reset();
      unreserve_outgoing();
    }
    if (!wanted)
      return;
    auto& o = i->second;
    o.state = link_state::failed;
    o.last_error = res.error();
    o.retry_at = clock_type::now() + retry_pause;
    auto ids = std::move(o.parked);
    o.parked.clear();
    for (auto id : ids) {
      auto b = batches_.find(id);
      if (b == batches_.end())
        continue;
      ++stats_.peer_lost;
      fail(b->second, transport_errc::peer_lost,
           "no verbs connection to " + peer + ": "
               + config::message_of(o.last_error),
           done);
    }
    return;
  }
  auto& o = i->second;
  o.state = link_state::connected;
  o.conn = next_conn_++;
  o.last_error = caf::none;
  o.lanes = res->lanes;
  for (size_t l = 0; l < res->lanes; ++l)
    o.qps[l] = std::move(res->qps[l]);
  o.table.clear();
  for (auto& e : res->table)
    o.table[e.id] = e;
  o.table_fetch = o.fetches;
  o.fetch_in_flight = false;
  ++stats_.connects;
  side_command c;
  c.kind = side_command::adopt;
  c.conn = o.conn;
  c.sender = true;
  c.ch = std::move(res->ch);
  command_side(std::move(c));
  wake();
  auto ids = std::move(o.parked);
  o.parked.clear();
  for (auto id : ids) {
    auto b = batches_.find(id);
    if (b != batches_.end())
      admit(o, b->second, done);
  }
}

caf::expected<verbs_backend::half_open>
verbs_backend::greet(verbs::channel ch) {
  half_open h;
  random_nonce(h.nonce);
  verbs::wire_writer w;
  w.u16(verbs::wire_version);
  w.raw(h.nonce, 32);
  w.text(opts_.node);
  w.u64(incarnation_);
  if (auto err = ch.send(frame_type::challenge, w.bytes(), opts_.io_timeout))
    return err;
  h.ch = std::move(ch);
  h.until = clock_type::now() + handshake_timeout();
  return h;
}

std::pair<uint64_t, verbs::channel>
verbs_backend::serve_handshake(half_open h, caf::expected<verbs::frame> f) {
  auto& ch = h.ch;
  const auto* nonce_s = h.nonce;
  auto none = std::pair<uint64_t, verbs::channel>{0, verbs::channel{}};
  auto say_no = [&](const std::string& why) {
    verbs::wire_writer w;
    w.text(why);
    static_cast<void>(
        ch.send(frame_type::refused, w.bytes(), opts_.io_timeout));
    return std::pair<uint64_t, verbs::channel>{0, verbs::channel{}};
  };
  if (!f || f->type != frame_type::hello) {
    std::lock_guard<std::mutex> guard{mtx_};
    ++stats_.dropped_half_open;
    return none;
  }
  if (!verbs::mac_ok(opts_.secret, 'c', nonce_s, f->body)) {
    {
      std::lock_guard<std::mutex> guard{mtx_};
      ++stats_.rejected_unauthenticated;
    }
    return say_no("authentication failed (transport.secret differs?)");
  }
  auto content = content_of(f->body);
  verbs::wire_reader r{content};
  uint8_t nonce_c[32];
  r.raw(nonce_c, 32);
  auto node_c = r.text(255);
  r.u64(); // the sender's incarnation (a restart makes a new connection)
  auto theirs = r.endpoint();
  if (!r.done() || node_c.empty()) {
    std::lock_guard<std::mutex> guard{mtx_};
    ++stats_.rejected_bad_frame;
    return say_no("malformed hello");
  }
  verbs::qp_endpoint mine;
  mine.address = dev_.address();
  std::vector<verbs::region_entry> table;
  uint64_t conn = 0;
  {
    std::lock_guard<std::mutex> guard{mtx_};
    // As many queue pairs as the sender has lanes (the wire reader bounds
    // the count to max_lanes), each with its receive queue for immediates.
    const int entries =
        static_cast<int>(theirs.lanes) * static_cast<int>(recv_depth + 1);
    if (auto err = grow_cq(entries))
      return say_no(config::message_of(err));
    incoming in;
    in.peer = node_c;
    in.lanes = theirs.lanes;
    mine.lanes = theirs.lanes;
    conn = next_conn_++;
    caf::error err;
    for (size_t l = 0; l < in.lanes && !err; ++l) {
      auto made =
          verbs::queue_pair::make(dev_, cq_.get(), cq_.get(), 1, recv_depth);
      if (!made) {
        err = made.error();
        break;
      }
      in.qps[l] = std::move(*made);
      for (uint32_t k = 0; k < recv_depth && !err; ++k)
        err = post_recv(in.qps[l].get(), conn);
      if (!err)
        err = in.qps[l].to_rtr(dev_, theirs, l);
      if (!err)
        err = in.qps[l].to_rts();
      mine.qpn[l] = in.qps[l].num();
      mine.psn[l] = in.qps[l].psn();
    }
    if (err) {
      cq_used_ -= entries;
      return say_no(config::message_of(err));
    }
    // One receiving connection per sending node: a new one replaces it.
    std::vector<uint64_t> old;
    for (auto& [id, x] : in_)
      if (x.peer == node_c)
        old.push_back(id);
    for (auto id : old)
      drop_incoming(id);
    in_.emplace(conn, std::move(in));
    ++stats_.connections_accepted;
    table = table_snapshot();
  }
  verbs::wire_writer v;
  v.endpoint(mine);
  v.table(table);
  v.seal(opts_.secret, 's', nonce_c);
  if (ch.send(frame_type::welcome, v.bytes(), opts_.io_timeout)) {
    std::lock_guard<std::mutex> guard{mtx_};
    drop_incoming(conn);
    return none;
  }
  return {conn, std::move(ch)};
}

void verbs_backend::side_loop() {
  struct link {
    verbs::channel ch;
    bool sender = false;
  };
  std::map<uint64_t, link> links;
  std::vector<half_open> greeting;
  while (!stop_) {
    std::vector<pollfd> fds;
    std::vector<uint64_t> conns;
    fds.push_back(pollfd{listener_.fd.get(), POLLIN, 0});
    fds.push_back(pollfd{wake_fd_.get(), POLLIN, 0});
    for (auto& [conn, l] : links) {
      fds.push_back(pollfd{l.ch.fd(), POLLIN, 0});
      conns.push_back(conn);
    }
    const size_t greeted = greeting.size();
    for (auto& h : greeting)
      fds.push_back(pollfd{h.ch.fd(), POLLIN, 0});
    int n = ::poll(fds.data(), fds.size(), 200);
    if (n < 0 && errno != EINTR)
      static_cast<void>(verbs::scall("poll", n)); // retried next round
    if (fds[1].revents & POLLIN) {
      uint64_t x = 0;
      static_cast<void>(::read(wake_fd_.get(), &x, sizeof(x)));
    }
    std::vector<side_command> cmds;
    {
      std::lock_guard<std::mutex> guard{commands_mtx_};
      cmds.swap(commands_);
    }
    std::vector<std::pair<uint64_t, caf::error>> lost;
    for (auto& c : cmds) {
      if (c.kind == side_command::adopt) {
        links[c.conn] = link{std::move(c.ch), c.sender};
      } else if (c.kind == side_command::close) {
        links.erase(c.conn);
      } else if (auto l = links.find(c.conn); l != links.end()) {
        if (auto err = l->second.ch.send(c.type, c.body, opts_.io_timeout))
          lost.emplace_back(c.conn, std::move(err));
      }
    }
    if (stop_)
      break;
    // Handshakes being served wait for their hello without holding up the
    // others (a slow peer costs only itself, at most handshake_timeout()).
    for (size_t k = 0; k < greeted; ++k) {
      auto& h = greeting[k];
      auto ev = fds[2 + conns.size() + k].revents;
      if ((ev & (POLLIN | POLLHUP | POLLERR)) == 0
          && clock_type::now() < h.until)
        continue;
      auto f = (ev & (POLLIN | POLLHUP | POLLERR)) != 0
                   ? h.ch.receive(opts_.io_timeout)
                   : caf::expected<verbs::frame>{
                       refused(transport_errc::peer_lost, "no hello")};
      auto [conn, served] = serve_handshake(std::move(h), std::move(f));
      if (conn != 0)
        links[conn] = link{std::move(served), false};
      h.ch = verbs::channel{};
    }
    greeting.erase(std::remove_if(greeting.begin(), greeting.end(),
                                  [](const half_open& h) { return !h.ch; }),
                   greeting.end());
    if (fds[0].revents & POLLIN)
      for (;;) {
        auto ch = listener_.accept();
        if (!ch || !*ch)
          break;
        if (greeting.size() >= max_half_open) {
          std::lock_guard<std::mutex> guard{mtx_};
          ++stats_.dropped_half_open;
          continue; // closed: too many handshakes at once
        }
        if (auto h = greet(std::move(*ch)))
          greeting.push_back(std::move(*h));
      }
    for (size_t k = 0; k < conns.size(); ++k) {
      if ((fds[k + 2].revents & (POLLIN | POLLHUP | POLLERR)) == 0)
        continue;
      auto l = links.find(conns[k]);
      if (l == links.end())
        continue;
      auto f = l->second.ch.receive(opts_.io_timeout);
      if (!f) {
        lost.emplace_back(conns[k], f.error());
        continue;
      }
      if (f->type == frame_type::regions_req && !l->second.sender) {
        verbs::wire_writer w;
        {
          std::lock_guard<std::mutex> guard{mtx_};
          w.table(table_snapshot());
        }
        if (auto err = l->second.ch.send(frame_type::regions, w.bytes(),
                                         opts_.io_timeout))
          lost.emplace_back(conns[k], std::move(err));
      } else if (l->second.sender
                 && (f->type == frame_type::regions
                     || f->type == frame_type::region_gone)) {
        on_side_frame(conns[k], std::move(*f));
      } else {
        lost.emplace_back(conns[k], refused(transport_errc::bad_frame,
                                            "unexpected side-channel frame"));
      }
    }
    for (auto& [conn, why] : lost) {
      auto l = links.find(conn);
      if (l == links.end())
        continue;
      bool sender = l->second.sender;
      links.erase(l);
      on_side_lost(conn, sender, why);
    }
  }
}

void verbs_backend::on_side_frame(uint64_t conn, verbs::frame f) {
  done_list done;
  {
    std::lock_guard<std::mutex> guard{mtx_};
    auto* o = find_conn(conn);
    if (o == nullptr)
      return;
    verbs::wire_reader r{f.body};
    if (f.type == frame_type::region_gone) {
      auto id = r.u32();
      if (r.done())
        o->table.erase(id);
      return;
    }
    auto table = r.table();
    if (!r.done()) {
      break_outgoing(*o, transport_errc::bad_frame,
                     o->peer + " sent a malformed region table", done);
    } else {
      o->table.clear();
      for (auto& e : table)
        o->table[e.id] = e;
      o->table_fetch = o->fetches;
      o->fetch_in_flight = false;
      auto ids = std::move(o->parked);
      o->parked.clear();
      for (auto id : ids) {
        auto b = batches_.find(id);
        if (b != batches_.end())
          admit(*o, b->second, done);
      }
    }
  }
  deliver(done);
}

void verbs_backend::on_side_lost(uint64_t conn, bool sender,
                                 const caf::error& why) {
  done_list done;
  {
    std::lock_guard<std::mutex> guard{mtx_};
    if (sender) {
      if (auto* o = find_conn(conn))
        break_outgoing(*o, transport_errc::peer_lost,
                       "lost " + o->peer + ": " + config::message_of(why),
                       done);
    } else {
      drop_incoming(conn);
    }
  }
  deliver(done);
}

} // namespace dualpath::transport::bulk
