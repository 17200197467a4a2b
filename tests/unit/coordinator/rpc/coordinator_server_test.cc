// The coordinator over real gRPC on loopback: a server on port 0, clients and
// fake workers speaking the protocol.
#include "coordinator/rpc/coordinator_server.h"

#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <future>
#include <limits>
#include <map>
#include <mutex>
#include <optional>
#include <thread>

#include "absl/strings/str_cat.h"
#include "bench/load/fake_worker.h"
#include "common/ir/proto_convert.h"
#include "common/job/job_spec.h"
#include "common/models/graph_builder.h"
#include "coordinator/store/job_store.h"
#include "tandem/v1/job_service.grpc.pb.h"
#include "tandem/v1/worker_service.grpc.pb.h"
#include "tests/unit/coordinator/tiny_job_spec.h"

namespace tandem {
namespace {

using namespace std::chrono_literals;
using ::testing::HasSubstr;

v1::JobSpec Spec() {
  v1::JobSpec spec = TinyJobSpec("tiny", 6);
  spec.mutable_optimize()->set_warmup_steps(2);
  return spec;
}

std::string TempDb(const char* name) {
  const std::string path = ::testing::TempDir() + "/" + name;
  for (const char* suffix : {"", "-wal", "-shm"}) {
    std::remove((path + suffix).c_str());
  }
  return path;
}

// One worker process's connection as the coordinator sees it: registration
// and a session stream (bench/load's SessionStream, the load bench's),
// driven by the test: each message it sends by hand, or a FakeRank's (the
// one fake worker's behaviour, bench/load/fake_worker.h).
class WorkerClient {
 public:
  WorkerClient(std::shared_ptr<grpc::Channel> channel, std::string job_id,
               std::string incarnation)
      : stub_(v1::WorkerService::NewStub(channel)),
        job_id_(std::move(job_id)),
        incarnation_(std::move(incarnation)) {}

  grpc::Status Register(int rank) {
    grpc::ClientContext ctx;
    v1::RegisterRequest req;
    req.set_job_id(job_id_);
    req.set_incarnation(incarnation_);
    req.set_hostname("host-" + incarnation_);
    req.set_requested_rank(rank);
    grpc::Status s = stub_->Register(&ctx, req, &registered_);
    return s;
  }

  // Opens the session with a hello at schedule `version`.
  void Connect(int64_t version = 0) {
    v1::WorkerMessage hello;
    hello.mutable_hello()->set_job_id(job_id_);
    hello.mutable_hello()->set_rank(registered_.rank());
    hello.mutable_hello()->set_incarnation(incarnation_);
    hello.mutable_hello()->set_schedule_version(version);
    Open({std::move(hello)}, nullptr);
  }
  // Opens the session as `rank` (registered with this worker's incarnation)
  // does, and hands it every schedule that arrives.
  void ConnectAs(FakeRank* rank) { Open(rank->ConnectMessages(), rank); }

  void Send(const v1::WorkerMessage& m) { ASSERT_TRUE(session_->Send(m)); }

  // Waits for a downstream message matching `pred`.
  std::optional<v1::CoordinatorMessage> WaitFor(
      std::function<bool(const v1::CoordinatorMessage&)> pred,
      std::chrono::milliseconds timeout = 10s) {
    std::unique_lock<std::mutex> lock(mu_);
    std::optional<v1::CoordinatorMessage> found;
    cv_.wait_for(lock, timeout, [&] {
      for (const auto& m : received_) {
        if (pred(m)) {
          found = m;
          return true;
        }
      }
      return false;
    });
    return found;
  }

  // Sends nothing more, and waits for the server to end the stream.
  grpc::Status Disconnect() {
    HalfClose();
    return Finish();
  }

  // Sends nothing more; the server ends the stream once it has handled
  // everything sent before.
  void HalfClose() { session_->HalfClose(); }
  // After HalfClose: waits for the server to end the stream.
  grpc::Status Finish() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [this] { return finished_; });
    return status_;
  }

