#include "coordinator/service/job_manager.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"

namespace tandem {
namespace {

// Rank 0's progress at `step` with `loss` under the baseline.
v1::IterationProgress Progress(int64_t step, double loss) {
  v1::IterationProgress p;
  p.set_step(step);
  p.set_loss(loss);
  return p;
}

using namespace std::chrono_literals;
using ::testing::HasSubstr;

v1::JobSpec TinySpec() {
  v1::JobSpec spec;
  spec.set_name("tiny");
  spec.mutable_model()->set_preset("tiny-llama");
  spec.mutable_batch()->set_micro_batch(2);
  spec.mutable_batch()->set_seq_len(16);
  spec.mutable_train()->set_steps(5);
  spec.mutable_parallel()->set_world_size(2);
  return spec;
}

class JobManagerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto store = JobStore::Open(":memory:");
    ASSERT_TRUE(store.ok());
    store_ = *std::move(store);
    manager_ = std::make_unique<JobManager>(store_.get());
  }
  std::unique_ptr<JobStore> store_;
  std::unique_ptr<JobManager> manager_;
};

TEST_F(JobManagerTest, Submit_ValidSpec_IsPendingWithEvent) {
  auto job = manager_->Submit(TinySpec());
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->state(), v1::JOB_STATE_PENDING);
  EXPECT_THAT(job->id(), ::testing::StartsWith("tiny-"));
  EXPECT_EQ(job->spec().parallel().zero_stage(), 3);  // defaults applied
  auto events = manager_->Events(job->id(), 0);
  ASSERT_EQ(events->size(), 1u);
  EXPECT_THAT((*events)[0].message(), HasSubstr("waiting for 2 workers"));
}

TEST_F(JobManagerTest, Submit_InvalidSpec_FieldLevelError) {
  v1::JobSpec spec = TinySpec();
  spec.mutable_parallel()->set_world_size(-1);
  auto job = manager_->Submit(spec);
  EXPECT_EQ(job.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(job.status().message()),
              HasSubstr("parallel.world_size must be >= 1"));
  EXPECT_TRUE(manager_->List({}, 0).empty());
}

TEST_F(JobManagerTest, Transition_Lifecycle_RecordsEventsAndEnds) {
  auto job = manager_->Submit(TinySpec());
  std::vector<v1::JobState> seen;
  manager_->SetStateListener(
      [&](const std::string&, v1::JobState s) { seen.push_back(s); });
  ASSERT_TRUE(manager_
                  ->Transition(job->id(), v1::JOB_STATE_RUNNING,
                               "all 2 workers registered")
                  .ok());
  ASSERT_TRUE(
      manager_->Transition(job->id(), v1::JOB_STATE_FAILED, "rank 1 lost")
          .ok());
  const absl::Status again =
      manager_->Transition(job->id(), v1::JOB_STATE_SUCCEEDED, "done");
  EXPECT_EQ(again.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(again.message()), HasSubstr("already ended FAILED"));
  EXPECT_EQ(seen, (std::vector<v1::JobState>{v1::JOB_STATE_RUNNING,
                                             v1::JOB_STATE_FAILED}));
  EXPECT_EQ(manager_->Get(job->id())->error(), "rank 1 lost");
  EXPECT_EQ(manager_->Events(job->id(), 0)->size(), 3u);
}

TEST_F(JobManagerTest, Recover_AfterRestart_KeepsJobsAndEvents) {
  auto job = manager_->Submit(TinySpec());
  ASSERT_TRUE(manager_->RecordEvent(job->id(), "schedule", "v1").ok());
  JobManager restarted(store_.get());
  ASSERT_TRUE(restarted.Recover().ok());
  auto got = restarted.Get(job->id());
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(got->spec().name(), "tiny");
  auto events = restarted.Events(job->id(), 1);
  ASSERT_EQ(events->size(), 1u);
  EXPECT_EQ((*events)[0].message(), "v1");
}

