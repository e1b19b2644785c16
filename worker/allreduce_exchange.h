// AllreduceExchange: Horovod-style synchronous training. Every step each
// layer's gradient is summed across all workers by a Collective (Gloo's ring
// over TCP, or NCCL between GPUs), started on a communication thread as soon
// as backward produces the layer, divided by the worker count, and applied
// locally with the same optimizer code the servers use (common/optimizer.h), so
// every replica stays bit-identical. The servers are off the gradient path:
// they give the initial weights, host the rendezvous store (RingRendezvous
// agrees there which ring to form), and rank 0 hands them the weights every
// `assign_every` steps and at the end, for the evaluator and checkpoints.
// Each time a ring forms (at Start, and in Reform after a peer died: the
// survivors wait up to the collective timeout for a replacement started with
// the dead rank's flags), its ranks agree where the job is: the rank that
// holds the most trained state (a survivor before a fresh process, then the
// highest clock, then the lowest rank) sends every other its step, weights
// and optimizer state. So a replacement that started with a stale clock (the
// shards that would tell it the job's may have restarted) goes on at the
// survivors' step with their model. No ring within the timeout: each rank
// exits naming the dead ones. In an elastic job (ps_server --elastic) the
// ring instead re-forms with the ranks that are live (ElasticRing): after a
// failure, and after any step whose vote asks for it (a rank leaves, one
// waits outside), so the ring grows and shrinks like Horovod elastic's.
// Used by one trainer thread.
#ifndef ASYNCPS_WORKER_ALLREDUCE_EXCHANGE_H_
#define ASYNCPS_WORKER_ALLREDUCE_EXCHANGE_H_

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "client/ps_client.h"
#include "client/rendezvous_client.h"
#include "common/clock.h"
#include "common/optimizer.h"
#include "worker/collective.h"
#include "worker/elastic_ring.h"
#include "worker/exchange.h"
#include "worker/ring_rendezvous.h"
#include "worker/task_queue.h"

namespace asyncps {

struct AllreduceConfig {
  int rank = 0;
  int num_workers = 1;
  std::string collective = "gloo";  // gloo or nccl.
  std::string host = "127.0.0.1";   // gloo: address peers reach us on.
  int cuda_device = -1;             // nccl: this worker's GPU.
  // Gradients summed in IEEE half on the ring (--compress=f16, Horovod's
  // fp16 compression); the mean and the optimizer stay in f32. A sum that
  // overflows half fails the step with nothing applied.
  bool f16 = false;
  // How long a ring may take to form (a replacement to come), and each
  // collective operation.
  absl::Duration timeout = absl::Seconds(30);
  int64_t assign_every = 50;  // Steps between weight uploads (rank 0).
  // Whether a failed all-reduce re-forms the ring (ps_worker); false: it
  // ends the worker.
  bool reform = false;
  // ps_server --elastic: rings of any size and ranks (ElasticRing). Each
  // step ends with a vote, one float per member: 2 if it leaves after the
  // step (`leaving` is set), 1 if a rank outside the ring waits to join
  // (`live`: the ranks shard 0 counts live), else 0; any but 0 re-forms
  // the ring after the step. A mean divides by the ring's size.
  bool elastic = false;
  ElasticRing::LiveFn live;
  const std::atomic<bool>* leaving = nullptr;  // Borrowed.
  Clock* clock = Clock::Real();  // Borrowed; the deadlines' clock.
};

class AllreduceExchange final : public GradientExchange {
 public:
  // `client` is borrowed and must have a model.
  AllreduceExchange(PsClient* client, AllreduceConfig config,
                    std::vector<std::vector<int>> layer_tensors);

  // Pulls the initial weights and joins the ring (rendezvous through the
  // servers' store); the ring's step, weights and optimizer state then
  // replace this worker's if another rank holds more (resumed_clock()).
  absl::Status Start(std::vector<std::vector<float>>* weights,
                     int64_t clock) override;
  int64_t resumed_clock() const override { return resumed_clock_; }
  void LayerReady(int layer, const std::vector<std::vector<float>>& grads,
                  int64_t clock) override;
  absl::Status FinishStep(int64_t clock,
                          std::vector<std::vector<float>>* weights,
                          StepStats* stats) override;
  // Rank 0 uploads the final weights.
  absl::Status Finish(int64_t clock) override { return Flush(clock); }
  // Elastic, in a ring of others, until a step's vote said it leaves.
  bool StepToLeave() const override {
    return elastic_ != nullptr && !voted_leave_ && RingSize() > 1;
  }

 private:
  // Rank 0 uploads the current weights (also done every assign_every).
  absl::Status Flush(int64_t clock);

  // After the all-reduce of step `clock` failed with `failure`: re-forms the
  // ring with a replacement of the dead peer (elastic: with the live ranks)
  // and sets stats->next_clock to where the job resumes, or returns the
  // failure explained.
  absl::Status Reform(int64_t clock, const absl::Status& failure,
                      StepStats* stats);

  // Joins a ring (again after each failure, until `deadline`) and takes up
  // its state (Sync); `clock` is the steps this worker has completed.
  absl::Status FormRing(int64_t clock, absl::Time deadline);

  // Elastic: step `clock`'s vote (AllreduceConfig::elastic). Sets *change
  // when the ring re-forms after the step, and voted_leave_ when this rank
  // leaves after it.
  absl::Status Vote(int64_t clock, bool* change);

  // The ring this worker is in: its size and this worker's place.
  int RingSize() const;
  int RingIndex() const;
  // "generation 3", and elastic ", ranks 0,2" (the log's words).
  std::string RingSays() const;
  int64_t Generation() const {
    return elastic_ != nullptr ? elastic_->generation() : ring_.generation();
  }

  // On a ring just joined: every rank says its clock and whether it holds
  // trained state; the rank with the most sends its step, weights and
  // optimizer state to all (a sum where the others add zeros: the same
  // bits). Sets resumed_clock_.
  absl::Status Sync(int64_t clock);

  // Turns a collective failure into an error naming the dead ranks, as far
  // as the servers' membership can tell within the worker timeout.
  absl::Status Explain(const std::string& what, int64_t clock);

  PsClient* const client_;
  RendezvousClient store_;  // The collectives meet here (shard 0).
  const AllreduceConfig config_;
  RingRendezvous ring_;
  std::unique_ptr<ElasticRing> elastic_;  // With config_.elastic.
  const std::vector<std::vector<int>> layer_tensors_;
  const std::vector<int> all_tensors_;  // Every tensor, ascending.
  std::unique_ptr<Collective> collective_;
  std::vector<std::vector<float>>* weights_ = nullptr;
  std::vector<std::vector<float>> sums_;       // Per tensor.
  std::vector<std::vector<uint16_t>> halves_;  // Per tensor, with f16.
  std::string staged_;  // A gradient's halves on their way into halves_.
  // One worker: the step's gradients, applied as they are (no copy, no
  // hand-off to the collective's thread).
  const std::vector<std::vector<float>>* alone_grads_ = nullptr;
  std::vector<OptimizerSlots> slots_;  // Per tensor.
  // Whether weights_ came from a ring (training, or a Sync); a fresh
  // process holds the servers' copy, older than any survivor's.
  bool trained_ = false;
  bool voted_leave_ = false;    // A step's vote said this rank leaves.
  int64_t resumed_clock_ = -1;  // Where the last ring formed goes on from.
  TaskQueue queue_;             // Last: its thread stops first.
};

}  // namespace asyncps

#endif  // ASYNCPS_WORKER_ALLREDUCE_EXCHANGE_H_
