// PsClient's model (client/ps_client.h): declaring or adopting it, the
// wire dtype of each tensor, the optimizer state, and the calls that
// replace weights (allreduce's Assign, recovery of a shard that lost the
// model). The tensor calls are in ps_client.cc.
#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "client/ps_client.h"
#include "client/slice_data.h"
#include "common/backoff.h"
#include "common/status.h"
#include "common/tensor_bytes.h"
#include "common/wire_dtype.h"
#include "glog/logging.h"

namespace asyncps {

absl::Status PsClient::UseModel(const v1::ModelSpec& spec) {
  if (static_cast<int>(spec.num_shards()) != num_shards()) {
    return absl::InvalidArgumentError(
        absl::StrCat("model spec has num_shards = ", spec.num_shards(), " but ",
                     num_shards(), " servers are configured"));
  }
  ASSIGN_OR_RETURN(Partition partition, Partition::Create(spec));
  spec_ = spec;
  partition_ = std::move(partition);
  wire_dtypes_.assign(spec.tensors_size(), options_.wire_dtype);
  return absl::OkStatus();
}

absl::Status PsClient::SetWireDtypes(const std::vector<v1::DType>& dtypes) {
  if (dtypes.size() != static_cast<size_t>(spec_.tensors_size())) {
    return absl::InvalidArgumentError(
        absl::StrCat("wire dtypes for ", dtypes.size(),
                     " tensors; the model has ", spec_.tensors_size()));
  }
  for (size_t t = 0; t < dtypes.size(); ++t) {
    if (!IsWireDtype(dtypes[t])) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor '", spec_.tensors(t).name(), "' cannot travel in ",
          DTypeName(dtypes[t]), " (DTYPE_F32, DTYPE_BF16 or DTYPE_F16)"));
    }
  }
  wire_dtypes_ = dtypes;
  return absl::OkStatus();
}

absl::Status PsClient::FetchModel() {
  Backoff backoff(options_.backoff_initial, options_.backoff_max,
                  options_.retry_for, options_.clock);
  while (true) {
    auto got = caller_->CallOne<v1::GetModelResponse>(
        0, v1::GetModelRequest(), ASYNCPS_RPC(GetModel), "GetModel");
    if (got.ok()) return UseModel(got->spec());
    const absl::Status& s = got.status();
    // FAILED_PRECONDITION: no model yet; the workers declare it.
    if (s.code() != absl::StatusCode::kFailedPrecondition || !backoff.Wait()) {
      return s;
    }
  }
}

absl::Status PsClient::DeclareModel(const v1::ModelSpec& spec) {
  std::vector<Call<v1::DeclareModelRequest, v1::DeclareModelResponse>> calls;
  return DeclareOnShards(spec, /*weights_follow=*/false, {}, &calls);
}

absl::Status PsClient::DeclareOnShards(
    const v1::ModelSpec& spec, bool weights_follow,
    const std::vector<int>& skip,
    std::vector<Call<v1::DeclareModelRequest, v1::DeclareModelResponse>>*
        calls) {
  // Checked here as UseModel would, but adopted only once the shards took
  // it: a refused declaration leaves the model this client had.
  if (static_cast<int>(spec.num_shards()) != num_shards()) {
    return UseModel(spec);
  }
  calls->clear();
  for (int s = 0; s < num_shards(); ++s) {
    if (std::find(skip.begin(), skip.end(), s) != skip.end()) continue;
    auto& call = calls->emplace_back();
    call.shard = s;
    *call.request.mutable_spec() = spec;
    call.request.set_weights_follow(weights_follow);
  }
  RETURN_IF_ERROR(
      caller_->CallAll(calls, ASYNCPS_RPC(DeclareModel), "DeclareModel"));
  return UseModel(spec);
}

