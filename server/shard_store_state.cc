// ShardStore's whole-state calls (server/shard_store.h): a checkpoint's
// snapshot and restore, Assign (allreduce's weights, recovery's restore)
// and LoadState (an optimizer state sent by a worker). The training calls
// are in shard_store.cc.
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "common/tensor_bytes.h"
#include "common/wire_dtype.h"
#include "server/shard_store.h"

namespace asyncps {

absl::StatusOr<v1::ShardCheckpoint> ShardStore::Snapshot(bool pending) const {
  std::shared_ptr<const Model> m = model();
  if (m == nullptr) {
    return absl::FailedPreconditionError("no model to checkpoint");
  }
  v1::ShardCheckpoint c;
  *c.mutable_spec() = m->model->spec();
  c.set_shard(shard_);
  for (int i : m->model->local_slices()) {
    v1::SliceCheckpoint* out = c.add_slices();
    out->set_slice(static_cast<uint32_t>(i));
    m->slices[i]->Save(out, pending);
  }
  return c;
}

absl::Status ShardStore::Restore(const v1::ShardCheckpoint& checkpoint) {
  if (static_cast<int>(checkpoint.shard()) != shard_) {
    return absl::FailedPreconditionError(
        absl::StrCat("checkpoint is of shard ", checkpoint.shard(),
                     ", this is shard ", shard_));
  }
  auto built = BuildModel(checkpoint.spec());
  if (!built.ok()) return Annotate(built.status(), "checkpoint");
  std::shared_ptr<Model> m = *std::move(built);
  if (static_cast<uint32_t>(checkpoint.slices_size()) !=
      m->model->num_slices()) {
    return absl::DataLossError(absl::StrCat(
        "checkpoint has ", checkpoint.slices_size(), " slices; the model puts ",
        m->model->num_slices(), " here"));
  }
  for (const v1::SliceCheckpoint& sc : checkpoint.slices()) {
    if (sc.slice() >= m->slices.size() || m->slices[sc.slice()] == nullptr) {
      return absl::DataLossError(absl::StrCat(
          "checkpoint has slice ", sc.slice(), " which is not on this shard"));
    }
    if (!m->slices[sc.slice()]->Load(sc)) {
      return absl::DataLossError(absl::StrCat("checkpoint slice ", sc.slice(),
                                              " does not fit the model"));
    }
  }
  absl::MutexLock lock(&mu_);
  if (model_ != nullptr) {
    return absl::FailedPreconditionError(
        "a model is already declared; restore before serving");
  }
  {
    // A replica's snapshot may hold steps in progress.
    absl::MutexLock pending(&pending_mu_);
    for (const v1::SliceCheckpoint& sc : checkpoint.slices()) {
      if (sc.step_ranks_size() > 0) pending_.insert(sc.slice());
    }
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
