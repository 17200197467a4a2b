#include "worker/agent/worker_agent.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/ir/proto_convert.h"
#include "common/job/job_spec.h"
#include "common/models/graph_builder.h"
#include "coordinator/rpc/coordinator_server.h"
#include "worker/agent/grpc_coordinator_client.h"

namespace tandem {
namespace {

using namespace std::chrono_literals;
using ::testing::HasSubstr;

template <typename Pred>
bool WaitUntil(Pred pred, std::chrono::milliseconds timeout = 10s) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    if (pred()) return true;
    std::this_thread::sleep_for(10ms);
  }
  return pred();
}

class WorkerAgentTest : public ::testing::Test {
 protected:
  void StartCoordinator(int port = 0) {
    CoordinatorOptions options;
    options.listen = "127.0.0.1:" + std::to_string(port);
    options.db = db_;
    auto server = CoordinatorServer::Start(options);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
  }
  void SetUp() override {
    db_ = ::testing::TempDir() + "/agent_" +
          ::testing::UnitTest::GetInstance()->current_test_info()->name() +
          ".db";
    for (const char* s : {"", "-wal", "-shm"}) std::remove((db_ + s).c_str());
    StartCoordinator();
    auto jobs = v1::JobService::NewStub(
        grpc::CreateChannel(Address(), grpc::InsecureChannelCredentials()));
    grpc::ClientContext ctx;
    v1::SubmitJobRequest req;
    v1::JobSpec& spec = *req.mutable_spec();
    spec.set_name("agent");
    spec.mutable_model()->set_preset("llama");
    spec.mutable_model()->set_layers(1);
    spec.mutable_model()->set_d_model(32);
    spec.mutable_model()->set_heads(2);
    spec.mutable_model()->set_ffn(64);
    spec.mutable_model()->set_vocab(64);
    spec.mutable_batch()->set_micro_batch(1);
    spec.mutable_batch()->set_seq_len(8);
    spec.mutable_train()->set_steps(4);
    spec.mutable_parallel()->set_world_size(1);
    spec.mutable_optimize()->set_warmup_steps(1);
    v1::SubmitJobResponse resp;
    ASSERT_TRUE(jobs->Submit(&ctx, req, &resp).ok());
    job_ = resp.job();
    graph_ = *BuildModelGraph(*ModelConfigFromJobSpec(job_.spec()));
  }

  std::string Address() const {
    return "127.0.0.1:" + std::to_string(server_->port());
  }
  WorkerAgent::Options AgentOptions() const {
    WorkerAgent::Options o;
    o.job_id = job_.id();
    o.hostname = "test-host";
    o.heartbeat_interval = 50ms;
    o.register_timeout = 5s;
    return o;
  }
  v1::GetJobResponse GetJobAndEvents() {
    auto jobs = v1::JobService::NewStub(
        grpc::CreateChannel(Address(), grpc::InsecureChannelCredentials()));
    grpc::ClientContext ctx;
    v1::GetJobRequest req;
    req.set_job_id(job_.id());
    v1::GetJobResponse resp;
    EXPECT_TRUE(jobs->Get(&ctx, req, &resp).ok());
    return resp;
  }
  v1::Job GetJob() { return GetJobAndEvents().job(); }
  // The job's state once it is `want`, or its last state after a timeout:
  // the coordinator moves a job to running when it has read a session's
  // hello, which can come after the agent's Start() (or reconnect) returns.
  v1::JobState JobStateSoon(v1::JobState want) {
    v1::JobState state = GetJob().state();
    WaitUntil([&] { return (state = GetJob().state()) == want; });
    return state;
  }
  v1::Profile ProfileOf(int64_t first, int64_t last) const {
    Profile p;
    p.graph_hash = graph_.StructuralHash();
    p.first_iteration = first;
    p.last_iteration = last;
    p.iteration_s = 0.01;
    for (const Node& n : graph_.nodes) p.nodes.push_back({n.id, 1e-4, 1});
    return ToProto(p);
  }

  // Sends the graph and one profile window; the plan the coordinator
  // pushes back (nullopt when none came within 10 s).
  std::optional<v1::ScheduleUpdate> FirstPlan(WorkerAgent& agent) {
    v1::GraphReport report;
    report.set_graph_hash(graph_.StructuralHash());
    *report.mutable_graph() = ToProto(graph_);
    agent.ReportGraph(report);
    v1::WorkerMessage profile;
    *profile.mutable_profile() = ProfileOf(0, 0);
    agent.Send(profile);
    std::optional<v1::ScheduleUpdate> update;
    WaitUntil([&] { return (update = agent.TakeSchedule()).has_value(); });
    return update;
  }

  std::string db_;
  std::unique_ptr<CoordinatorServer> server_;
  v1::Job job_;
  Graph graph_;
};

