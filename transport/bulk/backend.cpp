#include "transport/bulk/backend.hpp"

#include "config/enum_names.hpp"
#include "transport/bulk/verbs_backend.hpp"

#include <utility>

namespace dualpath::transport::bulk {

std::string to_string(memory_kind x) {
  return x == memory_kind::host ? "host" : "device";
}

constexpr std::string_view tcp_cpu_sched_names[] = {"normal", "batch", "idle"};

std::string to_string(tcp_cpu_sched x) {
  return config::name_of(x, tcp_cpu_sched_names, "tcp_cpu_sched");
}

bool from_string(std::string_view str, tcp_cpu_sched& x) {
  return config::parse_name(str, tcp_cpu_sched_names, x);
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

caf::error check_host_region(const std::string& backend, const void* ptr,
                             uint64_t len, memory_kind kind) {
  if (kind != memory_kind::host)
    return caf::make_error(transport_errc::unsupported,
                           backend + " backend registers host memory only");
  if (ptr == nullptr || len == 0)
    return caf::make_error(transport_errc::out_of_bounds, "empty region");
  return caf::none;
}

caf::expected<backend_choice>
make_backend(const options& opts, std::shared_ptr<local_fabric> fabric) {
  auto made = [](caf::expected<std::unique_ptr<backend>> b,
                 std::string why) -> caf::expected<backend_choice> {
    if (!b)
      return b.error();
    return backend_choice{std::move(*b), std::move(why)};
  };
  if (opts.backend == "local")
    return made(make_local_backend(opts, fabric ? std::move(fabric)
                                                : make_local_fabric()),
                "local");
  if (opts.backend == "tcp")
    return made(make_tcp_backend(opts), "tcp");
  if (opts.backend == "verbs") {
    auto v = verbs_backend::open(opts);
    if (!v)
      return v.error();
    auto why = "verbs on " + (*v)->description();
    return backend_choice{std::move(*v), std::move(why)};
  }
  if (opts.backend == "auto")
    return make_auto_backend(opts);
  return caf::make_error(transport_errc::unsupported,
                         "transport.backend must be auto|verbs|tcp|local, not "
                             + opts.backend);
}

} // namespace dualpath::transport::bulk
