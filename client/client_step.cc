// Client::Impl's bsp step (client/client_impl.h): which tensors this rank
// pushed in the step (MarkPushed), the no-gradient marks for the rest
// (PushNoGradient, EndStep), the implicit step's kept pushes (KeepPush,
// PushKeptAgain) and sending a step again that a shard lost (SendStepAgain).
#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "client/client_impl.h"
#include "common/status.h"
#include "glog/logging.h"

namespace asyncps {

std::vector<int> Client::Impl::NotPushedIn(const std::vector<int>& indices,
                                           int64_t step) {
  absl::MutexLock lock(&step_mu_);
  // EndStep of `step` ran (the clock is past it) and pushed none of these.
  if (clock() < step || pushed_step_ > step) return {};  // Not known.
  std::vector<int> absent;
  for (int t : indices) {
    if (!PushedLocked(t, step)) absent.push_back(t);
  }
  return absent;
}

bool Client::Impl::PushedLocked(int tensor, int64_t step) const {
  return pushed_step_ == step && static_cast<size_t>(tensor) < pushed_.size() &&
         pushed_[tensor];
}

absl::Status Client::Impl::SendStepAgain(const std::vector<int>& indices,
                                         int64_t step,
                                         const std::vector<SliceVersion>& held,
                                         bool kept) {
  bool any = false;
  if (kept) {
    absl::Status pushed = PushKeptAgain(indices, step);
    if (!absl::IsNotFound(pushed)) {
      RETURN_IF_ERROR(pushed);
      any = true;
    }
  }
  // After the gradients: a mark for a tensor that has its gradient there
  // would be dropped, but one that came first would count it as zero.
  const std::vector<int> absent = NotPushedIn(indices, step);
  if (!absent.empty()) {
    RETURN_IF_ERROR(ps_->PushNoGradient(absent, rank(), step, &held));
    any = true;
  }
  if (!any) {
    return absl::NotFoundError(
        absl::StrCat("nothing of step ", step, " known to send again"));
  }
  return absl::OkStatus();
}

absl::Status Client::Impl::PushNoGradient(const TensorSet& set) {
  RETURN_IF_ERROR(MustBeWorker("PushNoGradient"));
  RETURN_IF_ERROR(TakeStepError());
  RETURN_IF_ERROR(CheckSet(set, set.indices_.size()));
  if (mode_ != Mode::kBsp || set.indices_.empty()) return absl::OkStatus();
  const int64_t step = clock() + 1;
  MarkPushed(set.indices_, step);
  const std::vector<SliceVersion> held = Versions();
  return ps_->PushNoGradient(set.indices_, rank(), step, &held);
}

void Client::Impl::KeepPush(const std::vector<int>& indices,
                            const ConstTensorViews& views,
                            const std::vector<SliceVersion>& from,
                            const std::vector<v1::OptimizerSpec>& specs,
                            int64_t step) {
  KeptPush kept;
  kept.indices = indices;
  for (int t : indices) {
    kept.grads.emplace_back(views[t].begin(), views[t].end());
  }
  kept.from = from;
  kept.specs = specs;
  absl::MutexLock lock(&kept_mu_);
  if (step != kept_step_) {
    kept_step_ = step;
    kept_.clear();
  }
  kept_.push_back(std::move(kept));
}

absl::Status Client::Impl::PushKeptAgain(const std::vector<int>& indices,
                                         int64_t step) {
  std::vector<KeptPush> again;  // Copies: no lock held on the network.
  {
    absl::MutexLock lock(&kept_mu_);
    if (step == kept_step_) {
      for (const KeptPush& k : kept_) {
        if (std::find_first_of(k.indices.begin(), k.indices.end(),
                               indices.begin(),
                               indices.end()) != k.indices.end()) {
          again.push_back(k);
        }
      }
    }
  }
  if (again.empty()) {
    return absl::NotFoundError(
        absl::StrCat("no gradient of step ", step, " kept for these tensors"));
  }
  for (const KeptPush& k : again) {
    ConstTensorViews views(NumTensors());
    TensorOptimizers per_tensor;
    if (!k.specs.empty()) per_tensor.assign(NumTensors(), nullptr);
    for (size_t i = 0; i < k.indices.size(); ++i) {
      views[k.indices[i]] = k.grads[i];
      if (!k.specs.empty()) per_tensor[k.indices[i]] = &k.specs[i];
    }
    PushStats r;
    RETURN_IF_ERROR(ps_->Push(k.indices, views, k.from, rank(), step, &r,
                              k.specs.empty() ? nullptr : &per_tensor,
                              /*again=*/true));
  }
  return absl::OkStatus();
}

void Client::Impl::MarkPushed(const std::vector<int>& indices, int64_t step) {
  if (mode_ != Mode::kBsp) return;
  absl::MutexLock lock(&step_mu_);
  if (step != pushed_step_) {
    pushed_step_ = step;
    pushed_.assign(static_cast<size_t>(NumTensors()), false);
  }
  for (int t : indices) {
    if (static_cast<size_t>(t) < pushed_.size()) pushed_[t] = true;
  }
}

void Client::Impl::Leave() {
  absl::Status lost = TakeStepError();
  if (lost.ok()) lost = embeddings_.TakeStepError();
  if (!lost.ok()) {
    LOG(WARNING) << "rank " << rank()
                 << " leaves with its last step's failure unreported (no "
                    "call came after end_step to return it): "
                 << lost;
  }
  if (membership_ != nullptr) membership_->Leave();
}

absl::Status Client::Impl::TakeStepError() {
  absl::MutexLock lock(&step_mu_);
  return std::exchange(step_error_, absl::OkStatus());
}

void Client::Impl::EndStep() {
  // The rows' failure is kept by the embedding client for its next call.
  embeddings_.EndStep().IgnoreError();
  absl::Status failed;
  if (mode_ == Mode::kBsp && rank() >= 0 && NumTensors() > 0) {
    // A tensor this rank did not push in the step (a parameter its graph
    // did not use) goes as "no gradient": it counts for the step with
    // zero, as DDP's allreduce would count it, and nobody waits for it.
    const int64_t step = clock() + 1;
    std::vector<int> absent;
    {
      absl::MutexLock lock(&step_mu_);
      for (int t = 0; t < NumTensors(); ++t) {
        if (!PushedLocked(t, step)) absent.push_back(t);
      }
    }
    if (!absent.empty()) {
      const std::vector<SliceVersion> held = Versions();
      failed = ps_->PushNoGradient(absent, rank(), step, &held);
    }
  }
  if (!failed.ok()) {
    absl::MutexLock lock(&step_mu_);
    step_error_ = std::move(failed);
  }
  if (membership_ != nullptr) membership_->clock()->fetch_add(1);
}

}  // namespace asyncps
