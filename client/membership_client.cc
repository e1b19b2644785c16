#include "client/membership_client.h"

#include <unistd.h>

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "glog/logging.h"

namespace asyncps {

MembershipClient::MembershipClient(ShardCaller* client,
                                   v1::RegisterRequest join,
                                   absl::Duration heartbeat_every)
    : client_(client),
      join_(std::move(join)),
      heartbeat_every_(heartbeat_every),
      incarnations_(client->num_shards()) {}

absl::StatusOr<std::unique_ptr<MembershipClient>> MembershipClient::Join(
    ShardCaller* client, int rank, int num_workers, Mode mode,
    absl::Duration heartbeat_every) {
  char host[256] = "";
  gethostname(host, sizeof(host) - 1);
  v1::RegisterRequest join;
  join.set_rank(rank);
  join.set_num_workers(num_workers);
  join.set_host(host);
  if (rank == -1) {
    ASSIGN_OR_RETURN(const v1::RegisterResponse assigned,
                     client->Register(0, join));
    join.set_rank(assigned.rank());
  }
  std::unique_ptr<MembershipClient> m(
      new MembershipClient(client, join, heartbeat_every));
  m->left_ = true;  // Until every shard has us, there is nothing to leave.
  std::vector<int64_t> resumes(client->num_shards());
  for (int s = 0; s < client->num_shards(); ++s) {
    ASSIGN_OR_RETURN(const v1::RegisterResponse r, client->Register(s, join));
    if (r.mode() != ModeName(mode)) {
      return absl::FailedPreconditionError(
          absl::StrCat("shard ", s, " runs --mode=", r.mode(),
                       " but this worker has --mode=", ModeName(mode),
                       "; start both with the same mode"));
    }
    {
      absl::MutexLock lock(&m->mu_);
      m->incarnations_[s] = r.incarnation();
    }
    if (s == 0) {
      m->NoteMembers(r);
      m->elastic_ = r.elastic();
    }
    resumes[s] = r.resume_clock();
    m->start_clock_ = std::max(m->start_clock_, r.resume_clock());
  }
  if (m->elastic_) {
    // Each shard answered the front it knew, and the job's is the highest:
    // one behind it would count this worker in a bsp step it does not send
    // (that step would wait for it). Told where it starts, it counts it
    // from the step after.
    v1::RegisterRequest again = join;
    again.set_clock(m->start_clock_);
    for (int s = 0; s < client->num_shards() && m->start_clock_ > 0; ++s) {
      if (resumes[s] >= m->start_clock_) continue;
      ASSIGN_OR_RETURN(const v1::RegisterResponse r,
                       client->Register(s, again));
      absl::MutexLock lock(&m->mu_);
      m->incarnations_[s] = r.incarnation();
    }
  }
  m->left_ = false;
  m->clock_ = m->start_clock_;
  m->heartbeat_ = std::thread([p = m.get()] { p->HeartbeatLoop(); });
  return m;
}

MembershipClient::~MembershipClient() { Leave(); }

v1::RegisterRequest MembershipClient::Again() const {
  v1::RegisterRequest again = join_;
  again.set_clock(clock_.load());
  if (elastic_) {
    // Who the restarted shard should wait for meanwhile.
    for (int r : live_ranks()) again.add_known_live(r);
  }
  return again;
}

absl::Status MembershipClient::Heartbeat(int shard, bool leaving) {
  v1::HeartbeatRequest req;
  req.set_rank(join_.rank());
  {
    absl::MutexLock lock(&mu_);
    req.set_incarnation(incarnations_[shard]);
    *req.mutable_progress() = progress_;
  }
  req.mutable_progress()->set_nonfinite_pushes(nonfinite_.load());
  req.set_clock(clock_.load());
  req.set_leaving(leaving);
  // One attempt: the next period is the retry, and a shard that is down
  // must not hold up the heartbeats to the others.
  ShardCall<v1::HeartbeatRequest, v1::HeartbeatResponse> call;
  call.shard = shard;
  call.request = req;
  const absl::Status s =
      client_->GrpcAttempt<v1::HeartbeatRequest, v1::HeartbeatResponse>(
          {&call}, ASYNCPS_RPC(Heartbeat))[0];
  if (s.ok() && call.response.fastest_steps_per_second() > 0) {
    fastest_.store(call.response.fastest_steps_per_second());
  }
  if (s.ok() && shard == 0 && !leaving) NoteMembers(call.response);
  return Annotate(s, absl::StrCat("Heartbeat to shard ", shard));
}

void MembershipClient::HeartbeatLoop() {
  while (!stop_.WaitForNotificationWithTimeout(heartbeat_every_)) {
    for (int s = 0; s < client_->num_shards(); ++s) {
      absl::Status hs = Heartbeat(s, /*leaving=*/false);
      if (hs.code() == absl::StatusCode::kNotFound) {
        // The shard restarted and forgot us: join again, saying where we
        // are (so ssp does not take us for a worker at clock 0).
        auto r = client_->Register(s, Again());
        if (r.ok()) {
          absl::MutexLock lock(&mu_);
          incarnations_[s] = r->incarnation();
        } else {
          LOG(WARNING) << "re-register with shard " << s << ": " << r.status();
        }
      } else if (!hs.ok() && hs.code() != absl::StatusCode::kUnavailable) {
        LOG(WARNING) << "heartbeat to shard " << s << ": " << hs;
      }
    }
  }
}

void MembershipClient::Leave() {
  if (left_) return;
  left_ = true;
  stop_.Notify();
  if (heartbeat_.joinable()) heartbeat_.join();
  // The final clock (a job restarted later resumes from it), and that this
  // worker leaves.
  for (int s = 0; s < client_->num_shards(); ++s) {
    Heartbeat(s, /*leaving=*/true).IgnoreError();
  }
}

}  // namespace asyncps
