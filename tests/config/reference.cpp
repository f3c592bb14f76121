// ctest-label: foundation
// config/reference.toml is exactly what `dualpath config --reference`
// generates from the schema, so it cannot drift from the code, and it is a
// valid configuration file holding every default.
#include "config/settings.hpp"

#include <doctest/doctest.h>

#include <fstream>
#include <sstream>

using namespace dualpath::config;

namespace {

const std::string reference_path =
    std::string{DUALPATH_SOURCE_DIR} + "/config/reference.toml";

} // namespace

TEST_CASE("config/reference.toml equals the generated reference") {
  std::ifstream in{reference_path};
  REQUIRE_MESSAGE(in.good(), "cannot read " << reference_path);
  std::stringstream buf;
  buf << in.rdbuf();
  auto generated = reference_toml();
  CHECK_MESSAGE(buf.str() == generated,
                "config/reference.toml is stale: regenerate it with "
                "`build/bin/dualpath config --reference > "
                "config/reference.toml` and commit it");
}

TEST_CASE("the reference lists every key and loads to the defaults") {
  auto text = reference_toml();
  for (auto& spec : schema()) {
    auto line =
        "\n" + spec.short_name() + " = " + to_toml(spec.default_value) + "\n";
    CHECK_MESSAGE(text.find(line) != std::string::npos, spec.name);
  }
  load_request req;
  req.file = reference_path;
  auto s = load(req);
  if (!s)
    FAIL("reference.toml does not load: " << message_of(s.error()));
  for (auto& spec : schema()) {
    CHECK(to_toml(s->get(spec.name)) == to_toml(spec.default_value));
    CHECK(s->source_of(spec.name) == value_source::file);
  }
}
