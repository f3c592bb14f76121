// What the process can hold: the sizes that the configuration asks for
// (a KV block file, a storage reader's buffer pool, a prefetch store, a bulk
// frame, the token lists of a workload), derived from the keys before
// anything is allocated and compared against the memory this process may
// use, and the keys that the code stores in 32-bit fields compared against
// that range. load() runs the check, so a size that cannot be held exits 2
// naming the key instead of failing, or thrashing, at run time.
//
// Thread safety: pure functions (host_memory_bytes reads sysconf and
// getrlimit).
#pragma once

#include <cstdint>

#include <caf/error.hpp>

namespace dualpath::config {

class settings;

/// Bytes of memory this process may use: the smaller of the host's physical
/// memory and the address-space and data-segment limits (RLIMIT_AS,
/// RLIMIT_DATA).
uint64_t host_memory_bytes();

/// config_errc::out_of_range naming the first key whose value asks for more
/// than `memory_bytes` (or does not fit the field it is stored in), with the
/// derived size; none when everything fits.
caf::error check_capacity(const settings& cfg, uint64_t memory_bytes);

} // namespace dualpath::config
