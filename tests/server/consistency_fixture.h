// The fixture of the Consistency unit tests (consistency_test.cc,
// consistency_restart_test.cc): a Consistency over a ShardStore holding
// SmallModel, a Membership and a manual clock, with helpers to register
// workers, pull (recording the answer) and push.
#ifndef ASYNCPS_TESTS_SERVER_CONSISTENCY_FIXTURE_H_
#define ASYNCPS_TESTS_SERVER_CONSISTENCY_FIXTURE_H_

#include <optional>
#include <utility>
#include <vector>

#include "common/tensor_bytes.h"
#include "gtest/gtest.h"
#include "server/consistency.h"
#include "tests/server/small_model.h"

namespace asyncps::testing {

// One pull's request, response and answer.
struct Pulled {
  v1::PullRequest request;
  v1::PullResponse response;
  std::optional<absl::Status> answer;

  float Weight() const {
    std::vector<float> w(4);
    DecodeF32(response.slices(0).data(), absl::MakeSpan(w));
    return w[0];
  }
};

class ConsistencyTest : public ::testing::Test {
 protected:
  // `elastic`: the Membership of an elastic job (ps_server --elastic).
  explicit ConsistencyTest(bool elastic = false)
      : membership_(&clock_, absl::Seconds(5), Membership::Resume::kJobFront,
                    /*job_workers=*/0, absl::ZeroDuration(), elastic) {}

  void Start(ConsistencyConfig config, int workers) {
    consistency_.emplace(config, &store_, &membership_, &clock_);
    ASSERT_TRUE(store_.Declare(testing::SmallModel()).ok());
    for (int r = 0; r < workers; ++r) {
      v1::RegisterRequest join;
      join.set_rank(r);
      join.set_num_workers(workers);
      ASSERT_TRUE(membership_.Register(join).ok());
    }
  }

  // Pulls as `rank` at `clock`, with a deadline `timeout` from now;
  // `after_push`: the pull follows the rank's push of that step.
  void Pull(Pulled* p, int rank, int64_t clock,
            absl::Duration timeout = absl::Seconds(10),
            bool after_push = false) {
    p->request.set_rank(rank);
    p->request.set_clock(clock);
    p->request.set_after_push(after_push);
    *p->request.add_slices() = testing::SmallModelKey();
    membership_.Touch(rank, clock);
    PendingCall call;
    call.deadline = clock_.Now() + timeout;
    call.done = [p](absl::Status s) {
      ASSERT_FALSE(p->answer.has_value()) << "answered twice";
      p->answer = s;
    };
    consistency_->Pull(p->request, &p->response, std::move(call));
  }

  absl::Status Push(int rank, int64_t clock, float value) {
    membership_.Touch(rank, clock);
    v1::PushResponse resp;
    return consistency_->Push(
        testing::SmallModelPush(value, /*version=*/0, rank, clock), &resp);
  }

  ManualClock clock_;
  ShardStore store_{0, 1, 64 << 20};
  Membership membership_;
  std::optional<Consistency> consistency_;
};

}  // namespace asyncps::testing

#endif  // ASYNCPS_TESTS_SERVER_CONSISTENCY_FIXTURE_H_