  // The stream's callbacks reach into this worker: it ends before it goes.
  ~WorkerClient() {
    if (session_ == nullptr) return;
    session_->Cancel();
    Finish();
  }

  int rank() const { return registered_.rank(); }
  v1::WorkerService::Stub& stub() { return *stub_; }

 private:
  void Open(std::vector<v1::WorkerMessage> first, FakeRank* rank) {
    SessionStream::Handler handler;
    handler.on_message = [this, rank](SessionStream&,
                                      const v1::CoordinatorMessage& m) {
      if (rank != nullptr && m.has_schedule())
        rank->OfferSchedule(m.schedule());
      std::lock_guard<std::mutex> lock(mu_);
      received_.push_back(m);
      cv_.notify_all();
    };
    handler.on_done = [this](const grpc::Status& status, bool) {
      std::lock_guard<std::mutex> lock(mu_);
      status_ = status;
      finished_ = true;
      cv_.notify_all();
    };
    session_ = SessionStream::Open(stub_.get(), "", std::move(first),
                                   std::move(handler));
  }

  std::unique_ptr<v1::WorkerService::Stub> stub_;
  std::string job_id_;
  std::string incarnation_;
  v1::RegisterResponse registered_;
  std::shared_ptr<SessionStream> session_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<v1::CoordinatorMessage> received_;
  bool finished_ = false;
  grpc::Status status_;
};

class CoordinatorServerTest : public ::testing::Test {
 protected:
  void StartServer(const std::string& db, bool with_metrics = false) {
    CoordinatorOptions options;
    options.listen = "127.0.0.1:0";
    options.db = db;
    if (with_metrics) options.metrics_listen = "127.0.0.1:0";
    auto server = CoordinatorServer::Start(options);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    channel_ =
        grpc::CreateChannel("127.0.0.1:" + std::to_string(server_->port()),
                            grpc::InsecureChannelCredentials());
    jobs_ = v1::JobService::NewStub(channel_);
  }

  v1::Job Submit(const v1::JobSpec& spec) {
    grpc::ClientContext ctx;
    v1::SubmitJobRequest req;
    *req.mutable_spec() = spec;
    v1::SubmitJobResponse resp;
    grpc::Status s = jobs_->Submit(&ctx, req, &resp);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return resp.job();
  }

  v1::Job Get(const std::string& id) {
    grpc::ClientContext ctx;
    v1::GetJobRequest req;
    req.set_job_id(id);
    v1::GetJobResponse resp;
    EXPECT_TRUE(jobs_->Get(&ctx, req, &resp).ok());
    return resp.job();
  }
  // A job runs once every rank registered and opened its session (whose
  // hello the server handles on its own thread).
  v1::JobState WaitWhilePending(const std::string& id) {
    v1::JobState state = Get(id).state();
    for (int i = 0; i < 1000 && state == v1::JOB_STATE_PENDING; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
      state = Get(id).state();
    }
    return state;
  }

  static Graph GraphOf(const v1::Job& job) {
    return *BuildModelGraph(*ModelConfigFromJobSpec(job.spec()));
  }

  static v1::WorkerMessage ProfileMessage(const Graph& g, int rank,
                                          int64_t first, int64_t last) {
    Profile p;
    p.graph_hash = g.StructuralHash();
    p.rank = rank;
    p.first_iteration = first;
    p.last_iteration = last;
    p.iteration_s = 0.05;
    for (const Node& n : g.nodes) p.nodes.push_back({n.id, 1e-3, 2});
    v1::WorkerMessage m;
    *m.mutable_profile() = ToProto(p);
    return m;
  }

  std::unique_ptr<CoordinatorServer> server_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::JobService::Stub> jobs_;
};

