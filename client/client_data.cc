// Client::Impl's data calls (client/client_impl.h): Pull, Push and
// PushPull, with what a push is checked for before anything is sent (finite
// gradients, per-tensor optimizers of the declared kind), and bsp's retry of
// a step a shard lost with a restart.
#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "client/client_impl.h"
#include "common/status.h"
#include "common/wire_dtype.h"
#include "glog/logging.h"

namespace asyncps {

// INVALID_ARGUMENT at the first NaN or infinity of any gradient. Checked
// before anything is sent: each shard refuses such a gradient itself, but
// a push spans shards, and the others would apply their part.
absl::Status Client::Impl::CheckFinite(
    const std::vector<std::string>& names,
    const std::vector<absl::Span<const float>>& grads) {
  for (size_t k = 0; k < grads.size(); ++k) {
    // On the hot path of every push: vector code (common/wire_dtype.h).
    const int64_t i = FirstNonFinite(grads[k]);
    if (i < 0) continue;
    if (membership_ != nullptr) membership_->CountNonFinite();
    return absl::InvalidArgumentError(
        absl::StrCat("gradient of tensor '", names[k], "' has ",
                     std::isnan(grads[k][i]) ? "NaN" : "Inf", " at element ", i,
                     "; nothing was pushed"));
  }
  return absl::OkStatus();
}

absl::Status Client::Impl::Pull(const TensorSet& set,
                                const std::vector<absl::Span<float>>& out,
                                const CallOptions& options) {
  RETURN_IF_ERROR(TakeStepError());
  RETURN_IF_ERROR(CheckSet(set, out.size()));
  const std::vector<int>& indices = set.indices_;
  TensorViews views(NumTensors());
  for (size_t k = 0; k < indices.size(); ++k) views[indices[k]] = out[k];
  std::vector<SliceVersion> own;
  std::vector<SliceVersion>* versions = &own;
  if (options.into != nullptr) {
    versions = &options.into->rep_->versions;
  } else {
    own = Versions();
  }
  versions->resize(ps_->partition().slices().size());
  const int64_t step = options.step >= 0 ? options.step : clock();
  // Not told to the shards, and not forgotten here: a gradient pushed
  // again after a failed pull still says where its weights came from.
  auto any_incarnation = [&](bool after_push) {
    std::vector<SliceVersion> asked = *versions;
    for (int t : indices) {
      for (int i : ps_->partition().tensor_slices(t)) asked[i].incarnation = 0;
    }
    RETURN_IF_ERROR(
        ps_->Pull(indices, views, &asked, rank(), step, after_push));
    for (int t : indices) {
      for (int i : ps_->partition().tensor_slices(t)) (*versions)[i] = asked[i];
    }
    return absl::OkStatus();
  };
  absl::Status s = options.any_incarnation
                       ? any_incarnation(options.after_push)
                       : ps_->Pull(indices, views, versions, rank(), step,
                                   options.after_push);
  // bsp: ABORTED asks for this rank's part of the step again (a shard lost
  // it with a restart): SendStepAgain, then the step is pulled as one that
  // follows the rank's own push (so a shard that restarts again asks
  // again). A few times.
  for (int again = 0; again < 3 && mode_ == Mode::kBsp &&
                      s.code() == absl::StatusCode::kAborted;
       ++again) {
    absl::Status sent =
        SendStepAgain(indices, step, *versions, /*kept=*/options.step < 0);
    if (absl::IsNotFound(sent)) break;  // Nothing of the step known here.
    LOG(WARNING) << "step " << step << ": " << s.message()
                 << "; sent this rank's part of the step again";
    s = sent.ok() ? any_incarnation(/*after_push=*/true) : sent;
  }
  RETURN_IF_ERROR(s);
  if (options.into == nullptr) KeepVersions(indices, own);
  return absl::OkStatus();
}

absl::Status Client::Impl::Push(
    const TensorSet& set, const std::vector<absl::Span<const float>>& grads,
    const CallOptions& options) {
  RETURN_IF_ERROR(MustBeWorker("Push"));
  RETURN_IF_ERROR(TakeStepError());
  RETURN_IF_ERROR(CheckSet(set, grads.size()));
  const std::vector<int>& indices = set.indices_;
  const std::vector<std::string>& names = set.names_;
  RETURN_IF_ERROR(CheckFinite(names, grads));
  ConstTensorViews views(NumTensors());
  for (size_t k = 0; k < indices.size(); ++k) views[indices[k]] = grads[k];
  std::vector<SliceVersion> own;
  const std::vector<SliceVersion>& from = From(options, &own);
  const int64_t step = options.step >= 0 ? options.step : clock() + 1;
  std::vector<v1::OptimizerSpec> specs;
  TensorOptimizers per_tensor;
  RETURN_IF_ERROR(Optimizers(names, indices, options, &specs, &per_tensor));
  MarkPushed(indices, step);
  if (mode_ == Mode::kBsp && options.step < 0 && !options.again) {
    KeepPush(indices, views, from, specs, step);
  }
  PushStats r;
  RETURN_IF_ERROR(ps_->Push(indices, views, from, rank(), step, &r,
                            specs.empty() ? nullptr : &per_tensor,
                            options.again));
  if (options.stats != nullptr) options.stats->Add(r);
  return absl::OkStatus();
}

absl::Status Client::Impl::Optimizers(const std::vector<std::string>& names,
                                      const std::vector<int>& indices,
                                      const CallOptions& options,
                                      std::vector<v1::OptimizerSpec>* specs,
                                      TensorOptimizers* per_tensor) const {
  if (options.optimizers == nullptr) return absl::OkStatus();
  if (options.optimizers->size() != indices.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat(indices.size(), " tensors but ",
                     options.optimizers->size(), " optimizers"));
  }
  specs->reserve(indices.size());
  for (size_t k = 0; k < indices.size(); ++k) {
    absl::StatusOr<v1::OptimizerSpec> spec = ToSpec((*options.optimizers)[k]);
    if (!spec.ok()) return Annotate(spec.status(), "tensor '" + names[k] + "'");
    if (spec->kind() != ps_->spec().optimizer().kind()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor '", names[k], "': optimizer '", (*options.optimizers)[k].kind,
          "' is not the kind the model was declared with"));
    }
    specs->push_back(*std::move(spec));
  }
  per_tensor->assign(NumTensors(), nullptr);
  for (size_t k = 0; k < indices.size(); ++k) {
    (*per_tensor)[indices[k]] = &(*specs)[k];
  }
  return absl::OkStatus();
}

