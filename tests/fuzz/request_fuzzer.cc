// libFuzzer target: the request path of a shard, in process. The first
// byte picks the call (declare, push, pull, assign, register, a push then a
// pull through the consistency rules), the rest is its request message as
// it would arrive on the wire. The store starts with a small declared
// model each time. Any request must be answered (OK or an error), never
// crash or hang the shard.
#include <cstddef>
#include <cstdint>
#include <string>

#include "common/clock.h"
#include "google/protobuf/stubs/logging.h"
#include "server/consistency.h"
#include "server/membership.h"
#include "server/shard_store.h"
#include "tests/server/small_model.h"

namespace {

// Mutated strings are often not UTF-8, which protobuf logs on every parse.
void Quiet(google::protobuf::LogLevel, const char*, int, const std::string&) {}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  google::protobuf::SetLogHandler(&Quiet);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const uint8_t op = data[0] % 6;
  const void* body = data + 1;
  const int n = static_cast<int>(size - 1);
  asyncps::ShardStore store(0, 1, 1 << 20);
  if (!store.Declare(asyncps::testing::SmallModel()).ok()) __builtin_trap();
  switch (op) {
    case 0: {
      asyncps::v1::ModelSpec spec;
      if (spec.ParseFromArray(body, n)) (void)store.Declare(spec);
      break;
    }
    case 1: {
      asyncps::v1::PushRequest push;
      asyncps::v1::PushResponse pushed;
      if (push.ParseFromArray(body, n)) (void)store.Push(push, &pushed);
      break;
    }
    case 2: {
      asyncps::v1::PullRequest pull;
      asyncps::v1::PullResponse pulled;
      if (pull.ParseFromArray(body, n)) (void)store.Pull(pull, &pulled);
      break;
    }
    case 3: {
      asyncps::v1::AssignRequest assign;
      if (assign.ParseFromArray(body, n)) (void)store.Assign(assign);
      break;
    }
    case 4: {
      asyncps::ManualClock clock;
      asyncps::Membership membership(&clock, absl::Seconds(10));
      asyncps::v1::RegisterRequest join;
      if (join.ParseFromArray(body, n)) {
        // Registered once, then again and acting as the rank with the
        // secret it sent (a guess, almost always wrong).
        (void)membership.Register(join);
        (void)membership.Register(join);
        (void)membership.Authorize(join.rank(), join.secret(), join.clock());
      }
      break;
    }
    case 5: {
      asyncps::ManualClock clock;
      asyncps::Membership membership(&clock, absl::Seconds(10));
      asyncps::ConsistencyConfig config;
      config.mode = static_cast<asyncps::Mode>(data[0] / 6 % 3);
      asyncps::Consistency consistency(config, &store, &membership, &clock);
      asyncps::v1::PushPullRequest request;
      asyncps::v1::PushPullResponse response;
      if (request.ParseFromArray(body, n)) {
        asyncps::PendingCall call;
        call.deadline = clock.Now();  // Held pulls expire at the next tick.
        call.done = [](absl::Status) {};
        consistency.PushPull(request, &response, std::move(call));
        consistency.Tick();
      }
      break;
    }
  }
  return 0;
}
