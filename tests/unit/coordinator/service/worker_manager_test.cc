#include "coordinator/service/worker_manager.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <thread>

namespace tandem {
namespace {

using namespace std::chrono_literals;
using ::testing::HasSubstr;

class RecordingSink : public SessionSink {
 public:
  bool Send(const v1::CoordinatorMessage& message) override {
    std::lock_guard<std::mutex> lock(mu);
    messages.push_back(message);
    return true;
  }
  std::vector<v1::CoordinatorMessage> Take() {
    std::lock_guard<std::mutex> lock(mu);
    return messages;
  }
  std::mutex mu;
  std::vector<v1::CoordinatorMessage> messages;
};

v1::JobSpec Spec() {
  v1::JobSpec spec;
  spec.set_name("tiny");
  spec.mutable_model()->set_preset("tiny-llama");
  spec.mutable_batch()->set_micro_batch(1);
  spec.mutable_batch()->set_seq_len(8);
  spec.mutable_train()->set_steps(3);
  spec.mutable_parallel()->set_world_size(2);
  return spec;
}

class WorkerManagerTest : public ::testing::Test {
 protected:
  void SetUp() override { Start(15000ms); }
  void Start(std::chrono::milliseconds timeout) {
    workers_.reset();
    planning_.reset();
    jobs_.reset();
    store_ = *JobStore::Open(":memory:");
    jobs_ = std::make_unique<JobManager>(store_.get());
    planning_ =
        std::make_unique<PlanningManager>(jobs_.get(), store_.get(), nullptr);
    WorkerManager::Options options;
    options.heartbeat_timeout = timeout;
    options.watch_interval = 20ms;
    workers_ = std::make_unique<WorkerManager>(jobs_.get(), store_.get(),
                                               planning_.get(), &kv_, nullptr,
                                               &timelines_, options);
    jobs_->SetStateListener([this](const std::string& id, v1::JobState s) {
      if (IsTerminal(s)) workers_->OnJobEnded(id, s);
    });
    job_ = *jobs_->Submit(Spec());
  }

  absl::StatusOr<v1::RegisterResponse> Register(const std::string& inc,
                                                int rank = -1) {
    v1::RegisterRequest req;
    req.set_job_id(job_.id());
    req.set_incarnation(inc);
    req.set_hostname("host-" + inc);
    req.set_requested_rank(rank);
    return workers_->Register(req);
  }

  int64_t Open(int rank, const std::string& inc,
               std::shared_ptr<RecordingSink> sink) {
    v1::SessionHello hello;
    hello.set_job_id(job_.id());
    hello.set_rank(rank);
    hello.set_incarnation(inc);
    auto id = workers_->OpenSession(hello, sink);
    EXPECT_TRUE(id.ok()) << id.status();
    return id.value_or(0);
  }

  v1::JobState State() { return jobs_->Get(job_.id())->state(); }