TEST_F(CoordinatorServerTest, Submit_InvalidSpec_FieldLevelError) {
  StartServer(TempDb("invalid.db"));
  v1::JobSpec spec = Spec();
  spec.mutable_parallel()->set_world_size(0);
  spec.mutable_parallel()->set_zero_stage(3);
  grpc::ClientContext ctx;
  v1::SubmitJobRequest req;
  *req.mutable_spec() = spec;
  req.mutable_spec()->mutable_batch()->set_seq_len(-4);
  v1::SubmitJobResponse resp;
  grpc::Status s = jobs_->Submit(&ctx, req, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(),
              HasSubstr("batch.seq_len must be >= 1, got -4"));
}

TEST_F(CoordinatorServerTest,
       Job_FromSubmitToSucceeded_WithScheduleOverStream) {
  StartServer(TempDb("lifecycle.db"), /*with_metrics=*/true);
  EXPECT_GT(server_->metrics_port(), 0);
  const v1::Job job = Submit(Spec());
  const Graph graph = GraphOf(job);
  WorkerClient w0(channel_, job.id(), "inc-0"), w1(channel_, job.id(), "inc-1");
  ASSERT_TRUE(w0.Register(-1).ok());
  ASSERT_TRUE(w1.Register(-1).ok());
  EXPECT_EQ(Get(job.id()).state(), v1::JOB_STATE_PENDING);  // not connected
  w0.Connect();
  w1.Connect();
  EXPECT_EQ(WaitWhilePending(job.id()), v1::JOB_STATE_RUNNING);

  v1::WorkerMessage graph_msg;
  graph_msg.mutable_graph()->set_graph_hash(graph.StructuralHash());
  *graph_msg.mutable_graph()->mutable_graph() = ToProto(graph);
  w0.Send(graph_msg);
  graph_msg.mutable_graph()->clear_graph();
  w1.Send(graph_msg);

  // A NaN profile is refused and the session goes on.
  v1::WorkerMessage bad = ProfileMessage(graph, 0, 0, 1);
  bad.mutable_profile()->mutable_nodes(0)->set_time_s(
      std::numeric_limits<double>::quiet_NaN());
  w0.Send(bad);
  auto rejected = w0.WaitFor(
      [](const v1::CoordinatorMessage& m) { return m.has_rejected(); });
  ASSERT_TRUE(rejected.has_value());
  EXPECT_EQ(rejected->rejected().payload(), "profile");
  EXPECT_THAT(rejected->rejected().message(), HasSubstr("profile from rank 0"));

  w0.Send(ProfileMessage(graph, 0, 0, 1));
  w1.Send(ProfileMessage(graph, 1, 0, 1));
  auto is_schedule = [](const v1::CoordinatorMessage& m) {
    return m.has_schedule();
  };
  auto s0 = w0.WaitFor(is_schedule);
  auto s1 = w1.WaitFor(is_schedule);
  ASSERT_TRUE(s0.has_value());
  ASSERT_TRUE(s1.has_value());
  EXPECT_EQ(s0->schedule().schedule().version(), 1);
  EXPECT_EQ(s0->schedule().effective_step(), s1->schedule().effective_step());

  {
    grpc::ClientContext ctx;
    v1::GetScheduleRequest req;
    req.set_job_id(job.id());
    v1::GetScheduleResponse resp;
    ASSERT_TRUE(jobs_->GetSchedule(&ctx, req, &resp).ok());
    EXPECT_THAT(resp.text(),
                HasSubstr("schedule v1 graph=" + graph.StructuralHash()));
  }
  for (WorkerClient* w : {&w0, &w1}) {
    v1::WorkerMessage applied;
    applied.mutable_applied()->set_version(1);
    applied.mutable_applied()->set_step(3);
    w->Send(applied);
  }
  // Watch from the start in the background while the job finishes.
  std::vector<v1::WatchJobResponse> watched;
  std::thread watcher([&] {
    grpc::ClientContext ctx;
    v1::WatchJobRequest req;
    req.set_job_id(job.id());
    auto reader = jobs_->Watch(&ctx, req);
    v1::WatchJobResponse r;
    while (reader->Read(&r)) watched.push_back(r);
    EXPECT_TRUE(reader->Finish().ok());
  });
  for (int step = 1; step <= 6; ++step) {
    for (WorkerClient* w : {&w0, &w1}) {
      v1::WorkerMessage p;
      p.mutable_progress()->set_step(step);
      p.mutable_progress()->set_loss(5.0 - step * 0.1);
      p.mutable_progress()->set_iteration_s(0.05);
      p.mutable_progress()->set_schedule_version(step >= 3 ? 1 : 0);
      w->Send(p);
    }
  }
  auto stop = w0.WaitFor([](const v1::CoordinatorMessage& m) {
    return m.has_command() && m.command().kind() == v1::Command::KIND_STOP;
  });
  ASSERT_TRUE(stop.has_value());
  watcher.join();
  EXPECT_TRUE(w0.Disconnect().ok());
  EXPECT_TRUE(w1.Disconnect().ok());

  const v1::Job done = Get(job.id());
  EXPECT_EQ(done.state(), v1::JOB_STATE_SUCCEEDED);
  EXPECT_EQ(done.step(), 6);
  ASSERT_FALSE(watched.empty());
  EXPECT_EQ(watched.back().job().state(), v1::JOB_STATE_SUCCEEDED);
  bool saw_active = false;
  for (const auto& r : watched) {
    saw_active |= r.event().message().find("v1 active on all 2 ranks") !=
                  std::string::npos;
  }
  EXPECT_TRUE(saw_active);
}

