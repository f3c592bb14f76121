// The tcp backend: one-sided writes over real sockets, in three parts.
//
// Wire: a connection per (peer, traffic class), so a kv backlog in the
// kernel's socket buffers never sits in front of control bytes (the tcp
// analogue of a queue pair per class). tcp_handshake authenticates both ends
// with HMAC-SHA256 over fresh nonces; then the client sends frames (a fixed
// header, tcp_wire.hpp, followed by `length` payload bytes) and the receiver
// answers each with an acknowledgement. tcp_sender queues, arbitrates and
// writes; tcp_receiver checks and lands incoming writes; tcp_context holds
// what both share. This file glues them behind `backend`.
#include <arpa/inet.h>
#include <netinet/in.h>

#include <cstdlib>

#include "transport/bulk/backend.hpp"
#include "transport/bulk/tcp_context.hpp"
#include "transport/bulk/tcp_receiver.hpp"
#include "transport/bulk/tcp_sender.hpp"

namespace dualpath::transport::bulk {

namespace {

class tcp_backend final : public backend {
public:
  explicit tcp_backend(const options& opts)
      : ctx_(opts), receiver_(ctx_), sender_(ctx_) {
    // nop
  }

  ~tcp_backend() override {
    // The sender first: it fails what is still pending and delivers those
    // completions; then no thread touches the context.
    sender_.stop();
    receiver_.stop();
  }

  caf::error start() {
    if (auto err = receiver_.start())
      return err;
    return sender_.start();
  }

  capabilities caps() const override {
    capabilities c;
    c.name = "tcp";
    c.immediate = true;
    c.cross_process = true;
    return c;
  }

  const std::string& node() const override {
    return ctx_.opts.node;
  }

  caf::expected<local_registration>
  register_region(void* ptr, uint64_t len, memory_kind kind, int) override {
    if (auto err = check_host_region("tcp", ptr, len, kind))
      return err;
    auto desc = ctx_.regions.add(ctx_.opts.node, ptr, len);
    return local_registration{this, ptr, len, kind, std::move(desc)};
  }

  caf::expected<std::vector<uint8_t>> details_for(const std::string&) override {
    auto s = ctx_.opts.listen_host + ":" + std::to_string(receiver_.port());
    return std::vector<uint8_t>{s.begin(), s.end()};
  }

  caf::error connect(const std::string& peer,
                     const std::vector<uint8_t>& details) override {
    std::string s{details.begin(), details.end()};
    auto colon = s.rfind(':');
    if (colon == std::string::npos)
      return caf::make_error(transport_errc::bad_config,
                             "tcp details must be host:port, got " + s);
    auto digits = s.substr(colon + 1);
    auto port = std::strtoul(digits.c_str(), nullptr, 10);
    if (digits.empty()
        || digits.find_first_not_of("0123456789") != std::string::npos
        || port == 0 || port > 65535)
      return caf::make_error(transport_errc::bad_config, "bad port in " + s);
    auto host = s.substr(0, colon);
    in_addr addr{};
    if (::inet_pton(AF_INET, host.c_str(), &addr) != 1)
      return caf::make_error(transport_errc::bad_config,
                             "tcp details: host is not an IPv4 address: " + s);
    sender_.set_address(peer, std::move(host), static_cast<uint16_t>(port));
    return caf::none;
  }

  void post(batch b, completion_sink sink) override {
    post_defaults(b, ctx_.opts);
    auto err = validate(b);
    if (!err)
      err = sender_.enqueue(b, sink);
    if (!err)
      return;
    ctx_.stats.batches_posted += 1;
    ctx_.stats.batches_failed += 1;
    if (sink)
      sink(completion{b.tag, 0, static_cast<uint32_t>(b.writes.size()),
                      std::move(err)});
  }

  void on_immediate(immediate_handler f) override {
    ctx_.on_immediate(std::move(f));
  }

  counters stats() const override {
    return ctx_.stats.snapshot();
  }

  void drop_peer(const std::string& peer) override {
    // Outbound: its lanes close the connections and fail what is pending
    // (asynchronously). Inbound: closed before the return, so no write the
    // peer had begun lands later (tcp_receiver::drop_peer).
    sender_.drop_peer(peer);
    receiver_.drop_peer(peer);
  }

protected:
  void deregister(uint32_t region_id) override {
    // Batches still reading it fail now (unknown_region), not at their
    // deadline; incoming writes finish landing.
    ctx_.regions.remove(region_id, [&] { sender_.cancel_source(region_id); });
  }

private:
  tcp_context ctx_;
  tcp_receiver receiver_;
  tcp_sender sender_;
};

} // namespace

caf::expected<std::unique_ptr<backend>> make_tcp_backend(const options& opts) {
  if (opts.secret.empty())
    return caf::make_error(transport_errc::unauthenticated,
                           "transport.secret must be set for the tcp backend");
  auto ptr = std::make_unique<tcp_backend>(opts);
  if (auto err = ptr->start())
    return err;
  return std::unique_ptr<backend>{std::move(ptr)};
}

} // namespace dualpath::transport::bulk