// Limits (coordinator/README.md, "Limits"): jobs not yet ended, over all
// users and per user; an ended job frees its place.
TEST_F(JobManagerTest, Submit_PastActiveJobLimits_ResourceExhausted) {
  JobManager::Limits limits;
  limits.max_active_jobs = 3;
  limits.max_active_jobs_per_user = 2;
  JobManager jobs(store_.get(), limits);
  auto a = jobs.Submit(TinySpec(), "alice");
  auto b = jobs.Submit(TinySpec(), "alice");
  ASSERT_TRUE(a.ok() && b.ok());
  auto third = jobs.Submit(TinySpec(), "alice");
  EXPECT_EQ(third.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(third.status().message()),
              HasSubstr("user 'alice' already has 2 jobs that have not ended"));
  EXPECT_THAT(std::string(third.status().message()),
              HasSubstr("--max-active-jobs-per-user 2"));
  ASSERT_TRUE(jobs.Submit(TinySpec(), "bob").ok());
  auto fourth = jobs.Submit(TinySpec(), "bob");
  EXPECT_EQ(fourth.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(fourth.status().message()),
              HasSubstr("already holds 3 jobs that have not ended, its limit "
                        "(--max-active-jobs 3)"));
  ASSERT_TRUE(jobs.Transition(a->id(), v1::JOB_STATE_CANCELLED, "user").ok());
  EXPECT_TRUE(jobs.Submit(TinySpec(), "bob").ok());
  EXPECT_EQ(jobs.List({}, 0).size(), 4u);
}

TEST_F(JobManagerTest, Submit_PathsOutsideOperatorRoots_FieldErrors) {
  JobManager::Limits limits;
  limits.roots.read = {"/shared/data"};
  limits.roots.write = {"/shared/ckpt/"};
  JobManager jobs(store_.get(), limits);
  v1::JobSpec spec = TinySpec();
  spec.mutable_data()->set_kind("tokens");
  spec.mutable_data()->set_path("/shared/data/../secret/tokens.bin");
  spec.mutable_checkpoint()->set_dir("ckpt");
  spec.mutable_checkpoint()->set_every(5);
  auto refused = jobs.Submit(spec);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  const std::string message(refused.status().message());
  EXPECT_THAT(message, HasSubstr("data.path '/shared/data/../secret/tokens.bin'"
                                 " contains '..'"));
  spec.mutable_data()->set_path("/shared/secret/tokens.bin");
  EXPECT_THAT(std::string(jobs.Submit(spec).status().message()),
              HasSubstr("data.path '/shared/secret/tokens.bin' is not under a "
                        "data root this coordinator allows (/shared/data, "
                        "/shared/ckpt/)"));
  EXPECT_THAT(message, HasSubstr("checkpoint.dir 'ckpt' is relative"));
  EXPECT_TRUE(jobs.List({}, 0).empty());
  spec.mutable_data()->set_path("/shared/data/run1/tokens.bin");
  spec.mutable_checkpoint()->set_dir("/shared/ckpt/run1");
  EXPECT_TRUE(jobs.Submit(spec).ok());
  // A job may read its own checkpoints: the write roots are readable.
  spec.mutable_data()->set_path("/shared/ckpt/run1/tokens.bin");
  EXPECT_TRUE(jobs.Submit(spec).ok());
}

// Retention: the newest max_events_per_job events stay, with their seqs, in
// memory and in the store; a restart sees the same.
TEST_F(JobManagerTest, Events_PastRetention_OldestDropped) {
  JobManager::Limits limits;
  limits.max_events_per_job = 16;
  JobManager jobs(store_.get(), limits);
  auto job = jobs.Submit(TinySpec());
  ASSERT_TRUE(job.ok());
  for (int i = 0; i < 40; ++i) {
    ASSERT_TRUE(jobs.RecordEvent(job->id(), "worker", absl::StrCat(i)).ok());
  }
  auto events = jobs.Events(job->id(), 0);
  ASSERT_EQ(events->size(), 16u);
  EXPECT_EQ(events->front().seq(), 26);
  EXPECT_EQ(events->back().seq(), 41);
  EXPECT_EQ(events->back().message(), "39");
  EXPECT_EQ(store_->LoadEvents(job->id())->size(), 16u);
  JobManager restarted(store_.get(), limits);
  ASSERT_TRUE(restarted.Recover().ok());
  EXPECT_EQ(restarted.Events(job->id(), 0)->front().seq(), 26);
  // A coordinator restarted with a smaller retention trims the store too.
  limits.max_events_per_job = 4;
  JobManager smaller(store_.get(), limits);
  ASSERT_TRUE(smaller.Recover().ok());
  EXPECT_EQ(smaller.Events(job->id(), 0)->front().seq(), 38);
  EXPECT_EQ(store_->LoadEvents(job->id())->size(), 4u);
}

