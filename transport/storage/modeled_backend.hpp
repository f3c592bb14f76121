// A storage backend that stores no KV bytes, for simulations (`dualpath sim`):
// a write keeps only what identifies the block (its hash, parent, model id and
// geometry, decoded from the file's header); a read rebuilds the file image
// from them with the deterministic KV content (kv_content.hpp), so the block
// store's verification still holds. Directories exist as names only. Nothing
// touches a disk; I/O time is not modelled here but by the storage NIC the
// caller paces (the storage reader's `pace`). keeps_payload() is false, so a
// block_store over it does not even write blocks here: its index holds them
// (a few dozen bytes per block; millions of blocks at 48P96D).
//
// Reads and writes complete inline on the calling thread (queue_depth() is 1),
// so a simulation stays single-threaded and deterministic.
//
// Thread safety: every member function may be called from any thread (one
// mutex guards the name space). Ownership: shared like every backend.
#pragma once

#include <memory>

#include "transport/storage/backend.hpp"

namespace dualpath::transport::storage {

/// Makes the modeled backend (see file comment).
backend_ptr make_modeled_backend();

} // namespace dualpath::transport::storage
