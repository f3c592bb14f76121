// [transport]: the bulk transport over the compute NIC.
#include "config/keys.hpp"

namespace dualpath::config::keys {

void add_transport(std::vector<key_spec>& out) {
  section_keys s{out, "transport"};
  s.choice("backend", "auto", {"auto", "verbs", "tcp", "local"},
           "Bulk transport backend; auto probes verbs and falls back to tcp "
           "(local: in-process only).");
  s.string("secret", "",
           "Shared secret peers prove they hold; empty: generated per run.");
  s.integer("weight_control", 99, "", range::between(1, 255),
            "Weighted-round-robin weight of the control (model execution) "
            "traffic class.");
  s.integer("weight_kv", 1, "", range::between(1, 255),
            "Weighted-round-robin weight of the KV traffic class.");
  s.integer("deadline_ms", 5000, "ms", range::at_least(1),
            "Deadline of one transfer batch.");
  s.integer("max_outstanding", 64, "work requests", range::at_least(1),
            "Outstanding work requests per queue pair or connection.");
  s.integer("slice_kib", 1024, "KiB", range::at_least(1),
            "Largest piece one transfer is cut into.");
  s.integer("max_frame_mib", 64, "MiB", range::at_least(1),
            "Largest frame the tcp backend accepts.");
  s.string("verbs_device", "", "RDMA device name; empty: the first one.");
  s.integer("verbs_port", 1, "", range::between(1, 255), "RDMA device port.");
  s.integer("verbs_gid_index", -1, "", range::between(-1, 255),
            "GID index; -1: by link layer (InfiniBand: LID routing; RoCE: the "
            "RoCE v2 IPv4 GID).");
  s.integer(
      "verbs_sl_control", 0, "", range::between(0, 15),
      "InfiniBand service level of control traffic (high priority lane).");
  s.integer("verbs_sl_kv", 2, "", range::between(0, 15),
            "InfiniBand service level of KV traffic (low priority lane).");
  s.integer("verbs_traffic_class_control", 0, "", range::between(0, 255),
            "GRH traffic class (DSCP << 2 | ECN) of control traffic on RoCE "
            "and routed InfiniBand.");
  s.integer("verbs_traffic_class_kv", 0, "", range::between(0, 255),
            "GRH traffic class (DSCP << 2 | ECN) of KV traffic on RoCE and "
            "routed InfiniBand.");
  s.integer("verbs_hop_limit", 64, "", range::between(1, 255),
            "GRH hop limit of RoCE v2 / routed InfiniBand packets (routers on "
            "the path each take one).");
  s.integer("verbs_kv_queue_pairs", 2, "queue pairs", range::between(1, 8),
            "RC queue pairs per verbs connection for KV traffic, each with "
            "its own completion queue and thread (posting and completing); a "
            "KV batch goes on the least loaded one, so a batch and its "
            "immediate stay on one, but two batches may complete out of "
            "order.");
  s.integer("verbs_handshake_port", 0, "port", range::between(0, 65535),
            "TCP port of the verbs handshake listener (on the tcp_listen host "
            "or the node's host); 0: any free port.");
  s.string("tcp_listen", "127.0.0.1:0",
           "host:port the tcp backend listens on (port 0: any free port).");
  s.choice("tcp_kv_sched", "idle", {"idle", "batch", "normal"},
           "CPU scheduling of the node's KV threads (the tcp backend's kv "
           "sender and receive threads, the storage readers' I/O threads and "
           "the host GPU streams' copy threads, with any backend): idle "
           "(SCHED_IDLE, only time no other thread wants), batch "
           "(SCHED_BATCH at tcp_kv_nice) or normal (at tcp_kv_nice), so "
           "control threads run first on a busy host.");
  s.integer("tcp_kv_nice", 10, "", range::between(-20, 19),
            "Niceness of the node's KV threads when tcp_kv_sched is batch or "
            "normal.");
  s.integer("tcp_control_nice", 0, "", range::between(-20, 19),
            "Niceness of the tcp control threads; 0 leaves it; below 0 needs "
            "CAP_SYS_NICE.");
  s.integer("tcp_control_cpu", -1, "", range::between(-1, 4095),
            "CPU the tcp control threads (sender lane, receive thread) run "
            "on; -1: any. One CPU for the control path, so a wake-up between "
            "its threads takes over the waker's CPU instead of waiting for a "
            "kv thread to leave the kernel on another (docs/benchmarks.md, "
            "qos). The CPU must be one this process may use.");
  s.integer(
      "tcp_priority_control", 6, "", range::between(0, 6),
      "SO_PRIORITY of tcp control sockets (the host's queueing disciplines).");
  s.integer("tcp_priority_kv", 1, "", range::between(0, 6),
            "SO_PRIORITY of tcp kv sockets.");
  s.integer("tcp_tos_control", 184, "", range::between(0, 255),
            "IP TOS byte of tcp control sockets (184: DSCP EF).");
  s.integer("tcp_tos_kv", 32, "", range::between(0, 255),
            "IP TOS byte of tcp kv sockets (32: DSCP CS1, lower effort).");
  s.integer("tcp_kv_connections", 1, "", range::between(1, 16),
            "TCP connections per peer for KV traffic. Above 1 the kv sender "
            "spreads batches over them (a batch and its immediate stay on "
            "one) and takes turns writing them: a multi-queue NIC receives "
            "each on its own queue and core, and no one connection's send "
            "buffer and window bound the stream (on loopback here: no gain, "
            "docs/benchmarks.md).");
  s.integer("tcp_kv_spin_us", 1000, "us", range::between(0, 10000),
            "How long a tcp kv thread with a transfer under way polls its "
            "sockets without sleeping before it sleeps (0: never): a sender "
            "lane while batches are pending, a receive thread while a frame "
            "is half read (between frames it polls at most 100 us, so it "
            "sleeps soon after a stream's last frame); no wake-up latency "
            "within a stream; at tcp_kv_sched idle the polling takes only "
            "CPU time no other thread wants. The default outlasts the "
            "longest wait inside a stream of 4 Gbps or more (a 512 KiB "
            "receive threshold filling); with 50 us both ends of a loopback "
            "stream fell asleep mid-stream and woke each other, half idle "
            "(docs/benchmarks.md).");
  s.integer("tcp_kv_chunk_kib", 512, "KiB", range::between(4, 65536),
            "Largest kv send or receive of one system call, so a waking "
            "control thread never waits long behind a kv copy in the kernel; "
            "also the most a kv receiver waits for before it reads "
            "(SO_RCVLOWAT), so it wakes as a sender's call ends "
            "(docs/benchmarks.md, transport).");
  s.integer("tcp_kv_yield_chunk_kib", 32, "KiB", range::between(4, 65536),
            "Largest kv send or receive of one system call while control "
            "traffic was seen within tcp_kv_yield_ms (at most "
            "tcp_kv_chunk_kib): a waking control thread waits behind the kv "
            "copy in the kernel, so its tail grows with this size, and "
            "smaller calls cost kv throughput (docs/benchmarks.md, qos).");
  s.integer("tcp_kv_yield_ms", 10, "ms", range::between(0, 60000),
            "How long after control traffic (a control write posted or "
            "received by this process) kv system calls stay at "
            "tcp_kv_yield_chunk_kib; 0: always tcp_kv_chunk_kib.");
}

} // namespace dualpath::config::keys
