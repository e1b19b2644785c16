#include "server/edge/call_timeline.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace asyncps {

void CallTimeline::CallEnded(absl::string_view transport,
                             absl::string_view method, absl::StatusCode code,
                             absl::Duration took, int64_t received,
                             int64_t sent) {
  const absl::Time now = absl::Now();
  const std::string name =
      code == absl::StatusCode::kOk
          ? std::string(method)
          : absl::StrCat(method, " ", absl::StatusCodeToString(code));
  timeline_->Span(name, absl::StrCat("serve ", transport), now - took, now,
                  {{"received_bytes", received}, {"sent_bytes", sent}});
}

void CallTimeline::HeldPullAnswered(int rank, absl::Duration waited) {
  const int lane = HeldLane(rank);
  {
    absl::MutexLock lock(&mu_);
    if (named_.insert(lane).second) {
      timeline_->NameThread(absl::StrCat("held pulls of rank ", rank), lane);
    }
  }
  const absl::Time now = absl::Now();
  timeline_->Span("held pull", "held", now - waited, now, {{"rank", rank}},
                  lane);
}

}  // namespace asyncps
