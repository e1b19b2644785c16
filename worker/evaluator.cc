#include "worker/evaluator.h"

#include <cstdio>
#include <fstream>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "common/file_system.h"
#include "common/status.h"

namespace asyncps {
namespace {

constexpr int kEvalBatch = 1000;

}  // namespace

absl::StatusOr<Evaluation> EvaluateOnce(Client* client, Mlp* model,
                                        const Dataset& test, absl::Time start) {
  std::vector<std::vector<float>> weights;
  for (size_t n : model->TensorSizes()) weights.emplace_back(n, 0.0f);
  std::vector<std::string> names;
  std::vector<absl::Span<float>> out;
  for (const TensorSpec& t : client->tensors()) names.push_back(t.name);
  for (std::vector<float>& w : weights) out.push_back(absl::MakeSpan(w));
  Snapshot versions;
  CallOptions pull;
  pull.into = &versions;
  RETURN_IF_ERROR(client->Pull(names, out, pull));
  model->SetWeights(weights);

  double loss = 0;
  int64_t right = 0;
  std::vector<int> labels(kEvalBatch);
  for (int64_t i = 0; i < test.size; i += kEvalBatch) {
    const int n =
        static_cast<int>(std::min<int64_t>(kEvalBatch, test.size - i));
    for (int k = 0; k < n; ++k) labels[k] = test.labels[i + k];
    double l = 0;
    int64_t c = 0;
    model->Evaluate(test.pixels.data() + i * test.features, labels.data(), n,
                    &l, &c);
    loss += l;
    right += c;
  }
  // A slice's version counts the updates applied to it (async: pushes;
  // bsp: steps; allreduce: the step of the weights last assigned).
  Evaluation e;
  e.seconds = absl::ToDoubleSeconds(absl::Now() - start);
  e.updates = versions.mean_version();
  e.loss = loss / test.size;
  e.accuracy = static_cast<double>(right) / test.size;
  return e;
}

absl::Status AppendCurveRow(const std::string& path, const Evaluation& e) {
  bool fresh;
  {
    std::ifstream in(path);
    fresh = !in.good() || in.peek() == std::ifstream::traits_type::eof();
  }
  std::ofstream out(path, std::ios::app);
  if (!out) return absl::NotFoundError(absl::StrCat(path, ": cannot write"));
  if (fresh) out << "seconds,updates,test_loss,test_accuracy\n";
  out << absl::StrFormat("%.3f,%.1f,%.6f,%.6f\n", e.seconds, e.updates, e.loss,
                         e.accuracy);
  out.flush();
  if (!out) return absl::DataLossError(absl::StrCat(path, ": write failed"));
  return absl::OkStatus();
}

absl::StatusOr<Evaluation> RunEvaluator(
    Client* client, Mlp* model, const Dataset& test, absl::Duration every,
    const std::string& curve, absl::Notification* stop, WorkerMetrics* metrics,
    const JobDone& done) {
  const absl::Time start = absl::Now();
  while (true) {
    // Sleeping until the next period or a stop request, whichever first.
    bool stopping = stop->WaitForNotificationWithTimeout(every);
    if (!stopping && done) {
      // Asked before the pull: once the job is done no push follows, so
      // what the pull gets is the final model.
      absl::StatusOr<bool> finished = done();
      stopping = finished.ok() && *finished;
    }
    auto evaluated = EvaluateOnce(client, model, test, start);
    if (!evaluated.ok() && !stopping &&
        (evaluated.status().code() == absl::StatusCode::kFailedPrecondition ||
         evaluated.status().code() == absl::StatusCode::kUnavailable)) {
      // A shard restarted and has no model until the workers declare it
      // again, or was down past the retries: score at the next period.
      std::printf("evaluator skipped an evaluation: %s\n",
                  evaluated.status().ToString().c_str());
      std::fflush(stdout);
      continue;
    }
    ASSIGN_OR_RETURN(Evaluation e, std::move(evaluated));
    if (metrics != nullptr) metrics->Evaluated(e.accuracy, e.loss, e.updates);
    std::printf(
        "evaluator t=%.1fs updates=%.0f test_loss=%.4f accuracy=%.4f%s\n",
        e.seconds, e.updates, e.loss, e.accuracy, stopping ? " (final)" : "");
    std::fflush(stdout);
    if (!curve.empty()) RETURN_IF_ERROR(AppendCurveRow(curve, e));
    if (stopping) return e;
  }
}

namespace {

absl::Status WriteResult(const std::string& path, const Evaluation& e) {
  if (path.empty()) return absl::OkStatus();
  return Annotate(
      WriteFileAtomically(
          FileSystem::Default(), path,
          absl::StrFormat("{\"role\": \"evaluator\", \"seconds\": %.3f, "
                          "\"updates\": %.1f, \"test_loss\": %.6g, "
                          "\"accuracy\": %.6g}\n",
                          e.seconds, e.updates, e.loss, e.accuracy)),
      "--result_json");
}

}  // namespace

absl::Status RunEvaluatorRole(const WorkerConfig& config, Client* client,
                              Backend* backend, Dataset* test,
                              absl::Notification* stop, WorkerMetrics* metrics,
                              const JobDone& done) {
  // The evaluator scores whatever model the workers declared.
  RETURN_IF_ERROR(client->Attach());
  v1::ModelSpec spec;
  spec.set_name(client->model_name());
  for (const TensorSpec& t : client->tensors()) {
    v1::TensorSpec* out = spec.add_tensors();
    out->set_name(t.name);
    for (int64_t d : t.shape) out->add_shape(d);
  }
  ASSIGN_OR_RETURN(const std::vector<int> layers, LayersFromSpec(spec));
  RETURN_IF_ERROR(CheckLayersFit(layers, test->features));
  if (config.max_test_examples > 0 && config.max_test_examples < test->size) {
    test->size = config.max_test_examples;
  }
  Mlp model(backend, layers, kEvalBatch);
  if (!config.eval_once) {
    ASSIGN_OR_RETURN(
        const Evaluation e,
        RunEvaluator(client, &model, *test, config.eval_every, config.curve,
                     stop, metrics, config.until_done ? done : nullptr));
    return WriteResult(config.result_json, e);
  }
  ASSIGN_OR_RETURN(const Evaluation e,
                   EvaluateOnce(client, &model, *test, absl::Now()));
  std::printf("evaluator updates=%.0f test_loss=%.4f accuracy=%.4f\n",
              e.updates, e.loss, e.accuracy);
  std::fflush(stdout);
  if (!config.curve.empty()) RETURN_IF_ERROR(AppendCurveRow(config.curve, e));
  return WriteResult(config.result_json, e);
}

}  // namespace asyncps