// The load bench's fake ranks (bench/load/fake_worker.h) through a real
// coordinator: their windows, the simulator's replay of the baseline, are
// validated, aggregated and planned; v1 reaches both ranks, which switch to
// it together at its effective step; the coordinator sees v1 active on
// both, and the job succeeds at its last step.
TEST_F(CoordinatorServerTest, FakeRanks_WindowsPlannedAndScheduleApplied) {
  StartServer(TempDb("fake_ranks.db"));
  v1::JobSpec spec = Spec();
  spec.mutable_train()->set_steps(20);
  const v1::Job submitted = Submit(spec);
  FakeJob job;
  job.id = submitted.id();
  job.spec = submitted.spec();
  ASSERT_TRUE(job.Prepare().ok());
  FakeRank r0(&job, 0, "inc-0"), r1(&job, 1, "inc-1");
  WorkerClient w0(channel_, job.id, "inc-0"), w1(channel_, job.id, "inc-1");
  ASSERT_TRUE(w0.Register(0).ok());
  ASSERT_TRUE(w1.Register(1).ok());
  w0.ConnectAs(&r0);
  w1.ConnectAs(&r1);
  ASSERT_EQ(WaitWhilePending(job.id), v1::JOB_STATE_RUNNING);
  auto is_schedule = [](const v1::CoordinatorMessage& m) {
    return m.has_schedule();
  };
  std::optional<v1::CoordinatorMessage> s0, s1;
  std::map<int, int64_t> switched_at;  // rank -> step
  int windows = 0;
  for (int step = 0; step < 20; ++step) {
    for (auto [rank, worker] : {std::pair{&r0, &w0}, std::pair{&r1, &w1}}) {
      FakeRank::StepReport report = rank->Step();
      EXPECT_EQ(report.model_error, "");
      windows += report.window_last.has_value();
      for (const v1::WorkerMessage& m : report.messages) {
        if (m.has_applied()) switched_at[rank->rank()] = m.applied().step();
        worker->Send(m);
      }
    }
    // Once windows are in, the plan reaches both ranks before they step on
    // (the schedule takes effect kSwitchLeadSteps after the newest step).
    if (windows > 0 && !s1.has_value()) {
      s0 = w0.WaitFor(is_schedule, 200ms);
      s1 = w1.WaitFor(is_schedule, 200ms);
      ASSERT_LT(step, 12) << "no schedule after " << windows / 2 << " windows";
    }
  }
  ASSERT_TRUE(s0.has_value() && s1.has_value());
  const v1::ScheduleUpdate& update = s0->schedule();
  EXPECT_EQ(update.schedule().version(), 1);
  EXPECT_EQ(update.schedule().provenance().reason(), "initial");
  EXPECT_EQ(update.SerializeAsString(), s1->schedule().SerializeAsString());
  EXPECT_EQ(r0.applied_version(), 1);
  EXPECT_EQ(r1.applied_version(), 1);
  ASSERT_EQ(switched_at.size(), 2u);
  EXPECT_EQ(switched_at[0], update.effective_step());
  EXPECT_EQ(switched_at[1], update.effective_step());
  auto stop = w0.WaitFor([](const v1::CoordinatorMessage& m) {
    return m.has_command() && m.command().kind() == v1::Command::KIND_STOP;
  });
  ASSERT_TRUE(stop.has_value());
  const v1::Job done = Get(job.id);
  EXPECT_EQ(done.state(), v1::JOB_STATE_SUCCEEDED);
  EXPECT_EQ(done.step(), 20);
  EXPECT_EQ(done.schedule_version(), 1);
}

