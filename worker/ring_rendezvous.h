// RingRendezvous: how the ranks of an all-reduce job agree which ring to
// form, also after ranks died and fresh processes took their places
// knowing nothing of the rings before. Rings are numbered (generations).
// Each rank asks for one under "allreduce/gen/<rank>" in the rendezvous
// store, always the highest any rank asks for (or the next after the ring
// it saw break); once every rank asks for the same generation g, each
// joins the collective under the key prefix "allreduce/ring<g>". A join
// that fails (a peer died during it, or left an address behind when it
// died) asks for g + 1, and the others follow: a rank waiting inside a
// join gives it up as soon as any rank asks for a newer generation. So a
// replacement meets the survivors at whatever generation they are, and no
// two attempts share keys. Nothing here depends on the job's clock, which
// a replacement may not know (the shards that would tell it may have
// restarted too). Used by one thread.
#ifndef ASYNCPS_WORKER_RING_RENDEZVOUS_H_
#define ASYNCPS_WORKER_RING_RENDEZVOUS_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "common/rendezvous_store.h"
#include "worker/collective.h"

namespace asyncps {

class RingRendezvous {
 public:
  // `store` and `clock` are borrowed and must outlive this object (a
  // collective it returns no longer needs them). config.prefix is ignored.
  RingRendezvous(RendezvousStore* store, CollectiveConfig config,
                 Clock* clock = Clock::Real());

  // Joins a ring of every rank, trying again at a newer generation after
  // each failed join, until `deadline`. Returns the collective; after the
  // deadline DEADLINE_EXCEEDED naming the generation each rank asked for;
  // another error of JoinCollective (e.g. FAILED_PRECONDITION for nccl
  // without CUDA) at once.
  absl::StatusOr<std::unique_ptr<Collective>> Join(absl::Time deadline);

  // The ring last joined broke (a collective on it failed): the next Join
  // asks for a newer one.
  void Broke() { want_ = generation_ + 1; }

  // The generation of the ring last joined (0 before any).
  int64_t generation() const { return generation_; }

  // The store key where `rank` asks for a generation.
  static std::string GenerationKey(int rank);

 private:
  // The generation each rank asks for now (nullopt: not said, or lost with
  // a restart of shard 0).
  std::vector<std::optional<int64_t>> Asked();
  // Takes up the highest generation asked for and asks for it too, until
  // every rank asks for the same; returns it.
  absl::StatusOr<int64_t> Agree(absl::Time deadline);
  // Whether some rank asks for a generation above `g`.
  bool NewerAsked(int64_t g);

  class Guarded;  // The store as a join at one generation sees it.

  RendezvousStore* const store_;
  const CollectiveConfig config_;
  Clock* const clock_;
  int64_t want_ = 1;        // The generation this rank asks for.
  int64_t generation_ = 0;  // Of the ring last joined.
};

}  // namespace asyncps

#endif  // ASYNCPS_WORKER_RING_RENDEZVOUS_H_
