// PsClient's tensor calls (client/ps_client.h): pulls, pushes and
// push-pulls split into per-shard requests by Batches, and Restore; the
// model and its state are in ps_client_model.cc.
#include "client/ps_client.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "client/slice_data.h"
#include "common/parallel.h"
#include "common/status.h"
#include "common/tensor_bytes.h"
#include "common/wire_dtype.h"

namespace asyncps {

PsClient::PsClient(std::unique_ptr<ShardCaller> caller)
    : caller_(std::move(caller)),
      options_(caller_->options()),
      compressor_(options_.compress) {}

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

std::vector<std::vector<int>> PsClient::Batches(
    absl::Span<const int> tensors) const {
  const uint64_t limit = options_.max_message_bytes - kRequestOverhead;
  std::vector<std::vector<int>> batches;
  // The open batch per (shard, wire dtype) (-1: none yet), and its payload
  // so far, at shard * v1::DType_ARRAYSIZE + dtype.
  std::vector<int> open(num_shards() * v1::DType_ARRAYSIZE, -1);
  std::vector<uint64_t> open_bytes(open.size(), 0);
  for (int t : tensors) {
    for (int i : partition_->tensor_slices(t)) {
      const SliceInfo& s = partition_->slices()[i];
      const uint64_t bytes = s.count * kF32Bytes;
      const int key = s.shard * v1::DType_ARRAYSIZE + wire_dtypes_[t];
      if (open[key] < 0 || open_bytes[key] + bytes > limit) {
        open[key] = static_cast<int>(batches.size());
        open_bytes[key] = 0;
        batches.emplace_back();
      }
      batches[open[key]].push_back(i);
      open_bytes[key] += bytes;
    }
  }
  return batches;
}

namespace {

// Sums what the servers said of each pushed slice.
void AddPushResponse(const v1::PushResponse& response, PushStats* result) {
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
                        v1::PushRequest* request, bool again) {
  request->set_rank(rank);
  request->set_clock(clock);
  // Retries resend this very request, so they carry the same number.
  request->set_client_id(caller_->client_id());
  request->set_sequence(caller_->NextSequence());
  size_t elements = 0;
  for (int i : batch) {
    v1::SliceData* d = request->add_gradients();
    const SliceInfo& slice = partition_->slices()[i];
    FillKey(spec_, slice, d->mutable_key());
    d->set_version(versions[i].version);
    d->set_incarnation(versions[i].incarnation);
    if (optimizers != nullptr) {
      const v1::OptimizerSpec* o =
          (*optimizers)[partition_->slices()[i].tensor];
      if (o != nullptr) *d->mutable_optimizer() = *o;
    }
    elements += slice.count;
  }
  auto encode = [&](size_t k) {
    const SliceInfo& slice = partition_->slices()[batch[k]];
    const absl::Span<const float> values =
        grads[slice.tensor].subspan(slice.begin, slice.count);
    v1::SliceData* d = request->mutable_gradients(static_cast<int>(k));
    if (spec_.tensors(slice.tensor).buffer()) {
      // A buffer's push is its value (BatchNorm's running statistics), not
      // a gradient: it travels exact, and error feedback never sees it.
      d->set_dtype(v1::DTYPE_F32);
      EncodeTensor(v1::DTYPE_F32, values, d->mutable_data());
      return;
    }
    compressor_.Encode(batch[k], values, wire_dtypes_[slice.tensor], d, again);
  };
  // Compressing takes several passes over each slice (top-k of a
  // 33 M-parameter push: about 80 ms on one core, docs/COMPRESSION.md):
  // a large push's slices are encoded on several threads.
  constexpr size_t kParallelEncodeElements = size_t{4} << 20;
  const bool parallel = options_.compress.kind != Compression::kNone &&
                        elements >= kParallelEncodeElements;
  ParallelFor(batch.size(), parallel ? ParallelThreads() : 1, encode);
}

absl::Status PsClient::Push(absl::Span<const int> tensors,
                            const std::vector<std::vector<float>>& grads,
                            const std::vector<SliceVersion>& versions, int rank,
                            int64_t clock, PushStats* result) {
  return Push(tensors, Views(grads), versions, rank, clock, result);
}

absl::Status PsClient::Push(absl::Span<const int> tensors,
                            const ConstTensorViews& grads,
                            const std::vector<SliceVersion>& versions, int rank,
                            int64_t clock, PushStats* result,
                            const TensorOptimizers* optimizers, bool again) {
  RETURN_IF_ERROR(CheckViews(tensors, grads, "Push"));
  ScopedSpan span(options_.timeline, "push", "exchange");
  span.set_arg("tensors", static_cast<int64_t>(tensors.size()));
  std::vector<std::vector<int>> batches = Batches(tensors);
  std::vector<Call<v1::PushRequest, v1::PushResponse>> calls(batches.size());
  for (size_t b = 0; b < batches.size(); ++b) {
    calls[b].shard = partition_->slices()[batches[b][0]].shard;
    FillPush(batches[b], grads, versions, rank, clock, optimizers,
             &calls[b].request, again);
  }
  RETURN_IF_ERROR(caller_->Exchange(&calls, FrameOp::kPush, ASYNCPS_RPC(Push),
                                    "Push",
                                    /*idempotent=*/true));
  if (result != nullptr) {
    *result = PushStats();
    for (const auto& call : calls) AddPushResponse(call.response, result);
  }
  return absl::OkStatus();
}

absl::Status PsClient::PushNoGradient(
    absl::Span<const int> tensors, int rank, int64_t clock,
    const std::vector<SliceVersion>* versions) {
  std::vector<std::vector<int>> batches = Batches(tensors);
  std::vector<Call<v1::PushRequest, v1::PushResponse>> calls(batches.size());
  for (size_t b = 0; b < batches.size(); ++b) {
    calls[b].shard = partition_->slices()[batches[b][0]].shard;
    v1::PushRequest& request = calls[b].request;
    request.set_rank(rank);
    request.set_clock(clock);
    request.set_client_id(caller_->client_id());
    request.set_sequence(caller_->NextSequence());
    for (int i : batches[b]) {
      v1::SliceData* d = request.add_gradients();
      FillKey(spec_, partition_->slices()[i], d->mutable_key());
      d->set_dtype(v1::DTYPE_F32);
      d->set_no_gradient(true);
      if (versions != nullptr && static_cast<size_t>(i) < versions->size()) {
        d->set_incarnation((*versions)[i].incarnation);
      }
    }
  }
  return caller_->Exchange(&calls, FrameOp::kPush, ASYNCPS_RPC(Push), "Push",
                           /*idempotent=*/true);
}

absl::Status PsClient::PushPull(absl::Span<const int> tensors,
                                const std::vector<std::vector<float>>& grads,
                                const std::vector<SliceVersion>& versions,
                                int rank, int64_t clock,
                                std::vector<std::vector<float>>* weights,
                                std::vector<SliceVersion>* new_versions,
                                PushStats* result) {
  return PushPull(tensors, Views(grads), versions, rank, clock, Views(weights),
                  new_versions, result);
}

absl::Status PsClient::PushPull(
    absl::Span<const int> tensors, const ConstTensorViews& grads,
    const std::vector<SliceVersion>& versions, int rank, int64_t clock,
    const TensorViews& weights, std::vector<SliceVersion>* new_versions,
    PushStats* result, const TensorOptimizers* optimizers) {
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
  if (result != nullptr) *result = PushStats();
  for (size_t b = 0; b < batches.size(); ++b) {
    RETURN_IF_ERROR(TakeWeights(calls[b].shard, batches[b],
                                calls[b].response.pull(), weights,
                                new_versions));
    if (result != nullptr) AddPushResponse(calls[b].response.push(), result);
  }
  return absl::OkStatus();
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
