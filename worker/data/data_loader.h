// DataLoader: one worker's share of a data set, served in minibatches and
// reshuffled every epoch from a seed. Not thread-safe.
#ifndef ASYNCPS_WORKER_DATA_DATA_LOADER_H_
#define ASYNCPS_WORKER_DATA_DATA_LOADER_H_

#include <cstdint>
#include <functional>
#include <random>
#include <utility>
#include <vector>

#include "worker/data/idx_reader.h"

namespace asyncps {

class DataLoader {
 public:
  // Worker `rank` of `num_workers` gets examples rank, rank + n, rank + 2n,
  // ... (capped to `max_examples` if > 0). `data` is borrowed.
  // REQUIRES: 0 <= rank < num_workers; the share is not empty.
  DataLoader(const Dataset* data, int rank, int num_workers, uint64_t seed,
             int64_t max_examples = 0);

  // Fills `x` (batch x features) and `y` with the next `batch` examples of
  // this epoch's order; the last batch of an epoch may be short (a batch
  // never straddles two epochs). Returns the number of examples filled.
  // epoch() counts the epochs completed, so it advances with the batch that
  // ends one, and the next epoch's order is reshuffled.
  int NextBatch(int batch, std::vector<float>* x, std::vector<int>* y);

  // Moves past the next `batches` batches of `batch` examples as NextBatch
  // would, without copying them: where a worker that resumes at a clock
  // picks its share of the data up.
  void Skip(int64_t batches, int batch);

  // The size of rank's share of `size` examples, as a loader built with
  // these arguments has it (share()).
  static int64_t ShareSize(int64_t size, int rank, int num_workers,
                           int64_t max_examples = 0);

  // Where the share comes from at the start of each epoch from now on (an
  // elastic job: this worker's place among the live workers and their
  // number, which change as workers join and leave): `share` returns
  // (index, size), and the examples index, index + size, ... are the next
  // epoch's. Applied at once to the epoch this loader is at the start of.
  // Without it the share is fixed.
  using ShareFn = std::function<std::pair<int, int>()>;
  void FollowMembership(ShareFn share);

  int64_t epoch() const { return epoch_; }
  int64_t share() const { return static_cast<int64_t>(indices_.size()); }
  // Examples of this epoch served so far.
  int64_t position() const { return static_cast<int64_t>(next_); }

 private:
  void Shuffle();
  // A new epoch: its share (FollowMembership), then its order.
  void NextEpoch();
  // The share FollowMembership's function says now (none: unchanged).
  void Reshare();
  void Split(int rank, int num_workers);

  const Dataset* const data_;
  const uint64_t seed_;
  const int64_t max_examples_;
  ShareFn share_;
  std::vector<int64_t> indices_;
  size_t next_ = 0;
  int64_t epoch_ = 0;
};

}  // namespace asyncps

#endif  // ASYNCPS_WORKER_DATA_DATA_LOADER_H_