TEST_F(CoordinatorServerTest, Restart_SameDb_KeepsJobsSchedulesAndWorkers) {
  const std::string db = TempDb("restart.db");
  StartServer(db);
  const v1::Job job = Submit(Spec());
  const Graph graph = GraphOf(job);
  {
    WorkerClient w0(channel_, job.id(), "inc-0"),
        w1(channel_, job.id(), "inc-1");
    ASSERT_TRUE(w0.Register(0).ok());
    ASSERT_TRUE(w1.Register(1).ok());
    w0.Connect();
    w1.Connect();
    v1::WorkerMessage graph_msg;
    *graph_msg.mutable_graph()->mutable_graph() = ToProto(graph);
    w0.Send(graph_msg);
    w0.Send(ProfileMessage(graph, 0, 0, 1));
    w1.Send(ProfileMessage(graph, 1, 0, 1));
    ASSERT_TRUE(w0.WaitFor(
        [](const v1::CoordinatorMessage& m) { return m.has_schedule(); }));
  }
  server_.reset();  // the coordinator goes away
  StartServer(db);
  EXPECT_EQ(Get(job.id()).state(), v1::JOB_STATE_RUNNING);
  // The same workers come back: re-register with their incarnations, and
  // a worker still on the baseline gets v1 on reconnect.
  WorkerClient w1(channel_, job.id(), "inc-1");
  ASSERT_TRUE(w1.Register(1).ok());
  EXPECT_EQ(w1.rank(), 1);
  w1.Connect(/*version=*/0);
  auto s = w1.WaitFor(
      [](const v1::CoordinatorMessage& m) { return m.has_schedule(); });
  ASSERT_TRUE(s.has_value());
  EXPECT_EQ(s->schedule().schedule().version(), 1);
  // A stranger is refused.
  WorkerClient stranger(channel_, job.id(), "inc-9");
  EXPECT_EQ(stranger.Register(1).error_code(),
            grpc::StatusCode::FAILED_PRECONDITION);
}

TEST_F(CoordinatorServerTest, Session_UnknownWorker_IsRefused) {
  StartServer(TempDb("unknown.db"));
  const v1::Job job = Submit(Spec());
  auto stub = v1::WorkerService::NewStub(channel_);
  grpc::ClientContext ctx;
  auto stream = stub->Session(&ctx);
  v1::WorkerMessage hello;
  hello.mutable_hello()->set_job_id(job.id());
  hello.mutable_hello()->set_rank(0);
  hello.mutable_hello()->set_incarnation("never-registered");
  ASSERT_TRUE(stream->Write(hello));
  stream->WritesDone();
  grpc::Status s = stream->Finish();
  EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_THAT(s.error_message(), HasSubstr("unknown worker"));
}

