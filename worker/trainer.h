// Trainer: a worker's training loop, the same for every mode. Each step:
// upload the current weights, forward/backward over `accumulate`
// micro-batches (handing each layer's gradient to the exchange as soon as
// the last micro-batch produces it), then let the exchange deliver the next
// weights. trainer.cc keeps the loop plain: computing a step, the
// straggler's sleep, the exchange, and the progress (log line, report,
// result) are each a piece of their own.
#ifndef ASYNCPS_WORKER_TRAINER_H_
#define ASYNCPS_WORKER_TRAINER_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "common/timeline.h"
#include "worker/data/data_loader.h"
#include "worker/exchange.h"
#include "worker/model/mlp.h"

namespace asyncps {

// One training step, as the trainer saw it: its own figures beside the
// servers' answers to its pushes, as the client library summed them (the
// one statistics type from the wire's PushResponse to the heartbeat's
// v1::WorkerProgress, which sums these reports).
struct StepReport {
  int64_t samples = 0;
  double loss = 0;
  double data_seconds = 0;      // Reading the minibatches.
  double compute_seconds = 0;   // Forward and backward (and --slowdown).
  double exchange_seconds = 0;  // Waiting for the servers (or the ring).
  int64_t clock = 0;            // The rank's clock after the step.
  // Slices pushed, their staleness (versions applied between the step's
  // pull and its push; none in allreduce) and those not applied.
  PushStats pushed;
};

struct TrainerConfig {
  int rank = 0;
  int batch_size = 64;
  int accumulate = 1;
  int64_t epochs = 1;  // Stop after this many passes over the share...
  // ... or once the worker's clock (its steps, counting those done before
  // a restart) reaches this, if > 0, whichever first.
  int64_t steps = 0;
  absl::Duration log_every = absl::Seconds(5);
  // The clock this worker resumes from (0 on a fresh job); the loader is
  // expected to be at the same point of the data.
  int64_t start_clock = 0;
  // Straggler simulation: after each step's compute, sleep (slowdown - 1)
  // times its compute time. 1 = full speed.
  double slowdown = 1.0;
  // If > 0, stop once every slice's version has reached this: a budget of
  // updates shared by all workers (async and ssp, where fast workers should
  // do more of the work than stragglers).
  int64_t stop_at_version = 0;
  // If set, holds the steps this rank completed, for heartbeats, in the
  // servers' clock: divided by `local_steps` (--outer: the exchange counts
  // rounds of that many steps; start_clock is in steps).
  std::atomic<int64_t>* steps_done = nullptr;
  int local_steps = 1;
  // If set, told about every step (the worker's progress reports).
  std::function<void(const StepReport&)> on_step;
  // If set, each step's phases are spans here: data, compute (one span per
  // layer as its gradient becomes ready) and the wait for the exchange.
  Timeline* timeline = nullptr;
  // What the step times, the straggler's sleep and the log read; borrowed.
  Clock* clock = Clock::Real();
};

struct TrainerResult {
  int64_t steps = 0;
  int64_t samples = 0;
  double first_loss = 0;  // Mean over the first 10 steps.
  double last_loss = 0;   // Mean over the last 10 steps.
  double seconds = 0;
  double mean_staleness = 0;
  int64_t dropped = 0;            // Slice gradients the servers did not apply.
  uint64_t weights_checksum = 0;  // Of the weights after the last step.
};

// A checksum of weights (FNV-1a over the f32 bytes), to compare replicas.
uint64_t WeightsChecksum(const std::vector<std::vector<float>>& weights);

// Runs the loop until the configured epochs or steps are done, `stop` turns
// true, or the exchange fails (its error is returned). `model`, `loader`,
// `exchange` are borrowed.
absl::Status Train(const TrainerConfig& config, Mlp* model, DataLoader* loader,
                   GradientExchange* exchange, const std::atomic<bool>* stop,
                   TrainerResult* result);

}  // namespace asyncps

#endif  // ASYNCPS_WORKER_TRAINER_H_
