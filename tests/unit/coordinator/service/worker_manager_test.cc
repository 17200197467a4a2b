#include "coordinator/service/worker_manager.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <optional>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace tandem {
namespace {

using namespace std::chrono_literals;
using ::testing::AllOf;
using ::testing::ElementsAre;
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

// Records what the worker manager reports; OnGraph and OnProfile answer
// with `reply`.
class RecordingListener : public WorkerEventListener {
 public:
  struct Registered {
    std::string job_id;
    int32_t rank;
    std::string hostname;
    std::string device;
    int64_t device_memory_bytes;
  };

  void OnRankRegistered(const std::string& job_id, int32_t rank,
                        const std::string& hostname, const std::string& device,
                        int64_t device_memory_bytes) override {
    std::lock_guard<std::mutex> lock(mu);
    registered.push_back({job_id, rank, hostname, device, device_memory_bytes});
  }
  absl::Status OnGraph(const std::string& job_id, int32_t rank,
                       const v1::GraphReport& report) override {
    std::lock_guard<std::mutex> lock(mu);
    graphs.emplace_back(rank, report.graph_hash());
    return reply;
  }
  absl::Status OnProfile(const std::string& job_id, int32_t rank,
                         const v1::Profile& profile) override {
    std::lock_guard<std::mutex> lock(mu);
    profiles.emplace_back(rank, profile.first_iteration());
    return reply;
  }
  void OnProgress(const std::string& job_id, int32_t rank,
                  const v1::IterationProgress& progress) override {
    std::lock_guard<std::mutex> lock(mu);
    progress_steps.emplace_back(rank, progress.step());
  }
  void OnScheduleActive(const std::string& job_id, int64_t version) override {
    std::lock_guard<std::mutex> lock(mu);
    active_versions.push_back(version);
  }
  void OnMemoryGuard(const std::string& job_id, int32_t rank, int64_t step,
                     std::optional<int64_t> tripped_version,
                     const std::string& reason) override {
    std::lock_guard<std::mutex> lock(mu);
    guards.push_back({rank, step, tripped_version, reason});
  }

  std::mutex mu;
  absl::Status reply;
  std::vector<Registered> registered;
  std::vector<std::pair<int32_t, std::string>> graphs;
  std::vector<std::pair<int32_t, int64_t>> profiles;
  std::vector<std::pair<int32_t, int64_t>> progress_steps;
  std::vector<int64_t> active_versions;
  struct Guard {
    int32_t rank;
    int64_t step;
    std::optional<int64_t> tripped_version;
    std::string reason;
  };
  std::vector<Guard> guards;
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
    jobs_.reset();
    store_ = *JobStore::Open(":memory:");
    jobs_ = std::make_unique<JobManager>(store_.get());
    WorkerManager::Options options;
    options.heartbeat_timeout = timeout;
    options.watch_interval = 20ms;
    options.session_grace = session_grace_;
    workers_ = std::make_unique<WorkerManager>(jobs_.get(), store_.get(), &kv_,
                                               nullptr, &timelines_, options);
    workers_->SetListener(&listener_);
    jobs_->SetStateListener([this](const std::string& id, v1::JobState s) {
      if (IsTerminal(s)) workers_->OnJobEnded(id, s);
    });
    job_ = *jobs_->Submit(Spec());
  }

