#include "client/ps_client.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <chrono>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/blocking_counter.h"
#include "absl/synchronization/notification.h"
#include "common/backoff.h"
#include "common/grpc_credentials.h"
#include "common/grpc_status.h"
#include "common/random_id.h"
#include "common/status.h"
#include "common/tensor_bytes.h"
#include "common/wire_dtype.h"

namespace asyncps {
PsClient::PsClient(std::unique_ptr<ShardCaller> caller)
    : caller_(std::move(caller)), options_(caller_->options()) {}

absl::StatusOr<std::unique_ptr<PsClient>> PsClient::Create(
    PsClientOptions options) {
  ASSIGN_OR_RETURN(std::unique_ptr<ShardCaller> caller,
                   ShardCaller::Create(std::move(options)));
  return std::unique_ptr<PsClient>(new PsClient(std::move(caller)));
}

absl::Status PsClient::Join(int rank, int num_workers) {
  v1::RegisterRequest req;
  req.set_rank(rank);
  req.set_num_workers(num_workers);
  for (int s = 0; s < num_shards(); ++s) {
    RETURN_IF_ERROR(caller_->Register(s, req).status());
  }
  return absl::OkStatus();
}

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
  return DeclareOnEveryShard(spec, /*weights_follow=*/false, &calls);
}

absl::Status PsClient::DeclareOnEveryShard(
    const v1::ModelSpec& spec, bool weights_follow,
    std::vector<Call<v1::DeclareModelRequest, v1::DeclareModelResponse>>*
        calls) {
  // Checked here as UseModel would, but adopted only once the shards took
  // it: a refused declaration leaves the model this client had.
  if (static_cast<int>(spec.num_shards()) != num_shards()) {
    return UseModel(spec);
  }
  calls->assign(num_shards(), {});
  for (int s = 0; s < num_shards(); ++s) {
    (*calls)[s].shard = s;
    *(*calls)[s].request.mutable_spec() = spec;
    (*calls)[s].request.set_weights_follow(weights_follow);
  }
  RETURN_IF_ERROR(
      caller_->CallAll(calls, ASYNCPS_RPC(DeclareModel), "DeclareModel"));
  return UseModel(spec);
}

absl::Status PsClient::DeclareModel(const v1::ModelSpec& spec,
                                    const ConstTensorViews& initial) {
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
  std::vector<Call<v1::DeclareModelRequest, v1::DeclareModelResponse>> calls;
  RETURN_IF_ERROR(DeclareOnEveryShard(spec, /*weights_follow=*/true, &calls));
  const std::vector<SliceVersion> zero(partition_->slices().size());
  for (const auto& call : calls) {
    if (!call.response.created()) continue;
    RETURN_IF_ERROR(Restore(call.shard, initial, zero, caller_->rank()));
  }
  return absl::OkStatus();
}

std::vector<std::vector<int>> PsClient::Batches(
    absl::Span<const int> tensors) const {
  const uint64_t limit = options_.max_message_bytes - kRequestOverhead;
  std::vector<std::vector<int>> batches;
  // The open batch per (shard, wire dtype), and its payload so far.
  absl::flat_hash_map<std::pair<int, int>, std::pair<int, uint64_t>> open;
  for (int t : tensors) {
    for (int i : partition_->tensor_slices(t)) {
      const SliceInfo& s = partition_->slices()[i];
      const uint64_t bytes = s.count * kF32Bytes;
      auto [it, fresh] = open.try_emplace({s.shard, wire_dtypes_[t]});
      auto& [batch, batch_bytes] = it->second;
      if (fresh || batch_bytes + bytes > limit) {
        batch = static_cast<int>(batches.size());
        batch_bytes = 0;
        batches.emplace_back();
      }
      batches[batch].push_back(i);
      batch_bytes += bytes;
    }
  }
  return batches;
}