TEST_F(CoordinatorServerTest, Kv_RendezvousOverGrpc) {
  StartServer(TempDb("kv.db"));
  auto stub = v1::WorkerService::NewStub(channel_);
  std::thread setter([&] {
    std::this_thread::sleep_for(50ms);
    grpc::ClientContext ctx;
    v1::KvSetRequest req;
    req.set_key("jobs/x/addr");
    req.set_value("10.0.0.1:29500");
    v1::KvSetResponse resp;
    EXPECT_TRUE(stub->KvSet(&ctx, req, &resp).ok());
  });
  grpc::ClientContext ctx;
  v1::KvGetRequest req;
  req.set_key("jobs/x/addr");
  req.set_timeout_ms(5000);
  v1::KvGetResponse resp;
  ASSERT_TRUE(stub->KvGet(&ctx, req, &resp).ok());
  setter.join();
  EXPECT_TRUE(resp.found());
  EXPECT_EQ(resp.value(), "10.0.0.1:29500");
}

TEST_F(CoordinatorServerTest, Cancel_TwiceAndUnknown_ClearErrors) {
  StartServer(TempDb("cancel.db"));
  const v1::Job job = Submit(Spec());
  v1::CancelJobRequest req;
  req.set_job_id(job.id());
  v1::CancelJobResponse resp;
  {
    grpc::ClientContext ctx;
    ASSERT_TRUE(jobs_->Cancel(&ctx, req, &resp).ok());
    EXPECT_EQ(resp.job().state(), v1::JOB_STATE_CANCELLED);
  }
  {
    grpc::ClientContext ctx;
    grpc::Status s = jobs_->Cancel(&ctx, req, &resp);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
    EXPECT_THAT(s.error_message(), HasSubstr("already ended CANCELLED"));
  }
  {
    grpc::ClientContext ctx;
    req.set_job_id("nope");
    grpc::Status s = jobs_->Cancel(&ctx, req, &resp);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND);
  }
}

