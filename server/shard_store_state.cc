// ShardStore's whole-state calls (server/shard_store.h): a checkpoint's
// snapshot and restore, Assign (allreduce's weights, recovery's restore)
// and LoadState (an optimizer state sent by a worker). The training calls
// are in shard_store.cc.
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "common/status_macros.h"
#include "common/tensor_bytes.h"
#include "common/wire_dtype.h"
#include "server/shard_store.h"

namespace asyncps {

absl::StatusOr<v1::ShardCheckpoint> ShardStore::Snapshot(bool pending) const {
  CheckpointCollector collected;
  RETURN_IF_ERROR(Snapshot(pending, 0, &collected));
  return std::move(collected.checkpoint());
}

absl::Status ShardStore::Snapshot(bool pending, int64_t unix_micros,
                                  CheckpointSink* sink) const {
  std::shared_ptr<const Model> m = model();
  if (m == nullptr) {
    return absl::FailedPreconditionError("no model to checkpoint");
  }
  v1::ShardCheckpoint head;
  *head.mutable_spec() = m->model->spec();
  head.set_shard(shard_);
  head.set_unix_micros(unix_micros);
  RETURN_IF_ERROR(sink->Head(head));
  for (int i : m->model->local_slices()) {
    v1::SliceCheckpoint slice;
    slice.set_slice(static_cast<uint32_t>(i));
    m->slices[i]->Save(&slice, pending);
    RETURN_IF_ERROR(sink->Slice(&slice));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<ShardStore::LazyCopy>>
ShardStore::SnapshotLazily(bool pending, int64_t unix_micros,
                           v1::ShardCheckpoint* head,
                           std::vector<v1::SliceCheckpoint>* slices) const {
  std::shared_ptr<const Model> m = model();
  if (m == nullptr) {
    return absl::FailedPreconditionError("no model to checkpoint");
  }
  head->Clear();
  *head->mutable_spec() = m->model->spec();
  head->set_shard(shard_);
  head->set_unix_micros(unix_micros);
  const std::vector<int>& local = m->model->local_slices();
  slices->resize(local.size());
  auto copy = std::make_unique<LazyCopy>();
  copy->slices_.reserve(local.size());
  for (size_t k = 0; k < local.size(); ++k) {
    v1::SliceCheckpoint& slice = (*slices)[k];
    slice.Clear();  // Keeps its strings' buffers.
    slice.set_slice(static_cast<uint32_t>(local[k]));
    SliceState* state = m->slices[local[k]].get();
    state->CopyOnWrite(&slice, pending);
    copy->slices_.push_back(state);
  }
  copy->model_ = std::move(m);
  return copy;
}

void ShardStore::LazyCopy::Finish() {
  for (SliceState* s : slices_) s->FinishCopy();
  slices_.clear();
  model_.reset();
}

absl::Status ShardStore::Restore(const v1::ShardCheckpoint& checkpoint) {
  ASSIGN_OR_RETURN(std::unique_ptr<Restoring> restoring,
                   StartRestore(checkpoint));
  for (const v1::SliceCheckpoint& sc : checkpoint.slices()) {
    RETURN_IF_ERROR(restoring->Load(sc));
  }
  return FinishRestore(std::move(restoring));
}

ShardStore::Restoring::Restoring(std::shared_ptr<Model> model)
    : model_(std::move(model)), loaded_(model_->slices.size(), false) {}

absl::StatusOr<std::unique_ptr<ShardStore::Restoring>> ShardStore::StartRestore(
    const v1::ShardCheckpoint& head) const {
  if (static_cast<int>(head.shard()) != shard_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "checkpoint is of shard ", head.shard(), ", this is shard ", shard_));
  }
  auto built = BuildModel(head.spec());
  if (!built.ok()) return Annotate(built.status(), "checkpoint");
  return std::unique_ptr<Restoring>(new Restoring(*std::move(built)));
}

absl::Status ShardStore::Restoring::Load(const v1::SliceCheckpoint& sc) {
  if (sc.slice() >= model_->slices.size() ||
      model_->slices[sc.slice()] == nullptr) {
    return absl::DataLossError(absl::StrCat("checkpoint has slice ", sc.slice(),
                                            " which is not on this shard"));
  }
  if (loaded_[sc.slice()]) {
    return absl::DataLossError(
        absl::StrCat("checkpoint has slice ", sc.slice(), " twice"));
  }
  if (!model_->slices[sc.slice()]->Load(sc)) {
    return absl::DataLossError(absl::StrCat("checkpoint slice ", sc.slice(),
                                            " does not fit the model"));
  }
  loaded_[sc.slice()] = true;
  ++count_;
  if (sc.step_ranks_size() > 0)
    pending_.push_back(static_cast<int>(sc.slice()));
  return absl::OkStatus();
}

absl::Status ShardStore::FinishRestore(std::unique_ptr<Restoring> restoring) {
  std::shared_ptr<Model> m = std::move(restoring->model_);
  if (restoring->count_ != m->model->num_slices()) {
    return absl::DataLossError(absl::StrCat(
        "checkpoint has ", restoring->count_, " slices; the model puts ",
        m->model->num_slices(), " here"));
  }
  absl::MutexLock lock(&mu_);
  if (model_ != nullptr) {
    return absl::FailedPreconditionError(
        "a model is already declared; restore before serving");
  }
  {
    // A replica's snapshot may hold steps in progress.
    absl::MutexLock pending(&pending_mu_);
    pending_.insert(restoring->pending_.begin(), restoring->pending_.end());
  }
  model_ = std::move(m);
  return absl::OkStatus();
}

absl::Status ShardStore::Assign(const v1::AssignRequest& request,
                                bool steps_unknown) {
  std::shared_ptr<const Model> m = model();
  if (m == nullptr) {
    return Reject(absl::FailedPreconditionError(
        "assign before any model was declared on this shard"));
  }
  DecodedPayloads decoded;
  absl::Status valid = m->model->Decode(request.weights(), "weights", &decoded);
  if (!valid.ok()) return Reject(valid);
  for (int k = 0; k < request.weights_size(); ++k) {
    const absl::Span<const float> v = decoded.values[k];
    m->slices[decoded.indices[k]]->Assign(
        std::vector<float>(v.begin(), v.end()), request.weights(k).version(),
        steps_unknown);
  }
  return absl::OkStatus();
}

absl::Status ShardStore::LoadState(const v1::AssignRequest& request) {
  std::shared_ptr<const Model> m = model();
  if (m == nullptr) {
    return Reject(absl::FailedPreconditionError(
        "optimizer state before any model was declared on this shard"));
  }
  v1::PullRequest keys;
  for (const v1::SliceData& d : request.weights()) {
    *keys.add_slices() = d.key();
  }
  ASSIGN_OR_RETURN(const std::vector<int> slices, ResolvePull(keys));
  // Decoded and checked whole before any slice changes.
  struct Loaded {
    std::vector<float> slot1, slot2;
  };
  std::vector<Loaded> loaded(slices.size());
  for (size_t k = 0; k < slices.size(); ++k) {
    const v1::SliceData& d = request.weights(static_cast<int>(k));
    const SliceInfo& info = m->model->partition().slices()[slices[k]];
    auto decode = [&](const std::string& bytes, const char* which,
                      std::vector<float>* out) -> absl::Status {
      if (!DecodeF32Vector(bytes, out)) {
        return absl::InvalidArgumentError(
            absl::StrCat(which, " of slice ", SliceName(d.key()), " has ",
                         bytes.size(), " bytes, not whole f32s"));
      }
      for (float x : *out) {
        if (!std::isfinite(x)) {
          return absl::InvalidArgumentError(absl::StrCat(
              which, " of slice ", SliceName(d.key()), " is not finite"));
        }
      }
      if (!out->empty() && out->size() != info.count) {
        return absl::InvalidArgumentError(
            absl::StrCat(which, " of slice ", SliceName(d.key()), " has ",
                         out->size(), " values for ", info.count, " weights"));
      }
      return absl::OkStatus();
    };
    absl::Status s = decode(d.slot1(), "slot1", &loaded[k].slot1);
    if (s.ok()) s = decode(d.slot2(), "slot2", &loaded[k].slot2);
    if (s.ok() && d.optimizer_steps() < 0) {
      s = absl::InvalidArgumentError(absl::StrCat(
          "optimizer_steps of slice ", SliceName(d.key()), " is negative"));
    }
    if (!s.ok()) return Reject(s);
  }
  // The sizes the declared optimizer keeps, for every slice first.
  for (size_t k = 0; k < slices.size(); ++k) {
    const auto [keeps1, keeps2] = m->slices[slices[k]]->StateSizes();
    if (keeps1 != loaded[k].slot1.size() || keeps2 != loaded[k].slot2.size()) {
      return Reject(absl::InvalidArgumentError(absl::StrCat(
          "optimizer state of slice ",
          SliceName(request.weights(static_cast<int>(k)).key()), " has ",
          loaded[k].slot1.size(), " + ", loaded[k].slot2.size(),
          " values; the declared optimizer keeps ", keeps1, " + ", keeps2)));
    }
  }
  for (size_t k = 0; k < slices.size(); ++k) {
    m->slices[slices[k]]->LoadState(
        std::move(loaded[k].slot1), std::move(loaded[k].slot2),
        request.weights(static_cast<int>(k)).optimizer_steps());
  }
  return absl::OkStatus();
}

}  // namespace asyncps
