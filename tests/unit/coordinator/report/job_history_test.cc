#include "coordinator/report/job_history.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <map>

#include "tests/unit/coordinator/tiny_job_spec.h"

namespace tandem {
namespace {

v1::JobSpec Spec(int world) { return TinyJobSpec("history", 50, world); }

v1::IterationProgress Progress(int64_t step, double loss, double seconds,
                               int64_t version, double exposed = 0,
                               int64_t peak = 0) {
  v1::IterationProgress p;
  p.set_step(step);
  p.set_loss(loss);
  p.set_iteration_s(seconds);
  p.set_schedule_version(version);
  p.set_exposed_comm_s(exposed);
  p.set_peak_bytes(peak);
  return p;
}

class JobHistoryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    store_ = *JobStore::Open(":memory:");
    jobs_ = std::make_unique<JobManager>(store_.get());
    job_ = *jobs_->Submit(Spec(2));
    history_ = std::make_unique<JobHistory>(jobs_.get(), store_.get(),
                                            [this] { return now_; });
  }

  double now_ = 100;
  std::unique_ptr<JobStore> store_;
  std::unique_ptr<JobManager> jobs_;
  v1::Job job_;
  std::unique_ptr<JobHistory> history_;
};

TEST_F(JobHistoryTest, OnProgress_EveryRankReported_SlowestTimeAndRank0Loss) {
  history_->OnProgress(job_.id(), 1, Progress(1, 9.0, 0.30, 0, 0.05, 700));
  history_->OnProgress(job_.id(), 0, Progress(1, 5.0, 0.20, 0, 0.07, 900));
  absl::StatusOr<std::vector<StoredStep>> steps = history_->Steps(job_.id());
  ASSERT_TRUE(steps.ok()) << steps.status();
  ASSERT_EQ(steps->size(), 1u);
  const StoredStep& s = (*steps)[0];
  EXPECT_EQ(s.step, 1);
  EXPECT_EQ(s.schedule_version, 0);
  EXPECT_DOUBLE_EQ(s.loss, 5.0);
  EXPECT_DOUBLE_EQ(s.iteration_s, 0.30);
  EXPECT_DOUBLE_EQ(s.exposed_comm_s, 0.07);
  EXPECT_EQ(s.peak_bytes, 900);
  // Neither rank measured its wait share.
  EXPECT_EQ(s.cpu_wait_share, -1);
}

TEST_F(JobHistoryTest, OnProgress_LargestWaitShareOfTheRanksThatMeasuredIt) {
  v1::IterationProgress r0 = Progress(1, 5.0, 0.20, 0);
  r0.set_cpu_wait_share(0.06);
  v1::IterationProgress r1 = Progress(1, 5.0, 0.21, 0);
  r1.set_cpu_wait_share(0.19);
  history_->OnProgress(job_.id(), 0, r0);
  history_->OnProgress(job_.id(), 1, r1);
  // Step 2: rank 0 did not measure it, rank 1 did.
  history_->OnProgress(job_.id(), 0, Progress(2, 5.0, 0.20, 0));
  v1::IterationProgress measured = Progress(2, 5.0, 0.20, 0);
  measured.set_cpu_wait_share(0.05);
  history_->OnProgress(job_.id(), 1, measured);
  absl::StatusOr<std::vector<StoredStep>> steps = history_->Steps(job_.id());
  ASSERT_TRUE(steps.ok()) << steps.status();
  ASSERT_EQ(steps->size(), 2u);
  EXPECT_DOUBLE_EQ((*steps)[0].cpu_wait_share, 0.19);
  EXPECT_DOUBLE_EQ((*steps)[1].cpu_wait_share, 0.05);
}

TEST_F(JobHistoryTest, OnProgress_OneRankOnly_NoStepAndRepeatsNotCounted) {
  history_->OnProgress(job_.id(), 0, Progress(1, 5.0, 0.2, 0));
  history_->OnProgress(job_.id(), 0, Progress(1, 5.0, 0.2, 0));
  EXPECT_TRUE(history_->Steps(job_.id())->empty());
  history_->OnProgress(job_.id(), 1, Progress(1, 5.0, 0.25, 0));
  ASSERT_EQ(history_->Steps(job_.id())->size(), 1u);
}

TEST_F(JobHistoryTest,
       OnProgress_IncompleteOlderStep_DroppedWhenNewerCompletes) {
  history_->OnProgress(job_.id(), 0, Progress(1, 5.0, 0.2, 0));
  history_->OnProgress(job_.id(), 0, Progress(2, 4.9, 0.2, 0));
  history_->OnProgress(job_.id(), 1, Progress(2, 4.9, 0.2, 0));
  // Rank 1's late step 1 opens a step that is never completed.
  history_->OnProgress(job_.id(), 1, Progress(1, 5.0, 0.2, 0));
  const std::vector<StoredStep> steps = *history_->Steps(job_.id());
  ASSERT_EQ(steps.size(), 1u);
  EXPECT_EQ(steps[0].step, 2);
}

