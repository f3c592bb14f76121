#include "transport/storage/errors.hpp"

#include "config/caf_support.hpp"
#include "config/enum_names.hpp"

namespace dualpath::transport::storage {

constexpr std::string_view storage_errc_names[] = {"none",
                                                   "missing_block",
                                                   "truncated",
                                                   "header_checksum",
                                                   "layer_checksum",
                                                   "unknown_version",
                                                   "wrong_model",
                                                   "bad_header",
                                                   "unreadable_directory",
                                                   "disk_full",
                                                   "io_error",
                                                   "backend_unavailable",
                                                   "over_budget",
                                                   "invalid_argument",
                                                   "injected_fault",
                                                   "not_regular_file"};

std::string to_string(storage_errc x) {
  return config::name_of(x, storage_errc_names, "storage_errc");
}

storage_errc code_of(const caf::error& err) {
  if (!err || err.category() != caf::atom("dp_storage"))
    return storage_errc::none;
  return static_cast<storage_errc>(err.code());
}

bool has_code(const caf::error& err, storage_errc code) {
  return code_of(err) == code && code != storage_errc::none;
}

void add_error_category(caf::actor_system_config& cfg) {
  config::add_error_category<storage_errc>(cfg, caf::atom("dp_storage"),
                                           "storage");
}

} // namespace dualpath::transport::storage
