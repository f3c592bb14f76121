// ctest-label: foundation
// Every message type of the vocabulary round-trips through CAF's binary
// serializer unchanged, and deep_to_string shows every field.
#include <doctest/doctest.h>

#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/binary_deserializer.hpp>
#include <caf/binary_serializer.hpp>
#include <caf/deep_to_string.hpp>

#include "actors/protocol/register.hpp"
#include "actors/protocol/type_ids.hpp"
#include "transport/errors.hpp"
#include "transport/type_ids.hpp"

using namespace dualpath;
using namespace dualpath::actors;
using transport::remote_region;
using transport::traffic_class;

namespace {

// Distinct field values, so each one can be found in deep_to_string's output.
remote_region region(uint64_t seed) {
  return remote_region{"node" + std::to_string(seed),
                       uint32_t(seed + 1),
                       seed + 2,
                       seed + 3,
                       seed + 4,
                       seed + 5};
}

engine_id engine(uint32_t seed) {
  return engine_id{"eng" + std::to_string(seed), engine_role::decode, seed + 7};
}

request_spec request() {
  return request_spec{9001, 9002, 9003, {9004, 9005}, 9006, {9008}, 9007};
}

struct fixture {
  caf::actor_system_config cfg;
  caf::actor_system sys;
  fixture() : sys(init(cfg)) {
  }
  static caf::actor_system_config& init(caf::actor_system_config& cfg) {
    add_message_types(cfg);
    return cfg;
  }

  template <class T>
  void check(T value, std::vector<std::string> fields) {
    std::vector<char> buf;
    caf::binary_serializer sink{sys, buf};
    REQUIRE(!sink(value));
    T copy{};
    caf::binary_deserializer source{sys, buf};
    REQUIRE(!source(copy));
    auto str = caf::deep_to_string(value);
    CHECK_EQ(caf::deep_to_string(copy), str);
    for (auto& f : fields)
      CHECK_MESSAGE(str.find(f) != std::string::npos,
                    "field value " << f << " missing from " << str);
    ++checked;
  }

  size_t checked = 0;
};

} // namespace

TEST_CASE_FIXTURE(fixture, "every message round-trips and prints every field") {
  check(traffic_class::kv, {"kv"});
  check(region(10), {"\"node10\"", "11", "12", "13", "14", "15"});
  check(engine_role::decode, {"decode"});
  check(engine(20), {"\"eng20\"", "27"});
  check(request(),
        {"9001", "9002", "9003", "9004", "9005", "9006", "9007", "9008"});
  check(read_plan{31, 32}, {"31", "32"});
  check(
      assignment{request(), engine(40), engine(50), read_plan{61, 62}, {}, {}},
      {"9001", "\"eng40\"", "\"eng50\"", "61", "62"});
  check(work_batch{{assignment{request(), engine(40), engine(50), {}, {}, {}}}},
        {"9001", "\"eng40\""});
  check(request_result{101, engine(1), engine(2), 103, 104, 105, 106, 107, 108,
                       109, 110, 111, 112, 113, 114, 115, 116},
        {"101", "\"eng1\"", "\"eng2\"", "103", "104", "105", "106", "107",
         "108", "109", "110", "111", "112", "113", "114", "115", "116"});
  check(engine_load{engine(3), 121, 122, 123, 124, 125},
        {"\"eng3\"", "121", "122", "123", "124", "125"});
  check(group_report{131,
                     engine_role::decode,
                     {engine_load{engine(4), 132, 133, 134, 135, 136}}},
        {"131", "\"eng4\"", "132", "136"});
  check(engine_registration{engine(5), 141, caf::actor{}}, {"\"eng5\"", "141"});
  check(read_request{151, {152, 153}, 154, 155},
        {"151", "152", "153", "154", "155"});
  check(buffer_lease{161, 162, 163, region(164), 160},
        {"161", "162", "163", "\"node164\"", "160"});
  check(
      read_completion{
          171, {buffer_lease{172, 173, 174, region(175)}}, {176}, false, {}},
      {"171", "172", "173", "174", "\"node175\"", "176"});
  check(read_queue_status{181, 182, 183}, {"181", "182", "183"});
  check(persist_request{191, 192, 193, region(194)},
        {"191", "192", "193", "\"node194\""});
  check(persist_batch{{195, 196}, 197, 198}, {"195", "196", "197", "198"});
  check(decode_slot{241, {region(242), region(243)}, {244}},
        {"241", "\"node242\"", "\"node243\"", "244"});
  check(layer_chunk{251, 252, 253, 254, region(255)},
        {"251", "252", "253", "254", "\"node255\""});
  check(layer_batch{256, 257, {layer_chunk{258, 259, 260, 261, region(262)}}},
        {"256", "257", "258", "259", "260", "261", "\"node262\""});
  check(prefill_summary{361, 362, 363, 364, 365},
        {"361", "362", "363", "364", "365"});
  check(reserve_request{366, {367, 368}}, {"366", "367", "368"});
  check(lease_release{{371, 372, 373}}, {"371", "372", "373"});
  check(endpoint_info{"n261", "tcp", "127.0.0.1:262", {26, 3}},
        {"\"n261\"", "\"tcp\"", "127.0.0.1:262", "26", "3"});
  check(write_op{271, 272, region(273)}, {"271", "272", "\"node273\""});
  check(
      write_batch{
          281, traffic_class::control, 282, {write_op{283, 284, region(285)}}},
      {"281", "282", "283", "284", "\"node285\""});
  check(batch_completion{291, 292, 293,
                         caf::make_error(transport::transport_errc::wrong_key,
                                         "boom294")},
        {"291", "292", "293", "boom294"});
  check(node_info{"n301",
                  {engine(302)},
                  endpoint_info{"n303", "tcp", "a304", {}},
                  {"reader305"},
                  {},
                  "digest306",
                  "model.layers = 307\n"},
        {"\"n301\"", "\"eng302\"", "\"n303\"", "a304", "reader305", "digest306",
         "model.layers = 307"});
  check(cluster_view{311, {node_info{"n312", {}, {}, {}, {}, {}, {}}}, 313},
        {"311", "\"n312\"", "313"});
  check(metric_sample{"m321", 322.5}, {"m321", "322.5"});
  check(state_snapshot{"s331", 332, {metric_sample{"m333", 334}}},
        {"s331", "332", "m333", "334"});
  check(event_record{"s341", "reroute342", 343, 344, "d345"},
        {"s341", "reroute342", "343", "344", "d345"});
  check(request_failure{351, engine(352),
                        caf::make_error(transport::transport_errc::peer_lost,
                                        "gone353")},
        {"351", "\"eng352\"", "gone353"});
  step_chunk chunk{381,
                   caf::actor{},
                   382,
                   383,
                   384,
                   true,
                   385,
                   {386},
                   {buffer_lease{387, 388, 389, region(390)}},
                   decode_slot{391, {region(392)}, {393}}};
  check(chunk, {"381", "382", "383", "384", "true", "385", "386", "387", "388",
                "389", "\"node390\"", "391", "\"node392\"", "393"});
  check(step_lane{{chunk}, 394}, {"381", "393", "394"});
  check(prefill_step{395, {step_lane{{chunk}, 396}}, 397, 398, 399.5},
        {"395", "381", "396", "397", "398", "399.5"});
  // Every registered type was checked: adding a message without a test fails.
  CHECK_EQ(checked, registered_type_names().size());
}