// Retention of ended jobs: past max_ended_jobs the job that ended longest
// ago goes, with everything stored for it; jobs still running stay however
// old; a restart with a smaller limit deletes down to it.
TEST_F(JobManagerTest, EndedJobs_PastRetention_OldestDeleted) {
  JobManager::Limits limits;
  limits.max_ended_jobs = 2;
  JobManager jobs(store_.get(), limits);
  std::vector<std::string> ids;
  for (int i = 0; i < 5; ++i) ids.push_back(jobs.Submit(TinySpec())->id());
  ASSERT_TRUE(store_->PutSteps(ids[1], {StoredStep{}}).ok());
  // ids[0] runs throughout; 1..4 end in order.
  ASSERT_TRUE(jobs.Transition(ids[0], v1::JOB_STATE_RUNNING, "go").ok());
  for (int i = 1; i < 5; ++i) {
    ASSERT_TRUE(jobs.Transition(ids[i], v1::JOB_STATE_CANCELLED, "done").ok());
  }
  EXPECT_TRUE(jobs.Get(ids[0]).ok());
  for (int i : {1, 2}) {
    EXPECT_EQ(jobs.Get(ids[i]).status().code(), absl::StatusCode::kNotFound);
    EXPECT_TRUE(store_->LoadEvents(ids[i])->empty());
  }
  EXPECT_TRUE(store_->LoadSteps(ids[1])->empty());
  EXPECT_TRUE(jobs.Get(ids[3]).ok() && jobs.Get(ids[4]).ok());
  EXPECT_EQ(store_->LoadJobs()->size(), 3u);
  limits.max_ended_jobs = 1;
  JobManager smaller(store_.get(), limits);
  ASSERT_TRUE(smaller.Recover().ok());
  EXPECT_EQ(smaller.Get(ids[3]).status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(smaller.Get(ids[4]).ok() && smaller.Get(ids[0]).ok());
  EXPECT_EQ(store_->LoadJobs()->size(), 2u);
}

// The jobs gauge follows submits too, not only transitions.
TEST_F(JobManagerTest, Submit_TellsTheListenerPending_CountsByState) {
  std::vector<v1::JobState> seen;
  manager_->SetStateListener(
      [&](const std::string&, v1::JobState s) { seen.push_back(s); });
  auto a = manager_->Submit(TinySpec());
  auto b = manager_->Submit(TinySpec());
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(seen, (std::vector<v1::JobState>{v1::JOB_STATE_PENDING,
                                             v1::JOB_STATE_PENDING}));
  ASSERT_TRUE(manager_->Transition(a->id(), v1::JOB_STATE_RUNNING, "go").ok());
  auto counts = manager_->CountByState();
  EXPECT_EQ(counts[v1::JOB_STATE_PENDING], 1);
  EXPECT_EQ(counts[v1::JOB_STATE_RUNNING], 1);
  EXPECT_EQ(manager_->Unfinished().size(), 2u);
  ASSERT_TRUE(
      manager_->Transition(b->id(), v1::JOB_STATE_CANCELLED, "user").ok());
  EXPECT_EQ(manager_->Unfinished().size(), 1u);
  EXPECT_EQ(manager_->CountByState()[v1::JOB_STATE_CANCELLED], 1);
}

TEST_F(JobManagerTest, Get_UnknownJob_SaysHowToFindJobs) {
  auto job = manager_->Get("nope");
  EXPECT_EQ(job.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(job.status().message()), HasSubstr("tandem list"));
}

TEST_F(JobManagerTest, List_FiltersByStateNewestFirst) {
  auto a = manager_->Submit(TinySpec());
  std::this_thread::sleep_for(5ms);
  auto b = manager_->Submit(TinySpec());
  ASSERT_TRUE(
      manager_->Transition(a->id(), v1::JOB_STATE_CANCELLED, "user").ok());
  auto all = manager_->List({}, 10);
  ASSERT_EQ(all.size(), 2u);
  EXPECT_EQ(all[0].id(), b->id());
  auto cancelled = manager_->List({v1::JOB_STATE_CANCELLED}, 10);
  ASSERT_EQ(cancelled.size(), 1u);
  EXPECT_EQ(cancelled[0].id(), a->id());
}

// A limit below the matches returns the newest `limit` of them, newest
// first, the same on every call; the owner filter applies before it.
TEST_F(JobManagerTest, List_LimitKeepsTheNewestInOrder) {
  for (int i = 0; i < 30; ++i) {
    auto job = manager_->Submit(TinySpec());
    ASSERT_TRUE(job.ok());
    if (i % 3 == 0) std::this_thread::sleep_for(2ms);
  }
  std::vector<v1::Job> all = manager_->List({}, 1000);
  ASSERT_EQ(all.size(), 30u);
  for (size_t i = 1; i < all.size(); ++i) {
    EXPECT_GE(all[i - 1].submitted_unix_s(), all[i].submitted_unix_s());
  }
  std::vector<v1::Job> newest = manager_->List({}, 7);
  ASSERT_EQ(newest.size(), 7u);
  for (size_t i = 0; i < newest.size(); ++i) {
    EXPECT_EQ(newest[i].id(), all[i].id()) << i;
  }
  EXPECT_TRUE(manager_->List({}, 7, std::string("someone-else")).empty());
}

// Training diverged: the job's events say when, once, and the loss stays
// on the job as it is.
// A step the loss scaler skipped counts once (a restarted rank 0 may report
// it again) and is an event saying why; the job carries the latest scale.
TEST_F(JobManagerTest, UpdateProgress_SkippedStep_CountedOnceWithAnEvent) {
  auto job = manager_->Submit(TinySpec());
  ASSERT_TRUE(job.ok());
  v1::IterationProgress p = Progress(3, 2.5);
  p.set_loss_scale(65536);
  ASSERT_TRUE(manager_->UpdateProgress(job->id(), p).ok());
  EXPECT_EQ(manager_->Get(job->id())->skipped_steps(), 0);
  EXPECT_EQ(manager_->Get(job->id())->loss_scale(), 65536);
  p = Progress(4, std::nan(""));
  p.set_loss_scale(65536);
  p.set_skipped(true);
  ASSERT_TRUE(manager_->UpdateProgress(job->id(), p).ok());
  ASSERT_TRUE(manager_->UpdateProgress(job->id(), p).ok());  // a repeat
  p.set_step(5);
  p.set_loss_scale(32768);
  ASSERT_TRUE(manager_->UpdateProgress(job->id(), p).ok());
  absl::StatusOr<v1::Job> got = manager_->Get(job->id());
  EXPECT_EQ(got->skipped_steps(), 2);
  EXPECT_EQ(got->loss_scale(), 32768);
  absl::StatusOr<std::vector<v1::JobEvent>> events =
      manager_->Events(job->id(), 0);
  ASSERT_TRUE(events.ok());
  std::vector<std::string> skipped;
  for (const v1::JobEvent& e : *events) {
    if (e.kind() == "skipped") skipped.push_back(e.message());
  }
  ASSERT_EQ(skipped.size(), 2u);
  EXPECT_EQ(skipped[0],
            "step 4 skipped: a gradient held an infinity or a NaN at loss "
            "scale 65536, so no param changed and the scale backs off "
            "(train.loss_scale); 1 skipped so far");
  EXPECT_THAT(skipped[1], HasSubstr("step 5 skipped"));
}

TEST_F(JobManagerTest, UpdateProgress_NonFiniteLoss_OneDivergedEvent) {
  auto job = manager_->Submit(TinySpec());
  ASSERT_TRUE(job.ok());
  ASSERT_TRUE(manager_->UpdateProgress(job->id(), Progress(4, 2.5)).ok());
  ASSERT_TRUE(
      manager_->UpdateProgress(job->id(), Progress(5, std::nan(""))).ok());
  ASSERT_TRUE(
      manager_->UpdateProgress(job->id(), Progress(6, std::nan(""))).ok());
  EXPECT_TRUE(std::isnan(manager_->Get(job->id())->loss()));
  absl::StatusOr<std::vector<v1::JobEvent>> events =
      manager_->Events(job->id(), 0);
  ASSERT_TRUE(events.ok());
  std::vector<std::string> diverged;
  for (const v1::JobEvent& e : *events) {
    if (e.kind() == "diverged") diverged.push_back(e.message());
  }
  ASSERT_EQ(diverged.size(), 1u);
  EXPECT_EQ(diverged[0], "loss became NaN at step 5");
  // Back to finite and diverging again (continue): said again.
  ASSERT_TRUE(manager_->UpdateProgress(job->id(), Progress(7, 3.0)).ok());
  ASSERT_TRUE(
      manager_
          ->UpdateProgress(
              job->id(), Progress(8, -std::numeric_limits<double>::infinity()))
          .ok());
  EXPECT_EQ(manager_->Events(job->id(), 0)->back().message(),
            "loss became -inf at step 8");
}

TEST_F(JobManagerTest, WaitForEvents_WakesOnProgressAndEvents) {
  auto job = manager_->Submit(TinySpec());
  std::thread t([&] {
    std::this_thread::sleep_for(30ms);
    ASSERT_TRUE(manager_->UpdateProgress(job->id(), Progress(3, 2.5)).ok());
  });
  auto changes = manager_->WaitForEvents(job->id(), 1, *job, 5000ms);
  t.join();
  ASSERT_TRUE(changes.ok());
  EXPECT_TRUE(changes->events.empty());
  EXPECT_EQ(changes->job.step(), 3);
  // Nothing new: times out, with the job as it is.
  auto none =
      manager_->WaitForEvents(job->id(), 1, *manager_->Get(job->id()), 20ms);
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->events.empty());
  EXPECT_EQ(none->job.step(), 3);
}

