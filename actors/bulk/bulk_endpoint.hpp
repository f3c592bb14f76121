// The behaviour of bulk_endpoint_actor
// (actors/protocol/bulk_endpoint_actor.hpp): a node's bulk transport endpoint.
// It owns nothing but a shared handle to the node's bulk backend and to the
// node's region directory (which local registrations write_op.local_region
// names); the bytes move over the backend, never through CAF.
//
// Connecting two endpoints A and B (any backend; verbs needs all three steps,
// tcp and local are satisfied by fewer):
//   1. info_a = A.request(connect, endpoint_info{node = B})   (no details:
//      A prepares its side for B, e.g. queue pairs, and describes it)
//   2. info_b = B.request(connect, info_a)  (B prepares, connects to A)
//   3. A.request(connect, info_b)           (A connects to B)
// A connect whose details are empty only prepares and describes.
//
// write_batch: each op writes destination.length bytes from the registration
// `local_region` at `local_offset`; the reply is one batch_completion (its
// error the backend's transport_errc, none on success). deadline_ns is
// relative to the time the endpoint posts the batch; 0 means the backend's
// configured default. Completions come back from backend threads as an
// internal message, so the reply is sent from the actor's own thread.
//
// Thread safety: region_directory is thread-safe; the actor's state is its own.
#pragma once

#include <memory>
#include <mutex>
#include <unordered_map>

#include <caf/actor_system.hpp>

#include "actors/protocol/bulk_endpoint_actor.hpp"
#include "transport/bulk/backend.hpp"

namespace dualpath::actors {

/// Which local registrations an endpoint may write from, by region id. The
/// registrations stay owned by their creators and must outlive their entries
/// (remove them before destroying the registration).
class region_directory {
public:
  void add(const transport::bulk::local_registration& reg) {
    std::lock_guard<std::mutex> guard{mtx_};
    regs_[reg.id()] = &reg;
  }
  void remove(uint32_t id) {
    std::lock_guard<std::mutex> guard{mtx_};
    regs_.erase(id);
  }
  const transport::bulk::local_registration* find(uint32_t id) const {
    std::lock_guard<std::mutex> guard{mtx_};
    auto i = regs_.find(id);
    return i == regs_.end() ? nullptr : i->second;
  }

private:
  mutable std::mutex mtx_;
  std::unordered_map<uint32_t, const transport::bulk::local_registration*>
      regs_;
};

/// Spawns an endpoint over `backend` (which must outlive the actor's last
/// pending batch; pending batches complete when the backend is destroyed).
bulk_endpoint_actor
spawn_bulk_endpoint(caf::actor_system& sys,
                    std::shared_ptr<transport::bulk::backend> backend,
                    std::shared_ptr<region_directory> regions);

} // namespace dualpath::actors