absl::Status PsClient::DeclareModel(const v1::ModelSpec& spec,
                                    const ConstTensorViews& initial,
                                    bool job_trained) {
  ASSIGN_OR_RETURN(const Partition partition, Partition::Create(spec));
  for (int t = 0; t < spec.tensors_size(); ++t) {
    const uint64_t have =
        static_cast<size_t>(t) < initial.size() ? initial[t].size() : 0;
    if (have != partition.tensor_elements(t)) {
      return absl::InvalidArgumentError(
          absl::StrCat("DeclareModel: tensor '", spec.tensors(t).name(),
                       "' has ", partition.tensor_elements(t),
                       " elements but its initial buffer ", have));
    }
  }
  // A shard that lost the model while the job has trained waits for a
  // worker that pulled its weights (Client::Impl::Recover): these initial
  // ones would set its part of the model back to the start (a chaos sweep
  // did so, in bsp with no checkpoints: accuracy 0.06).
  std::vector<int> skip;
  if (static_cast<int>(spec.num_shards()) == num_shards()) {
    ASSIGN_OR_RETURN(const ModelPresence presence, Presence());
    if (presence.trained || job_trained) skip = presence.lost;
  }
  if (!skip.empty()) {
    LOG(WARNING) << "shard(s) " << absl::StrJoin(skip, ",")
                 << " lost the model after the job trained: left to a "
                    "worker that holds their trained weights";
  }
  std::vector<Call<v1::DeclareModelRequest, v1::DeclareModelResponse>> calls;
  RETURN_IF_ERROR(DeclareOnShards(spec, /*weights_follow=*/true, skip, &calls));
  for (const auto& call : calls) {
    if (!call.response.created()) continue;
    RETURN_IF_ERROR(SendInitialWeights(call.shard, initial));
  }
  return absl::OkStatus();
}

absl::Status PsClient::SendInitialWeights(int shard,
                                          const ConstTensorViews& initial) {
  const std::vector<SliceVersion> zero(partition_->slices().size());
  // A shard may restart more than once while a job starts (chaos: kills a
  // second or two apart): a few rounds.
  absl::Status s;
  for (int round = 0; round < 3; ++round) {
    s = Restore(shard, initial, zero, caller_->rank());
    // FAILED_PRECONDITION: the shard awaits no restore (another copy came)
    // or has no model (it restarted since the declaration).
    if (s.code() != absl::StatusCode::kFailedPrecondition) return s;
    ASSIGN_OR_RETURN(const bool created, DeclareAgain(shard));
    if (!created) return absl::OkStatus();  // The model is there.
    LOG(WARNING) << "shard " << shard
                 << " restarted before it had the model's initial weights: "
                    "declared it there again";
  }
  return s;
}

absl::Status PsClient::PullState(absl::Span<const int> tensors,
                                 std::vector<TensorSlots>* state) {
  state->resize(spec_.tensors_size());
  std::vector<std::vector<int>> batches = Batches(tensors);
  std::vector<Call<v1::PullRequest, v1::PullResponse>> calls(batches.size());
  for (size_t b = 0; b < batches.size(); ++b) {
    calls[b].shard = partition_->slices()[batches[b][0]].shard;
    calls[b].request.set_rank(-1);
    calls[b].request.set_with_state(true);
    for (int i : batches[b]) {
      FillKey(spec_, partition_->slices()[i], calls[b].request.add_slices());
    }
  }
  RETURN_IF_ERROR(caller_->Exchange(&calls, FrameOp::kPull, ASYNCPS_RPC(Pull),
                                    "Pull",
                                    /*idempotent=*/true));
  for (size_t b = 0; b < batches.size(); ++b) {
    const v1::PullResponse& r = calls[b].response;
    if (r.slices_size() != static_cast<int>(batches[b].size())) {
      return absl::InternalError(
          absl::StrCat("shard ", calls[b].shard, " answered ", r.slices_size(),
                       " slices for a pull of ", batches[b].size()));
    }
    for (size_t k = 0; k < batches[b].size(); ++k) {
      const SliceInfo& s = partition_->slices()[batches[b][k]];
      const v1::SliceData& d = r.slices(static_cast<int>(k));
      TensorSlots& t = (*state)[s.tensor];
      const uint64_t n = partition_->tensor_elements(s.tensor);
      auto take = [&](const std::string& bytes, std::vector<float>* slot) {
        if (bytes.empty()) return absl::OkStatus();
        if (bytes.size() != s.count * kF32Bytes) {
          return absl::InternalError(absl::StrCat(
              "shard ", calls[b].shard, " answered a malformed state for '",
              spec_.tensors(s.tensor).name(), "'#", s.index));
        }
        slot->resize(n);
        DecodeF32(bytes, absl::MakeSpan(*slot).subspan(s.begin, s.count));
        return absl::OkStatus();
      };
      RETURN_IF_ERROR(take(d.slot1(), &t.slot1));
      RETURN_IF_ERROR(take(d.slot2(), &t.slot2));
      if (s.index == 0) t.steps = d.optimizer_steps();
    }
  }
  return absl::OkStatus();
}

