// The templates of client/shard_caller.h; include that header, not this.
#ifndef ASYNCPS_CLIENT_SHARD_CALLER_INL_H_
#define ASYNCPS_CLIENT_SHARD_CALLER_INL_H_

#include <atomic>
#include <cstddef>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace asyncps {

template <typename Request, typename Response, typename Attempt>
absl::Status ShardCaller::Retry(std::vector<Call<Request, Response>>* calls,
                                Attempt attempt, const char* what,
                                bool idempotent) {
  std::vector<Call<Request, Response>*> pending;
  for (auto& call : *calls) pending.push_back(&call);
  Backoff backoff(options_.backoff_initial, options_.backoff_max,
                  options_.retry_for, options_.clock);
  while (true) {
    const int64_t ended = registrations_ended_.load();
    // Each attempt stamps its requests as it sends them (GrpcAttempt,
    // TcpAttempt): a retry after a registration carries the new secret.
    // The member each call goes to, to move on from it if it is not
    // serving.
    std::vector<int> tried;
    for (const Call<Request, Response>* call : pending) {
      tried.push_back(Current(call->shard));
    }
    const std::vector<absl::Status> results = attempt(pending);
    // A refusal for want of a secret that has changed since (a shard
    // restarted, the worker registered again) is retried with the new one,
    // also when the new one is still on its way.
    const bool newer_secret = registrations_started_.load() != ended;
    std::vector<Call<Request, Response>*> retry;
    std::string last_error;
    for (size_t k = 0; k < pending.size(); ++k) {
      const absl::Status& s = results[k];
      if (s.ok()) continue;
      const int shard = pending[k]->shard;
      const std::string where =
          absl::StrCat(what, " to shard ", shard, " at ",
                       members_[shard][tried[k]].address.ToString());
      if (s.code() == absl::StatusCode::kUnavailable ||
          (idempotent && s.code() == absl::StatusCode::kDeadlineExceeded) ||
          (newer_secret && s.code() == absl::StatusCode::kPermissionDenied)) {
        retry.push_back(pending[k]);
        if (s.code() == absl::StatusCode::kUnavailable && !WasNotWaitedFor(s)) {
          NextMember(shard, tried[k]);
        }
        // The answer that ended the attempt says more than those it cut.
        if (!WasNotWaitedFor(s) || last_error.empty()) {
          last_error = absl::StrCat(where, ": ", s.message());
        }
        continue;
      }
      return Annotate(s, where);
    }
    if (retry.empty()) return absl::OkStatus();
    retries_ += static_cast<int64_t>(retry.size());
    // A replicated shard being retried is most likely failing over: its
    // new primary is asked for often, so that the pause is the promotion's
    // and not the backoff's (which would have grown while the group had
    // none).
    bool group = false;
    for (const Call<Request, Response>* call : retry) {
      group |= members_[call->shard].size() > 1;
    }
    if (!backoff.Wait(group ? kGroupBackoffMax : absl::InfiniteDuration())) {
      return absl::UnavailableError(absl::StrCat(
          "giving up after ", absl::FormatDuration(options_.retry_for),
          " of retries: ", last_error));
    }
    pending = std::move(retry);
  }
}

template <typename Request, typename Response, typename Method>
std::vector<absl::Status> ShardCaller::GrpcAttempt(
    const std::vector<Call<Request, Response>*>& calls, Method method,
    bool end_early) {
  std::vector<grpc::Status> results(calls.size());
  std::vector<std::unique_ptr<grpc::ClientContext>> contexts(calls.size());
  for (size_t k = 0; k < calls.size(); ++k) {
    contexts[k] = NewContext(absl::Now() + options_.rpc_timeout);
  }
  absl::BlockingCounter done(static_cast<int>(calls.size()));
  // The first answer that is not OK (-1: none yet); the calls still out
  // are cancelled then.
  std::atomic<int> failed{-1};
  for (size_t k = 0; k < calls.size(); ++k) {
    Call<Request, Response>& call = *calls[k];
    Stamp(call.shard, &call.request);
    method(Stub(call.shard), contexts[k].get(), &call.request, &call.response,
           [&results, &done, &contexts, &failed, end_early, k](grpc::Status s) {
             int none = -1;
             if (end_early && !s.ok() &&
                 failed.compare_exchange_strong(none, static_cast<int>(k))) {
               for (size_t j = 0; j < contexts.size(); ++j) {
                 if (j != k) contexts[j]->TryCancel();
               }
             }
             results[k] = std::move(s);
             done.DecrementCount();
           });
  }
  done.Wait();
  const int first = failed.load();
  std::vector<absl::Status> out;
  for (size_t k = 0; k < results.size(); ++k) {
    absl::Status s = FromGrpcStatus(results[k]);
    if (first >= 0 && static_cast<int>(k) != first &&
        s.code() == absl::StatusCode::kCancelled) {
      s = NotWaitedFor(calls[k]->shard);
    } else if (s.code() == absl::StatusCode::kCancelled) {
      // Not this client's doing: the server cancelled it as it shut down
      // (gRPC's answer to calls in flight then). Nothing was done that a
      // retry would repeat (pushes are answered once, by their ledger), so
      // it is retried as the shard being away.
      s = absl::UnavailableError(absl::StrCat(
          "cancelled by the server (shutting down): ", s.message()));
    }
    out.push_back(std::move(s));
  }
  return out;
}

