// One planner everywhere: the schedule the coordinator publishes for a job's
// graph and profile is the schedule `tandem-plan` prints for the same inputs
// (the binary, run as a user would, with the job's hardware on its flags).
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/ir/proto_convert.h"
#include "common/ir/text_format.h"
#include "common/job/job_spec.h"
#include "common/models/graph_builder.h"
#include "common/sim/simulator.h"
#include "coordinator/planner/planner.h"
#include "coordinator/service/planning_manager.h"

namespace tandem {
namespace {

std::string ReadAll(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// The job both tests plan: a 4-layer llama at world 2.
v1::JobSpec SmallLlamaSpec() {
  v1::JobSpec spec;
  spec.set_name("identity");
  spec.mutable_model()->set_preset("llama");
  spec.mutable_model()->set_layers(4);
  spec.mutable_model()->set_d_model(128);
  spec.mutable_model()->set_heads(4);
  spec.mutable_model()->set_ffn(256);
  spec.mutable_model()->set_vocab(512);
  spec.mutable_batch()->set_micro_batch(2);
  spec.mutable_batch()->set_seq_len(64);
  spec.mutable_train()->set_steps(50);
  spec.mutable_parallel()->set_world_size(2);
  return spec;
}

struct IdentityCase {
  std::string name;
  // optimize.policy, or empty with `passes`.
  std::string policy;
  std::vector<std::string> passes;
  // The budget, as a multiple of the smallest feasible one.
  double budget_factor = 1.5;
};

class PlanIdentityTest : public ::testing::TestWithParam<IdentityCase> {};

TEST_P(PlanIdentityTest, CoordinatorPlan_EqualsTandemPlans) {
  const IdentityCase& c = GetParam();
  const std::string dir =
      absl::StrCat(::testing::TempDir(), "/identity_", getpid(), "_", c.name);
  ASSERT_EQ(std::system(absl::StrCat("mkdir -p ", dir).c_str()), 0);

  v1::JobSpec spec = SmallLlamaSpec();
  spec.mutable_optimize()->set_warmup_steps(2);
  spec.mutable_optimize()->set_policy(c.policy);
  for (const std::string& p : c.passes) spec.mutable_optimize()->add_passes(p);
  spec.mutable_hardware()->set_device_memory_bytes(int64_t{1} << 30);
  ApplyJobSpecDefaults(spec);
  absl::StatusOr<Graph> graph = BuildModelGraph(*ModelConfigFromJobSpec(spec));
  ASSERT_TRUE(graph.ok()) << graph.status();
  HardwareModel probe = HardwareModel::H100(2);
  absl::StatusOr<int64_t> smallest = SmallestFeasibleBudget(*graph, probe);
  ASSERT_TRUE(smallest.ok());
  const int64_t budget = static_cast<int64_t>(*smallest * c.budget_factor);
  spec.mutable_memory()->set_budget_bytes(budget);

  // A profile as two ranks would send it: measured node times (not the
  // estimates), collectives of three sizes, and a peak above the model.
  Profile profile;
  profile.graph_hash = graph->StructuralHash();
  profile.first_iteration = 0;
  profile.last_iteration = 1;
  profile.iteration_s = 0.2;
  profile.peak_bytes = *smallest / 2 + (int64_t{3} << 20);
  for (const Node& n : graph->nodes) {
    profile.nodes.push_back({n.id, 1e-3 * (1 + n.id % 5), 2});
  }
  for (int64_t bytes : {int64_t{1} << 16, int64_t{1} << 20, int64_t{1} << 24}) {
    CollectiveTiming gather;
    gather.kind = CollectiveKind::kAllGather;
    gather.node_id = graph->nodes.front().id;
    gather.bytes = bytes;
    gather.issue_to_done_s = 1e-4 + bytes / 40e6;
    profile.collectives.push_back(gather);
    CollectiveTiming reduce = gather;
    reduce.kind = CollectiveKind::kReduceScatter;
    reduce.issue_to_done_s = 2e-4 + bytes / 30e6;
    profile.collectives.push_back(reduce);
  }

  // The coordinator's path.
  absl::StatusOr<std::unique_ptr<JobStore>> store = JobStore::Open(":memory:");
  ASSERT_TRUE(store.ok());
  JobManager jobs(store->get());
  PlanningManager planning(&jobs, store->get(), nullptr);
  std::vector<v1::ScheduleUpdate> published;
  planning.SetPublisher([&](const std::string&, const v1::ScheduleUpdate& u) {
    published.push_back(u);
  });
  absl::StatusOr<v1::Job> job = jobs.Submit(spec);
  ASSERT_TRUE(job.ok()) << job.status();
  v1::GraphReport report;
  report.set_graph_hash(graph->StructuralHash());
  *report.mutable_graph() = ToProto(*graph);
  ASSERT_TRUE(planning.OnGraph(job->id(), 0, report).ok());
  report.clear_graph();
  ASSERT_TRUE(planning.OnGraph(job->id(), 1, report).ok());
  for (int32_t rank : {0, 1}) {
    Profile p = profile;
    p.rank = rank;
    ASSERT_TRUE(planning.OnProfile(job->id(), rank, ToProto(p)).ok());
  }
  planning.Drain();
  ASSERT_EQ(published.size(), 1u)
      << "no plan published; events: "
      << jobs.Events(job->id(), 0)->back().message();
  absl::StatusOr<Schedule> coordinator = FromProto(published[0].schedule());
  ASSERT_TRUE(coordinator.ok());

  // tandem-plan's path, on the job's hardware: its device memory and
  // budget, 2 ranks on one node (no host reported), the CPU host link.
  {
    std::ofstream(dir + "/graph.txt") << PrintGraph(*graph);
    Profile aggregate = profile;
    aggregate.rank = Profile::kAggregateRank;
    std::ofstream(dir + "/profile.txt") << PrintProfile(aggregate);
  }
  std::string flags =
      c.passes.empty() ? absl::StrCat(" --policy ", c.policy) : " --passes ";
  for (size_t i = 0; i < c.passes.size(); ++i) {
    absl::StrAppend(&flags, i > 0 ? "," : "", c.passes[i]);
  }
  const std::string command = absl::StrCat(
      TANDEM_PLAN_BIN, " --graph ", dir, "/graph.txt --profile ", dir,
      "/profile.txt --hw 'world=2 ranks_per_node=2 host_gbps=",
      kAssumedCpuHostBytesPerS / 1e9, " memory=1GiB' --budget ", budget, flags,
      " --summary --explain --timeline --schedule-out ", dir,
      "/schedule.txt > ", dir, "/out.txt 2>&1");
  ASSERT_EQ(std::system(command.c_str()), 0) << command << "\n"
                                             << ReadAll(dir + "/out.txt");
  absl::StatusOr<Schedule> offline =
      ParseSchedule(ReadAll(dir + "/schedule.txt"));
  ASSERT_TRUE(offline.ok()) << offline.status();

  // What differs by design: the version, why and how fast it was planned.
  for (Schedule* s : {&*coordinator, &*offline}) {
    s->version = 0;
    s->provenance.reason.clear();
    s->provenance.plan_wall_s = 0;
  }
  EXPECT_EQ(PrintSchedule(*coordinator), PrintSchedule(*offline));
  EXPECT_TRUE(*coordinator == *offline);
  // tandem-plan --explain prints the explanation the coordinator stored
  // with its schedule, decision by decision.
  const std::string out = ReadAll(dir + "/out.txt");
  EXPECT_NE(out.find("# explanation\n" +
                     FormatExplanation(coordinator->explanation,
                                       coordinator->prediction.iteration_s,
                                       coordinator->prediction.exposed_comm_s)),
            std::string::npos)
      << out;
  EXPECT_FALSE(coordinator->explanation.empty());
  // Where the predicted peak is: a node of the graph, and a breakdown that
  // adds up to the peak.
  std::smatch at;
  ASSERT_TRUE(std::regex_search(
      out, at, std::regex("peak_at +n([0-9]+) ([^:]+): ([^(]*) \\(B\\)")))
      << out;
  const int node = std::stoi(at[1].str());
  ASSERT_LT(node, static_cast<int>(graph->nodes.size()));
  EXPECT_EQ(at[2].str(), graph->nodes[node].name);
  const std::string parts = at[3].str();
  int64_t sum = 0;
  const std::regex number("[0-9]+");
  for (std::sregex_iterator it(parts.begin(), parts.end(), number);
       it != std::sregex_iterator(); ++it) {
    sum += std::stoll(it->str());
  }
  EXPECT_EQ(sum, coordinator->prediction.peak_bytes) << at[0].str();
  // --timeline: every node once, in order, and every collective the
  // schedule issues.
  int nodes = 0;
  int transfers = 0;
  for (absl::string_view line : absl::StrSplit(out, '\n')) {
    if (absl::StartsWith(line, absl::StrCat("node n", nodes, " "))) ++nodes;
    if (absl::StartsWith(line, "allgather ") ||
        absl::StartsWith(line, "reduce_scatter ")) {
      ++transfers;
    }
  }
  EXPECT_EQ(nodes, static_cast<int>(graph->nodes.size())) << out;
  int issued = 0;
  for (const Action& a : coordinator->actions) {
    issued += a.kind == ActionKind::kAllGather ||
              a.kind == ActionKind::kReduceScatter;
  }
  EXPECT_GE(transfers, issued) << out;
  // The inputs were not trivial: the plan did more than the baseline.
  EXPECT_GT(coordinator->provenance.passes.size(), 1u);
}

INSTANTIATE_TEST_SUITE_P(
    Pipelines, PlanIdentityTest,
    ::testing::Values(IdentityCase{"tandem", "tandem", {}, 1.5},
                      IdentityCase{"tandem_tight", "tandem", {}, 1.05},
                      IdentityCase{"deepcompile", "deepcompile", {}, 3.0},
                      IdentityCase{"own_passes",
                                   "",
                                   {"zero3-insert", "prefetch", "unshard"},
                                   2.0}),
    [](const ::testing::TestParamInfo<IdentityCase>& info) {
      return info.param.name;
    });

// tandem-plan --measured re-fits what transfers take from compute to a
// schedule's measured time exactly as the coordinator does with a live job's
// measurements (CalibrateWithEvidence), and refuses malformed evidence.
// A 4-layer llama at world 2 and a profile of it with collective fits and
// the probe's interference figures, written to DIR/graph.txt and
// DIR/profile.txt.
struct OfflineJob {
  Graph graph;
  Profile profile;
};
OfflineJob WriteOfflineJob(const std::string& dir) {
  EXPECT_EQ(std::system(absl::StrCat("mkdir -p ", dir).c_str()), 0);
  v1::JobSpec spec = SmallLlamaSpec();
  ApplyJobSpecDefaults(spec);
  absl::StatusOr<Graph> graph = BuildModelGraph(*ModelConfigFromJobSpec(spec));
  EXPECT_TRUE(graph.ok()) << graph.status();
  Profile profile;
  profile.graph_hash = graph->StructuralHash();
  profile.rank = Profile::kAggregateRank;
  profile.iteration_s = 0.2;
  for (const Node& n : graph->nodes) {
    profile.nodes.push_back({n.id, 1e-2, 2});
  }
  for (int64_t bytes : {int64_t{1} << 16, int64_t{1} << 20, int64_t{1} << 24}) {
    CollectiveTiming gather;
    gather.kind = CollectiveKind::kAllGather;
    gather.node_id = graph->nodes.front().id;
    gather.bytes = bytes;
    gather.issue_to_done_s = 1e-4 + bytes / 40e6;
    profile.collectives.push_back(gather);
  }
  // The probe's figures: compute seconds per byte moved.
  profile.compute_s_per_allgather_byte = 2e-9;
  profile.compute_s_per_reduce_scatter_byte = 2e-9;
  std::ofstream(dir + "/graph.txt") << PrintGraph(*graph);
  std::ofstream(dir + "/profile.txt") << PrintProfile(profile);
  return {*std::move(graph), std::move(profile)};
}

TEST(TandemPlanMeasuredTest, Measured_RefitsLikeTheCoordinator) {
  const std::string dir =
      absl::StrCat(::testing::TempDir(), "/measured_", getpid());
  OfflineJob offline = WriteOfflineJob(dir);
  const Graph* graph = &offline.graph;
  // A plan that overlaps gathers with compute, where interference matters.
  const std::string plan = absl::StrCat(
      TANDEM_PLAN_BIN, " --graph ", dir, "/graph.txt --profile ", dir,
      "/profile.txt --hw 'world=2 ranks_per_node=2' --summary --schedule-out ",
      dir, "/v1.sched > ", dir, "/plan.txt 2>&1");
  ASSERT_EQ(std::system(plan.c_str()), 0) << ReadAll(dir + "/plan.txt");
  absl::StatusOr<Schedule> start = ParseSchedule(ReadAll(dir + "/v1.sched"));
  ASSERT_TRUE(start.ok()) << start.status();

  auto predicted = [&](const std::string& extra) -> double {
    const std::string command = absl::StrCat(
        TANDEM_PLAN_BIN, " --graph ", dir, "/graph.txt --profile ", dir,
        "/profile.txt --hw 'world=2 ranks_per_node=2' --schedule ", dir,
        "/v1.sched --summary", extra, " > ", dir, "/out.txt 2>&1");
    EXPECT_EQ(std::system(command.c_str()), 0) << command << "\n"
                                               << ReadAll(dir + "/out.txt");
    const std::string out = ReadAll(dir + "/out.txt");
    const size_t at = out.find("iteration_s");
    EXPECT_NE(at, std::string::npos) << out;
    return at == std::string::npos ? 0 : std::atof(out.c_str() + at + 11);
  };
  const double before = predicted("");
  ASSERT_GT(before, 0);
  // Measured 30% slower than predicted: the refit charges transfers more.
  const double measured = 1.3 * before;
  const double after =
      predicted(absl::StrCat(" --measured ", dir, "/v1.sched=", measured));
  EXPECT_GT(after, before * 1.01);
  EXPECT_LT(std::abs(after - measured), std::abs(before - measured));

  // The same evidence through the coordinator's own call.
  Profile parsed = *ParseProfile(ReadAll(dir + "/profile.txt"));
  absl::StatusOr<Calibrated> calibrated =
      CalibrateWithEvidence(*graph, HardwareModel::H100(2), &parsed, nullptr,
                            ShardingMode::kZero3, {{*start, measured}});
  ASSERT_TRUE(calibrated.ok()) << calibrated.status();
  absl::StatusOr<SimResult> sim =
      Simulate(calibrated->graph, *start, calibrated->hw);
  ASSERT_TRUE(sim.ok());
  EXPECT_NEAR(after, sim->iteration_s, 1e-6);

  // Malformed evidence is refused with what to write instead.
  const std::string bad =
      absl::StrCat(TANDEM_PLAN_BIN, " --graph ", dir, "/graph.txt --profile ",
                   dir, "/profile.txt --measured ", dir, "/v1.sched=fast > ",
                   dir, "/bad.txt 2>&1");
  EXPECT_NE(std::system(bad.c_str()), 0);
  EXPECT_THAT(ReadAll(dir + "/bad.txt"),
              ::testing::HasSubstr("is not FILE=SECONDS"));

  // A profile of another graph is refused where it comes in, naming the
  // file and the hash (the planner does not check it again).
  Profile other = offline.profile;
  other.graph_hash = "0123456789abcdef";
  std::ofstream(dir + "/other.txt") << PrintProfile(other);
  const std::string foreign = absl::StrCat(
      TANDEM_PLAN_BIN, " --graph ", dir, "/graph.txt --profile ", dir,
      "/other.txt --hw 'world=2 ranks_per_node=2' --summary > ", dir,
      "/foreign.txt 2>&1");
  EXPECT_NE(std::system(foreign.c_str()), 0);
  EXPECT_THAT(ReadAll(dir + "/foreign.txt"),
              ::testing::HasSubstr("other.txt: profile was measured on graph "
                                   "0123456789abcdef"));
}

// tandem-plan --headroom keeps that much more of the budget free, exactly as
// the coordinator's plan after a memory-guard trip (PlanFromMeasurements
// with extra_headroom_bytes), and refuses a value that is not a size.
TEST(TandemPlanMeasuredTest, Headroom_PlansLikeTheCoordinatorAfterAGuardTrip) {
  const std::string dir =
      absl::StrCat(::testing::TempDir(), "/headroom_", getpid());
  OfflineJob offline = WriteOfflineJob(dir);
  HardwareModel hw = HardwareModel::H100(2);
  hw.ranks_per_node = 2;
  hw.device_memory_bytes = int64_t{1} << 30;
  // A budget between the least-memory plan's peak and the unconstrained
  // plan's, so that headroom changes what fits.
  absl::StatusOr<int64_t> least =
      SmallestFeasibleBudget(offline.graph, hw, ShardingMode::kZero3);
  ASSERT_TRUE(least.ok()) << least.status();
  absl::StatusOr<PlanResult> free_plan =
      PlanFromMeasurements(offline.graph, hw, &offline.profile, nullptr, {});
  ASSERT_TRUE(free_plan.ok()) << free_plan.status();
  ASSERT_GT(free_plan->sim.peak_bytes, *least);
  hw.budget_bytes = (*least + free_plan->sim.peak_bytes) / 2 +
                    (free_plan->sim.peak_bytes - *least) / 4;
  const int64_t extra = (free_plan->sim.peak_bytes - *least) / 3;

  auto offline_plan = [&](const std::string& flags) {
    const std::string command = absl::StrCat(
        TANDEM_PLAN_BIN, " --graph ", dir, "/graph.txt --profile ", dir,
        "/profile.txt --hw 'world=2 ranks_per_node=2 memory=1GiB' --budget ",
        hw.budget_bytes, flags, " --summary --schedule-out ", dir,
        "/planned.sched > ", dir, "/out.txt 2>&1");
    EXPECT_EQ(std::system(command.c_str()), 0) << command << "\n"
                                               << ReadAll(dir + "/out.txt");
    absl::StatusOr<Schedule> s = ParseSchedule(ReadAll(dir + "/planned.sched"));
    EXPECT_TRUE(s.ok()) << s.status();
    return s.ok() ? *s : Schedule{};
  };
  PlanOptions options;
  options.extra_headroom_bytes = extra;
  absl::StatusOr<PlanResult> coordinator = PlanFromMeasurements(
      offline.graph, hw, &offline.profile, nullptr, options);
  ASSERT_TRUE(coordinator.ok()) << coordinator.status();
  Schedule with = offline_plan(absl::StrCat(" --headroom ", extra));
  Schedule without = offline_plan("");
  for (Schedule* s : {&coordinator->schedule, &with, &without}) {
    s->provenance.plan_wall_s = 0;
  }
  EXPECT_EQ(PrintSchedule(with), PrintSchedule(coordinator->schedule));
  // The headroom bound the plan: it peaks lower than the plan without it,
  // within the budget less MemoryHeadroom with the extra.
  EXPECT_LT(with.prediction.peak_bytes, without.prediction.peak_bytes);
  EXPECT_LE(with.prediction.peak_bytes,
            hw.budget_bytes -
                MemoryHeadroom(hw.budget_bytes, &offline.profile, extra));

  const std::string bad = absl::StrCat(
      TANDEM_PLAN_BIN, " --graph ", dir, "/graph.txt --profile ", dir,
      "/profile.txt --headroom lots > ", dir, "/bad.txt 2>&1");
  EXPECT_NE(std::system(bad.c_str()), 0);
  EXPECT_THAT(ReadAll(dir + "/bad.txt"), ::testing::HasSubstr("--headroom"));
}

TEST(GuardHeadroomTest, OvershootPlusSpread) {
  // Peaks 2 MiB over the prediction at most, 5 MiB apart: 7 MiB more kept.
  EXPECT_EQ(GuardHeadroom(70 << 20, 67 << 20, 72 << 20), 7 << 20);
  // Under the prediction: the spread alone.
  EXPECT_EQ(GuardHeadroom(80 << 20, 67 << 20, 72 << 20), 5 << 20);
  // No prediction: the spread alone; one step: nothing.
  EXPECT_EQ(GuardHeadroom(0, 67 << 20, 72 << 20), 5 << 20);
  EXPECT_EQ(GuardHeadroom(70 << 20, 72 << 20, 72 << 20), 2 << 20);
}

}  // namespace
}  // namespace tandem