  v1::RegisterRequest Request(const std::string& inc, int rank = -1) {
    v1::RegisterRequest req;
    req.set_job_id(job_.id());
    req.set_incarnation(inc);
    req.set_hostname("host-" + inc);
    req.set_requested_rank(rank);
    req.set_device("cpu");
    req.set_device_memory_bytes(int64_t{16} << 30);
    return req;
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

  // Registers and, like a worker, opens the rank's session (`connect`):
  // a job runs once every rank is registered and connected.
  absl::StatusOr<v1::RegisterResponse> Register(const std::string& inc,
                                                int rank = -1,
                                                bool connect = true) {
    absl::StatusOr<v1::RegisterResponse> r =
        workers_->Register(Request(inc, rank));
    if (connect && r.ok() && r->not_needed().empty()) {
      Open(r->rank(), inc, std::make_shared<RecordingSink>());
    }
    return r;
  }

  v1::JobState State() { return jobs_->Get(job_.id())->state(); }

  std::chrono::milliseconds session_grace_ = 5000ms;
  KvStore kv_;
  TimelineStore timelines_;
  RecordingListener listener_;
  std::unique_ptr<JobStore> store_;
  std::unique_ptr<JobManager> jobs_;
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

// A PENDING job says what it waits for: the ranks connected, those
// missing, and the command that starts them; a rank whose session closes
// is missing again; once all run, nothing.
TEST_F(WorkerManagerTest, Pending_SaysWhichRanksAreMissingAndHow) {
  v1::Job job = *jobs_->Get(job_.id());
  EXPECT_EQ(job.waiting(),
            absl::StrCat("no rank of 2 registered yet; missing ranks 0, 1: "
                         "start them with `tandem launch --nproc 2 --job ",
                         job_.id(),
                         "` (deploy/slurm, deploy/k8s on a "
                         "cluster)"));
  EXPECT_DOUBLE_EQ(job.waiting_since_unix_s(), job.submitted_unix_s());
  // Registered but not connected: still missing.
  ASSERT_TRUE(Register("a", 1, /*connect=*/false).ok());
  EXPECT_THAT(jobs_->Get(job_.id())->waiting(),
              HasSubstr("no rank of 2 registered yet"));
  const int64_t s1 = Open(1, "a", std::make_shared<RecordingSink>());
  EXPECT_THAT(jobs_->Get(job_.id())->waiting(),
              HasSubstr(absl::StrCat(
                  "1 of 2 ranks registered (rank 1 on host-a); missing rank "
                  "0: start it with `tandem launch --nproc 1 --job ",
                  job_.id(), "`")));
  auto events = jobs_->Events(job_.id(), 0);
  EXPECT_THAT(events->back().message(),
              HasSubstr("waiting: 1 of 2 ranks registered"));
  workers_->CloseSession(s1);
  EXPECT_THAT(jobs_->Get(job_.id())->waiting(),
              HasSubstr("no rank of 2 registered yet"));
  ASSERT_TRUE(Register("b", 0).ok());
  ASSERT_TRUE(Register("c", 1).ok());
  job = *jobs_->Get(job_.id());
  EXPECT_EQ(job.state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(job.waiting(), "");
  EXPECT_EQ(job.waiting_since_unix_s(), 0);
}

// A job whose ranks never all come fails after parallel.start_timeout_s,
// saying which were missing and what to do.
TEST_F(WorkerManagerTest, Pending_PastStartTimeout_FailsNamingMissingRanks) {
  v1::JobSpec spec = Spec();
  spec.mutable_parallel()->set_start_timeout_s(0.2);
  const v1::Job job = *jobs_->Submit(spec);
  v1::RegisterRequest req = Request("a", 0);
  req.set_job_id(job.id());
  ASSERT_TRUE(workers_->Register(req).ok());
  v1::SessionHello hello;
  hello.set_job_id(job.id());
  hello.set_rank(0);
  hello.set_incarnation("a");
  ASSERT_TRUE(
      workers_->OpenSession(hello, std::make_shared<RecordingSink>()).ok());
  for (int i = 0; i < 150 && !IsTerminal(jobs_->Get(job.id())->state()); ++i) {
    std::this_thread::sleep_for(20ms);
  }
  const v1::Job failed = *jobs_->Get(job.id());
  EXPECT_EQ(failed.state(), v1::JOB_STATE_FAILED);
  EXPECT_THAT(failed.error(),
              AllOf(HasSubstr("its ranks did not all start within "
                              "parallel.start_timeout_s (0.2 s)"),
                    HasSubstr("1 of 2 ranks registered (rank 0 on host-a); "
                              "missing rank 1: start it with `tandem launch "
                              "--nproc 1 --job"),
                    HasSubstr("or raise parallel.start_timeout_s")));
  // The default job (900 s) still waits.
  EXPECT_EQ(State(), v1::JOB_STATE_PENDING);
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

// model.dtype f16 is accepted at submit where the hardware is not declared;
// a rank that registers without a GPU fails the job, saying why.
TEST_F(WorkerManagerTest, Register_F16OnCpu_FailsTheJobSayingWhy) {
  v1::JobSpec spec = Spec();
  spec.mutable_model()->set_dtype(v1::DTYPE_F16);
  job_ = *jobs_->Submit(spec);
  v1::RegisterRequest gpu = Request("g");
  gpu.set_device("cuda:0");
  ASSERT_TRUE(workers_->Register(gpu).ok());
  const absl::Status cpu = workers_->Register(Request("a")).status();
  EXPECT_EQ(cpu.code(), absl::StatusCode::kFailedPrecondition);
  const std::string why =
      "the worker on host-a reports device cpu, but model.dtype f16 needs a "
      "CUDA device on every rank";
  EXPECT_THAT(std::string(cpu.message()), HasSubstr(why));
  EXPECT_EQ(State(), v1::JOB_STATE_FAILED);
  EXPECT_THAT(jobs_->Get(job_.id())->error(), HasSubstr(why));

  // Declared hardware: a rank on another device is refused alike.
  spec = Spec();
  spec.mutable_hardware()->set_device("cuda");
  job_ = *jobs_->Submit(spec);
  EXPECT_THAT(std::string(workers_->Register(Request("b")).status().message()),
              HasSubstr("but the job's hardware.device is cuda"));
  EXPECT_EQ(State(), v1::JOB_STATE_FAILED);
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
  // A rank that reconnects afterwards is told the job ended, not that it is
  // unknown (its registration may be forgotten by then).
  v1::SessionHello hello;
  hello.set_job_id(job_.id());
  hello.set_rank(0);
  hello.set_incarnation("a");
  auto late = workers_->OpenSession(hello, std::make_shared<RecordingSink>());
  EXPECT_EQ(late.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(late.status().message()),
              HasSubstr("already ended SUCCEEDED; this worker should exit"));
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

// tandem_worker_restarts_total: 0 from the job's first registration, 1
// after a rank came back as a new process.
TEST_F(WorkerManagerTest, RestartedWorker_CountedInTheRestartsMetric) {
  metrics::Registry registry;
  auto m = CoordinatorMetrics::Create(registry);
  ASSERT_TRUE(m.ok()) << m.status();
  WorkerManager counted(jobs_.get(), store_.get(), &kv_, m->get(), nullptr,
                        WorkerManager::Options());
  auto reg = [&](const std::string& inc, int rank) {
    absl::StatusOr<v1::RegisterResponse> r =
        counted.Register(Request(inc, rank));
    if (r.ok()) {
      v1::SessionHello hello;
      hello.set_job_id(job_.id());
      hello.set_rank(r->rank());
      hello.set_incarnation(inc);
      EXPECT_TRUE(
          counted.OpenSession(hello, std::make_shared<RecordingSink>()).ok());
    }
    return r;
  };
  ASSERT_TRUE(reg("a", 0).ok());
  EXPECT_EQ((*m)->worker_restarts->WithLabels({job_.id()}).value(), 0);
  ASSERT_TRUE(reg("b", 1).ok());
  EXPECT_FALSE(reg("b2", 1).ok());
  EXPECT_EQ((*m)->worker_restarts->WithLabels({job_.id()}).value(), 1);
  EXPECT_THAT(
      registry.Expose(),
      HasSubstr("tandem_worker_restarts_total{job=\"" + job_.id() + "\"} 1"));
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

// A survivor's collective fails on a killed peer (WorkerError.peer_lost):
// the job fails at once naming the rank whose session closed, whichever
// came first, the error or the killed process's closed stream (gRPC can
// notice the stream after the peer's error arrived: the integration test
// test_worker_killed_fails_job_naming_rank then waited for the heartbeat
// timeout).
TEST_F(WorkerManagerTest, PeerLost_FailsJobNamingTheClosedRank_EitherOrder) {
  for (const bool error_first : {true, false}) {
    SCOPED_TRACE(error_first ? "error first" : "session closed first");
    Start(15000ms);
    ASSERT_TRUE(Register("a", 0, false).ok());
    ASSERT_TRUE(Register("b", 1, false).ok());
    const int64_t s0 = Open(0, "a", std::make_shared<RecordingSink>());
    const int64_t s1 = Open(1, "b", std::make_shared<RecordingSink>());
    ASSERT_EQ(State(), v1::JOB_STATE_RUNNING);
    v1::WorkerMessage m;
    m.mutable_error()->set_message("collective failed: connection reset");
    m.mutable_error()->set_peer_lost(true);
    if (error_first) {
      ASSERT_TRUE(workers_->OnMessage(s0, m).ok());
      EXPECT_EQ(State(), v1::JOB_STATE_RUNNING);  // no session closed yet
      workers_->CloseSession(s1);
    } else {
      workers_->CloseSession(s1);
      EXPECT_EQ(State(), v1::JOB_STATE_RUNNING);  // may be a reconnect
      ASSERT_TRUE(workers_->OnMessage(s0, m).ok());
    }
    EXPECT_EQ(State(), v1::JOB_STATE_FAILED);
    EXPECT_THAT(jobs_->Get(job_.id())->error(),
                HasSubstr("rank 1 (host-b) is gone: its session closed and "
                          "rank 0 (host-a)'s collective failed"));
  }
}

// The reporter's own session closing is no evidence against anyone.
TEST_F(WorkerManagerTest, PeerLost_ReporterClosing_LosesNobody) {
  ASSERT_TRUE(Register("a", 0, false).ok());
  ASSERT_TRUE(Register("b", 1, false).ok());
  const int64_t s0 = Open(0, "a", std::make_shared<RecordingSink>());
  Open(1, "b", std::make_shared<RecordingSink>());
  v1::WorkerMessage m;
  m.mutable_error()->set_message("collective failed");
  m.mutable_error()->set_peer_lost(true);
  ASSERT_TRUE(workers_->OnMessage(s0, m).ok());
  workers_->CloseSession(s0);
  EXPECT_EQ(State(), v1::JOB_STATE_RUNNING);
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
  // A wait share is a share of the step: in [0, 1], or unset.
  for (const double share : {-0.1, 1.5, std::nan("")}) {
    v1::WorkerMessage waits;
    waits.mutable_progress()->set_iteration_s(0.3);
    waits.mutable_progress()->set_cpu_wait_share(share);
    const absl::Status s = workers_->OnMessage(s0, waits);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << share;
    EXPECT_THAT(s.message(), HasSubstr("cpu_wait_share")) << share;
  }
  EXPECT_TRUE(listener_.progress_steps.empty());
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
  WorkerManager restarted(jobs_.get(), store_.get(), &kv_, nullptr, nullptr,
                          options);
  ASSERT_TRUE(restarted.Recover().ok());
  v1::SessionHello hello;
  hello.set_job_id(job_.id());
  hello.set_rank(1);
  hello.set_incarnation("b");
  EXPECT_TRUE(
      restarted.OpenSession(hello, std::make_shared<RecordingSink>()).ok());
}

// A restart recovers every job still running, however many newer jobs the
// database holds (List caps at 1000, newest first).
TEST_F(WorkerManagerTest, Recover_OldRunningJobBehindAThousandNewerOnes) {
  ASSERT_TRUE(Register("a").ok());
  ASSERT_TRUE(Register("b").ok());
  for (int i = 0; i < 1000; ++i) {
    v1::Job newer;
    newer.set_id(absl::StrCat("newer-", i));
    newer.set_state(v1::JOB_STATE_RUNNING);
    newer.set_submitted_unix_s(job_.submitted_unix_s() + 10 + i);
    *newer.mutable_spec() = job_.spec();
    ASSERT_TRUE(store_->PutJob(newer).ok());
  }
  JobManager jobs(store_.get());
  ASSERT_TRUE(jobs.Recover().ok());
  ASSERT_EQ(jobs.List({}, 0).size(), 1000u);
  EXPECT_EQ(jobs.Unfinished().size(), 1001u);
  WorkerManager restarted(&jobs, store_.get(), &kv_, nullptr, nullptr,
                          WorkerManager::Options());
  ASSERT_TRUE(restarted.Recover().ok());
  v1::SessionHello hello;
  hello.set_job_id(job_.id());
  hello.set_rank(1);
  hello.set_incarnation("b");
  EXPECT_TRUE(
      restarted.OpenSession(hello, std::make_shared<RecordingSink>()).ok());
}

// `tandem status`'s workers: each registered rank with its host and
// device, connected once its session is open, with when it was last heard.
TEST_F(WorkerManagerTest, Describe_RegisteredRanksAndTheirSessions) {
  auto none = workers_->Describe(job_.id());
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->empty());
  ASSERT_TRUE(Register("a", -1, /*connect=*/false).ok());
  ASSERT_TRUE(Register("b", -1, /*connect=*/false).ok());
  v1::SessionHello hello;
  hello.set_job_id(job_.id());
  hello.set_rank(1);
  hello.set_incarnation("b");
  const double before = absl::ToDoubleSeconds(absl::Now() - absl::UnixEpoch());
  ASSERT_TRUE(
      workers_->OpenSession(hello, std::make_shared<RecordingSink>()).ok());
  auto workers = workers_->Describe(job_.id());
  ASSERT_TRUE(workers.ok()) << workers.status();
  ASSERT_EQ(workers->size(), 2u);
  EXPECT_EQ((*workers)[0].rank(), 0);
  EXPECT_EQ((*workers)[0].incarnation(), "a");
  EXPECT_FALSE((*workers)[0].connected());
  EXPECT_EQ((*workers)[1].rank(), 1);
  EXPECT_EQ((*workers)[1].incarnation(), "b");
  EXPECT_TRUE((*workers)[1].connected());
  EXPECT_GE((*workers)[1].last_heartbeat_unix_s(), before - 1);

  // A restarted coordinator knows them from the store; not heard since.
  JobManager jobs(store_.get());
  ASSERT_TRUE(jobs.Recover().ok());
  WorkerManager restarted(&jobs, store_.get(), &kv_, nullptr, nullptr,
                          WorkerManager::Options());
  ASSERT_TRUE(restarted.Recover().ok());
  auto recovered = restarted.Describe(job_.id());
  ASSERT_TRUE(recovered.ok());
  ASSERT_EQ(recovered->size(), 2u);
  EXPECT_EQ((*recovered)[1].incarnation(), "b");
  EXPECT_FALSE((*recovered)[1].connected());
  EXPECT_EQ((*recovered)[1].last_heartbeat_unix_s(), 0);
}

TEST_F(WorkerManagerTest, Register_ReportsRankToListener) {
  ASSERT_TRUE(Register("a").ok());
  ASSERT_TRUE(Register("b").ok());
  ASSERT_EQ(listener_.registered.size(), 2u);
  const RecordingListener::Registered& b = listener_.registered[1];
  EXPECT_EQ(b.job_id, job_.id());
  EXPECT_EQ(b.rank, 1);
  EXPECT_EQ(b.hostname, "host-b");
  EXPECT_EQ(b.device, "cpu");
  EXPECT_EQ(b.device_memory_bytes, int64_t{16} << 30);
  // Refused registrations are not reported.
  EXPECT_FALSE(Register("c").ok());
  EXPECT_EQ(listener_.registered.size(), 2u);
}

TEST_F(WorkerManagerTest, OnMessage_Reports_GoToListenerWithSessionRank) {
  ASSERT_TRUE(Register("a").ok());
  ASSERT_TRUE(Register("b").ok());
  const int64_t s1 = Open(1, "b", std::make_shared<RecordingSink>());
  v1::WorkerMessage graph;
  graph.mutable_graph()->set_graph_hash("0123456789abcdef");
  ASSERT_TRUE(workers_->OnMessage(s1, graph).ok());
  v1::WorkerMessage profile;
  profile.mutable_profile()->set_first_iteration(4);
  ASSERT_TRUE(workers_->OnMessage(s1, profile).ok());
  v1::WorkerMessage progress;
  progress.mutable_progress()->set_step(2);
  ASSERT_TRUE(workers_->OnMessage(s1, progress).ok());
  EXPECT_THAT(listener_.graphs,
              ElementsAre(std::make_pair(1, std::string("0123456789abcdef"))));
  EXPECT_THAT(listener_.profiles, ElementsAre(std::make_pair(1, int64_t{4})));
  EXPECT_THAT(listener_.progress_steps,
              ElementsAre(std::make_pair(1, int64_t{2})));
}

// The listener refusing a report refuses the worker's message, which the
// RPC layer sends back to that worker.
TEST_F(WorkerManagerTest, OnMessage_ListenerRefuses_ErrorComesBack) {
  ASSERT_TRUE(Register("a").ok());
  const int64_t s0 = Open(0, "a", std::make_shared<RecordingSink>());
  listener_.reply = absl::FailedPreconditionError("rank 0 must report first");
  v1::WorkerMessage profile;
  profile.mutable_profile()->set_graph_hash("x");
  const absl::Status s = workers_->OnMessage(s0, profile);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(s.message(), "rank 0 must report first");
}

// Listeners are called in the order added (the server: planning, then the
// job history). A refusal by the first is the answer and the second never
// sees that report; what the first accepts, both see; other reports go to
// both.
TEST_F(WorkerManagerTest, OnMessage_ListenersInOrder_FirstRefusalStopsTheRest) {
  RecordingListener second;
  workers_->AddListener(&second);
  ASSERT_TRUE(Register("a").ok());
  ASSERT_EQ(second.registered.size(), 1u);
  const int64_t s0 = Open(0, "a", std::make_shared<RecordingSink>());
  listener_.reply = absl::InvalidArgumentError("profile from rank 0: bad");
  v1::WorkerMessage profile;
  profile.mutable_profile()->set_first_iteration(2);
  const absl::Status refused = workers_->OnMessage(s0, profile);
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(refused.message(), "profile from rank 0: bad");
  v1::WorkerMessage graph;
  graph.mutable_graph()->set_graph_hash("0123456789abcdef");
  EXPECT_FALSE(workers_->OnMessage(s0, graph).ok());
  EXPECT_THAT(listener_.profiles, ElementsAre(std::make_pair(0, int64_t{2})));
  EXPECT_TRUE(second.profiles.empty());
  EXPECT_TRUE(second.graphs.empty());
  listener_.reply = absl::OkStatus();
  profile.mutable_profile()->set_first_iteration(4);
  ASSERT_TRUE(workers_->OnMessage(s0, profile).ok());
  EXPECT_THAT(second.profiles, ElementsAre(std::make_pair(0, int64_t{4})));
  v1::WorkerMessage progress;
  progress.mutable_progress()->set_step(3);
  ASSERT_TRUE(workers_->OnMessage(s0, progress).ok());
  EXPECT_THAT(second.progress_steps,
              ElementsAre(std::make_pair(0, int64_t{3})));
  EXPECT_THAT(listener_.progress_steps,
              ElementsAre(std::make_pair(0, int64_t{3})));
  // SetListener makes one the only listener again.
  workers_->SetListener(&listener_);
  progress.mutable_progress()->set_step(4);
  ASSERT_TRUE(workers_->OnMessage(s0, progress).ok());
  EXPECT_EQ(second.progress_steps.size(), 1u);
  EXPECT_EQ(listener_.progress_steps.size(), 2u);
}

TEST_F(WorkerManagerTest, Applied_AllRanks_ReportsActiveOnce) {
  ASSERT_TRUE(Register("a").ok());
  ASSERT_TRUE(Register("b").ok());
  const int64_t s0 = Open(0, "a", std::make_shared<RecordingSink>());
  const int64_t s1 = Open(1, "b", std::make_shared<RecordingSink>());
  v1::WorkerMessage applied;
  applied.mutable_applied()->set_version(1);
  applied.mutable_applied()->set_step(5);
  ASSERT_TRUE(workers_->OnMessage(s0, applied).ok());
  EXPECT_TRUE(listener_.active_versions.empty());
  ASSERT_TRUE(workers_->OnMessage(s1, applied).ok());
  ASSERT_TRUE(workers_->OnMessage(s1, applied).ok());  // a repeat
  EXPECT_THAT(listener_.active_versions, ElementsAre(1));
  EXPECT_THAT(jobs_->Events(job_.id(), 0)->back().message(),
              HasSubstr("v1 active on all 2 ranks from step 5"));
}

// The memory guard's switch (version -1) is no published version: it goes
// to the listener with the version that tripped it, as the worker said it
// (v0 is a version too), or none from a worker that does not say.
TEST_F(WorkerManagerTest, Applied_MemoryGuard_PassesTheTrippedVersion) {
  ASSERT_TRUE(Register("a").ok());
  ASSERT_TRUE(Register("b").ok());
  const int64_t s0 = Open(0, "a", std::make_shared<RecordingSink>());
  const int64_t s1 = Open(1, "b", std::make_shared<RecordingSink>());
  v1::WorkerMessage guard;
  guard.mutable_applied()->set_version(-1);
  guard.mutable_applied()->set_step(14);
  guard.mutable_applied()->set_reason("memory guard: rank(s) 0 came within");
  guard.mutable_applied()->set_tripped_version(0);
  ASSERT_TRUE(workers_->OnMessage(s0, guard).ok());
  guard.mutable_applied()->clear_tripped_version();
  ASSERT_TRUE(workers_->OnMessage(s1, guard).ok());
  ASSERT_EQ(listener_.guards.size(), 2u);
  EXPECT_EQ(listener_.guards[0].rank, 0);
  EXPECT_EQ(listener_.guards[0].step, 14);
  EXPECT_EQ(listener_.guards[0].tripped_version, std::optional<int64_t>(0));
  EXPECT_EQ(listener_.guards[0].reason, "memory guard: rank(s) 0 came within");
  EXPECT_EQ(listener_.guards[1].tripped_version, std::nullopt);
  EXPECT_TRUE(listener_.active_versions.empty());
}

TEST_F(WorkerManagerTest, OpenSession_BehindLatestSchedule_SendsIt) {
  v1::ScheduleUpdate latest;
  latest.mutable_schedule()->set_version(3);
  latest.set_effective_step(12);
  // A comparison: the incumbent travels with it.
  latest.mutable_incumbent()->set_version(2);
  latest.set_block_steps(4);
  std::vector<std::string> asked;
  workers_->SetScheduleLookup(
      [&](const std::string& job_id) -> absl::StatusOr<v1::ScheduleUpdate> {
        asked.push_back(job_id);
        return latest;
      });
  ASSERT_TRUE(Register("a", -1, /*connect=*/false).ok());
  ASSERT_TRUE(Register("b", -1, /*connect=*/false).ok());
  auto behind = std::make_shared<RecordingSink>();
  v1::SessionHello hello;
  hello.set_job_id(job_.id());
  hello.set_rank(0);
  hello.set_incarnation("a");
  hello.set_schedule_version(2);
  ASSERT_TRUE(workers_->OpenSession(hello, behind).ok());
  ASSERT_EQ(behind->Take().size(), 1u);
  EXPECT_EQ(behind->Take()[0].schedule().schedule().version(), 3);
  EXPECT_EQ(behind->Take()[0].schedule().effective_step(), 12);
  EXPECT_EQ(behind->Take()[0].schedule().incumbent().version(), 2);
  EXPECT_EQ(behind->Take()[0].schedule().block_steps(), 4);
  auto current = std::make_shared<RecordingSink>();
  hello.set_rank(1);
  hello.set_incarnation("b");
  hello.set_schedule_version(3);
  ASSERT_TRUE(workers_->OpenSession(hello, current).ok());
  EXPECT_TRUE(current->Take().empty());
  EXPECT_THAT(asked, ElementsAre(job_.id(), job_.id()));
}

TEST_F(WorkerManagerTest, Stop_Twice_WatcherFailsNoJobAfter) {
  Start(50ms);
  ASSERT_TRUE(Register("a").ok());
  ASSERT_TRUE(Register("b").ok());
  workers_->Stop();
  workers_->Stop();
  std::this_thread::sleep_for(200ms);
  EXPECT_EQ(State(), v1::JOB_STATE_RUNNING);
}

// restart.min_world (coordinator/README.md, "Elastic restarts"): a restart
// that waited rejoin_timeout_s for every rank resumes with those that came,
// renumbered by arrival; the registered ones, told the old world, stop and
// register again; a late worker is not needed; a connected rank is not
// displaced by one asking for its number.
TEST_F(WorkerManagerTest, Restart_RankMissingPastRejoinTimeout_ResumesSmaller) {
  v1::JobSpec spec = Spec();
  spec.mutable_parallel()->set_world_size(3);
  spec.mutable_restart()->set_max_restarts(2);
  spec.mutable_restart()->set_min_world(2);
  // Long enough for rank 2 to register and open its session first on a
  // loaded machine.
  spec.mutable_restart()->set_rejoin_timeout_s(1.0);
  job_ = *jobs_->Submit(spec);
  ASSERT_TRUE(Register("a", 0).ok());
  ASSERT_TRUE(Register("b", 1).ok());
  ASSERT_TRUE(Register("c", 2).ok());
  ASSERT_EQ(State(), v1::JOB_STATE_RUNNING);
  // Rank 0's process comes back as a new one: restart 1. Rank 2 comes
  // back too; rank 1 never does.
  ASSERT_TRUE(Register("a2", 0).ok());
  ASSERT_EQ(State(), v1::JOB_STATE_PENDING);
  ASSERT_TRUE(Register("c2", 2).ok());
  auto sink = std::make_shared<RecordingSink>();
  Open(2, "c2", sink);
  for (int i = 0; i < 250 && jobs_->Get(job_.id())->submitted_world_size() == 0;
       ++i) {
    std::this_thread::sleep_for(20ms);
  }
  v1::Job job = *jobs_->Get(job_.id());
  ASSERT_EQ(job.submitted_world_size(), 3);
  EXPECT_EQ(job.spec().parallel().world_size(), 2);
  EXPECT_EQ(job.state(), v1::JOB_STATE_PENDING);
  EXPECT_EQ(job.restarts(), 1);
  auto events = *jobs_->Events(job_.id(), 0);
  EXPECT_THAT(events.back().message(),
              HasSubstr("restart 1 resumes at world 2 of 3: rank 1 did not "
                        "register within restart.rejoin_timeout_s"));
  // The registered rank was told to stop and register again (the command
  // can reach its session after the job's new world is stored).
  std::vector<v1::CoordinatorMessage> told;
  for (int i = 0; i < 250 && (told.empty() || !told.back().has_command());
       ++i) {
    for (v1::CoordinatorMessage& m : sink->Take()) told.push_back(std::move(m));
    if (told.empty() || !told.back().has_command()) {
      std::this_thread::sleep_for(20ms);
    }
  }
  ASSERT_FALSE(told.empty());
  EXPECT_EQ(told.back().command().kind(), v1::Command::KIND_RESTART);
  EXPECT_THAT(told.back().command().reason(), HasSubstr("resumes at world 2"));
  // They register again: rank 2 is outside the world now and takes rank 1.
  auto c3 = Register("c3", 2);
  ASSERT_TRUE(c3.ok()) << c3.status();
  EXPECT_EQ(c3->rank(), 0);
  EXPECT_EQ(c3->world_size(), 2);
  EXPECT_EQ(c3->spec().parallel().world_size(), 2);
  EXPECT_EQ(c3->store_prefix(), "jobs/" + job_.id() + "/r1w2/");
  auto a3 = Register("a3", 0);
  ASSERT_TRUE(a3.ok()) << a3.status();
  EXPECT_EQ(a3->rank(), 1);  // rank 0 went to c3, which came first
  EXPECT_EQ(State(), v1::JOB_STATE_RUNNING);
  Open(0, "c3", std::make_shared<RecordingSink>());
  Open(1, "a3", std::make_shared<RecordingSink>());
  // Late: rank 1's process, and one asking for a connected rank's number.
  auto late = Register("b2", 1);
  ASSERT_TRUE(late.ok()) << late.status();
  EXPECT_THAT(late->not_needed(), HasSubstr("resumed at world 2 of 3"));
  auto asks_zero = Register("x", 0);
  ASSERT_TRUE(asks_zero.ok()) << asks_zero.status();
  EXPECT_FALSE(asks_zero->not_needed().empty());
  EXPECT_EQ(State(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(jobs_->Get(job_.id())->restarts(), 1);
}

TEST_F(WorkerManagerTest, Restart_FewerThanMinWorld_KeepsWaiting) {
  v1::JobSpec spec = Spec();
  spec.mutable_parallel()->set_world_size(3);
  spec.mutable_restart()->set_max_restarts(1);
  spec.mutable_restart()->set_min_world(2);
  spec.mutable_restart()->set_rejoin_timeout_s(0.1);
  job_ = *jobs_->Submit(spec);
  ASSERT_TRUE(Register("a", 0).ok());
  ASSERT_TRUE(Register("b", 1).ok());
  ASSERT_TRUE(Register("c", 2).ok());
  ASSERT_TRUE(Register("a2", 0).ok());  // restart 1; only rank 0 is back
  std::this_thread::sleep_for(400ms);
  v1::Job job = *jobs_->Get(job_.id());
  EXPECT_EQ(job.state(), v1::JOB_STATE_PENDING);
  EXPECT_EQ(job.spec().parallel().world_size(), 3);
  EXPECT_EQ(job.submitted_world_size(), 0);
  // The two others come back: the full world resumes.
  ASSERT_TRUE(Register("b2", 1).ok());
  ASSERT_TRUE(Register("c2", 2).ok());
  EXPECT_EQ(State(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(jobs_->Get(job_.id())->spec().parallel().world_size(), 3);
}

// A rank whose process dies after registering, before its peers did
// (coordinator/README.md, "Registration"): the job does not start with it,
// its relaunch takes the rank without a restart, and no rank begins the
// rendezvous (the start key) until every rank is registered and live.
TEST_F(WorkerManagerTest, Register_RankGoneBeforeStart_RelaunchTakesIt) {
  auto a = Register("a");
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->start_key(), "jobs/" + job_.id() + "/tandem/started");
  workers_->CloseSession(Open(0, "a", std::make_shared<RecordingSink>()));
  ASSERT_TRUE(Register("b", 1).ok());
  EXPECT_EQ(State(), v1::JOB_STATE_PENDING);
  EXPECT_FALSE(kv_.Check({a->start_key()}));
  // The relaunch asks for no rank in particular: the gone one is free.
  auto c = Register("c");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->rank(), 0);
  EXPECT_EQ(State(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(jobs_->Get(job_.id())->restarts(), 0);
  EXPECT_TRUE(kv_.Check({c->start_key()}));
  bool said = false;
  const std::vector<v1::JobEvent> events = *jobs_->Events(job_.id(), 0);
  for (const v1::JobEvent& e : events) {
    said = said || e.message().find(
                       "rank 0 (host-a) left before the job started (its "
                       "session closed); incarnation c takes its rank") !=
                       std::string::npos;
  }
  EXPECT_TRUE(said);
  // The rank is c's now: a's hello is refused.
  v1::SessionHello hello;
  hello.set_job_id(job_.id());
  hello.set_rank(0);
  hello.set_incarnation("a");
  EXPECT_EQ(workers_->OpenSession(hello, std::make_shared<RecordingSink>())
                .status()
                .code(),
            absl::StatusCode::kPermissionDenied);
}

// A session that closed and comes back (a network blip, not a death): the
// job starts once it does.
TEST_F(WorkerManagerTest, Register_GoneRankReconnects_JobStarts) {
  ASSERT_TRUE(Register("a").ok());
  workers_->CloseSession(Open(0, "a", std::make_shared<RecordingSink>()));
  ASSERT_TRUE(Register("b", 1).ok());
  EXPECT_EQ(State(), v1::JOB_STATE_PENDING);
  Open(0, "a", std::make_shared<RecordingSink>());
  EXPECT_EQ(State(), v1::JOB_STATE_RUNNING);
}

// A registered worker that never opened a session (it died between the two
// calls, or did not come back after a coordinator restart) does not count
// toward the start, and past the grace a new worker may take its rank.
TEST_F(WorkerManagerTest, Register_NoSessionPastGrace_DoesNotCount) {
  session_grace_ = 100ms;
  Start(15000ms);
  ASSERT_TRUE(Register("a", -1, /*connect=*/false).ok());
  std::this_thread::sleep_for(300ms);
  ASSERT_TRUE(Register("b", 1).ok());
  EXPECT_EQ(State(), v1::JOB_STATE_PENDING);
  EXPECT_EQ(Register("c")->rank(), 0);
  EXPECT_EQ(State(), v1::JOB_STATE_RUNNING);
}

// A coordinator that died between the job's start and setting its start key
// sets it on recovery.
TEST_F(WorkerManagerTest, Recover_RunningJob_HasItsStartKey) {
  auto a = Register("a");
  ASSERT_TRUE(Register("b").ok());
  ASSERT_EQ(State(), v1::JOB_STATE_RUNNING);
  kv_.DeletePrefix(WorkerManager::StorePrefix(job_.id()));
  ASSERT_FALSE(kv_.Check({a->start_key()}));
  WorkerManager restarted(jobs_.get(), store_.get(), &kv_, nullptr, nullptr,
                          WorkerManager::Options());
  ASSERT_TRUE(restarted.Recover().ok());
  EXPECT_TRUE(kv_.Check({a->start_key()}));
}

// A push that a coordinator restart interrupted (rank 0 already ran the new
// version; the last "applied" never arrived): the ranks re-send what they
// applied on reconnect and the version is recorded active, once, across
// restarts (Job.active_version).
TEST_F(WorkerManagerTest, Applied_PushInterruptedByRestart_RecordedOnResend) {
  ASSERT_TRUE(Register("a").ok());
  ASSERT_TRUE(Register("b").ok());
  const int64_t s0 = Open(0, "a", std::make_shared<RecordingSink>());
  Open(1, "b", std::make_shared<RecordingSink>());
  v1::WorkerMessage applied;
  applied.mutable_applied()->set_version(1);
  applied.mutable_applied()->set_step(5);
  ASSERT_TRUE(workers_->OnMessage(s0, applied).ok());
  v1::WorkerMessage progress;
  progress.mutable_progress()->set_step(6);
  progress.mutable_progress()->set_schedule_version(1);
  ASSERT_TRUE(workers_->OnMessage(s0, progress).ok());
  // Any event writes the job row (progress alone, at most once a second).
  ASSERT_TRUE(jobs_->RecordEvent(job_.id(), "replan", "persist").ok());
  auto count_active = [&](JobManager& jobs) {
    int n = 0;
    const std::vector<v1::JobEvent> events = *jobs.Events(job_.id(), 0);
    for (const v1::JobEvent& e : events) {
      n += e.message().find("v1 active on all 2 ranks") != std::string::npos;
    }
    return n;
  };
  EXPECT_EQ(count_active(*jobs_), 0);
  workers_->Stop();
  for (int restart = 0; restart < 2; ++restart) {
    JobManager jobs(store_.get());
    ASSERT_TRUE(jobs.Recover().ok());
    ASSERT_EQ(jobs.Get(job_.id())->schedule_version(), 1);
    WorkerManager again(&jobs, store_.get(), &kv_, nullptr, nullptr,
                        WorkerManager::Options());
    ASSERT_TRUE(again.Recover().ok());
    for (int rank = 0; rank < 2; ++rank) {
      v1::SessionHello hello;
      hello.set_job_id(job_.id());
      hello.set_rank(rank);
      hello.set_incarnation(rank == 0 ? "a" : "b");
      auto id = again.OpenSession(hello, std::make_shared<RecordingSink>());
      ASSERT_TRUE(id.ok()) << id.status();
      ASSERT_TRUE(again.OnMessage(*id, applied).ok());
    }
    EXPECT_EQ(count_active(jobs), 1) << "after restart " << restart;
    EXPECT_EQ(jobs.Get(job_.id())->active_version(), 1);
  }
}

// A heartbeat timeout names the coordinator as the likelier cause when
// heartbeats reach it late (overloaded).
TEST_F(WorkerManagerTest, SilentWorker_HeartbeatsLate_SaysOverloaded) {
  Start(150ms);
  ASSERT_TRUE(Register("a").ok());
  ASSERT_TRUE(Register("b").ok());
  const int64_t s0 = Open(0, "a", std::make_shared<RecordingSink>());
  Open(1, "b", std::make_shared<RecordingSink>());
  v1::WorkerMessage late;
  late.mutable_heartbeat()->set_time_unix_s(absl::ToDoubleSeconds(
      absl::Now() - absl::Seconds(12) - absl::UnixEpoch()));
  ASSERT_TRUE(workers_->OnMessage(s0, late).ok());
  for (int i = 0; i < 200 && State() == v1::JOB_STATE_RUNNING; ++i) {
    std::this_thread::sleep_for(10ms);
  }
  ASSERT_EQ(State(), v1::JOB_STATE_FAILED);
  EXPECT_THAT(jobs_->Get(job_.id())->error(),
              HasSubstr("heartbeats reach this coordinator up to 12."));
  // Without either, the plain cause.
  Start(150ms);
  ASSERT_TRUE(Register("a").ok());
  ASSERT_TRUE(Register("b").ok());
  for (int i = 0; i < 200 && State() == v1::JOB_STATE_RUNNING; ++i) {
    std::this_thread::sleep_for(10ms);
  }
  ASSERT_EQ(State(), v1::JOB_STATE_FAILED);
  EXPECT_THAT(jobs_->Get(job_.id())->error(),
              ::testing::EndsWith("the worker died or lost its connection"));
}

}  // namespace
}  // namespace tandem
