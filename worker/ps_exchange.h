// PsExchange: the parameter-server exchange (async, ssp, bsp), in one of
// three ways:
// - layered: each layer's gradient is pushed as soon as backward produces
//   it, on a communication thread, and that layer's next weights are pulled
//   right after its push, so communication overlaps the rest of the backward
//   pass. In ssp and bsp the servers hold those pulls as the mode requires.
// - fused (async only): at the end of each step one PushPull per shard
//   sends the step's gradients and brings back the weights they produced:
//   one round trip per step instead of one push and one pull per layer.
// - prefetch (async only): at the end of step t one PushPull per shard sends
//   step t's gradients and brings back the weights they produced, on the
//   communication thread, while step t+1 computes on the weights that step
//   t-1's PushPull brought. Half the round trips, and communication overlaps
//   a whole step; each gradient is then at most one step staler (the
//   staleness histogram shows it).
// A shard that restarts costs at most the step in flight: its new weights
// come back in the next answer (the gradients computed against the lost
// ones are dropped, or in bsp added to the step the job is on); a shard
// that restarted without a checkpoint gets the model declared again and
// this worker's copy of its weights (Recover); a bsp pull that a restarted
// shard answers ABORTED pushes its layer again.
// It goes through the public client library (include/asyncps/client.h) in
// its explicit form: each call names its step and the snapshot of versions
// its gradients came from.
// Used by one trainer thread.
#ifndef ASYNCPS_WORKER_PS_EXCHANGE_H_
#define ASYNCPS_WORKER_PS_EXCHANGE_H_

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "asyncps/client.h"
#include "worker/exchange.h"
#include "worker/exchange_mode.h"
#include "worker/task_queue.h"

namespace asyncps {

class PsExchange final : public GradientExchange {
 public:
  using Mode = ExchangeMode;  // worker/exchange_mode.h.
  // "layered", "fused", "prefetch" (--exchange).
  static absl::StatusOr<Mode> ParseMode(const std::string& text) {
    return ParseExchangeMode(text);
  }
  static const char* ModeName(Mode mode) { return ExchangeModeName(mode); }

  // `client` is borrowed, a worker, and must have a model;
  // `layer_tensors[l]` lists the indices (in client->tensors()) of layer
  // l's tensors. `steps`: the servers run bsp, where a step's gradient
  // must reach every slice (a step broken off by a shard's restart is sent
  // again whole).
  PsExchange(Client* client, std::vector<std::vector<int>> layer_tensors,
             Mode mode = Mode::kLayered, bool steps = false);

  // A shard that restarted without a checkpoint between this worker's
  // declaration and Start's first pull (chaos: a kill in the job's first
  // seconds) lacks the model, and this worker holds no weights to restore
  // it from. Start then waits up to `wait` for a worker that holds trained
  // weights to restore it (Recover, at its next push); if none does (no
  // worker has trained yet), it calls `declare`, which declares the model
  // there again from its initializers (the initial weights), and pulls.
  // Without `declare`, Start fails on such a shard.
  struct LostModelAtStart {
    std::function<absl::Status()> declare;
    absl::Duration wait = absl::Seconds(5);
  };
  void set_lost_model_at_start(LostModelAtStart lost) {
    lost_at_start_ = std::move(lost);
  }

  absl::Status Start(std::vector<std::vector<float>>* weights,
                     int64_t clock) override;
  void LayerReady(int layer, const std::vector<std::vector<float>>& grads,
                  int64_t clock) override;
  absl::Status FinishStep(int64_t clock,
                          std::vector<std::vector<float>>* weights,
                          StepStats* stats) override;
  // Waits for the last PushPull, whose weights become the final ones.
  absl::Status Finish(int64_t clock) override;