TEST_CASE_FIXTURE(fixture, "a request's tokens: copies share, loads do not") {
  auto r = request();
  auto copy = r;
  CHECK(copy.tokens.shares_with(r.tokens));
  CHECK_EQ(caf::deep_to_string(r.tokens), "[9004, 9005]");
  // Through the serializer (another node): equal ids in a buffer of its own.
  std::vector<char> buf;
  caf::binary_serializer sink{sys, buf};
  REQUIRE(!sink(r));
  request_spec loaded;
  loaded.tokens = token_list{1, 2, 3};
  auto other = loaded.tokens; // shares the buffer the load replaces
  caf::binary_deserializer source{sys, buf};
  REQUIRE(!source(loaded));
  CHECK(loaded.tokens == r.tokens);
  CHECK_FALSE(loaded.tokens.shares_with(r.tokens));
  CHECK(other == token_list{1, 2, 3}); // not overwritten in place
  CHECK_EQ(r.tokens.size(), 2u);
  // Empty lists hold no buffer and equal each other.
  CHECK(token_list{} == token_list{std::vector<uint32_t>{}});
  CHECK(token_list{}.empty());
  CHECK_FALSE(token_list{}.shares_with(token_list{}));
}

TEST_CASE("registered names are the fully qualified type names") {
  auto names = registered_type_names();
  CHECK(std::find(names.begin(), names.end(), "dualpath::actors::request_spec")
        != names.end());
  CHECK(std::find(names.begin(), names.end(),
                  "dualpath::transport::remote_region")
        != names.end());
}

TEST_CASE("subrange is bounds-checked and overflow-safe") {
  auto r = region(0);
  r.offset = 0;
  r.length = 100;
  auto sub = r.subrange(10, 20);
  REQUIRE(sub);
  CHECK_EQ(sub->offset, 10u);
  CHECK_EQ(sub->length, 20u);
  auto subsub = sub->subrange(5, 15);
  REQUIRE(subsub);
  CHECK_EQ(subsub->offset, 15u);
  CHECK_EQ(subsub->length, 15u);
  CHECK_FALSE(sub->subrange(5, 16));
  CHECK_FALSE(r.subrange(101, 0));
  CHECK(r.subrange(100, 0));
  CHECK_FALSE(r.subrange(1, UINT64_MAX));
  CHECK_FALSE(r.subrange(UINT64_MAX, 2));
}