// A watcher that sees the job terminal sees the event that ended it in the
// same answer (a watch stream ends at a terminal job with no new events).
TEST_F(JobManagerTest, WaitForEvents_TerminalJobComesWithItsStateEvent) {
  auto job = manager_->Submit(TinySpec());
  ASSERT_TRUE(job.ok());
  ASSERT_TRUE(
      manager_->Transition(job->id(), v1::JOB_STATE_RUNNING, "registered")
          .ok());
  const v1::Job running = *manager_->Get(job->id());
  const int64_t seen = manager_->Events(job->id(), 0)->back().seq();
  std::thread t([&] {
    std::this_thread::sleep_for(20ms);
    ASSERT_TRUE(manager_
                    ->Transition(job->id(), v1::JOB_STATE_SUCCEEDED,
                                 "all 1 ranks finished 1 steps")
                    .ok());
  });
  auto changes = manager_->WaitForEvents(job->id(), seen, running, 5000ms);
  t.join();
  ASSERT_TRUE(changes.ok());
  EXPECT_EQ(changes->job.state(), v1::JOB_STATE_SUCCEEDED);
  ASSERT_EQ(changes->events.size(), 1u);
  EXPECT_EQ(changes->events[0].message(),
            "SUCCEEDED: all 1 ranks finished 1 steps");
}

