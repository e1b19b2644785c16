// KvStore with a manual clock: a Get waits for its key, times out at its
// wait or its deadline, and is answered UNAVAILABLE at shutdown.
#include "server/kv_store.h"

#include <optional>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "gtest/gtest.h"

namespace asyncps {
namespace {

struct Got {
  std::string value;
  std::optional<absl::Status> answer;
};

class KvStoreTest : public ::testing::Test {
 protected:
  void Get(Got* g, const std::string& key, absl::Duration wait,
           absl::Duration deadline = absl::Hours(2),
           const bool* gone = nullptr) {
    PendingCall call;
    call.deadline = clock_.Now() + deadline;
    if (gone != nullptr) call.cancelled = [gone] { return *gone; };
    call.done = [g](absl::Status s) {
      ASSERT_FALSE(g->answer.has_value()) << "answered twice";
      g->answer = s;
    };
    kv_.Get(key, wait, &g->value, std::move(call));
  }

  ManualClock clock_;
  KvStore kv_{&clock_};
};

TEST_F(KvStoreTest, GetOfAKeyThatIsThereAnswersAtOnce) {
  ASSERT_TRUE(kv_.Set("a", "1").ok());
  Got g;
  Get(&g, "a", absl::ZeroDuration());
  ASSERT_TRUE(g.answer.has_value());
  EXPECT_TRUE(g.answer->ok());
  EXPECT_EQ(g.value, "1");
}

TEST_F(KvStoreTest, MissingKeyWithoutWaitIsNotFound) {
  Got g;
  Get(&g, "a", absl::ZeroDuration());
  ASSERT_TRUE(g.answer.has_value());
  EXPECT_EQ(g.answer->code(), absl::StatusCode::kNotFound);
}

TEST_F(KvStoreTest, WaitingGetIsAnsweredWhenItsKeyIsSet) {
  Got a, b;
  Get(&a, "a", absl::Seconds(5));
  Get(&b, "b", absl::Seconds(5));
  EXPECT_EQ(kv_.waiting(), 2u);
  ASSERT_TRUE(kv_.Set("a", "x").ok());
  ASSERT_TRUE(a.answer.has_value());
  EXPECT_TRUE(a.answer->ok());
  EXPECT_EQ(a.value, "x");
  EXPECT_FALSE(b.answer.has_value());
  EXPECT_EQ(kv_.waiting(), 1u);
  kv_.Shutdown();  // Answers b while it is still in scope.
}

TEST_F(KvStoreTest, WaitingGetExpiresAtItsWaitOrItsDeadline) {
  Got by_wait, by_deadline;
  Get(&by_wait, "a", absl::Seconds(2));
  Get(&by_deadline, "a", absl::Seconds(60), absl::Seconds(3));
  clock_.Advance(absl::Seconds(1));
  kv_.Expire();
  EXPECT_FALSE(by_wait.answer.has_value());
  clock_.Advance(absl::Seconds(1.5));
  kv_.Expire();
  ASSERT_TRUE(by_wait.answer.has_value());
  EXPECT_EQ(by_wait.answer->code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_NE(by_wait.answer->message().find("'a'"), absl::string_view::npos);
  EXPECT_FALSE(by_deadline.answer.has_value());
  clock_.Advance(absl::Seconds(1));
  kv_.Expire();
  ASSERT_TRUE(by_deadline.answer.has_value());
  EXPECT_EQ(by_deadline.answer->code(), absl::StatusCode::kDeadlineExceeded);
}

// A held Get whose caller has gone is taken out by the next Set (of any
// key): it must still be answered, once, or gRPC's shutdown waits for it
// forever (issue #24: SIGTERM never completed).
TEST_F(KvStoreTest, AGetWhoseCallerLeftIsAnsweredBySetsSweep) {
  bool gone = false;
  Got left, waiting;
  Get(&left, "a", absl::Seconds(60), absl::Hours(2), &gone);
  Get(&waiting, "a", absl::Seconds(60));
  gone = true;
  ASSERT_TRUE(kv_.Set("other", "1").ok());
  ASSERT_TRUE(left.answer.has_value()) << "dropped without an answer";
  EXPECT_EQ(left.answer->code(), absl::StatusCode::kCancelled);
  EXPECT_FALSE(waiting.answer.has_value());
  EXPECT_EQ(kv_.waiting(), 1u);
  ASSERT_TRUE(kv_.Set("a", "x").ok());
  ASSERT_TRUE(waiting.answer.has_value());
  EXPECT_TRUE(waiting.answer->ok());
}

TEST_F(KvStoreTest, BadKeysAndValuesAreRefused) {
  EXPECT_EQ(kv_.Set("", "v").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(kv_.Set(std::string(kMaxKvKeyBytes + 1, 'k'), "v").code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(kv_.Set("k", std::string(kMaxKvValueBytes + 1, 'v')).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(KvStoreTest, ShutdownAnswersWaitingAndLaterGetsUnavailable) {
  Got waiting, later;
  Get(&waiting, "a", absl::Seconds(5));
  kv_.Shutdown();
  ASSERT_TRUE(waiting.answer.has_value());
  EXPECT_EQ(waiting.answer->code(), absl::StatusCode::kUnavailable);
  Get(&later, "a", absl::Seconds(5));
  ASSERT_TRUE(later.answer.has_value());
  EXPECT_EQ(later.answer->code(), absl::StatusCode::kUnavailable);
}

// A writer cannot make the store hold more than kMaxKvTotalBytes or
// kMaxKvKeys: the write past either is refused and stores nothing, and
// replacing a key counts only the difference.
TEST_F(KvStoreTest, TotalBytesAndKeysAreBounded) {
  const std::string mib(kMaxKvValueBytes, 'x');
  size_t held = 0;
  int n = 0;
  for (; held + 8 + mib.size() <= kMaxKvTotalBytes;
       ++n, held += 8 + mib.size()) {
    ASSERT_TRUE(kv_.Set(absl::StrFormat("big%05d", n), mib).ok()) << n;
  }
  const absl::Status full = kv_.Set("big-over", mib);
  EXPECT_EQ(full.code(), absl::StatusCode::kResourceExhausted) << full;
  EXPECT_NE(full.message().find("bytes held"), std::string::npos) << full;
  Got g;
  Get(&g, "big-over", absl::ZeroDuration());
  EXPECT_EQ(g.answer->code(), absl::StatusCode::kNotFound);
  // Replacing a key with a value of the same size still fits; freeing
  // room by replacing with a small value lets a new key in.
  EXPECT_TRUE(kv_.Set("big00000", mib).ok());
  EXPECT_TRUE(kv_.Set("big00001", "small").ok());
  EXPECT_TRUE(kv_.Set("big-over", mib).ok());

  KvStore keys(&clock_);
  for (size_t k = 0; k < kMaxKvKeys; ++k) {
    ASSERT_TRUE(keys.Set(absl::StrCat(k), "").ok()) << k;
  }
  const absl::Status many = keys.Set("one-more", "");
  EXPECT_EQ(many.code(), absl::StatusCode::kResourceExhausted) << many;
  EXPECT_NE(many.message().find("keys"), std::string::npos) << many;
  EXPECT_TRUE(keys.Set("0", "again").ok());  // Replacing needs no new key.
}

}  // namespace
}  // namespace asyncps
