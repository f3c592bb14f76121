// The bulk transport interface: one-sided writes from registered local memory
// into registered memory of a peer node, without passing the bytes through
// CAF messages. Backends (one per file): local (peers in one process), tcp
// (real sockets, framed writes read straight into the target region), verbs
// (rdma-core RC queue pairs) and auto (verbs per peer where it works, else
// tcp); `make_backend` chooses one by configuration. `fault_backend`
// decorates any backend.
//
// Ownership: a `local_registration` is move-only and owns the registration of
// one memory region; its destructor deregisters, waiting until no incoming
// write is still landing in the region and no posted batch still reads from
// it (so an owner that ends the registration before freeing the memory never
// has a send read freed memory). Its `describe()` is the copyable,
// serialisable `remote_region` a peer writes to. The memory itself stays owned
// by the caller and must outlive the registration; the registration must not
// move while a batch that names it as a source is pending.
//
// Thread safety: every member function of `backend` may be called from any
// thread concurrently. `post` never blocks on the network: it queues the batch
// and returns; the completion arrives later, exactly once per batch, on a
// backend thread (through a `completion_sink`). Completion sinks must be cheap
// and must not call back into the backend's destructor, nor end a
// registration that another pending batch reads from (it would wait for that
// thread).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <caf/error.hpp>
#include <caf/expected.hpp>
#include <caf/meta/type_name.hpp>

#include "config/settings.hpp"
#include "transport/errors.hpp"
#include "transport/types.hpp"

namespace dualpath::transport::bulk {

using clock_type = std::chrono::steady_clock;

/// Where the memory of a region lives.
enum class memory_kind : uint8_t {
  /// Ordinary (or pinned) host memory.
  host = 0,
  /// GPU memory, registered through a dmabuf file descriptor (verbs only).
  device = 1,
};

std::string to_string(memory_kind x);

/// What a backend can do; callers branch on this, never on the backend type.
struct capabilities {
  std::string name;           ///< "local", "tcp" or "verbs".
  bool write = true;          ///< One-sided writes (always).
  bool read = false;          ///< One-sided reads.
  bool immediate = false;     ///< Immediate values signalled to the receiver.
  bool device_memory = false; ///< memory_kind::device regions.
  bool cross_process = false; ///< Peers may live in other processes.
};

class backend;

/// Owns the registration of one local region (move-only, see file comment).
class local_registration {
public:
  local_registration() = default;
  local_registration(backend* owner, void* ptr, uint64_t len, memory_kind kind,
                     remote_region desc)
      : owner_(owner),
        ptr_(ptr),
        len_(len),
        kind_(kind),
        desc_(std::move(desc)) {
    // nop
  }
  local_registration(local_registration&& other) noexcept;
  local_registration& operator=(local_registration&& other) noexcept;
  local_registration(const local_registration&) = delete;
  local_registration& operator=(const local_registration&) = delete;
  ~local_registration();

  /// The copyable descriptor a peer writes to (the whole region).
  const remote_region& describe() const {
    return desc_;
  }
  uint32_t id() const {
    return desc_.region_id;
  }
  void* data() const {
    return ptr_;
  }
  uint64_t size() const {
    return len_;
  }
  memory_kind kind() const {
    return kind_;
  }
  explicit operator bool() const {
    return owner_ != nullptr;
  }