  KvStore kv_;
  TimelineStore timelines_;
  std::unique_ptr<JobStore> store_;
  std::unique_ptr<JobManager> jobs_;
  std::unique_ptr<PlanningManager> planning_;
  std::unique_ptr<WorkerManager> workers_;
  v1::Job job_;
};

TEST_F(WorkerManagerTest, Register_AllRanks_JobRuns) {
  auto a = Register("a");
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->rank(), 0);
  EXPECT_EQ(a->world_size(), 2);
  EXPECT_EQ(a->store_prefix(), "jobs/" + job_.id() + "/");
  EXPECT_EQ(State(), v1::JOB_STATE_PENDING);
  auto b = Register("b");
  EXPECT_EQ(b->rank(), 1);
  EXPECT_EQ(State(), v1::JOB_STATE_RUNNING);
  // Same incarnation again (a reconnect after a coordinator restart).
  EXPECT_EQ(Register("a")->rank(), 0);
  EXPECT_EQ(Register("c").status().code(),
            absl::StatusCode::kResourceExhausted);
}

TEST_F(WorkerManagerTest, Register_BadRequests_AreRefused) {
  EXPECT_EQ(Register("x", 5).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Register("").status().code(), absl::StatusCode::kInvalidArgument);
  v1::RegisterRequest unknown;
  unknown.set_job_id("nope");
  unknown.set_incarnation("i");
  EXPECT_EQ(workers_->Register(unknown).status().code(),
            absl::StatusCode::kNotFound);
  ASSERT_TRUE(Register("a", 0).ok());
  Open(0, "a", std::make_shared<RecordingSink>());
  auto taken = Register("z", 0);
  EXPECT_EQ(taken.status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_THAT(std::string(taken.status().message()),
              HasSubstr("connected worker on host-a"));
}

TEST_F(WorkerManagerTest, OpenSession_WrongIncarnation_IsDenied) {
  ASSERT_TRUE(Register("a").ok());
  v1::SessionHello hello;
  hello.set_job_id(job_.id());
  hello.set_rank(0);
  hello.set_incarnation("impostor");
  auto s = workers_->OpenSession(hello, std::make_shared<RecordingSink>());
  EXPECT_EQ(s.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(std::string(s.status().message()), HasSubstr("unknown worker"));
}

TEST_F(WorkerManagerTest, Progress_AllRanksFinish_JobSucceedsAndStops) {
  ASSERT_TRUE(Register("a").ok());
  ASSERT_TRUE(Register("b").ok());
  auto sink0 = std::make_shared<RecordingSink>();
  const int64_t s0 = Open(0, "a", sink0);
  const int64_t s1 = Open(1, "b", std::make_shared<RecordingSink>());
  v1::WorkerMessage m;
  m.mutable_progress()->set_step(3);
  m.mutable_progress()->set_loss(2.5);
  ASSERT_TRUE(workers_->OnMessage(s0, m).ok());
  EXPECT_EQ(State(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(jobs_->Get(job_.id())->loss(), 2.5);
  ASSERT_TRUE(workers_->OnMessage(s1, m).ok());
  EXPECT_EQ(State(), v1::JOB_STATE_SUCCEEDED);
  auto sent = sink0->Take();
  ASSERT_FALSE(sent.empty());
  EXPECT_EQ(sent.back().command().kind(), v1::Command::KIND_STOP);
}

TEST_F(WorkerManagerTest, SilentWorker_FailsJobNamingRank) {
  Start(150ms);
  ASSERT_TRUE(Register("a").ok());
  ASSERT_TRUE(Register("b").ok());
  const int64_t s0 = Open(0, "a", std::make_shared<RecordingSink>());
  v1::WorkerMessage hb;
  hb.mutable_heartbeat()->set_time_unix_s(1);
  for (int i = 0; i < 30 && State() == v1::JOB_STATE_RUNNING; ++i) {
    ASSERT_TRUE(workers_->OnMessage(s0, hb).ok());
    std::this_thread::sleep_for(20ms);
  }
  EXPECT_EQ(State(), v1::JOB_STATE_FAILED);
  EXPECT_THAT(jobs_->Get(job_.id())->error(),
              HasSubstr("rank 1 (host-b) missed heartbeats"));
}

TEST_F(WorkerManagerTest, RestartedWorker_FailsRunningJob) {
  ASSERT_TRUE(Register("a", 0).ok());
  ASSERT_TRUE(Register("b", 1).ok());
  auto again = Register("b2", 1);
  EXPECT_EQ(again.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(State(), v1::JOB_STATE_FAILED);
  EXPECT_THAT(jobs_->Get(job_.id())->error(),
              HasSubstr("rank 1 (host-b) restarted"));
}

TEST_F(WorkerManagerTest, FatalError_FailsJob) {
  ASSERT_TRUE(Register("a").ok());
  ASSERT_TRUE(Register("b").ok());
  const int64_t s1 = Open(1, "b", std::make_shared<RecordingSink>());
  v1::WorkerMessage m;
  m.mutable_error()->set_message("CUDA out of memory");
  m.mutable_error()->set_fatal(true);
  ASSERT_TRUE(workers_->OnMessage(s1, m).ok());
  EXPECT_EQ(State(), v1::JOB_STATE_FAILED);
  EXPECT_EQ(jobs_->Get(job_.id())->error(),
            "rank 1 (host-b): CUDA out of memory");
}

TEST_F(WorkerManagerTest, BadMessages_AreRejected) {
  ASSERT_TRUE(Register("a").ok());
  const int64_t s0 = Open(0, "a", std::make_shared<RecordingSink>());
  v1::WorkerMessage empty;
  EXPECT_EQ(workers_->OnMessage(s0, empty).code(),
            absl::StatusCode::kInvalidArgument);
  v1::WorkerMessage bad;
  bad.mutable_progress()->set_iteration_s(-1);
  EXPECT_EQ(workers_->OnMessage(s0, bad).code(),
            absl::StatusCode::kInvalidArgument);
  // Profiles before the graph are held (a few per rank), then refused.
  v1::WorkerMessage profile;
  profile.mutable_profile()->set_graph_hash("x");
  for (int i = 0; i < 2 * PlanningManager::kMaxEarlyProfilesPerRank; ++i) {
    EXPECT_TRUE(workers_->OnMessage(s0, profile).ok());
  }
  EXPECT_EQ(workers_->OnMessage(s0, profile).code(),
            absl::StatusCode::kFailedPrecondition);
  workers_->CloseSession(s0);
  EXPECT_EQ(workers_->OnMessage(s0, empty).code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST_F(WorkerManagerTest, Timeline_IsKeptPerRank) {
  ASSERT_TRUE(Register("a").ok());
  ASSERT_TRUE(Register("b").ok());
  const int64_t s1 = Open(1, "b", std::make_shared<RecordingSink>());
  v1::WorkerMessage m;
  m.mutable_timeline()->set_step(7);
  m.mutable_timeline()->set_schedule_version(1);
  m.mutable_timeline()->set_trace_json(R"({"traceEvents":[]})");
  ASSERT_TRUE(workers_->OnMessage(s1, m).ok());
  auto got = timelines_.Get(job_.id(), {});
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_EQ(got->size(), 1u);
  EXPECT_EQ((*got)[0].rank(), 1);
  EXPECT_EQ((*got)[0].step(), 7);
  m.mutable_timeline()->set_trace_json("not json");
  EXPECT_EQ(workers_->OnMessage(s1, m).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(WorkerManagerTest, Recover_KeepsRegistrations) {
  ASSERT_TRUE(Register("a").ok());
  ASSERT_TRUE(Register("b").ok());
  WorkerManager::Options options;
  WorkerManager restarted(jobs_.get(), store_.get(), planning_.get(), &kv_,
                          nullptr, nullptr, options);
  ASSERT_TRUE(restarted.Recover().ok());
  v1::SessionHello hello;
  hello.set_job_id(job_.id());
  hello.set_rank(1);
  hello.set_incarnation("b");
  EXPECT_TRUE(
      restarted.OpenSession(hello, std::make_shared<RecordingSink>()).ok());
}

}  // namespace
}  // namespace tandem