TEST_F(JobHistoryTest, Writes_AtMostOnceASecondThenOnJobEnd) {
  auto report_step = [&](int64_t step) {
    for (int rank = 0; rank < 2; ++rank) {
      history_->OnProgress(job_.id(), rank, Progress(step, 5.0, 0.2, 0));
    }
  };
  report_step(1);
  report_step(2);
  EXPECT_TRUE(store_->LoadSteps(job_.id())->empty());
  now_ += 1.5;
  report_step(3);
  EXPECT_EQ(store_->LoadSteps(job_.id())->size(), 3u);
  report_step(4);
  EXPECT_EQ(store_->LoadSteps(job_.id())->size(), 3u);
  history_->OnJobEnded(job_.id());
  EXPECT_EQ(store_->LoadSteps(job_.id())->size(), 4u);

  // Stored: a new history over the same store (a restarted coordinator)
  // reads them.
  JobHistory restarted(jobs_.get(), store_.get());
  const std::vector<StoredStep> steps = *restarted.Steps(job_.id());
  ASSERT_EQ(steps.size(), 4u);
  EXPECT_EQ(steps.back().step, 4);
}

TEST_F(JobHistoryTest, OnProgress_UnknownJob_Ignored) {
  history_->OnProgress("no-such-job", 0, Progress(1, 5.0, 0.2, 0));
  EXPECT_TRUE(history_->Steps("no-such-job")->empty());
}

TEST_F(JobHistoryTest, OnProfile_StoresTheRankWindowInBrief) {
  v1::Profile p;
  p.set_schedule_version(1);
  p.set_first_iteration(4);
  p.set_last_iteration(7);
  p.set_iteration_s(0.5);
  p.set_peak_bytes(4096);
  v1::CollectiveTiming* a = p.add_collectives();
  a->set_run_s(0.10);
  a->set_issue_to_done_s(0.15);
  a->set_exposed_s(0.02);
  v1::CollectiveTiming* b = p.add_collectives();
  b->set_issue_to_done_s(0.05);  // run time not measured
  b->set_exposed_s(0.01);
  ASSERT_TRUE(history_->OnProfile(job_.id(), 1, p).ok());
  const std::vector<StoredRankWindow> windows =
      *history_->RankWindows(job_.id());
  ASSERT_EQ(windows.size(), 1u);
  const StoredRankWindow& w = windows[0];
  EXPECT_EQ(w.rank, 1);
  EXPECT_EQ(w.schedule_version, 1);
  EXPECT_EQ(w.first_iteration, 4);
  EXPECT_EQ(w.last_iteration, 7);
  EXPECT_DOUBLE_EQ(w.iteration_s, 0.5);
  EXPECT_DOUBLE_EQ(w.comm_s, 0.15);
  EXPECT_DOUBLE_EQ(w.exposed_comm_s, 0.03);
  EXPECT_EQ(w.peak_bytes, 4096);
}

// --max-history-rows-per-job: a long job's history stays within the quota
// plus a quarter; the newest steps stay whole, the first step stays, and
// the older ones thin out. Rank windows go by window, every rank's at once.
TEST_F(JobHistoryTest, LongJob_HistoryThinsOutWithinItsQuota) {
  constexpr int64_t kMax = 200;
  history_ = std::make_unique<JobHistory>(
      jobs_.get(), store_.get(), [this] { return now_; }, kMax);
  constexpr int64_t kSteps = 5000;
  for (int64_t step = 0; step < kSteps; ++step) {
    history_->OnProgress(job_.id(), 0, Progress(step, 1.0, 0.1, 0));
    history_->OnProgress(job_.id(), 1, Progress(step, 1.0, 0.1, 0));
    now_ += 2;  // every step written
    if (step % 4 == 0) {
      v1::Profile p;
      p.set_first_iteration(step);
      p.set_last_iteration(step + 3);
      for (int32_t rank : {0, 1}) {
        ASSERT_TRUE(history_->OnProfile(job_.id(), rank, p).ok());
      }
    }
  }
  const std::vector<StoredStep> steps = *history_->Steps(job_.id());
  EXPECT_LE(static_cast<int64_t>(steps.size()), kMax + kMax / 4);
  EXPECT_GE(static_cast<int64_t>(steps.size()), kMax / 2);
  EXPECT_EQ(steps.front().step, 0);
  EXPECT_EQ(steps.back().step, kSteps - 1);
  // The newest half of the quota is whole.
  for (size_t i = steps.size() - kMax / 2; i < steps.size(); ++i) {
    EXPECT_EQ(steps[i].step, steps[i - 1].step + 1) << i;
  }
  // Older ones thinned: gaps grow toward the start.
  EXPECT_GT(steps[1].step - steps[0].step, 1);
  const std::vector<StoredRankWindow> windows =
      *history_->RankWindows(job_.id());
  EXPECT_LE(static_cast<int64_t>(windows.size()), kMax + kMax / 4);
  std::map<int64_t, int> ranks_per_window;
  for (const StoredRankWindow& w : windows)
    ++ranks_per_window[w.first_iteration];
  for (const auto& [first, ranks] : ranks_per_window) {
    EXPECT_EQ(ranks, 2) << "window " << first;
  }
  EXPECT_EQ(ranks_per_window.rbegin()->first, kSteps - 4);
}

}  // namespace
}  // namespace tandem
