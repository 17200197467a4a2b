#include "coordinator/service/timeline_store.h"

#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace tandem {
namespace {

v1::TimelineReport Report(int64_t step, std::string json = "") {
  v1::TimelineReport r;
  r.set_step(step);
  r.set_schedule_version(step / 10);
  r.set_trace_json(json.empty()
                       ? absl::StrCat(R"({"traceEvents":[],"s":)", step, "}")
                       : json);
  return r;
}

TEST(TimelineStoreTest, Put_KeepsLatestPerRank_GetFiltersByRank) {
  TimelineStore store([] { return 123.0; });
  ASSERT_TRUE(store.Put("j", 0, Report(5)).ok());
  ASSERT_TRUE(store.Put("j", 1, Report(5)).ok());
  ASSERT_TRUE(store.Put("j", 0, Report(15)).ok());
  auto all = store.Get("j", {});
  ASSERT_TRUE(all.ok()) << all.status();
  ASSERT_EQ(all->size(), 2u);
  EXPECT_EQ((*all)[0].rank(), 0);
  EXPECT_EQ((*all)[0].step(), 15);
  EXPECT_EQ((*all)[0].schedule_version(), 1);
  EXPECT_EQ((*all)[0].received_unix_s(), 123.0);
  EXPECT_EQ((*all)[1].rank(), 1);
  auto one = store.Get("j", {1});
  ASSERT_TRUE(one.ok());
  ASSERT_EQ(one->size(), 1u);
  EXPECT_EQ((*one)[0].step(), 5);
}

// With a store attached, a coordinator restarted on the same database (a
// new TimelineStore) still has every rank's latest timeline.
TEST(TimelineStoreTest, AttachedStore_SurvivesARestart) {
  std::unique_ptr<JobStore> db = *JobStore::Open(":memory:");
  {
    TimelineStore store([] { return 7.0; });
    store.AttachStore(db.get());
    ASSERT_TRUE(store.Put("j", 0, Report(5)).ok());
    ASSERT_TRUE(store.Put("j", 1, Report(6)).ok());
    ASSERT_TRUE(store.Put("j", 0, Report(15)).ok());
  }
  TimelineStore restarted;
  restarted.AttachStore(db.get());
  auto all = restarted.Get("j", {});
  ASSERT_TRUE(all.ok()) << all.status();
  ASSERT_EQ(all->size(), 2u);
  EXPECT_EQ((*all)[0].step(), 15);
  EXPECT_EQ((*all)[0].received_unix_s(), 7.0);
  EXPECT_EQ((*all)[1].rank(), 1);
  EXPECT_EQ((*all)[1].trace_json(), Report(6).trace_json());
  auto one = restarted.Get("j", {1});
  ASSERT_TRUE(one.ok());
  ASSERT_EQ(one->size(), 1u);
  EXPECT_EQ((*one)[0].step(), 6);
  EXPECT_EQ(restarted.Get("other", {}).status().code(),
            absl::StatusCode::kNotFound);
}

TEST(TimelineStoreTest, Get_NoneYet_IsNotFoundSayingWhen) {
  TimelineStore store;
  auto got = store.Get("j", {});
  EXPECT_EQ(got.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(got.status().message().find("profile window"), std::string::npos);
  ASSERT_TRUE(store.Put("j", 0, Report(1)).ok());
  EXPECT_EQ(store.Get("j", {3}).status().code(), absl::StatusCode::kNotFound);
}

TEST(TimelineStoreTest, Put_Malformed_IsRefused) {
  TimelineStore store;
  EXPECT_EQ(store.Put("j", 0, Report(-1)).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store.Put("j", -1, Report(1)).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store.Put("j", 0, Report(1, "[1, 2]")).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(
      store
          .Put("j", 0,
               Report(1, "{" + std::string(TimelineStore::kMaxTraceBytes, ' ') +
                             "}"))
          .code(),
      absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store.Get("j", {}).status().code(), absl::StatusCode::kNotFound);
}

TEST(TimelineStoreTest, Put_ManyJobs_ForgetsLeastRecentlyWritten) {
  TimelineStore store;
  for (size_t j = 0; j <= TimelineStore::kMaxJobs; ++j) {
    ASSERT_TRUE(store.Put(absl::StrCat("job", j), 0, Report(1)).ok());
    if (j == 0) continue;
    // job0 is written again early on, so job1 is the oldest.
    if (j == 1) ASSERT_TRUE(store.Put("job0", 0, Report(2)).ok());
  }
  EXPECT_TRUE(store.Get("job0", {}).ok());
  EXPECT_EQ(store.Get("job1", {}).status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(store.Get(absl::StrCat("job", TimelineStore::kMaxJobs), {}).ok());
}

}  // namespace
}  // namespace tandem