TEST_F(WorkerAgentTest, FullLoop_ScheduleArrivesAndJobSucceeds) {
  GrpcCoordinatorClient client(Address());
  WorkerAgent agent(&client, AgentOptions());
  auto reg = agent.Register();
  ASSERT_TRUE(reg.ok()) << reg.status();
  EXPECT_EQ(reg->rank(), 0);
  EXPECT_EQ(reg->spec().name(), "agent");
  ASSERT_TRUE(agent.Start().ok());
  EXPECT_EQ(agent.state(), WorkerAgent::State::kConnected);
  EXPECT_EQ(JobStateSoon(v1::JOB_STATE_RUNNING), v1::JOB_STATE_RUNNING);

  std::optional<v1::ScheduleUpdate> update = FirstPlan(agent);
  ASSERT_TRUE(update.has_value());
  EXPECT_EQ(update->schedule().version(), 1);
  agent.ReportApplied(1, update->effective_step());
  for (int step = 1; step <= 4; ++step) {
    v1::IterationProgress p;
    p.set_step(step);
    p.set_loss(4.0);
    p.set_iteration_s(0.01);
    p.set_schedule_version(1);
    agent.ReportProgress(p);
  }
  ASSERT_TRUE(WaitUntil([&] { return agent.StopReason().has_value(); }));
  EXPECT_THAT(*agent.StopReason(), HasSubstr("SUCCEEDED"));
  EXPECT_EQ(agent.state(), WorkerAgent::State::kStopped);
  EXPECT_EQ(GetJob().state(), v1::JOB_STATE_SUCCEEDED);
}

TEST_F(WorkerAgentTest, CoordinatorRestart_AgentReconnects) {
  GrpcCoordinatorClient client(Address());
  WorkerAgent agent(&client, AgentOptions());
  ASSERT_TRUE(agent.Register().ok());
  ASSERT_TRUE(agent.Start().ok());
  const int port = server_->port();
  server_.reset();
  ASSERT_TRUE(WaitUntil(
      [&] { return agent.state() == WorkerAgent::State::kDisconnected; }));
  // Training goes on: reports while away are dropped, not errors.
  v1::IterationProgress p;
  p.set_step(1);
  agent.ReportProgress(p);
  StartCoordinator(port);
  ASSERT_TRUE(WaitUntil(
      [&] { return agent.state() == WorkerAgent::State::kConnected; }, 15s));
  EXPECT_EQ(JobStateSoon(v1::JOB_STATE_RUNNING), v1::JOB_STATE_RUNNING);
}

// Reports made while the coordinator was away (a schedule applied, the
// newest step) reach it once the session is back: the push is recorded
// active and the job's step is current.
TEST_F(WorkerAgentTest, CoordinatorRestart_ReportsWhileAwayAreResent) {
  GrpcCoordinatorClient client(Address());
  WorkerAgent agent(&client, AgentOptions());
  ASSERT_TRUE(agent.Register().ok());
  ASSERT_TRUE(agent.Start().ok());
  std::optional<v1::ScheduleUpdate> update = FirstPlan(agent);
  ASSERT_TRUE(update.has_value());
  const int port = server_->port();
  server_.reset();
  ASSERT_TRUE(WaitUntil(
      [&] { return agent.state() == WorkerAgent::State::kDisconnected; }));
  agent.ReportApplied(update->schedule().version(), 2);
  v1::IterationProgress p;
  p.set_step(3);
  p.set_schedule_version(update->schedule().version());
  agent.ReportProgress(p);
  StartCoordinator(port);
  const std::string active =
      absl::StrCat("v", update->schedule().version(), " active on all 1 ranks");
  ASSERT_TRUE(WaitUntil(
      [&] {
        v1::GetJobResponse r = GetJobAndEvents();
        bool recorded = false;
        for (const v1::JobEvent& e : r.events()) {
          recorded = recorded || e.message().find(active) != std::string::npos;
        }
        return recorded && r.job().step() == 3;
      },
      15s));
  EXPECT_EQ(GetJob().active_version(), update->schedule().version());
}

TEST_F(WorkerAgentTest, Cancel_StopsTheAgent) {
  GrpcCoordinatorClient client(Address());
  WorkerAgent agent(&client, AgentOptions());
  ASSERT_TRUE(agent.Register().ok());
  ASSERT_TRUE(agent.Start().ok());
  auto jobs = v1::JobService::NewStub(
      grpc::CreateChannel(Address(), grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  v1::CancelJobRequest req;
  req.set_job_id(job_.id());
  req.set_reason("test says stop");
  v1::CancelJobResponse resp;
  ASSERT_TRUE(jobs->Cancel(&ctx, req, &resp).ok());
  ASSERT_TRUE(WaitUntil([&] { return agent.StopReason().has_value(); }));
  // Whether the stop reached the open session or the session opened after
  // the job ended, the reason names the state and the user's words.
  EXPECT_THAT(*agent.StopReason(), HasSubstr("CANCELLED"));
  EXPECT_THAT(*agent.StopReason(), HasSubstr("test says stop"));
}

TEST_F(WorkerAgentTest, Register_UnknownJob_FailsWithoutRetrying) {
  GrpcCoordinatorClient client(Address());
  WorkerAgent::Options o = AgentOptions();
  o.job_id = "no-such-job";
  WorkerAgent agent(&client, o);
  const auto start = std::chrono::steady_clock::now();
  auto reg = agent.Register();
  EXPECT_EQ(reg.status().code(), absl::StatusCode::kNotFound);
  EXPECT_LT(std::chrono::steady_clock::now() - start, 2s);
}

TEST_F(WorkerAgentTest, Register_Unreachable_NamesTheAddress) {
  GrpcCoordinatorClient client("127.0.0.1:1", {}, 200ms);
  WorkerAgent::Options o = AgentOptions();
  o.register_timeout = 500ms;
  WorkerAgent agent(&client, o);
  auto reg = agent.Register();
  EXPECT_EQ(reg.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(reg.status().message()),
              HasSubstr("coordinator at 127.0.0.1:1 is unreachable"));
}

}  // namespace
}  // namespace tandem