// Stop() lands while the first plan is queued, running or done (the delay
// before it varies), 200 times over: no crash, no hang, the store holds the
// job with no schedule or with v1, and a coordinator restarted on the store
// serves exactly that.
TEST_F(CoordinatorServerTest, Stop_WhilePlanInFlight_StoreConsistentRepeated) {
  constexpr int kRounds = 200;
  int rounds_with_schedule = 0;
  for (int round = 0; round < kRounds; ++round) {
    SCOPED_TRACE(absl::StrCat("round ", round));
    const std::string db = TempDb("stop_while_planning.db");
    StartServer(db);
    // Deep enough that planning takes a few ms, so Stop() often finds the
    // planner busy.
    v1::JobSpec spec = Spec();
    spec.mutable_model()->set_layers(16);
    const v1::Job job = Submit(spec);
    const Graph graph = GraphOf(job);
    {
      WorkerClient w0(channel_, job.id(), "inc-0");
      WorkerClient w1(channel_, job.id(), "inc-1");
      ASSERT_TRUE(w0.Register(0).ok());
      ASSERT_TRUE(w1.Register(1).ok());
      w0.Connect();
      w1.Connect();
      ASSERT_EQ(WaitWhilePending(job.id()), v1::JOB_STATE_RUNNING);
      v1::WorkerMessage graph_msg;
      graph_msg.mutable_graph()->set_graph_hash(graph.StructuralHash());
      w1.Send(graph_msg);
      *graph_msg.mutable_graph()->mutable_graph() = ToProto(graph);
      w0.Send(graph_msg);
      w0.Send(ProfileMessage(graph, 0, 0, 1));
      w1.Send(ProfileMessage(graph, 1, 0, 1));
      w0.HalfClose();
      w1.HalfClose();
      std::this_thread::sleep_for(std::chrono::microseconds(round % 20 * 100));
      // Stop() on its own thread, so that a hang fails the test in time.
      CoordinatorServer* server = server_.get();
      std::future<void> stopped =
          std::async(std::launch::async, [server] { server->Stop(); });
      if (stopped.wait_for(30s) != std::future_status::ready) {
        std::fprintf(stderr, "round %d: Stop() did not return in 30 s\n",
                     round);
        std::abort();
      }
      w0.Finish();
      w1.Finish();
    }
    server_.reset();

    absl::StatusOr<std::unique_ptr<JobStore>> store = JobStore::Open(db);
    ASSERT_TRUE(store.ok()) << store.status();
    absl::StatusOr<std::vector<v1::Job>> stored_jobs = (*store)->LoadJobs();
    ASSERT_TRUE(stored_jobs.ok()) << stored_jobs.status();
    ASSERT_EQ(stored_jobs->size(), 1u);
    EXPECT_EQ((*stored_jobs)[0].id(), job.id());
    EXPECT_EQ((*stored_jobs)[0].state(), v1::JOB_STATE_RUNNING);
    absl::StatusOr<std::vector<StoredSchedule>> schedules =
        (*store)->LoadSchedules(job.id());
    ASSERT_TRUE(schedules.ok()) << schedules.status();
    ASSERT_LE(schedules->size(), 1u);
    if (!schedules->empty()) {
      EXPECT_EQ((*schedules)[0].schedule.version(), 1);
      ++rounds_with_schedule;
    }
    store->reset();

    StartServer(db);
    EXPECT_EQ(Get(job.id()).state(), v1::JOB_STATE_RUNNING);
    grpc::ClientContext ctx;
    v1::GetScheduleRequest req;
    req.set_job_id(job.id());
    v1::GetScheduleResponse resp;
    const grpc::Status got = jobs_->GetSchedule(&ctx, req, &resp);
    if (schedules->empty()) {
      EXPECT_EQ(got.error_code(), grpc::StatusCode::NOT_FOUND);
    } else {
      ASSERT_TRUE(got.ok()) << got.error_message();
      EXPECT_EQ(resp.schedule().version(), 1);
      EXPECT_EQ(resp.schedule().SerializeAsString(),
                (*schedules)[0].schedule.SerializeAsString());
    }
    server_.reset();
    if (HasFatalFailure()) return;
  }
  RecordProperty("rounds_with_schedule", rounds_with_schedule);
  std::printf("%d of %d rounds stopped after v1 was stored\n",
              rounds_with_schedule, kRounds);
}

TEST_F(CoordinatorServerTest, Stop_Twice_SecondReturnsAndServingEnds) {
  StartServer(TempDb("stop_twice.db"));
  server_->Stop();
  server_->Stop();
  server_->Wait();
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + 2s);
  v1::ListJobsRequest req;
  v1::ListJobsResponse resp;
  EXPECT_EQ(jobs_->List(&ctx, req, &resp).error_code(),
            grpc::StatusCode::UNAVAILABLE);
}

}  // namespace
}  // namespace tandem

namespace tandem {
namespace {

TEST(CoordinatorPortTest, Start_PortTaken_FailsNamingTheFlag) {
  CoordinatorOptions first;
  first.listen = "127.0.0.1:0";
  first.db = ":memory:";
  auto a = CoordinatorServer::Start(first);
  ASSERT_TRUE(a.ok()) << a.status();
  CoordinatorOptions second = first;
  second.listen = "127.0.0.1:" + std::to_string((*a)->port());
  auto b = CoordinatorServer::Start(second);
  EXPECT_EQ(b.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(b.status().message()),
              ::testing::HasSubstr("--listen"));
}

}  // namespace
}  // namespace tandem