// ChangesSince (the watch hub's poll): nothing until the job changes, then
// the job and only the events past the last one seen; the listener hears
// each change.
TEST_F(JobManagerTest, ChangesSince_AnswersOnlyChanges_AndTheListenerHears) {
  std::atomic<int> heard{0};
  manager_->SetChangeListener([&] { ++heard; });
  auto job = manager_->Submit(TinySpec());
  ASSERT_TRUE(job.ok());
  int64_t generation = 0;
  auto first = manager_->ChangesSince(job->id(), 0, &generation);
  ASSERT_TRUE(first.ok());
  ASSERT_TRUE(first->has_value());
  ASSERT_FALSE((*first)->events.empty());
  const int64_t seen = (*first)->events.back().seq();
  auto none = manager_->ChangesSince(job->id(), seen, &generation);
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->has_value());

  const int before = heard;
  ASSERT_TRUE(manager_->UpdateProgress(job->id(), Progress(3, 2.5)).ok());
  EXPECT_EQ(heard, before + 1);
  auto progress = manager_->ChangesSince(job->id(), seen, &generation);
  ASSERT_TRUE(progress.ok() && progress->has_value());
  EXPECT_TRUE((*progress)->events.empty());
  EXPECT_EQ((*progress)->job.step(), 3);

  ASSERT_TRUE(
      manager_->Transition(job->id(), v1::JOB_STATE_CANCELLED, "by test").ok());
  EXPECT_GT(heard, before + 1);
  auto ended = manager_->ChangesSince(job->id(), seen, &generation);
  ASSERT_TRUE(ended.ok() && ended->has_value());
  EXPECT_EQ((*ended)->job.state(), v1::JOB_STATE_CANCELLED);
  ASSERT_EQ((*ended)->events.size(), 1u);
  EXPECT_GT((*ended)->events[0].seq(), seen);

  EXPECT_EQ(
      manager_->ChangesSince("no-such-job", 0, &generation).status().code(),
      absl::StatusCode::kNotFound);
  manager_->SetChangeListener(nullptr);
}

}  // namespace
}  // namespace tandem