  /// Backend-private handle (e.g. the verbs lkey); 0 where unused.
  uint32_t lkey = 0;

private:
  void release();
  backend* owner_ = nullptr;
  void* ptr_ = nullptr;
  uint64_t len_ = 0;
  memory_kind kind_ = memory_kind::host;
  remote_region desc_;
};

/// One write: `destination.length` bytes from `source` at `source_offset`.
struct write_request {
  const local_registration* source = nullptr;
  uint64_t source_offset = 0;
  remote_region destination;
};

/// A batch of writes to ONE peer node, completed together.
struct batch {
  std::vector<write_request> writes;
  traffic_class tclass = traffic_class::kv;
  /// Signalled to the receiver after the batch's last write lands.
  std::optional<uint32_t> immediate;
  uint64_t tag = 0;
  /// Absolute deadline; every batch has one (`post_defaults` fills it).
  clock_type::time_point deadline{};
};

/// The outcome of a batch: delivered exactly once. On failure every write of
/// the batch counts as failed (bytes may have landed partially).
struct completion {
  uint64_t tag = 0;
  uint64_t bytes = 0;      ///< Bytes acknowledged by the receiver.
  uint32_t failed_ops = 0; ///< 0 on success, else the batch's write count.
  caf::error error;        ///< Empty on success; a transport_errc otherwise.
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, completion& x) {
  return f(caf::meta::type_name("bulk_completion"), x.tag, x.bytes,
           x.failed_ops, x.error);
}

/// Receives completions (actors post through actors/bulk/bulk_post.hpp, which
/// turns a later completion into a message).
using completion_sink = std::function<void(completion)>;

/// A write carrying an immediate value landed (receiver side).
struct incoming_immediate {
  std::string from_node;
  uint32_t region_id = 0;
  uint32_t value = 0;
};

using immediate_handler = std::function<void(const incoming_immediate&)>;

/// Monotonic counters; bad input is counted per kind.
struct counters {
  uint64_t batches_posted = 0;
  uint64_t batches_completed = 0;
  uint64_t batches_failed = 0;
  uint64_t bytes_sent[traffic_class_count] = {0, 0};
  uint64_t bytes_received = 0;
  /// Bytes granted by the sender's arbiter while both classes had data
  /// and could send (the weighted-round-robin share under contention).
  uint64_t contended_bytes[traffic_class_count] = {0, 0};
  uint64_t rejected_unknown_region = 0;
  uint64_t rejected_wrong_key = 0;
  uint64_t rejected_out_of_bounds = 0;
  uint64_t rejected_bad_frame = 0;
  uint64_t rejected_unauthenticated = 0;
  uint64_t dropped_half_open = 0;
  uint64_t deadline_exceeded = 0;
  uint64_t peer_lost = 0;
  uint64_t connections_accepted = 0;
  uint64_t connects = 0;
  /// Peers `auto` reaches over tcp although verbs was wanted (no device,
  /// or the verbs handshake with that peer failed).
  uint64_t tcp_fallbacks = 0;
  /// tcp kv threads: waits answered while polling without sleeping
  /// (`tcp_kv_spin`), and waits that slept in the kernel.
  uint64_t kv_spin_hits = 0;
  uint64_t kv_sleeps = 0;
  /// tcp kv system calls held to `tcp_kv_yield_chunk_kib` because control
  /// traffic was seen within `tcp_kv_yield_ms`.
  uint64_t kv_yield_calls = 0;
};

/// The abstract bulk transport (see file comment).
class backend {
public:
  virtual ~backend();

  virtual capabilities caps() const = 0;

  /// This node's name (the `node` of every descriptor it hands out).
  virtual const std::string& node() const = 0;

  /// Registers [ptr, ptr+len). `dmabuf_fd` is the GPU memory's dmabuf fd for
  /// memory_kind::device (verbs only).
  virtual caf::expected<local_registration>
  register_region(void* ptr, uint64_t len, memory_kind kind = memory_kind::host,
                  int dmabuf_fd = -1) = 0;

  /// Connection details this node gives to `peer` (tcp: "host:port"; verbs:
  /// "verbs=host:port/incarnation" of its handshake listener; auto: both,
  /// ';'-separated). The same for every peer.
  virtual caf::expected<std::vector<uint8_t>>
  details_for(const std::string& peer) = 0;

  /// Learns how to reach `peer` from the details it gave us. Connections are
  /// made lazily (tcp) or now (verbs: the handshake runs before it returns).
  virtual caf::error connect(const std::string& peer,
                             const std::vector<uint8_t>& details) = 0;

  /// Queues `b` (all writes to one node); `sink` receives its completion.
  virtual void post(batch b, completion_sink sink) = 0;

  /// Called on a backend thread when a write with an immediate lands here
  /// (tcp: on the receive thread of the write's class, so two calls may
  /// overlap).
  virtual void on_immediate(immediate_handler f) = 0;

  virtual counters stats() const = 0;