absl::Status Client::Impl::PushPull(
    const TensorSet& set, const std::vector<absl::Span<const float>>& grads,
    const std::vector<absl::Span<float>>& out, const CallOptions& options) {
  RETURN_IF_ERROR(MustBeWorker("PushPull"));
  RETURN_IF_ERROR(TakeStepError());
  RETURN_IF_ERROR(CheckSet(set, grads.size()));
  const std::vector<int>& indices = set.indices_;
  const std::vector<std::string>& names = set.names_;
  if (out.size() != names.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "PushPull: ", names.size(), " names but ", out.size(), " outputs"));
  }
  RETURN_IF_ERROR(CheckFinite(names, grads));
  ConstTensorViews in(NumTensors());
  TensorViews views(NumTensors());
  for (size_t k = 0; k < indices.size(); ++k) {
    in[indices[k]] = grads[k];
    views[indices[k]] = out[k];
  }
  std::vector<SliceVersion> own;
  const std::vector<SliceVersion>& from = From(options, &own);
  std::vector<SliceVersion> pulled;
  std::vector<SliceVersion>* into = &pulled;
  if (options.into != nullptr) into = &options.into->rep_->versions;
  const int64_t step = options.step >= 0 ? options.step : clock() + 1;
  std::vector<v1::OptimizerSpec> specs;
  TensorOptimizers per_tensor;
  RETURN_IF_ERROR(Optimizers(names, indices, options, &specs, &per_tensor));
  MarkPushed(indices, step);
  PushStats r;
  const TensorOptimizers* hyper = specs.empty() ? nullptr : &per_tensor;
  absl::Status s =
      ps_->PushPull(indices, in, from, rank(), step, views, into, &r, hyper);
  // bsp: ABORTED says a shard's step waits without this rank's gradient
  // (lost on the way): it goes again, as it went (error feedback counts it
  // once), and then the step is pulled, as the per-tensor path does
  // (CallOptions::after_push). A few times: a shard may restart again.
  for (int again = 0; again < 3 && mode_ == Mode::kBsp &&
                      s.code() == absl::StatusCode::kAborted;
       ++again) {
    LOG(WARNING) << "step " << step << ": " << s.message()
                 << "; pushing the step's gradient again";
    s = ps_->Push(indices, in, from, rank(), step, &r, hyper, /*again=*/true);
    if (!s.ok()) break;
    std::vector<SliceVersion> asked = *into;  // Any incarnation, as Pull's.
    asked.resize(ps_->partition().slices().size());
    for (int t : indices) {
      for (int i : ps_->partition().tensor_slices(t)) asked[i].incarnation = 0;
    }
    s = ps_->Pull(indices, views, &asked, rank(), step, /*after_push=*/true);
    if (s.ok()) *into = std::move(asked);
  }
  RETURN_IF_ERROR(s);
  if (options.stats != nullptr) options.stats->Add(r);
  if (options.into == nullptr) KeepVersions(indices, pulled);
  return absl::OkStatus();
}

}  // namespace asyncps
