// The agent trainer driven by an in-process fake coordinator: a tiny model at
// world 1 on the CPU (Gloo over the fake's key-value store), a schedule
// pushed when the graph arrives, the job ended after the last step.
#include "worker/trainer/agent_trainer.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_split.h"
#include "common/ir/proto_convert.h"
#include "common/job/job_spec.h"
#include "tests/unit/worker/agent/fake_coordinator_client.h"
#include "worker/runtime/standard_schedules.h"
#include "worker/trainer/coordinator_store.h"
#include "worker/trainer/training_job.h"

namespace tandem {
namespace {

using ::testing::HasSubstr;

constexpr int kSteps = 5;
// The pushed schedule takes effect at this step.
constexpr int kSwitchStep = 3;

v1::JobSpec TinySpec(int world) {
  v1::JobSpec spec;
  spec.set_name("agent-trainer");
  spec.mutable_model()->set_preset("llama");
  spec.mutable_model()->set_layers(1);
  spec.mutable_model()->set_d_model(32);
  spec.mutable_model()->set_heads(2);
  spec.mutable_model()->set_ffn(64);
  spec.mutable_model()->set_vocab(64);
  spec.mutable_batch()->set_micro_batch(1);
  spec.mutable_batch()->set_seq_len(8);
  spec.mutable_train()->set_steps(kSteps);
  spec.mutable_parallel()->set_world_size(world);
  spec.mutable_optimize()->set_warmup_steps(1);
  ApplyJobSpecDefaults(spec);
  return spec;
}

v1::RegisterResponse Registration(int world) {
  v1::RegisterResponse r;
  r.set_rank(0);
  r.set_world_size(world);
  r.set_incarnation("test");
  *r.mutable_spec() = TinySpec(world);
  r.set_store_prefix("job-1/");
  return r;
}

AgentTrainerOptions Options() {
  AgentTrainerOptions o;
  o.job_id = "job-1";
  o.hostname = "test-host";
  o.threads = 1;
  o.heartbeat_interval = std::chrono::milliseconds(50);
  return o;
}

std::vector<v1::WorkerMessage> OfKind(const std::vector<v1::WorkerMessage>& all,
                                      v1::WorkerMessage::PayloadCase kind) {
  std::vector<v1::WorkerMessage> out;
  for (const v1::WorkerMessage& m : all) {
    if (m.payload_case() == kind) out.push_back(m);
  }
  return out;
}

v1::CoordinatorMessage Stop(const std::string& reason) {
  v1::CoordinatorMessage m;
  m.mutable_command()->set_kind(v1::Command::KIND_STOP);
  m.mutable_command()->set_reason(reason);
  return m;
}

TEST(AgentTrainerTest, RunAgent_WorldOne_TrainsSwitchesAndReportsEveryStep) {
  FakeCoordinatorClient client(Registration(1));
  // The coordinator's part: plan v1 (everything persistent) from the graph
  // rank 0 reports, and end the job once the last step's progress arrives.
  client.set_on_send([&](const v1::WorkerMessage& m) {
    if (m.has_graph() && m.graph().has_graph()) {
      absl::StatusOr<Graph> graph = FromProto(m.graph().graph());
      ASSERT_TRUE(graph.ok()) << graph.status();
      absl::StatusOr<Schedule> v1 = AllPersistentSchedule(*graph, 1);
      ASSERT_TRUE(v1.ok()) << v1.status();
      v1::CoordinatorMessage update;
      *update.mutable_schedule()->mutable_schedule() = ToProto(*v1);
      update.mutable_schedule()->set_effective_step(kSwitchStep);
      client.Push(update);
    }
    if (m.has_progress() && m.progress().step() == kSteps) {
      client.Push(Stop("job SUCCEEDED"));
    }
  });
  std::ostringstream out;

  const absl::Status status = RunAgent(client, Options(), out);

  ASSERT_TRUE(status.ok()) << status;
  const std::vector<v1::RegisterRequest> registered =
      client.register_requests();
  ASSERT_EQ(registered.size(), 1u);
  EXPECT_EQ(registered[0].job_id(), "job-1");
  EXPECT_EQ(registered[0].device(), "cpu");
  // The host's available memory, for budget 0 (the coordinator shares it
  // among the ranks on this host).
  EXPECT_GT(registered[0].device_memory_bytes(), int64_t{1} << 20);
  EXPECT_EQ(registered[0].requested_rank(), -1);
  ASSERT_EQ(client.hellos().size(), 1u);
  EXPECT_EQ(client.hellos()[0].hello().rank(), 0);

  const std::vector<v1::WorkerMessage> sent = client.sent();
  // Rank 0 reports the whole graph once, with the model's structural hash.
  const std::vector<v1::WorkerMessage> graphs =
      OfKind(sent, v1::WorkerMessage::kGraph);
  ASSERT_EQ(graphs.size(), 1u);
  absl::StatusOr<ModelParts> model = PrepareModel(TinySpec(1), 1);
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_EQ(graphs[0].graph().graph_hash(), model->graph.StructuralHash());
  EXPECT_EQ(graphs[0].graph().graph().nodes_size(),
            static_cast<int>(model->graph.nodes.size()));

  // One progress report per step, in order, on the schedule of that step.
  const std::vector<v1::WorkerMessage> progress =
      OfKind(sent, v1::WorkerMessage::kProgress);
  ASSERT_EQ(progress.size(), static_cast<size_t>(kSteps));
  for (int i = 0; i < kSteps; ++i) {
    const v1::IterationProgress& p = progress[i].progress();
    EXPECT_EQ(p.step(), i + 1);
    EXPECT_TRUE(std::isfinite(p.loss()) && p.loss() > 0) << p.loss();
    EXPECT_GT(p.peak_bytes(), 0);
    EXPECT_EQ(p.schedule_version(), i < kSwitchStep ? 0 : 1) << "step " << i;
  }
  // The switch is reported once, at the step it took effect.
  const std::vector<v1::WorkerMessage> applied =
      OfKind(sent, v1::WorkerMessage::kApplied);
  ASSERT_EQ(applied.size(), 1u);
  EXPECT_EQ(applied[0].applied().version(), 1);
  EXPECT_EQ(applied[0].applied().step(), kSwitchStep);
  // Profile windows of one step (warmup_steps 1), a timeline with them:
  // step 2's. Steps 0 and 1 (the process's first, kUnprofiledProcessSteps)
  // and step 3 (the switch, v1's first) pay one-time costs and are not
  // profiled; the last window's
  // profile would follow the last progress report, which ends the job: the
  // agent drops it once stopped.
  const std::vector<v1::WorkerMessage> profiles =
      OfKind(sent, v1::WorkerMessage::kProfile);
  ASSERT_EQ(profiles.size(), 1u);
  EXPECT_EQ(profiles[0].profile().first_iteration(), 2);
  EXPECT_EQ(profiles[0].profile().last_iteration(), 2);
  EXPECT_EQ(profiles[0].profile().schedule_version(), 0);
  // Every step holds the same work (fixed shapes): the profile says so too.
  EXPECT_GT(progress[0].progress().work(), 0);
  for (const v1::WorkerMessage& m : progress) {
    EXPECT_EQ(m.progress().work(), progress[0].progress().work());
  }
  EXPECT_EQ(profiles[0].profile().work(),
            static_cast<double>(progress[0].progress().work()));
  EXPECT_FALSE(OfKind(sent, v1::WorkerMessage::kTimeline).empty());
  EXPECT_TRUE(OfKind(sent, v1::WorkerMessage::kError).empty());

  // stdout: one JSON line per step, then the final param digests.
  const std::vector<std::string> lines =
      absl::StrSplit(out.str(), '\n', absl::SkipEmpty());
  ASSERT_EQ(lines.size(), static_cast<size_t>(kSteps + 1));
  EXPECT_THAT(lines[0], HasSubstr("\"step\":0"));
  EXPECT_THAT(lines[kSteps],
              HasSubstr("{\"param_digests\":{\"embed.weight\":"));
  EXPECT_THAT(lines[kSteps], HasSubstr("\"steps\":5,\"rank\":0"));
}

TEST(AgentTrainerTest, RunAgent_CoordinatorStopsJob_FailedPreconditionNoSteps) {
  FakeCoordinatorClient client(Registration(1));
  client.set_on_send([&](const v1::WorkerMessage& m) {
    if (m.has_graph()) client.Push(Stop("CANCELLED: test says stop"));
  });
  std::ostringstream out;

  const absl::Status status = RunAgent(client, Options(), out);

  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(status.message()),
              HasSubstr("CANCELLED: test says stop"));
  EXPECT_TRUE(OfKind(client.sent(), v1::WorkerMessage::kProgress).empty());
  EXPECT_EQ(out.str(), "");
}

// No rendezvous before the job's start key is set (every rank registered,
// coordinator/README.md "Elastic restarts"); the wait rides out a
// coordinator restart, and a stop ends it.
TEST(AgentTrainerTest, RunAgent_WaitsForTheStartKey) {
  v1::RegisterResponse registration = Registration(1);
  registration.set_start_key("job-1/tandem/started");
  FakeCoordinatorClient client(registration);
  client.FailKvGets(3);
  client.set_on_send([&](const v1::WorkerMessage& m) {
    if (m.has_progress() && m.progress().step() == kSteps) {
      client.Push(Stop("job SUCCEEDED"));
    }
  });
  std::ostringstream out;
  absl::Status status;
  std::thread agent([&] { status = RunAgent(client, Options(), out); });
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  EXPECT_TRUE(OfKind(client.sent(), v1::WorkerMessage::kProgress).empty());
  ASSERT_TRUE(client.KvSet("job-1/tandem/started", "1").ok());
  agent.join();
  ASSERT_TRUE(status.ok()) << status;
  EXPECT_EQ(OfKind(client.sent(), v1::WorkerMessage::kProgress).size(),
            static_cast<size_t>(kSteps));

  FakeCoordinatorClient stopped(registration);
  std::thread stopper([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    stopped.Push(Stop("CANCELLED: while waiting for its peers"));
  });
  const absl::Status waited = RunAgent(stopped, Options(), out);
  stopper.join();
  EXPECT_EQ(waited.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(waited.message()), HasSubstr("while waiting"));
}

// The rendezvous store's wait (Gloo's rendezvous uses it) rides out a
// coordinator restart instead of failing the rank at once.
TEST(AgentTrainerTest, CoordinatorStore_WaitRetriesWhileTheCoordinatorIsAway) {
  FakeCoordinatorClient client(Registration(1));
  CoordinatorStore store(&client, "job-1/", std::chrono::seconds(20));
  client.FailKvGets(5);
  std::thread setter([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    ASSERT_TRUE(client.KvSet("job-1/0/1", "addr").ok());
  });
  EXPECT_NO_THROW(store.wait({"0/1"}));
  setter.join();
  // Past the timeout it still says so.
  CoordinatorStore quick(&client, "job-1/", std::chrono::milliseconds(300));
  try {
    quick.wait({"never"});
    ADD_FAILURE() << "wait returned";
  } catch (const c10::Error& e) {
    EXPECT_THAT(e.what_without_backtrace(),
                HasSubstr("timed out after 300 ms waiting for key 'never'"));
  }
}

TEST(AgentTrainerTest, RunAgent_JobOfAnotherWorldSize_InvalidArgumentReported) {
  FakeCoordinatorClient client(Registration(2));
  AgentTrainerOptions options = Options();
  options.expected_world = 1;
  std::ostringstream out;

  const absl::Status status = RunAgent(client, options, out);

  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(status.message()), HasSubstr("world_size 2"));
  const std::vector<v1::WorkerMessage> errors =
      OfKind(client.sent(), v1::WorkerMessage::kError);
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_TRUE(errors[0].error().fatal());
  EXPECT_THAT(errors[0].error().message(), HasSubstr("world_size 2"));
}

TEST(AgentTrainerTest, RunAgent_BackendNotForDevice_FailsBeforeRegistering) {
  FakeCoordinatorClient client(Registration(1));
  AgentTrainerOptions options = Options();
  options.runtime.backend = CollectiveBackend::kNccl;  // on the CPU
  std::ostringstream out;

  const absl::Status status = RunAgent(client, options, out);

  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(status.message()), HasSubstr("nccl"));
  EXPECT_TRUE(client.register_requests().empty());
}

}  // namespace
}  // namespace tandem