  /// Drops every connection to and from `peer`: pending batches to it fail
  /// with peer_lost, and once the call returns no byte of a write `peer`
  /// had begun (or sends later on a connection opened before the call) is
  /// written into any of our registered regions (verbs: the queue pair is
  /// destroyed; tcp: its inbound connections are closed and the receive
  /// threads have let go of them). A frame cut mid-way keeps the bytes that
  /// landed before the call. Later connections and posts work as before
  /// (the next use reconnects). Thread-safe; may block briefly (tcp: one
  /// receive pass); from an immediate handler too (tcp: then the other
  /// class's connections close at the end of that thread's current pass).
  virtual void drop_peer(const std::string& peer) = 0;

protected:
  friend class local_registration;
  /// Ends a registration; returns once no write still lands in it and no
  /// posted batch still reads from it (a pending batch that uses it as a
  /// source completes first: at worst, by its deadline).
  virtual void deregister(uint32_t region_id) = 0;

  /// Helper for implementations: validates `b` (non-empty, one destination
  /// node, sources set and in bounds, destination lengths equal to the
  /// source ranges). Returns the first problem.
  static caf::error validate(const batch& b);
};

/// How the operating system schedules the tcp backend's kv threads.
enum class tcp_cpu_sched : uint8_t {
  /// SCHED_OTHER at `tcp_kv_nice`.
  normal,
  /// SCHED_BATCH at `tcp_kv_nice` (no wake-up preemption of others).
  batch,
  /// SCHED_IDLE: only CPU time no other thread wants.
  idle,
};

std::string to_string(tcp_cpu_sched x);

/// Sets `x` to the policy named `str` (normal, batch, idle); false if none is.
bool from_string(std::string_view str, tcp_cpu_sched& x);

/// Settings of every backend (`transport.*` config keys).
struct options {
  std::string backend = "auto"; ///< auto|verbs|tcp|local.
  std::string node = "node";    ///< This node's name.
  // tcp
  std::string listen_host = "127.0.0.1";
  uint16_t listen_port = 0; ///< 0 = pick a free port.
  std::string secret;       ///< Shared secret for the HMAC handshake.
  uint64_t max_frame_mib = 64;
  uint64_t slice_kib = 1024;
  /// Scheduling of the tcp kv sender and receive threads, so a busy host
  /// runs control threads first.
  tcp_cpu_sched tcp_kv_sched = tcp_cpu_sched::idle;
  int tcp_kv_nice = 10;     ///< kv threads' niceness (normal and batch).
  int tcp_control_nice = 0; ///< Control threads' niceness; 0 leaves it.
  /// CPU of the control threads (-1: any): the control path's wake-ups
  /// then hand over one CPU instead of preempting a kv thread elsewhere.
  int tcp_control_cpu = -1;
  int tcp_priority_control = 6; ///< SO_PRIORITY of control sockets (0..6).
  int tcp_priority_kv = 1;      ///< SO_PRIORITY of kv sockets (0..6).
  int tcp_tos_control = 0xb8;   ///< IP TOS byte of control (DSCP EF).
  int tcp_tos_kv = 0x20;        ///< IP TOS byte of kv (DSCP CS1).
  /// Largest kv send or receive per system call, so a control thread never
  /// waits long for a kv copy in the kernel to end; also the most a kv
  /// receiver waits for before it reads (SO_RCVLOWAT): it wakes as a
  /// sender's call ends, not amid one (both ends read it; a mismatch
  /// costs only speed).
  uint32_t tcp_kv_chunk_kib = 512;
  /// ... and at most this while control traffic was seen within
  /// `tcp_kv_yield` (a waking control thread then waits behind a kv copy
  /// of this size at most; 0 ms: always tcp_kv_chunk_kib).
  uint32_t tcp_kv_yield_chunk_kib = 32;
  std::chrono::milliseconds tcp_kv_yield{10};
  /// kv connections per peer; each batch goes on one (least loaded).
  uint32_t tcp_kv_connections = 1;
  /// A kv sender or receive thread with a transfer under way (batches
  /// pending; a frame half read) polls without sleeping this long before it
  /// sleeps (0: never).
  std::chrono::microseconds tcp_kv_spin{1000};
  uint32_t weight_control = 99;
  uint32_t weight_kv = 1;
  /// Per peer and traffic class (tcp); more fail queue_full.
  uint32_t max_pending_batches = 4096;
  std::chrono::milliseconds default_deadline{5000};
  std::chrono::milliseconds io_timeout{2000}; ///< Handshake/half-open bound.
  // verbs (ranges checked when the backend opens; errors name the key)
  std::string verbs_device; ///< Empty = first device.
  uint8_t verbs_port = 1;
  /// -1: chosen by link layer (none on InfiniBand, RoCE v2 on Ethernet).
  int verbs_gid_index = -1;
  int verbs_sl_control = 0; ///< InfiniBand service level, 0..15.
  int verbs_sl_kv = 2;
  int verbs_traffic_class_control = 0; ///< GRH traffic class, 0..255.
  int verbs_traffic_class_kv = 0;
  int verbs_hop_limit = 64;          ///< GRH hop limit, 1..255.
  uint16_t verbs_handshake_port = 0; ///< Side channel; 0 = any free port.
  uint32_t verbs_max_outstanding = 64;
  /// KV queue pairs per connection (1..8), each served by its own thread.
  uint32_t verbs_kv_queue_pairs = 2;
  /// Where `auto` reports per-peer choices (fallbacks); may be empty.
  std::function<void(const std::string&)> notice;
};

/// The in-process "network" of local backends (defined in local_backend.cpp);
/// shared by every local backend of one process that should reach each other.
class local_fabric;
std::shared_ptr<local_fabric> make_local_fabric();

caf::expected<std::unique_ptr<backend>>
make_local_backend(const options& opts, std::shared_ptr<local_fabric> fabric);

/// Starts the listener and I/O threads.
caf::expected<std::unique_ptr<backend>> make_tcp_backend(const options& opts);

/// Fails with transport_errc::no_device when no RDMA device (or not the named
/// one) exists or its port is down; with an error naming the key when a
/// transport.verbs_* setting does not fit the device (verbs_backend.hpp).
caf::expected<std::unique_ptr<backend>> make_verbs_backend(const options& opts);

/// Deterministic faults injected by `make_fault_backend`.
struct fault_plan {
  /// Posts after this many succeed fail with injected_fault (-1: never).
  int64_t fail_after = -1;
  /// Posts to this node fail with peer_lost (and drop the inner peer).
  std::string drop_peer;
  /// Extra delay before each completion is delivered.
  std::chrono::milliseconds delay{0};
  /// Injected failures (fail_after, drop_peer) complete without `delay`, so
  /// they overtake completions of earlier posts still held back by it.
  bool fail_at_once = false;
  /// Flips the first byte of each write on the wire (source restored after).
  bool corrupt_byte = false;
  /// connect() takes this long before it calls the inner backend's (a slow
  /// handshake, as verbs' towards a peer that does not answer).
  std::chrono::milliseconds connect_delay{0};
};

/// Wraps `inner`, injecting the faults of `plan` (thread-safe).
std::unique_ptr<backend> make_fault_backend(std::unique_ptr<backend> inner,
                                            fault_plan plan);

/// Reads the `transport.*` keys of `cfg` (see config/keys_transport.cpp);
/// `node` names this node. An empty transport.secret becomes a random one
/// (enough for in-process peers; multi-process runs must share a secret).
caf::expected<options> options_from(const config::settings& cfg,
                                    std::string node);

/// The kv CPU class `transport.tcp_kv_sched` names (read by options_from
/// and by the node's other kv threads); bad_config naming the key
/// otherwise.
caf::expected<tcp_cpu_sched> kv_sched_from(const config::settings& cfg);

/// A backend and why it was chosen ("verbs on rxe0 port 1 (...)", "auto:
/// verbs on ... towards every peer whose handshake succeeds, else tcp", ...).
struct backend_choice {
  std::unique_ptr<backend> chosen;
  std::string reason;
};

/// `auto`: verbs towards every peer whose verbs handshake succeeds, tcp
/// towards the others (and all of them without a working device); each tcp
/// peer is reported through opts.notice and counted in tcp_fallbacks.
caf::expected<backend_choice> make_auto_backend(const options& opts);

/// Makes the backend `opts.backend` names (auto|verbs|tcp|local). `local`
/// needs a fabric shared by the in-process peers (a fresh one if null).
caf::expected<backend_choice>
make_backend(const options& opts,
             std::shared_ptr<local_fabric> fabric = nullptr);

/// Fills a zero deadline with now + opts.default_deadline.
void post_defaults(batch& b, const options& opts);

/// What a backend that registers host memory only checks first in
/// register_region: unsupported for any other memory (naming `backend`),
/// out_of_bounds for an empty region.
caf::error check_host_region(const std::string& backend, const void* ptr,
                             uint64_t len, memory_kind kind);

} // namespace dualpath::transport::bulk
