// ctest-label: foundation
// ctest-links: actors_engines transport_storage scheduler_workload scheduler
// The name tables of config/enum_names.hpp: a value past the table falls back
// to "<type>(<number>)", words parse back to their values, and every table of
// the tree names its enum's first and last enumerator by its own word (a
// missing or shifted entry would name the last one wrongly or not at all).
#include <doctest/doctest.h>

#include <string>
#include <string_view>
#include <utility>

#include "actors/engines/engine_context.hpp"
#include "actors/protocol/messages.hpp"
#include "config/enum_names.hpp"
#include "config/errors.hpp"
#include "config/settings.hpp"
#include "config/value.hpp"
#include "gpu/device.hpp"
#include "gpu/errors.hpp"
#include "scheduler/path_choice.hpp"
#include "scheduler/policy.hpp"
#include "scheduler/workload/errors.hpp"
#include "transport/bulk/backend.hpp"
#include "transport/errors.hpp"
#include "transport/storage/backend.hpp"
#include "transport/storage/errors.hpp"
#include "transport/types.hpp"

using namespace dualpath;

namespace {

enum class toy : uint8_t { a, b, c };

constexpr std::string_view toy_names[] = {"a", "b"};

} // namespace

TEST_CASE("a value the table does not name falls back to type(number)") {
  CHECK(config::name_of(toy::a, toy_names, "toy") == "a");
  CHECK(config::name_of(toy::b, toy_names, "toy") == "b");
  CHECK(config::name_of(toy::c, toy_names, "toy") == "toy(2)");
  CHECK(config::name_of(static_cast<toy>(200), toy_names, "toy") == "toy(200)");
}

TEST_CASE("words parse back to their values; others leave the value alone") {
  auto x = toy::a;
  CHECK(config::parse_name("b", toy_names, x));
  CHECK(x == toy::b);
  CHECK_FALSE(config::parse_name("c", toy_names, x));
  CHECK_FALSE(config::parse_name("", toy_names, x));
  CHECK(x == toy::b);
}

TEST_CASE("every table names its enum's first and last enumerator") {
  const std::pair<std::string, std::string_view> named[] = {
      {to_string(config::value_type::boolean), "boolean"},
      {to_string(config::value_type::string), "string"},
      {to_string(config::value_source::schema_default), "default"},
      {to_string(config::value_source::override_value), "override"},
      {to_string(config::config_errc::none), "none"},
      {to_string(config::config_errc::malformed_override),
       "malformed_override"},
      {to_string(scheduler::read_mode::pe_only), "pe_only"},
      {to_string(scheduler::read_mode::split), "split"},
      {to_string(scheduler::policy_kind::basic), "basic"},
      {to_string(scheduler::policy_kind::dualpath), "dualpath"},
      {to_string(scheduler::workload::workload_errc::none), "none"},
      {to_string(scheduler::workload::workload_errc::bad_parameter),
       "bad_parameter"},
      {to_string(transport::traffic_class::control), "control"},
      {to_string(transport::traffic_class::kv), "kv"},
      {to_string(transport::transport_errc::none), "none"},
      {to_string(transport::transport_errc::bad_config), "bad_config"},
      {to_string(transport::bulk::tcp_cpu_sched::normal), "normal"},
      {to_string(transport::bulk::tcp_cpu_sched::idle), "idle"},
      {to_string(transport::storage::io_mode::buffered), "buffered"},
      {to_string(transport::storage::io_mode::direct), "direct"},
      {to_string(transport::storage::backend_kind::automatic), "auto"},
      {to_string(transport::storage::backend_kind::pread), "pread"},
      {to_string(transport::storage::storage_errc::none), "none"},
      {to_string(transport::storage::storage_errc::not_regular_file),
       "not_regular_file"},
      {to_string(gpu::backend_kind::host), "host"},
      {to_string(gpu::backend_kind::cuda), "cuda"},
      {to_string(gpu::backend_choice::automatic), "auto"},
      {to_string(gpu::backend_choice::host), "host"},
      {to_string(gpu::copy_method::per_chunk), "per_chunk"},
      {to_string(gpu::copy_method::automatic), "automatic"},
      {to_string(gpu::gpu_errc::none), "none"},
      {to_string(gpu::gpu_errc::driver_too_old), "driver_too_old"},
      {to_string(actors::engine_role::prefill), "prefill"},
      {to_string(actors::engine_role::decode), "decode"},
      {to_string(actors::load_mode::basic), "basic"},
      {to_string(actors::load_mode::oracle), "oracle"},
      {to_string(actors::batching::quota), "quota"},
      {to_string(actors::batching::token_budget), "token_budget"},
  };
  for (auto& [got, want] : named)
    CHECK(got == want);
}

TEST_CASE("from_string reads what to_string writes") {
  auto k = transport::storage::backend_kind::automatic;
  CHECK(transport::storage::from_string("io_uring", k));
  CHECK(k == transport::storage::backend_kind::io_uring);
  CHECK_FALSE(transport::storage::from_string("uring", k));
  auto tc = transport::traffic_class::control;
  CHECK(transport::from_string("kv", tc));
  CHECK(tc == transport::traffic_class::kv);
  auto m = actors::load_mode::basic;
  CHECK(actors::from_string("layerwise", m));
  CHECK(m == actors::load_mode::layerwise);
}
