// ElasticRing: how the ranks of an elastic all-reduce job (ps_server
// --elastic --mode=allreduce) agree which ring to form when ranks come and
// go (docs/ELASTIC.md). Rings are numbered (generations); generation g's
// members are a list of ranks, written once under "allreduce/elastic/<g>/
// members" in the rendezvous store, and a member's place in the list is
// its rank in g's collective (so the ring has any size and any ranks).
//
// The next ring: each rank that means to be in generation g + 1 says so
// under "<g>/next/<rank>": g's members after g broke (a collective failed)
// or after a step whose vote asked for a change, and a rank outside g (a
// newcomer, or a replacement of a dead member) announcing itself while g is
// the newest. g's leader, its lowest member that said next once no other
// member that is still live (as shard 0's membership says, `LiveFn`) is yet
// to say it, writes g + 1's members: the ranks that said next and are
// live (a member that left never says it). Generation 1, at the job's start:
// rank 0, once every rank below the size the job started with has said
// next under generation 0; its members are those that did. A rank left out
// of g + 1 (it said next too late) announces itself there and waits for
// g + 2. The store has no
// compare-and-set: two ranks that each saw themselves leader (a member
// shard 0 took for dead while it was not) may write different lists, and
// then the join of g + 1 fails for some and the ring moves on to g + 2.
// Used by one thread.
#ifndef ASYNCPS_WORKER_ELASTIC_RING_H_
#define ASYNCPS_WORKER_ELASTIC_RING_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "common/rendezvous_store.h"
#include "worker/collective.h"

namespace asyncps {

class ElasticRing {
 public:
  // The ranks live now, as shard 0's membership says (ascending).
  using LiveFn = std::function<std::vector<int>()>;

  // `store` and `clock` are borrowed. config.rank is this worker's rank,
  // config.num_workers the size the job started with (generation 1's
  // ranks); config.prefix is ignored.
  ElasticRing(RendezvousStore* store, CollectiveConfig config, LiveFn live,
              Clock* clock = Clock::Real());

  // Joins the next ring that has this rank in it: a newcomer's first, or
  // the one after the ring last joined (it broke, or its vote asked for a
  // change), until `deadline`, then DEADLINE_EXCEEDED saying what it waited
  // for. A member that leaves says nothing: it is waited for until shard 0
  // no longer counts it live (at once after a clean leave).
  absl::StatusOr<std::unique_ptr<Collective>> Join(absl::Time deadline);

  // Whether a live rank outside the ring has announced itself for the
  // next one (what this rank votes at each step).
  bool OutsiderWaiting();

  int64_t generation() const { return generation_; }
  // The ring last joined: its ranks, and this worker's place among them.
  const std::vector<int>& members() const { return members_; }
  int index() const { return index_; }
  bool InRing(int rank) const;

  // The store keys (tests).
  static std::string MembersKey(int64_t g);
  static std::string NextKey(int64_t g, int rank);
  static std::string CurrentKey();

 private:
  // Says next under `g` and waits until g + 1's members are written
  // (writing them as g's leader); returns them.
  absl::StatusOr<std::vector<int>> NextMembers(int64_t g, bool member,
                                               absl::Time deadline);
  // g + 1's members when this rank is g's leader (`member`: of g), or
  // empty when it is not, or not yet (a live member has not said next).
  std::vector<int> LeadFor(int64_t g, bool member);
  bool SaidNext(int64_t g, int rank);
  // The generation last written under CurrentKey (0: none).
  int64_t Current();

  RendezvousStore* const store_;
  const CollectiveConfig config_;
  const LiveFn live_;
  Clock* const clock_;
  int64_t generation_ = 0;  // Of the ring last joined, or announced in.
  bool in_ring_ = false;    // Whether this rank is a member of generation_.
  std::vector<int> members_;
  int index_ = 0;
};

}  // namespace asyncps

#endif  // ASYNCPS_WORKER_ELASTIC_RING_H_
