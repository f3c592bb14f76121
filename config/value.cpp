#include "config/value.hpp"

#include <charconv>
#include <cmath>
#include <cstdio>

#include "config/enum_names.hpp"

namespace dualpath::config {

constexpr std::string_view value_type_names[] = {"boolean", "integer", "real",
                                                 "string"};

std::string to_string(value_type x) {
  return config::name_of(x, value_type_names, "value_type");
}

value_type type_of(const value& x) {
  return static_cast<value_type>(x.index());
}

std::string format_real(double x) {
  if (std::isnan(x))
    return "nan";
  if (std::isinf(x))
    return x > 0 ? "inf" : "-inf";
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof(buf), x);
  return std::string(buf, res.ptr);
}

std::string toml_quote(const std::string& str) {
  std::string out = "\"";
  for (unsigned char c : str) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\r':
        out += "\\r";
        break;
      default:
        if (c < 0x20 || c == 0x7f) {
          char buf[8];
          std::snprintf(buf, sizeof(buf), "\\u%04x", c);
          out += buf;
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  out += '"';
  return out;
}

std::string to_toml(const value& x) {
  switch (type_of(x)) {
    case value_type::boolean:
      return std::get<bool>(x) ? "true" : "false";
    case value_type::integer:
      return std::to_string(std::get<int64_t>(x));
    case value_type::real: {
      auto str = format_real(std::get<double>(x));
      if (str.find_first_of(".eni") == std::string::npos)
        str += ".0";
      return str;
    }
    case value_type::string:
      return toml_quote(std::get<std::string>(x));
  }
  return {};
}

std::string to_string(const value& x) {
  return to_toml(x);
}

} // namespace dualpath::config
