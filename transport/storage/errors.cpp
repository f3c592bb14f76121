#include "transport/storage/errors.hpp"

#include "config/caf_support.hpp"

namespace dualpath::transport::storage {

std::string to_string(storage_errc x) {
  switch (x) {
    case storage_errc::none:
      return "none";
    case storage_errc::missing_block:
      return "missing_block";
    case storage_errc::truncated:
      return "truncated";
    case storage_errc::header_checksum:
      return "header_checksum";
    case storage_errc::layer_checksum:
      return "layer_checksum";
    case storage_errc::unknown_version:
      return "unknown_version";
    case storage_errc::wrong_model:
      return "wrong_model";
    case storage_errc::bad_header:
      return "bad_header";
    case storage_errc::unreadable_directory:
      return "unreadable_directory";
    case storage_errc::disk_full:
      return "disk_full";
    case storage_errc::io_error:
      return "io_error";
    case storage_errc::backend_unavailable:
      return "backend_unavailable";
    case storage_errc::over_budget:
      return "over_budget";
    case storage_errc::invalid_argument:
      return "invalid_argument";
    case storage_errc::injected_fault:
      return "injected_fault";
    case storage_errc::not_regular_file:
      return "not_regular_file";
  }
  return "storage_errc(" + std::to_string(static_cast<int>(x)) + ")";
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
