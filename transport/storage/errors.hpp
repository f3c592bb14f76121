// Errors of the KV block store and its storage backends, as CAF error codes
// (errors are values). Every failed read maps to one of these; callers turn the
// affected blocks into misses to recompute.
#pragma once

#include <cstdint>
#include <string>

#include <caf/error.hpp>
#include <caf/fwd.hpp>
#include <caf/make_message.hpp>
#include <caf/message.hpp>

namespace dualpath::transport::storage {

enum class storage_errc : uint8_t {
  /// Not an error.
  none = 0,
  /// No file for this block hash exists in the store.
  missing_block,
  /// The file is shorter than its header says (or than a header).
  truncated,
  /// The header's checksum does not match its bytes (or the magic is wrong).
  header_checksum,
  /// A Layer Block's bytes do not match the header's checksum for that layer.
  layer_checksum,
  /// The header was written by a format version this build cannot read.
  unknown_version,
  /// The block belongs to another model (different model id or KV geometry).
  wrong_model,
  /// The header cannot be decoded (malformed msgpack or fields).
  bad_header,
  /// The store's directory (or a fan-out directory) cannot be listed.
  unreadable_directory,
  /// A write failed because the device is full (ENOSPC, EDQUOT).
  disk_full,
  /// A system or io_uring call failed; the context names the call and errno.
  io_error,
  /// The requested backend cannot be set up on this host.
  backend_unavailable,
  /// A request needs more buffer space than the whole pool holds.
  over_budget,
  /// An argument is out of range (layer index, buffer too small, ...).
  invalid_argument,
  /// Injected by the fault-injecting backend decorator.
  injected_fault,
  /// The block's path is a FIFO, socket, device or directory (or a symlink
  /// to one), not a regular file: refused without opening it.
  not_regular_file,
};

std::string to_string(storage_errc x);

/// True if `err` is the storage error `code`.
bool has_code(const caf::error& err, storage_errc code);

/// The storage error code of `err` (none if `err` is empty or of another
/// category).
storage_errc code_of(const caf::error& err);

/// Registers the error category with an actor system config so that
/// `actor_system::render` prints the code's name.
void add_error_category(caf::actor_system_config& cfg);

} // namespace dualpath::transport::storage

CAF_ERROR_CODE_ENUM(dualpath::transport::storage::storage_errc, "dp_storage")
