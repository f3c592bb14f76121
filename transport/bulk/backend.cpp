#include "transport/bulk/backend.hpp"

#include <utility>

namespace dualpath::transport::bulk {

std::string to_string(memory_kind x) {
  return x == memory_kind::host ? "host" : "device";
}

std::string to_string(tcp_cpu_sched x) {
  switch (x) {
    case tcp_cpu_sched::normal:
      return "normal";
    case tcp_cpu_sched::batch:
      return "batch";
    case tcp_cpu_sched::idle:
      return "idle";
  }
  return "tcp_cpu_sched(" + std::to_string(static_cast<int>(x)) + ")";
}

local_registration::local_registration(local_registration&& other) noexcept
    : lkey(other.lkey),
      owner_(std::exchange(other.owner_, nullptr)),
      ptr_(other.ptr_),
      len_(other.len_),
      kind_(other.kind_),
      desc_(std::move(other.desc_)) {
  // nop
}

local_registration&
local_registration::operator=(local_registration&& other) noexcept {
  if (this != &other) {
    release();
    lkey = other.lkey;
    owner_ = std::exchange(other.owner_, nullptr);
    ptr_ = other.ptr_;
    len_ = other.len_;
    kind_ = other.kind_;
    desc_ = std::move(other.desc_);
  }
  return *this;
}

local_registration::~local_registration() {
  release();
}

void local_registration::release() {
  if (auto owner = std::exchange(owner_, nullptr))
    owner->deregister(desc_.region_id);
}

backend::~backend() {
  // nop
}

caf::error backend::validate(const batch& b) {
  if (b.writes.empty())
    return caf::make_error(transport_errc::bad_frame, "empty batch");
  const auto& node = b.writes.front().destination.node;
  for (const auto& w : b.writes) {
    if (w.source == nullptr || !*w.source)
      return caf::make_error(transport_errc::unknown_region,
                             "write without a local registration");
    if (w.destination.node != node)
      return caf::make_error(transport_errc::bad_frame,
                             "a batch must target one node");
    auto len = w.destination.length;
    if (w.source_offset > w.source->size()
        || len > w.source->size() - w.source_offset)
      return caf::make_error(transport_errc::out_of_bounds,
                             "source range outside the local registration");
  }
  return caf::none;
}

void post_defaults(batch& b, const options& opts) {
  if (b.deadline == clock_type::time_point{})
    b.deadline = clock_type::now() + opts.default_deadline;
}

caf::expected<std::unique_ptr<backend>>
make_backend(const options& opts, std::shared_ptr<local_fabric> fabric,
             std::string* chosen) {
  auto say = [&](std::string what) {
    if (chosen)
      *chosen = std::move(what);
  };
  if (opts.backend == "local") {
    if (!fabric)
      fabric = make_local_fabric();
    say("local");
    return make_local_backend(opts, std::move(fabric));
  }
  if (opts.backend == "tcp") {
    say("tcp");
    return make_tcp_backend(opts);
  }
  if (opts.backend == "verbs") {
    say("verbs");
    return make_verbs_backend(opts);
  }
  if (opts.backend != "auto")
    return caf::make_error(transport_errc::unsupported,
                           "transport.backend must be auto|verbs|tcp|local, "
                           "not "
                               + opts.backend);
  auto v = make_verbs_backend(opts);
  if (v) {
    say("verbs (auto: RDMA device found)");
    return v;
  }
  std::string why =
      v.error().code() == static_cast<uint8_t>(transport_errc::no_device)
          ? "no RDMA device"
          : "verbs failed";
  say("tcp (auto: " + why + ")");
  return make_tcp_backend(opts);
}

} // namespace dualpath::transport::bulk