absl::Status PsClient::LoadState(absl::Span<const int> tensors,
                                 const std::vector<TensorSlots>& state,
                                 int rank) {
  for (int t : tensors) {
    const uint64_t n = partition_->tensor_elements(t);
    const bool fits = static_cast<size_t>(t) < state.size() &&
                      (state[t].slot1.empty() || state[t].slot1.size() == n) &&
                      (state[t].slot2.empty() || state[t].slot2.size() == n);
    if (!fits) {
      return absl::InvalidArgumentError(
          absl::StrCat("optimizer state for '", spec_.tensors(t).name(),
                       "' does not have its ", n, " elements"));
    }
  }
  return AssignSlices(
      tensors, rank, /*load_state=*/true,
      [this, &state](const SliceInfo& s, v1::SliceData* d) {
        const TensorSlots& t = state[s.tensor];
        FillKey(spec_, s, d->mutable_key());
        auto put = [&s](const std::vector<float>& slot, std::string* out) {
          if (slot.empty()) return;
          EncodeF32(absl::MakeConstSpan(slot).subspan(s.begin, s.count), out);
        };
        put(t.slot1, d->mutable_slot1());
        put(t.slot2, d->mutable_slot2());
        d->set_optimizer_steps(t.steps);
      });
}

absl::Status PsClient::Assign(absl::Span<const int> tensors,
                              const std::vector<std::vector<float>>& weights,
                              int64_t version, int rank) {
  const ConstTensorViews views = Views(weights);
  // Weights go in f32 whatever the wire dtype: they replace the servers'
  // master copy.
  return AssignSlices(tensors, rank, /*load_state=*/false,
                      [&](const SliceInfo& s, v1::SliceData* d) {
                        FillSliceData(spec_, s, views, SliceVersion{version, 0},
                                      v1::DTYPE_F32, d);
                      });
}

template <typename Fill>
absl::Status PsClient::AssignSlices(absl::Span<const int> tensors, int rank,
                                    bool load_state, Fill fill) {
  std::vector<std::vector<int>> batches = Batches(tensors);
  std::vector<Call<v1::AssignRequest, v1::AssignResponse>> calls(
      batches.size());
  for (size_t b = 0; b < batches.size(); ++b) {
    calls[b].shard = partition_->slices()[batches[b][0]].shard;
    calls[b].request.set_rank(rank);
    calls[b].request.set_load_state(load_state);
    for (int i : batches[b]) {
      fill(partition_->slices()[i], calls[b].request.add_weights());
    }
  }
  return caller_->CallAll(&calls, ASYNCPS_RPC(Assign), "Assign",
                          /*idempotent=*/true);
}

absl::StatusOr<std::vector<int>> PsClient::ShardsWithoutModel() {
  ASSIGN_OR_RETURN(ModelPresence presence, Presence());
  return std::move(presence.lost);
}

absl::StatusOr<PsClient::ModelPresence> PsClient::Presence() {
  std::vector<Call<v1::GetModelRequest, v1::GetModelResponse>> calls(
      num_shards());
  for (int s = 0; s < num_shards(); ++s) calls[s].shard = s;
  ModelPresence presence;
  std::vector<int>& lost = presence.lost;
  // One attempt per shard (a FAILED_PRECONDITION is an answer, not an
  // error, here); UNAVAILABLE ones are retried.
  RETURN_IF_ERROR(caller_->Retry(
      &calls,
      [this, &lost](
          const std::vector<Call<v1::GetModelRequest, v1::GetModelResponse>*>&
              pending) {
        std::vector<absl::Status> results =
            caller_->GrpcAttempt(pending, ASYNCPS_RPC(GetModel));
        for (size_t k = 0; k < pending.size(); ++k) {
          if (results[k].code() == absl::StatusCode::kFailedPrecondition) {
            lost.push_back(pending[k]->shard);
            results[k] = absl::OkStatus();
          }
        }
        return results;
      },
      "GetModel", /*idempotent=*/true));
  std::sort(lost.begin(), lost.end());
  for (const auto& call : calls) {
    presence.trained |= call.response.newest_version() > 0;
  }
  return presence;
}

absl::StatusOr<bool> PsClient::Redeclare(int shard) {
  return DeclareOne(shard, /*recover=*/true);
}

absl::StatusOr<bool> PsClient::DeclareAgain(int shard) {
  return DeclareOne(shard, /*recover=*/false);
}

absl::StatusOr<bool> PsClient::DeclareOne(int shard, bool recover) {
  v1::DeclareModelRequest request;
  *request.mutable_spec() = spec_;
  if (recover) {
    request.set_recover(true);
  } else {
    request.set_weights_follow(true);
  }
  ASSIGN_OR_RETURN(v1::DeclareModelResponse response,
                   caller_->CallOne<v1::DeclareModelResponse>(
                       shard, request, ASYNCPS_RPC(DeclareModel),
                       "DeclareModel", /*idempotent=*/true));
  return response.created();
}

}  // namespace asyncps