namespace {

void FillKey(const v1::ModelSpec& spec, const SliceInfo& s, v1::SliceKey* key) {
  key->set_tensor(spec.tensors(s.tensor).name());
  key->set_index(s.index);
  key->set_begin(s.begin);
  key->set_count(s.count);
}

// Slice `s` of `values` (one view per tensor) as `dtype` payload.
void FillSliceData(const v1::ModelSpec& spec, const SliceInfo& s,
                   const ConstTensorViews& values, SliceVersion version,
                   v1::DType dtype, v1::SliceData* d) {
  FillKey(spec, s, d->mutable_key());
  d->set_dtype(dtype);
  d->set_version(version.version);
  d->set_incarnation(version.incarnation);
  EncodeTensor(dtype, values[s.tensor].subspan(s.begin, s.count),
               d->mutable_data());
}

ConstTensorViews Views(const std::vector<std::vector<float>>& values) {
  ConstTensorViews views;
  for (const std::vector<float>& v : values) views.emplace_back(v);
  return views;
}

TensorViews Views(std::vector<std::vector<float>>* values) {
  TensorViews views;
  for (std::vector<float>& v : *values) views.emplace_back(absl::MakeSpan(v));
  return views;
}

// Sums what the servers said of each pushed slice.
void AddPushResponse(const v1::PushResponse& response, PushResult* result) {
  for (int64_t s : response.staleness()) {
    ++result->slices;
    result->total_staleness += s;
    result->max_staleness = std::max(result->max_staleness, s);
  }
  for (bool d : response.dropped()) result->dropped += d;
  result->front_step = std::max(result->front_step, response.front_step());
}

}  // namespace

template <typename View>
absl::Status PsClient::CheckViews(absl::Span<const int> tensors,
                                  const std::vector<View>& views,
                                  const char* what) const {
  for (int t : tensors) {
    if (t < 0 || t >= spec_.tensors_size()) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": no tensor ", t, " in the model"));
    }
    const uint64_t want = partition_->tensor_elements(t);
    const uint64_t have =
        static_cast<size_t>(t) < views.size() ? views[t].size() : 0;
    if (have != want) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": tensor '", spec_.tensors(t).name(), "' has ",
                       want, " elements but its buffer ", have));
    }
  }
  return absl::OkStatus();
}

absl::Status PsClient::Pull(absl::Span<const int> tensors,
                            std::vector<std::vector<float>>* values,
                            std::vector<SliceVersion>* versions, int rank,
                            int64_t clock) {
  return Pull(tensors, Views(values), versions, rank, clock);
}

absl::Status PsClient::Pull(absl::Span<const int> tensors,
                            const TensorViews& values,
                            std::vector<SliceVersion>* versions, int rank,
                            int64_t clock, bool after_push) {
  RETURN_IF_ERROR(CheckViews(tensors, values, "Pull"));
  ScopedSpan span(options_.timeline, "pull", "exchange");
  span.set_arg("tensors", static_cast<int64_t>(tensors.size()));
  std::vector<std::vector<int>> batches = Batches(tensors);
  std::vector<Call<v1::PullRequest, v1::PullResponse>> calls(batches.size());
  for (size_t b = 0; b < batches.size(); ++b) {
    calls[b].shard = partition_->slices()[batches[b][0]].shard;
    calls[b].request.set_rank(rank);
    calls[b].request.set_clock(clock);
    calls[b].request.set_after_push(after_push);
    calls[b].request.set_dtype(BatchDtype(batches[b]));
    for (int i : batches[b]) {
      FillKey(spec_, partition_->slices()[i], calls[b].request.add_slices());
    }
    const size_t first = static_cast<size_t>(batches[b][0]);
    if (first < versions->size()) {
      calls[b].request.set_incarnation((*versions)[first].incarnation);
    }
  }
  RETURN_IF_ERROR(caller_->Exchange(&calls, FrameOp::kPull, ASYNCPS_RPC(Pull),
                                    "Pull",
                                    /*idempotent=*/true));
  versions->resize(partition_->slices().size());
  for (size_t b = 0; b < batches.size(); ++b) {
    RETURN_IF_ERROR(TakeWeights(calls[b].shard, batches[b], calls[b].response,
                                values, versions));
  }
  return absl::OkStatus();
}

absl::Status PsClient::TakeWeights(int shard, const std::vector<int>& batch,
                                   const v1::PullResponse& response,
                                   const TensorViews& values,
                                   std::vector<SliceVersion>* versions) const {
  if (response.slices_size() != static_cast<int>(batch.size())) {
    return absl::InternalError(
        absl::StrCat("shard ", shard, " answered ", response.slices_size(),
                     " slices for a pull of ", batch.size()));
  }
  for (size_t k = 0; k < batch.size(); ++k) {
    const SliceInfo& s = partition_->slices()[batch[k]];
    const v1::SliceData& d = response.slices(static_cast<int>(k));
    if (d.dtype() != wire_dtypes_[s.tensor] ||
        d.data().size() != s.count * DTypeSize(d.dtype())) {
      return absl::InternalError(
          absl::StrCat("shard ", shard, " answered a malformed slice for '",
                       spec_.tensors(s.tensor).name(), "'#", s.index));
    }
    DecodeTensor(d.dtype(), d.data(),
                 values[s.tensor].subspan(s.begin, s.count));
    (*versions)[batch[k]] = SliceVersion{d.version(), d.incarnation()};
  }
  return absl::OkStatus();
}

