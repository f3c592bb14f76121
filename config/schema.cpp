#include "config/schema.hpp"

#include <algorithm>
#include <cmath>

#include "config/keys.hpp"
#include "config/profiles.hpp"

namespace dualpath::config {

namespace {

std::string number(double x) {
  return format_real(x);
}

std::vector<key_spec> build_schema() {
  std::vector<key_spec> out;
  // Section order here is the order of --print-config and reference.toml.
  keys::add_hardware(out);
  keys::add_model(out);
  keys::add_workload(out);
  keys::add_storage(out);
  keys::add_transport(out);
  keys::add_gpu(out);
  keys::add_engines(out);
  keys::add_scheduler(out);
  keys::add_run(out);
  keys::add_sim(out);
  keys::add_caf(out);
  keys::add_observe(out);
  return out;
}

} // namespace

bool range::contains(double x) const {
  if (std::isnan(x))
    return false;
  if (min && (min_exclusive ? x <= *min : x < *min))
    return false;
  if (max && x > *max)
    return false;
  return true;
}

std::string range::describe() const {
  if (min && max && !min_exclusive)
    return number(*min) + " .. " + number(*max);
  if (min && max)
    return "> " + number(*min) + " and <= " + number(*max);
  if (min)
    return (min_exclusive ? "> " : ">= ") + number(*min);
  if (max)
    return "<= " + number(*max);
  return "any";
}

std::string key_spec::section() const {
  return name.substr(0, name.find('.'));
}

std::string key_spec::short_name() const {
  auto pos = name.find('.');
  return pos == std::string::npos ? name : name.substr(pos + 1);
}

std::string key_spec::allowed() const {
  switch (type) {
    case value_type::boolean:
      return "true or false";
    case value_type::integer:
    case value_type::real: {
      auto what = type == value_type::integer ? std::string{"an integer"}
                                              : std::string{"a number"};
      auto lim = limits.describe();
      if (lim == "any")
        return what;
      if (limits.min && limits.max && !limits.min_exclusive)
        return what + " in " + lim;
      return what + " " + lim;
    }
    case value_type::string: {
      if (choices.empty())
        return "a string";
      std::string str = "one of ";
      for (size_t i = 0; i < choices.size(); ++i) {
        if (i > 0)
          str += ", ";
        str += choices[i];
      }
      return str;
    }
  }
  return {};
}

const std::vector<key_spec>& schema() {
  static const std::vector<key_spec> table = build_schema();
  return table;
}

const key_spec* find_key(std::string_view name) {
  for (auto& spec : schema())
    if (spec.name == name)
      return &spec;
  return nullptr;
}

std::vector<std::string> sections() {
  std::vector<std::string> out;
  for (auto& spec : schema()) {
    auto sec = spec.section();
    if (out.empty() || out.back() != sec)
      out.push_back(sec);
  }
  return out;
}

size_t edit_distance(std::string_view x, std::string_view y) {
  std::vector<size_t> row(y.size() + 1);
  for (size_t j = 0; j <= y.size(); ++j)
    row[j] = j;
  for (size_t i = 1; i <= x.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= y.size(); ++j) {
      size_t up = row[j];
      size_t cost = x[i - 1] == y[j - 1] ? 0 : 1;
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + cost});
      diag = up;
    }
  }
  return row[y.size()];
}

std::string suggest_key(std::string_view name) {
  // Compare against full names and, for a key given without a section or in
  // the wrong section, against the part after the dot as well.
  auto dot = name.find('.');
  auto tail = dot == std::string_view::npos ? name : name.substr(dot + 1);
  const key_spec* best = nullptr;
  size_t best_dist = 0;
  for (auto& spec : schema()) {
    auto dist = std::min(edit_distance(name, spec.name),
                         edit_distance(tail, spec.short_name()) + 1);
    if (best == nullptr || dist < best_dist) {
      best = &spec;
      best_dist = dist;
    }
  }
  // Plausible typo: at most a third of the name's length, and at most 4.
  auto limit = std::min<size_t>(4, std::max<size_t>(1, name.size() / 3));
  return best != nullptr && best_dist <= limit ? best->name : std::string{};
}

std::string suggest(std::string_view word,
                    const std::vector<std::string>& choices) {
  const std::string* best = nullptr;
  size_t best_dist = 0;
  for (auto& choice : choices) {
    auto dist = edit_distance(word, choice);
    if (best == nullptr || dist < best_dist) {
      best = &choice;
      best_dist = dist;
    }
  }
  auto limit = std::min<size_t>(4, std::max<size_t>(1, word.size() / 3));
  return best != nullptr && best_dist > 0 && best_dist <= limit ? *best
                                                                : std::string{};
}

namespace keys {

section_keys::section_keys(std::vector<key_spec>& out, std::string section)
    : out_(out), section_(std::move(section)) {
}

void section_keys::add(const std::string& name, value_type type, value def,
                       std::string unit, range limits,
                       std::vector<std::string> choices, std::string meaning) {
  out_.push_back(key_spec{section_ + "." + name, type, std::move(def),
                          std::move(unit), std::move(meaning), limits,
                          std::move(choices), false});
}

void section_keys::profile(std::string def) {
  add("profile", value_type::string, std::move(def), "", range{},
      profile_names(section_),
      "Named " + section_
          + " profile: sets the other keys of this section; any key set "
            "explicitly overrides it.");
  out_.back().selects_profile = true;
}

void section_keys::boolean(const std::string& name, bool def,
                           std::string meaning) {
  add(name, value_type::boolean, def, "", range{}, {}, std::move(meaning));
}

void section_keys::integer(const std::string& name, int64_t def,
                           std::string unit, range limits,
                           std::string meaning) {
  add(name, value_type::integer, def, std::move(unit), limits, {},
      std::move(meaning));
}

void section_keys::real(const std::string& name, double def, std::string unit,
                        range limits, std::string meaning) {
  add(name, value_type::real, def, std::move(unit), limits, {},
      std::move(meaning));
}

void section_keys::string(const std::string& name, std::string def,
                          std::string meaning) {
  add(name, value_type::string, std::move(def), "", range{}, {},
      std::move(meaning));
}

void section_keys::choice(const std::string& name, std::string def,
                          std::vector<std::string> choices,
                          std::string meaning) {
  add(name, value_type::string, std::move(def), "", range{}, std::move(choices),
      std::move(meaning));
}

} // namespace keys

} // namespace dualpath::config
