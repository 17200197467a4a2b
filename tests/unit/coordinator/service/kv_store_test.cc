#include "coordinator/service/kv_store.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "coordinator/store/job_store.h"

namespace tandem {
namespace {

using namespace std::chrono_literals;
using ::testing::HasSubstr;

TEST(KvStoreTest, Get_KeySetLater_WakesUp) {
  KvStore kv;
  std::thread setter([&] {
    std::this_thread::sleep_for(50ms);
    ASSERT_TRUE(kv.Set("job/a", "v").ok());
  });
  auto v = kv.Get("job/a", 5000ms);
  setter.join();
  ASSERT_TRUE(v.ok());
  ASSERT_TRUE(v->has_value());
  EXPECT_EQ(**v, "v");
}

TEST(KvStoreTest, Get_Timeout_ReturnsNothing) {
  KvStore kv;
  auto v = kv.Get("missing", 20ms);
  ASSERT_TRUE(v.ok());
  EXPECT_FALSE(v->has_value());
}

// GetOrWait: the waiter holds no thread; exactly one of set, deadline and
// cancel ends it.
struct Answers {
  std::mutex mu;
  std::vector<std::optional<std::string>> got;
  KvStore::WaitDone Record() {
    return [this](std::optional<std::string> v) {
      std::lock_guard<std::mutex> lock(mu);
      got.push_back(std::move(v));
    };
  }
  size_t size() {
    std::lock_guard<std::mutex> lock(mu);
    return got.size();
  }
};

std::chrono::steady_clock::time_point In(std::chrono::milliseconds d) {
  return std::chrono::steady_clock::now() + d;
}

TEST(KvStoreTest, GetOrWait_KeyThere_AnswersAtOnceWithoutTheCallback) {
  KvStore kv;
  ASSERT_TRUE(kv.Set("jobs/a/k", "v").ok());
  Answers answers;
  auto w = kv.GetOrWait("jobs/a/k", In(5s), answers.Record());
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ(w->value.value_or(""), "v");
  EXPECT_EQ(kv.waiters(), 0u);
  EXPECT_EQ(answers.size(), 0u);
}

TEST(KvStoreTest, GetOrWait_SetAddAndCompareSet_EachWakeTheirWaitersOnce) {
  KvStore kv;
  Answers a, b, c, other;
  ASSERT_FALSE(kv.GetOrWait("jobs/a/x", In(5s), a.Record())->value);
  ASSERT_FALSE(kv.GetOrWait("jobs/a/x", In(5s), b.Record())->value);
  ASSERT_FALSE(kv.GetOrWait("jobs/a/n", In(5s), c.Record())->value);
  ASSERT_FALSE(kv.GetOrWait("jobs/a/y", In(5s), other.Record())->value);
  EXPECT_EQ(kv.waiters(), 4u);
  ASSERT_TRUE(kv.Set("jobs/a/x", "1").ok());
  ASSERT_TRUE(kv.Set("jobs/a/x", "2").ok());  // nobody waits any more
  ASSERT_TRUE(kv.Add("jobs/a/n", 7).ok());
  ASSERT_EQ(a.got, std::vector<std::optional<std::string>>{"1"});
  ASSERT_EQ(b.got, std::vector<std::optional<std::string>>{"1"});
  ASSERT_EQ(c.got, std::vector<std::optional<std::string>>{"7"});
  EXPECT_EQ(other.size(), 0u);
  ASSERT_TRUE(*kv.CompareSet("jobs/a/y", "", "z") == "z");
  ASSERT_EQ(other.got, std::vector<std::optional<std::string>>{"z"});
  EXPECT_EQ(kv.waiters(), 0u);
}

TEST(KvStoreTest, GetOrWait_Deadline_AnswersNothingOnTheExpiryThread) {
  KvStore kv;
  Answers early, late;
  ASSERT_FALSE(kv.GetOrWait("jobs/a/k", In(30ms), early.Record())->value);
  ASSERT_FALSE(kv.GetOrWait("jobs/a/k", In(10s), late.Record())->value);
  for (int i = 0; i < 500 && early.size() == 0; ++i) {
    std::this_thread::sleep_for(10ms);
  }
  ASSERT_EQ(early.got, std::vector<std::optional<std::string>>{std::nullopt});
  EXPECT_EQ(late.size(), 0u);
  EXPECT_EQ(kv.waiters(), 1u);
  ASSERT_TRUE(kv.Set("jobs/a/k", "v").ok());
  ASSERT_EQ(late.got, std::vector<std::optional<std::string>>{"v"});
  EXPECT_EQ(early.size(), 1u);  // never twice
}

TEST(KvStoreTest, CancelWait_RemovesTheWaiterOnce) {
  KvStore kv;
  Answers answers;
  auto w = kv.GetOrWait("jobs/a/k", In(10s), answers.Record());
  ASSERT_TRUE(w.ok());
  EXPECT_TRUE(kv.CancelWait(w->waiter));
  EXPECT_FALSE(kv.CancelWait(w->waiter));
  EXPECT_EQ(kv.waiters(), 0u);
  ASSERT_TRUE(kv.Set("jobs/a/k", "v").ok());
  EXPECT_EQ(answers.size(), 0u);
}

TEST(KvStoreTest, GetOrWait_PerJobQuota_LeavesOtherJobsTheirs) {
  KvStore kv;
  Answers answers;
  for (size_t i = 0; i < KvStore::kMaxWaitersPerJob; ++i) {
    ASSERT_TRUE(
        kv.GetOrWait(absl::StrCat("jobs/greedy/", i), In(10s), answers.Record())
            .ok());
  }
  auto refused = kv.GetOrWait("jobs/greedy/more", In(10s), answers.Record());
  ASSERT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(refused.status().message(),
              HasSubstr("job greedy has 4096 gets waiting"));
  EXPECT_TRUE(kv.GetOrWait("jobs/other/k", In(10s), answers.Record()).ok());
  EXPECT_EQ(kv.waiters(), KvStore::kMaxWaitersPerJob + 1);
}

// Many setters and waiters at once: every waiter is answered exactly once.
TEST(KvStoreTest, GetOrWait_RacingSetsAndDeadlines_AnswerEachWaiterOnce) {
  KvStore kv;
  constexpr int kKeys = 200;
  std::vector<std::unique_ptr<Answers>> answers;
  for (int i = 0; i < kKeys; ++i) {
    answers.push_back(std::make_unique<Answers>());
    // Half expire while the setter runs.
    auto w = kv.GetOrWait(absl::StrCat("jobs/r/", i),
                          In(i % 2 == 0 ? 5ms : 10s), answers[i]->Record());
    ASSERT_TRUE(w.ok());
  }
  std::thread setter([&] {
    for (int i = 0; i < kKeys; ++i) {
      ASSERT_TRUE(kv.Set(absl::StrCat("jobs/r/", i), "v").ok());
    }
  });
  setter.join();
  for (int i = 0; i < 500 && kv.waiters() > 0; ++i) {
    std::this_thread::sleep_for(10ms);
  }
  for (int i = 0; i < kKeys; ++i) {
    ASSERT_EQ(answers[i]->size(), 1u) << i;
    if (i % 2 == 1) EXPECT_EQ(answers[i]->got[0].value_or(""), "v") << i;
  }
}

TEST(KvStoreTest, Add_CountsAndRejectsNonIntegers) {
  KvStore kv;
  EXPECT_EQ(*kv.Add("n", 2), 2);
  EXPECT_EQ(*kv.Add("n", 3), 5);
  ASSERT_TRUE(kv.Set("s", "abc").ok());
  EXPECT_EQ(kv.Add("s", 1).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST(KvStoreTest, CompareSet_FollowsC10dSemantics) {
  KvStore kv;
  EXPECT_EQ(*kv.CompareSet("k", "", "first"), "first");  // absent + empty
  EXPECT_EQ(*kv.CompareSet("k", "wrong", "x"), "first");
  EXPECT_EQ(*kv.CompareSet("k", "first", "second"), "second");
  EXPECT_EQ(*kv.CompareSet("absent", "x", "y"), "x");
  EXPECT_FALSE(kv.Check({"absent"}));
}

TEST(KvStoreTest, CheckDeleteAndCount_ByPrefix) {
  KvStore kv;
  ASSERT_TRUE(kv.Set("j1/a", "1").ok());
  ASSERT_TRUE(kv.Set("j1/b", "1").ok());
  ASSERT_TRUE(kv.Set("j2/a", "1").ok());
  EXPECT_TRUE(kv.Check({"j1/a", "j1/b"}));
  EXPECT_EQ(kv.NumKeys("j1/"), 2);
  EXPECT_TRUE(kv.Delete("j1/a"));
  EXPECT_FALSE(kv.Delete("j1/a"));
  kv.DeletePrefix("j1/");
  EXPECT_EQ(kv.NumKeys("j1/"), 0);
  EXPECT_EQ(kv.NumKeys(""), 1);
}

TEST(KvStoreTest, Oversized_IsRejectedWithSizes) {
  KvStore kv;
  EXPECT_THAT(std::string(kv.Set("", "v").message()), HasSubstr("key must be"));
  const std::string big(KvStore::kMaxValueBytes + 1, 'x');
  const absl::Status s = kv.Set("k", big);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("at most 1048576"));
}

TEST(KvStoreTest, Add_OverflowIsRefusedAndChangesNothing) {
  // tests/fuzz/regressions/service: a client's delta overflowed (UB).
  KvStore kv;
  ASSERT_EQ(*kv.Add("n", 9018546907345390174), 9018546907345390174);
  const absl::StatusOr<int64_t> over = kv.Add("n", 1803709381469078020);
  EXPECT_EQ(over.status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_THAT(std::string(over.status().message()), HasSubstr("overflows"));
  EXPECT_EQ(*kv.Add("n", 0), 9018546907345390174);
  EXPECT_EQ(kv.Add("m", INT64_MIN).value_or(0), INT64_MIN);
  EXPECT_EQ(kv.Add("m", -1).status().code(), absl::StatusCode::kOutOfRange);
}

TEST(KvStoreTest, Namespace_IsTheJobsPrefix) {
  EXPECT_EQ(KvNamespace("jobs/j-1/rank0"), "jobs/j-1/");
  EXPECT_EQ(KvNamespace("jobs/j-1"), "");
  EXPECT_EQ(KvNamespace("jobs//x"), "");
  EXPECT_EQ(KvNamespace("other"), "");
}

TEST(KvStoreTest, JobQuota_OneJobCannotFillTheStoreForOthers) {
  KvStore kv;
  for (size_t i = 0; i < KvStore::kMaxKeysPerJob; ++i) {
    ASSERT_TRUE(kv.Set(absl::StrCat("jobs/greedy/", i), "v").ok()) << i;
  }
  const absl::Status full = kv.Set("jobs/greedy/one-more", "v");
  EXPECT_EQ(full.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(full.message()),
              HasSubstr("rendezvous quota: job greedy would hold 16385 keys"));
  // Every other operation that adds a key is held to it too.
  EXPECT_EQ(kv.Add("jobs/greedy/counter", 1).status().code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(kv.CompareSet("jobs/greedy/cas", "", "x").status().code(),
            absl::StatusCode::kResourceExhausted);
  // Overwriting an existing key adds none, and another job is untouched.
  EXPECT_TRUE(kv.Set("jobs/greedy/0", "w").ok());
  EXPECT_TRUE(kv.Set("jobs/polite/addr", "10.0.0.1:1234").ok());
  // Deleting gives the quota back.
  kv.DeletePrefix("jobs/greedy/");
  EXPECT_TRUE(kv.Set("jobs/greedy/again", "v").ok());
}

TEST(KvStoreTest, JobQuota_CountsBytes) {
  KvStore kv;
  const std::string mib(KvStore::kMaxValueBytes, 'x');
  const size_t fit = KvStore::kMaxBytesPerJob / (mib.size() + 16);
  for (size_t i = 0; i < fit; ++i) {
    ASSERT_TRUE(kv.Set(absl::StrCat("jobs/big/", i), mib).ok()) << i;
  }
  absl::Status s;
  for (size_t i = fit; i < fit + 2 && s.ok(); ++i) {
    s = kv.Set(absl::StrCat("jobs/big/", i), mib);
  }
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(s.message()), HasSubstr("33554432 bytes"));
  // Shrinking a value frees bytes.
  ASSERT_TRUE(kv.Set("jobs/big/0", "small").ok());
  EXPECT_TRUE(kv.Set(absl::StrCat("jobs/big/", fit), mib).ok());
  EXPECT_TRUE(kv.Set("jobs/other/x", mib).ok());
}

TEST(KvStoreTest, AttachedStore_KeysSurviveARestart) {
  const std::string path = ::testing::TempDir() + "/kv-restart.db";
  for (const char* suffix : {"", "-wal", "-shm"}) {
    std::remove((path + suffix).c_str());
  }
  {
    absl::StatusOr<std::unique_ptr<JobStore>> db = JobStore::Open(path);
    ASSERT_TRUE(db.ok()) << db.status();
    KvStore kv;
    ASSERT_TRUE(kv.AttachStore(db->get()).ok());
    ASSERT_TRUE(kv.Set("jobs/a/addr0", "10.0.0.1:1").ok());
    ASSERT_TRUE(kv.Set("jobs/a/addr1", "10.0.0.2:1").ok());
    ASSERT_EQ(*kv.Add("jobs/a/count", 2), 2);
    ASSERT_EQ(*kv.CompareSet("jobs/a/cas", "", "x"), "x");
    ASSERT_TRUE(kv.Delete("jobs/a/addr1"));
    ASSERT_TRUE(kv.Set("jobs/b/k", "v").ok());
    kv.DeletePrefix("jobs/b/");
  }
  absl::StatusOr<std::unique_ptr<JobStore>> db = JobStore::Open(path);
  ASSERT_TRUE(db.ok()) << db.status();
  KvStore kv;
  ASSERT_TRUE(kv.AttachStore(db->get()).ok());
  EXPECT_EQ(kv.Get("jobs/a/addr0", 0ms)->value_or(""), "10.0.0.1:1");
  EXPECT_FALSE(kv.Get("jobs/a/addr1", 0ms)->has_value());
  EXPECT_EQ(*kv.Add("jobs/a/count", 1), 3);
  EXPECT_EQ(kv.Get("jobs/a/cas", 0ms)->value_or(""), "x");
  EXPECT_EQ(kv.NumKeys("jobs/b/"), 0);
  EXPECT_EQ(kv.NumKeys(""), 3);
  // The quota counts what was loaded.
  for (size_t i = 3; i < KvStore::kMaxKeysPerJob; ++i) {
    ASSERT_TRUE(kv.Set(absl::StrCat("jobs/a/", i), "").ok()) << i;
  }
  EXPECT_EQ(kv.Set("jobs/a/over", "").code(),
            absl::StatusCode::kResourceExhausted);
}

}  // namespace
}  // namespace tandem
