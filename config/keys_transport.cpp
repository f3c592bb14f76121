// [transport]: the bulk transport over the compute NIC.
#include "config/keys.hpp"

namespace dualpath::config::keys {

void add_transport(std::vector<key_spec>& out) {
  out.push_back(choice_key("transport.backend", "auto",
                           {"auto", "verbs", "tcp", "local"},
                           "Bulk transport backend; auto probes verbs and "
                           "falls back to tcp (local: in-process only)."));
  out.push_back(string_key("transport.secret", "",
                           "Shared secret peers prove they hold; empty: "
                           "generated per run."));
  out.push_back(int_key("transport.weight_control", 99, "",
                        "Weighted-round-robin weight of the control (model "
                        "execution) traffic class.",
                        range::between(1, 255)));
  out.push_back(int_key("transport.weight_kv", 1, "",
                        "Weighted-round-robin weight of the KV traffic "
                        "class.",
                        range::between(1, 255)));
  out.push_back(int_key("transport.deadline_ms", 5000, "ms",
                        "Deadline of one transfer batch.", range::at_least(1)));
  out.push_back(int_key("transport.max_outstanding", 64, "work requests",
                        "Outstanding work requests per queue pair or "
                        "connection.",
                        range::at_least(1)));
  out.push_back(int_key("transport.slice_kib", 1024, "KiB",
                        "Largest piece one transfer is cut into.",
                        range::at_least(1)));
  out.push_back(int_key("transport.max_frame_mib", 64, "MiB",
                        "Largest frame the tcp backend accepts.",
                        range::at_least(1)));
  out.push_back(string_key("transport.verbs_device", "",
                           "RDMA device name; empty: the first one."));
  out.push_back(int_key("transport.verbs_port", 1, "", "RDMA device port.",
                        range::between(1, 255)));
  out.push_back(int_key("transport.verbs_gid_index", -1, "",
                        "GID index; -1: by link layer (InfiniBand: LID "
                        "routing; RoCE: the RoCE v2 IPv4 GID).",
                        range::between(-1, 255)));
  out.push_back(int_key("transport.verbs_sl_control", 0, "",
                        "InfiniBand service level of control traffic (high "
                        "priority lane).",
                        range::between(0, 15)));
  out.push_back(int_key("transport.verbs_sl_kv", 2, "",
                        "InfiniBand service level of KV traffic (low "
                        "priority lane).",
                        range::between(0, 15)));
  out.push_back(int_key("transport.verbs_traffic_class_control", 0, "",
                        "GRH traffic class (DSCP << 2 | ECN) of control "
                        "traffic on RoCE and routed InfiniBand.",
                        range::between(0, 255)));
  out.push_back(int_key("transport.verbs_traffic_class_kv", 0, "",
                        "GRH traffic class (DSCP << 2 | ECN) of KV traffic on "
                        "RoCE and routed InfiniBand.",
                        range::between(0, 255)));
  out.push_back(int_key("transport.verbs_hop_limit", 64, "",
                        "GRH hop limit of RoCE v2 / routed InfiniBand "
                        "packets (routers on the path each take one).",
                        range::between(1, 255)));
  out.push_back(int_key("transport.verbs_handshake_port", 0, "port",
                        "TCP port of the verbs handshake listener (on the "
                        "tcp_listen host or the node's host); 0: any free "
                        "port.",
                        range::between(0, 65535)));
  out.push_back(string_key("transport.tcp_listen", "127.0.0.1:0",
                           "host:port the tcp backend listens on (port 0: "
                           "any free port)."));
  out.push_back(choice_key("transport.tcp_kv_sched", "idle",
                           {"idle", "batch", "normal"},
                           "CPU scheduling of the tcp backend's kv sender and "
                           "receive threads: idle (SCHED_IDLE, only time no "
                           "other thread wants), batch (SCHED_BATCH at "
                           "tcp_kv_nice) or normal (at tcp_kv_nice), so "
                           "control threads run first on a busy host."));
  out.push_back(int_key("transport.tcp_kv_nice", 10, "",
                        "Niceness of the tcp kv threads when tcp_kv_sched is "
                        "batch or normal.",
                        range::between(-20, 19)));
  out.push_back(int_key("transport.tcp_control_nice", 0, "",
                        "Niceness of the tcp control threads; 0 leaves it; "
                        "below 0 needs CAP_SYS_NICE.",
                        range::between(-20, 19)));
  out.push_back(int_key("transport.tcp_priority_control", 6, "",
                        "SO_PRIORITY of tcp control sockets (the host's "
                        "queueing disciplines).",
                        range::between(0, 6)));
  out.push_back(int_key("transport.tcp_priority_kv", 1, "",
                        "SO_PRIORITY of tcp kv sockets.",
                        range::between(0, 6)));
  out.push_back(int_key("transport.tcp_tos_control", 184, "",
                        "IP TOS byte of tcp control sockets (184: DSCP EF).",
                        range::between(0, 255)));
  out.push_back(int_key("transport.tcp_tos_kv", 32, "",
                        "IP TOS byte of tcp kv sockets (32: DSCP CS1, lower "
                        "effort).",
                        range::between(0, 255)));
  out.push_back(int_key("transport.tcp_kv_chunk_kib", 256, "KiB",
                        "Largest kv send or receive of one system call, so a "
                        "waking control thread never waits long behind a kv "
                        "copy in the kernel.",
                        range::between(4, 65536)));
}

} // namespace dualpath::config::keys