template <typename Request, typename Response>
std::vector<absl::Status> ShardCaller::TcpAttempt(
    const std::vector<Call<Request, Response>*>& calls, FrameOp op) {
  const absl::Time deadline = absl::Now() + options_.rpc_timeout;
  const bool end_early = MayHold(op);
  std::vector<absl::Status> results(calls.size());
  std::vector<std::unique_ptr<DataConnection>> connections(calls.size());
  // Where each connection goes back (the shard's member may change).
  std::vector<DataChannel*> channels(calls.size());
  // Every request goes out before any answer is read, so the shards work
  // at once. (No deadlock: a shard answers only after reading its whole
  // request, and reading one answer never waits on another shard.)
  std::vector<size_t> out;  // The calls whose answers are to come.
  bool unsent = false;
  for (size_t k = 0; k < calls.size(); ++k) {
    Call<Request, Response>& call = *calls[k];
    Stamp(call.shard, &call.request);
    DataChannel& channel = Data(call.shard);
    channels[k] = &channel;
    auto c = channel.Take(deadline);
    if (!c.ok()) {
      results[k] = c.status();
      unsent = true;
      continue;
    }
    sent_bytes_ += static_cast<int64_t>(call.request.ByteSizeLong());
    results[k] = (*c)->Send(op, &call.request, options_.rpc_timeout, deadline);
    if (results[k].ok()) {
      connections[k] = *std::move(c);
      out.push_back(k);
    } else {
      unsent = true;
      channel.Reset();
    }
  }
  // A request that could not go out ends the attempt before any wait.
  if (end_early && unsent) {
    for (size_t j : out) results[j] = NotWaitedFor(calls[j]->shard);
    out.clear();
  }
  // Answers in the order they come (a shard holding a bsp pull may answer
  // long after another refused it).
  while (!out.empty()) {
    absl::InlinedVector<DataConnection*, 4> waiting;
    for (size_t k : out) waiting.push_back(connections[k].get());
    // The last one is read at once (Receive waits for it itself).
    absl::StatusOr<size_t> ready =
        out.size() == 1 ? 0 : DataConnection::WaitAny(waiting, deadline);
    if (!ready.ok()) {
      // Connections with an answer still to come are closed, not reused.
      for (size_t k : out) results[k] = ready.status();
      break;
    }
    const size_t k = out[*ready];
    out.erase(out.begin() + static_cast<std::ptrdiff_t>(*ready));
    Call<Request, Response>& call = *calls[k];
    results[k] = connections[k]->Receive(&call.response, deadline);
    if (results[k].ok()) {
      received_bytes_ += static_cast<int64_t>(call.response.ByteSizeLong());
    }
    const bool failed = results[k].code() == absl::StatusCode::kUnavailable;
    channels[k]->Give(std::move(connections[k]));
    if (failed) channels[k]->Reset();
    if (end_early && !results[k].ok()) {
      for (size_t j : out) results[j] = NotWaitedFor(calls[j]->shard);
      break;
    }
  }
  return results;
}

template <typename Request, typename Response, typename Method>
absl::Status ShardCaller::CallAll(std::vector<Call<Request, Response>>* calls,
                                  Method method, const char* what,
                                  bool idempotent) {
  return Retry(
      calls,
      [this, &method](const std::vector<Call<Request, Response>*>& pending) {
        return GrpcAttempt(pending, method);
      },
      what, idempotent);
}

template <typename Request, typename Response, typename Method>
absl::Status ShardCaller::Exchange(std::vector<Call<Request, Response>>* calls,
                                   FrameOp op, Method method, const char* what,
                                   bool idempotent) {
  if (options_.transport == Transport::kGrpc) {
    RETURN_IF_ERROR(Retry(
        calls,
        [this, &method, op](const std::vector<Call<Request, Response>*>& p) {
          return GrpcAttempt(p, method, /*end_early=*/MayHold(op));
        },
        what, idempotent));
    for (const auto& call : *calls) {
      sent_bytes_ += static_cast<int64_t>(call.request.ByteSizeLong());
      received_bytes_ += static_cast<int64_t>(call.response.ByteSizeLong());
    }
    return absl::OkStatus();
  }
  return Retry(
      calls,
      [this, op](const std::vector<Call<Request, Response>*>& pending) {
        return TcpAttempt(pending, op);
      },
      what, idempotent);
}

template <typename Response, typename Request, typename Method>
absl::StatusOr<Response> ShardCaller::CallOne(int shard, const Request& request,
                                              Method method, const char* what,
                                              bool idempotent) {
  std::vector<Call<Request, Response>> calls(1);
  calls[0].shard = shard;
  calls[0].request = request;
  absl::Status s = CallAll(&calls, method, what, idempotent);
  if (!s.ok()) return s;
  return std::move(calls[0].response);
}

template <typename Response, typename Request, typename Method>
absl::StatusOr<Response> ShardCaller::CallMember(int shard, int member,
                                                 const Request& request,
                                                 Method method) {
  if (shard < 0 || shard >= num_shards() || member < 0 ||
      member >= num_members(shard)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "no member ", member, " of shard ", shard, " in --servers"));
  }
  std::unique_ptr<grpc::ClientContext> context =
      NewContext(absl::Now() + options_.rpc_timeout);
  Request r = request;
  Response response;
  absl::Notification done;
  grpc::Status status;
  method(members_[shard][member].stub.get(), context.get(), &r, &response,
         [&](grpc::Status s) {
           status = std::move(s);
           done.Notify();
         });
  done.WaitForNotification();
  RETURN_IF_ERROR(FromGrpcStatus(status));
  return response;
}

}  // namespace asyncps

#endif  // ASYNCPS_CLIENT_SHARD_CALLER_INL_H_