void PsClient::FillPush(const std::vector<int>& batch,
                        const ConstTensorViews& grads,
                        const std::vector<SliceVersion>& versions, int rank,
                        int64_t clock, const TensorOptimizers* optimizers,
                        v1::PushRequest* request) {
  request->set_rank(rank);
  request->set_clock(clock);
  // Retries resend this very request, so they carry the same number.
  request->set_client_id(caller_->client_id());
  request->set_sequence(caller_->NextSequence());
  for (int i : batch) {
    v1::SliceData* d = request->add_gradients();
    FillSliceData(spec_, partition_->slices()[i], grads, versions[i],
                  wire_dtypes_[partition_->slices()[i].tensor], d);
    if (optimizers != nullptr) {
      const v1::OptimizerSpec* o =
          (*optimizers)[partition_->slices()[i].tensor];
      if (o != nullptr) *d->mutable_optimizer() = *o;
    }
  }
}

absl::Status PsClient::Push(absl::Span<const int> tensors,
                            const std::vector<std::vector<float>>& grads,
                            const std::vector<SliceVersion>& versions, int rank,
                            int64_t clock, PushResult* result) {
  return Push(tensors, Views(grads), versions, rank, clock, result);
}

absl::Status PsClient::Push(absl::Span<const int> tensors,
                            const ConstTensorViews& grads,
                            const std::vector<SliceVersion>& versions, int rank,
                            int64_t clock, PushResult* result,
                            const TensorOptimizers* optimizers) {
  RETURN_IF_ERROR(CheckViews(tensors, grads, "Push"));
  ScopedSpan span(options_.timeline, "push", "exchange");
  span.set_arg("tensors", static_cast<int64_t>(tensors.size()));
  std::vector<std::vector<int>> batches = Batches(tensors);
  std::vector<Call<v1::PushRequest, v1::PushResponse>> calls(batches.size());
  for (size_t b = 0; b < batches.size(); ++b) {
    calls[b].shard = partition_->slices()[batches[b][0]].shard;
    FillPush(batches[b], grads, versions, rank, clock, optimizers,
             &calls[b].request);
  }
  RETURN_IF_ERROR(caller_->Exchange(&calls, FrameOp::kPush, ASYNCPS_RPC(Push),
                                    "Push",
                                    /*idempotent=*/true));
  if (result != nullptr) {
    *result = PushResult();
    for (const auto& call : calls) AddPushResponse(call.response, result);
  }
  return absl::OkStatus();
}

absl::Status PsClient::PushPull(absl::Span<const int> tensors,
                                const std::vector<std::vector<float>>& grads,
                                const std::vector<SliceVersion>& versions,
                                int rank, int64_t clock,
                                std::vector<std::vector<float>>* weights,
                                std::vector<SliceVersion>* new_versions,
                                PushResult* result) {
  return PushPull(tensors, Views(grads), versions, rank, clock, Views(weights),
                  new_versions, result);
}

absl::Status PsClient::PushPull(
    absl::Span<const int> tensors, const ConstTensorViews& grads,
    const std::vector<SliceVersion>& versions, int rank, int64_t clock,
    const TensorViews& weights, std::vector<SliceVersion>* new_versions,
    PushResult* result, const TensorOptimizers* optimizers) {
  RETURN_IF_ERROR(CheckViews(tensors, grads, "PushPull"));
  RETURN_IF_ERROR(CheckViews(tensors, weights, "PushPull"));
  ScopedSpan span(options_.timeline, "pushpull", "exchange");
  span.set_arg("tensors", static_cast<int64_t>(tensors.size()));
  // The answer carries weights as large as the gradients, so the same
  // batches keep both directions under the message limit.
  std::vector<std::vector<int>> batches = Batches(tensors);
  std::vector<Call<v1::PushPullRequest, v1::PushPullResponse>> calls(
      batches.size());
  for (size_t b = 0; b < batches.size(); ++b) {
    calls[b].shard = partition_->slices()[batches[b][0]].shard;
    calls[b].request.set_weights_dtype(BatchDtype(batches[b]));
    FillPush(batches[b], grads, versions, rank, clock, optimizers,
             calls[b].request.mutable_push());
  }
  RETURN_IF_ERROR(caller_->Exchange(&calls, FrameOp::kPushPull,
                                    ASYNCPS_RPC(PushPull), "PushPull",
                                    /*idempotent=*/true));
  new_versions->resize(partition_->slices().size());
  if (result != nullptr) *result = PushResult();
  for (size_t b = 0; b < batches.size(); ++b) {
    RETURN_IF_ERROR(TakeWeights(calls[b].shard, batches[b],
                                calls[b].response.pull(), weights,
                                new_versions));
    if (result != nullptr) AddPushResponse(calls[b].response.push(), result);
  }
  return absl::OkStatus();
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
  std::vector<std::vector<int>> batches = Batches(tensors);
  std::vector<Call<v1::AssignRequest, v1::AssignResponse>> calls(
      batches.size());
  for (size_t b = 0; b < batches.size(); ++b) {
    calls[b].shard = partition_->slices()[batches[b][0]].shard;
    calls[b].request.set_rank(rank);
    calls[b].request.set_load_state(true);
    for (int i : batches[b]) {
      const SliceInfo& s = partition_->slices()[i];
      const TensorSlots& t = state[s.tensor];
      v1::SliceData* d = calls[b].request.add_weights();
      FillKey(spec_, s, d->mutable_key());
      auto put = [&s](const std::vector<float>& slot, std::string* out) {
        if (slot.empty()) return;
        EncodeF32(absl::MakeConstSpan(slot).subspan(s.begin, s.count), out);
      };
      put(t.slot1, d->mutable_slot1());
      put(t.slot2, d->mutable_slot2());
      d->set_optimizer_steps(t.steps);
    }
  }
  return caller_->CallAll(&calls, ASYNCPS_RPC(Assign), "Assign",
                          /*idempotent=*/true);
}