 private:
  // After a tensor call failed with `failure`: if some shards lost the
  // model, declares it on them again, restores those this worker's call
  // created from this worker's copy, and pulls every weight afresh (the
  // step's gradient is lost where it was not applied). Any other failure
  // is returned as it is.
  absl::Status Recover(const absl::Status& failure);
  // Pushes `grads` of `tensors` (resolved as `set`) for step `clock`, computed
  // from the weights held; what the servers did is added to the step's
  // stats when `count`. `again`: the step's gradients sent a second time
  // (CallOptions::again).
  absl::Status PushTensors(const TensorSet& set,
                           const std::vector<int>& tensors,
                           const std::vector<std::vector<float>>& grads,
                           int64_t clock, bool count, bool again = false);
  // Layered: pulls `tensors` (resolved as `set`) after their push; a bsp shard
  // that restarted since answers ABORTED, and then the push goes again
  // first (PushAgain).
  absl::Status PullLayer(const TensorSet& set, const std::vector<int>& tensors,
                         const std::vector<std::vector<float>>& grads,
                         int64_t clock);
  // A bsp shard restarted during step `clock`: it lost this worker's
  // gradient for every layer pushed to it this step, also of the layers
  // whose step it had applied and this worker pulled (another worker may
  // wait there for one of them). Those go again, then `tensors` (resolved
  // as `set`); shards that have them drop the copies.
  absl::Status PushAgain(const TensorSet& set, const std::vector<int>& tensors,
                         const std::vector<std::vector<float>>& grads,
                         int64_t clock);
  // After the step's call failed with `failure`: Recover, and in bsp send
  // every gradient of the step (`grads`, for step `clock`) again and pull
  // the step's weights, as every exchange must: the step is applied only
  // once every rank's gradient reached every slice, and a restarted shard
  // has lost this worker's (a slice that has it drops the copy). A few
  // times, as a shard may restart again meanwhile.
  absl::Status RecoverStep(absl::Status failure,
                           const std::vector<std::vector<float>>& grads,
                           int64_t clock);
  absl::Status FinishLayered(int64_t clock, StepStats* stats);
  absl::Status FinishFused(int64_t clock, StepStats* stats);
  absl::Status FinishPrefetched(int64_t clock, StepStats* stats);
  void AddPushStats(const PushStats& r);
  // The model's tensors as handles, per layer and all of them (Start).
  absl::Status ResolveTensors();
  // Views of the buffers of `tensors` in `w`.
  static std::vector<absl::Span<float>> Out(const std::vector<int>& tensors,
                                            std::vector<std::vector<float>>* w);
  static std::vector<absl::Span<const float>> In(
      const std::vector<int>& tensors,
      const std::vector<std::vector<float>>& w);
  // Every tensor's weights, the buffer given to Start.
  std::vector<absl::Span<float>> AllWeights() {
    return Out(all_tensors_, weights_);
  }
  // Hands the step's stats (with the lowest version held) to `stats`, and
  // starts the next step's.
  void TakeStepStats(StepStats* stats);
  // Prefetch: the weights the PushPull in flight brought become the
  // weights. REQUIRES: the queue is drained.
  void AdoptStaged();

  Client* const client_;
  LostModelAtStart lost_at_start_;
  const std::vector<std::vector<int>> layer_tensors_;
  const std::vector<int> all_tensors_;
  std::vector<TensorSet> layer_sets_;  // Per layer (Start).
  TensorSet all_set_;                  // Every tensor, ascending.
  const Mode mode_;
  const bool steps_;
  // Touched by the queue's thread only while tasks are pending; the trainer
  // reads them after FinishStep has drained the queue.
  Snapshot versions_;
  std::vector<std::vector<float>>* weights_ = nullptr;
  StepStats step_stats_;
  std::vector<int> pushed_layers_;  // Layered: this step's, in push order.
  // Prefetch: the gradients being sent and the versions they came from;
  // the weights (and versions) the PushPull in flight brings.
  const std::vector<std::vector<float>>* grads_ = nullptr;
  std::vector<std::vector<float>> sent_grads_;
  int64_t sent_clock_ = 0;
  Snapshot sent_versions_;
  std::vector<std::vector<float>> staged_;
  Snapshot staged_versions_;
  bool in_flight_ = false;
  TaskQueue queue_;  // Last: its thread stops before the rest is destroyed.
};

}  // namespace asyncps

#endif  // ASYNCPS_WORKER_PS_EXCHANGE_H_
