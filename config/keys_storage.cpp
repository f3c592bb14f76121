// [storage]: the KV block store behind the storage NIC.
#include "config/keys.hpp"

namespace dualpath::config::keys {

void add_storage(std::vector<key_spec>& out) {
  out.push_back(string_key("storage.dir", "",
                           "Directory of the block store; empty: a fresh "
                           "temporary directory (on /dev/shm when it has "
                           "room) removed at exit."));
  out.push_back(int_key("storage.block_tokens", 64, "tokens",
                        "Tokens per KV block (paper: 64).",
                        range::at_least(1)));
  out.push_back(choice_key("storage.backend", "auto",
                           {"auto", "io_uring", "pread"},
                           "Block I/O backend; auto probes io_uring and falls "
                           "back to pread."));
  out.push_back(bool_key("storage.o_direct", false,
                         "Open block files with O_DIRECT (bypass the page "
                         "cache)."));
  out.push_back(bool_key("storage.fsync", false,
                         "fsync each persisted block before reporting it "
                         "durable."));
  out.push_back(int_key("storage.queue_depth", 32, "requests",
                        "Outstanding reads per storage reader.",
                        range::between(1, 4096)));
  out.push_back(int_key("storage.io_threads", 4, "threads",
                        "I/O threads per storage reader.",
                        range::between(1, 256)));
  out.push_back(choice_key("storage.reader", "default",
                           {"default", "prefetching"},
                           "Storage reader behaviour: default, or prefetching "
                           "(the extension example of docs/extending.md: "
                           "reads an agent's next-turn blocks into DRAM while "
                           "its tool call runs)."));
  out.push_back(int_key("storage.prefetch_blocks", 256, "blocks",
                        "prefetching reader: Full Blocks it holds prefetched "
                        "at most (per node).",
                        range::at_least(1)));
}

} // namespace dualpath::config::keys
