// [storage]: the KV block store behind the storage NIC.
#include "config/keys.hpp"

namespace dualpath::config::keys {

void add_storage(std::vector<key_spec>& out) {
  section_keys s{out, "storage"};
  s.string("dir", "",
           "Directory of the block store; empty: a fresh temporary directory "
           "(on /dev/shm when it has room) removed at exit.");
  s.integer("block_tokens", 64, "tokens", range::at_least(1),
            "Tokens per KV block (paper: 64).");
  s.choice("backend", "auto", {"auto", "io_uring", "pread"},
           "Block I/O backend; auto probes io_uring and falls back to pread.");
  s.boolean("o_direct", false,
            "Open block files with O_DIRECT (bypass the page cache).");
  s.boolean("fsync", false,
            "fsync each persisted block before reporting it durable.");
  s.integer("queue_depth", 32, "requests", range::between(1, 4096),
            "Outstanding reads per storage reader.");
  s.integer("io_threads", 4, "threads", range::between(1, 256),
            "I/O threads per storage reader.");
  s.choice("reader", "default", {"default", "prefetching"},
           "Storage reader behaviour: default, or prefetching (the extension "
           "example of docs/extending.md: reads an agent's next-turn blocks "
           "into DRAM while its tool call runs).");
  s.integer("prefetch_blocks", 256, "blocks", range::at_least(1),
            "prefetching reader: Full Blocks it holds prefetched at most (per "
            "node).");
}

} // namespace dualpath::config::keys