absl::Status PsClient::Assign(absl::Span<const int> tensors,
                              const std::vector<std::vector<float>>& weights,
                              int64_t version, int rank) {
  const ConstTensorViews views = Views(weights);
  std::vector<std::vector<int>> batches = Batches(tensors);
  std::vector<Call<v1::AssignRequest, v1::AssignResponse>> calls(
      batches.size());
  for (size_t b = 0; b < batches.size(); ++b) {
    calls[b].shard = partition_->slices()[batches[b][0]].shard;
    calls[b].request.set_rank(rank);
    for (int i : batches[b]) {
      // Weights go in f32 whatever the wire dtype: they replace the
      // servers' master copy.
      FillSliceData(spec_, partition_->slices()[i], views,
                    SliceVersion{version, 0}, v1::DTYPE_F32,
                    calls[b].request.add_weights());
    }
  }
  return caller_->CallAll(&calls, ASYNCPS_RPC(Assign), "Assign",
                          /*idempotent=*/true);
}

absl::StatusOr<std::vector<int>> PsClient::ShardsWithoutModel() {
  std::vector<Call<v1::GetModelRequest, v1::GetModelResponse>> calls(
      num_shards());
  for (int s = 0; s < num_shards(); ++s) calls[s].shard = s;
  std::vector<int> lost;
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
  return lost;
}

absl::StatusOr<bool> PsClient::Redeclare(int shard) {
  v1::DeclareModelRequest request;
  *request.mutable_spec() = spec_;
  request.set_recover(true);
  ASSIGN_OR_RETURN(v1::DeclareModelResponse response,
                   caller_->CallOne<v1::DeclareModelResponse>(
                       shard, request, ASYNCPS_RPC(DeclareModel),
                       "DeclareModel", /*idempotent=*/true));
  return response.created();
}

absl::Status PsClient::Restore(int shard,
                               const std::vector<std::vector<float>>& weights,
                               const std::vector<SliceVersion>& versions,
                               int rank) {
  return Restore(shard, Views(weights), versions, rank);
}

absl::Status PsClient::Restore(int shard, const ConstTensorViews& weights,
                               const std::vector<SliceVersion>& versions,
                               int rank) {
  std::vector<int> all(spec_.tensors_size());
  for (int t = 0; t < spec_.tensors_size(); ++t) all[t] = t;
  RETURN_IF_ERROR(CheckViews(all, weights, "Restore"));
  std::vector<Call<v1::AssignRequest, v1::AssignResponse>> calls;
  for (const std::vector<int>& batch : Batches(all)) {
    if (partition_->slices()[batch[0]].shard != shard) continue;
    Call<v1::AssignRequest, v1::AssignResponse>& call = calls.emplace_back();
    call.shard = shard;
    call.request.set_rank(rank);
    call.request.set_restore(true);
    for (int i : batch) {
      // The weights replace the lost master copy: f32, and the versions
      // as they were (the incarnation they came from means nothing there).
      FillSliceData(spec_, partition_->slices()[i], weights,
                    SliceVersion{versions[i].version, 0}, v1::DTYPE_F32,
                    call.request.add_weights());
    }
  }
  return caller_->CallAll(&calls, ASYNCPS_RPC(Assign), "Assign",
                          /*idempotent=*/true);
}

}  // namespace asyncps
