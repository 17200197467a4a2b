// The planner's entry points: policy names, profiles, collective fits, and
// Plan() for every policy, including the infeasible-budget error.
#include "coordinator/planner/planner.h"

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/bytes.h"
#include "common/ir/text_format.h"
#include "common/ir/validate.h"
#include "common/lowering/schedule_semantics.h"
#include "common/models/graph_builder.h"
#include "common/models/model_config.h"
#include "coordinator/planner/job_plan.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tandem {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::string ReadTestData(const std::string& name) {
  const std::string path = std::string(TANDEM_TESTDATA_DIR) + "/" + name;
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << "cannot read " << path;
  std::stringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

Graph TinyGraph() {
  absl::StatusOr<Graph> graph = ParseGraph(ReadTestData("tiny_graph.txt"));
  EXPECT_TRUE(graph.ok()) << graph.status();
  return *graph;
}

Profile TinyProfile() {
  absl::StatusOr<Profile> profile =
      ParseProfile(ReadTestData("tiny_profile.txt"));
  EXPECT_TRUE(profile.ok()) << profile.status();
  return *profile;
}

Graph TinyLlama(int world) {
  absl::StatusOr<ModelConfig> config =
      ParseModelConfig("preset=tiny-llama world=" + std::to_string(world) +
                       " checkpointing=true");
  EXPECT_TRUE(config.ok()) << config.status();
  absl::StatusOr<Graph> graph = BuildModelGraph(*config);
  EXPECT_TRUE(graph.ok()) << graph.status();
  return *graph;
}

class RecordingSink : public PassRecordSink {
 public:
  void Record(const PassRecord& record) override {
    passes.push_back(record.pass);
  }
  std::vector<std::string> passes;
};

TEST(PolicyNameTest, EveryPolicy_RoundTripsThroughParsePolicy) {
  std::vector<std::string> names;
  for (Policy policy : AllPolicies()) {
    names.emplace_back(PolicyName(policy));
    EXPECT_EQ(ParsePolicy(PolicyName(policy)), policy);
  }
  EXPECT_THAT(names, ElementsAre("on-demand", "deepspeed-zero3", "fsdp",
                                 "deepcompile", "tandem"));
}

TEST(ParsePolicyTest, UnknownName_ReturnsNullopt) {
  EXPECT_EQ(ParsePolicy("zero3"), std::nullopt);
  EXPECT_EQ(ParsePolicy(""), std::nullopt);
  EXPECT_EQ(ParsePolicy("Tandem"), std::nullopt);
}

TEST(ApplyProfileTest, TinyProfile_ReplacesMeasuredTimesOnly) {
  const Graph graph = TinyGraph();
  absl::StatusOr<Graph> profiled = ApplyProfile(graph, TinyProfile());
  ASSERT_TRUE(profiled.ok()) << profiled.status();
  EXPECT_DOUBLE_EQ(profiled->nodes[0].time_s, 0.21e-3);
  EXPECT_DOUBLE_EQ(profiled->nodes[3].time_s, 1.6e-3);
  EXPECT_DOUBLE_EQ(profiled->nodes[7].time_s, 410e-6);
  // Everything but the times is the graph's.
  EXPECT_EQ(profiled->StructuralHash(), graph.StructuralHash());
  EXPECT_EQ(profiled->nodes[1].activation_bytes,
            graph.nodes[1].activation_bytes);
}

TEST(ApplyProfileTest, UncoveredNode_KeepsItsEstimate) {
  const Graph graph = TinyGraph();
  Profile profile = TinyProfile();
  profile.nodes.erase(profile.nodes.begin() + 2);  // n2
  absl::StatusOr<Graph> profiled = ApplyProfile(graph, profile);
  ASSERT_TRUE(profiled.ok()) << profiled.status();
  EXPECT_DOUBLE_EQ(profiled->nodes[2].time_s, graph.nodes[2].time_s);
}

TEST(ApplyProfileTest, InterferenceTakenOutOfMeasuredTimes) {
  const Graph graph = TinyGraph();
  Profile profile = TinyProfile();
  profile.compute_s_per_allgather_byte = 1e-9;
  profile.compute_s_per_reduce_scatter_byte = 2e-9;
  profile.compute_s_per_copy_byte = 0.5e-9;
  ASSERT_FALSE(profile.nodes.empty());
  NodeTiming& t = profile.nodes[0];
  t.time_s = 0.01;
  // 1 MB gathered, 1 MB reduced and 2 MB copied alongside: 1 + 2 + 1 ms.
  t.allgather_overlap_bytes = 1000000;
  t.reduce_scatter_overlap_bytes = 1000000;
  t.copy_overlap_bytes = 2000000;
  absl::StatusOr<Graph> timed = ApplyProfile(graph, profile);
  ASSERT_TRUE(timed.ok()) << timed.status();
  const GraphIndex index(*timed);
  EXPECT_NEAR(timed->nodes[index.NodePos(t.node_id)].time_s, 0.006, 1e-12);
  // Never more than 90% of a measured time.
  t.copy_overlap_bytes = 1000000000;
  timed = ApplyProfile(graph, profile);
  ASSERT_TRUE(timed.ok()) << timed.status();
  EXPECT_NEAR(timed->nodes[index.NodePos(t.node_id)].time_s, 0.001, 1e-12);
}

// tiny-llama on two ranks at 2 Gbit/s with CPU-like node times (so that
// hidden transfers slow compute, which bounds the iteration), and what the
// starting schedule and a plan measure on a machine `real`.
class CalibrateWithEvidenceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<ModelConfig> config =
        ParseModelConfig("preset=tiny-llama world=2");
    ASSERT_TRUE(config.ok()) << config.status();
    absl::StatusOr<Graph> graph = BuildModelGraph(*config);
    ASSERT_TRUE(graph.ok()) << graph.status();
    for (Node& n : graph->nodes) n.time_s *= 1000;
    graph_ = *std::move(graph);
    absl::StatusOr<HardwareModel> hw =
        ParseHardwareModel("world=2 intra_gbps=2 inter_gbps=2");
    ASSERT_TRUE(hw.ok()) << hw.status();
    hw_ = *std::move(hw);
  }

  // The starting schedule and `plan`, each at its simulated time on `real`.
  void Measure(const Schedule& plan, const HardwareModel& real,
               std::vector<std::pair<Schedule, double>>& measured) {
    absl::StatusOr<Schedule> baseline =
        StartingSchedule(graph_, ShardingMode::kZero3);
    ASSERT_TRUE(baseline.ok()) << baseline.status();
    const Schedule& start = *baseline;
    for (const Schedule* s : {&start, &plan}) {
      absl::StatusOr<SimResult> sim = Simulate(graph_, *s, real);
      ASSERT_TRUE(sim.ok()) << sim.status();
      measured.emplace_back(*s, sim->iteration_s);
    }
  }

  Graph graph_;
  HardwareModel hw_;
};

// A job whose transfers really cost twice what the probe measured: the
// schedules it ran measured accordingly, and the refit finds the factor, so
// the plan is priced with what the machine does.
TEST_F(CalibrateWithEvidenceTest, MeasuredSchedules_RefitInterferenceScale) {
  Profile profile;
  profile.graph_hash = graph_.StructuralHash();
  profile.compute_s_per_allgather_byte = 1e-10;
  profile.compute_s_per_reduce_scatter_byte = 1e-10;

  PlanOptions options;
  options.policy = Policy::kDeepCompile;
  absl::StatusOr<PlanResult> prefetching =
      PlanFromMeasurements(graph_, hw_, &profile, nullptr, options);
  ASSERT_TRUE(prefetching.ok()) << prefetching.status();

  // What the machine does: twice the probe's cost per byte.
  HardwareModel real = prefetching->hw;
  real.compute_s_per_allgather_byte = 2e-10;
  real.compute_s_per_reduce_scatter_byte = 2e-10;
  std::vector<std::pair<Schedule, double>> measured;
  ASSERT_NO_FATAL_FAILURE(Measure(prefetching->schedule, real, measured));
  ASSERT_GT(prefetching->sim.interference_s, 0);
  ASSERT_GT(prefetching->sim.compute_s, prefetching->sim.comm_s)
      << "compute must bound the iteration for interference to show";

  InterferenceRefit refit;
  absl::StatusOr<Calibrated> calibrated = CalibrateWithEvidence(
      graph_, hw_, &profile, nullptr, ShardingMode::kZero3, measured, &refit);
  ASSERT_TRUE(calibrated.ok()) << calibrated.status();
  EXPECT_NEAR(refit.scale, 2.0, 0.02);
  EXPECT_LT(refit.error, 1e-4);
  EXPECT_GT(refit.probe_error, refit.error);
  EXPECT_NEAR(calibrated->hw.compute_s_per_allgather_byte, 2e-10, 2e-12);

  // No evidence: the probe's figures as they are.
  calibrated = CalibrateWithEvidence(graph_, hw_, &profile, nullptr,
                                     ShardingMode::kZero3, {}, &refit);
  ASSERT_TRUE(calibrated.ok()) << calibrated.status();
  EXPECT_DOUBLE_EQ(calibrated->hw.compute_s_per_allgather_byte, 1e-10);
}

// The other way round: the probe over-read the contention both ways (what
// transfers take from compute and how much compute stretches them). The
// refit scales both by one k, so a machine with half the probe's contention
// is found at k = 0.5, stretches included.
TEST_F(CalibrateWithEvidenceTest, MeasuredSchedules_RefitScalesStretchToo) {
  Profile profile;
  profile.graph_hash = graph_.StructuralHash();
  profile.compute_s_per_allgather_byte = 4e-9;
  profile.compute_s_per_reduce_scatter_byte = 4e-9;
  profile.allgather_stretch = 3;
  profile.reduce_scatter_stretch = 3;

  PlanOptions options;
  options.policy = Policy::kDeepCompile;
  absl::StatusOr<PlanResult> prefetching =
      PlanFromMeasurements(graph_, hw_, &profile, nullptr, options);
  ASSERT_TRUE(prefetching.ok()) << prefetching.status();
  EXPECT_DOUBLE_EQ(prefetching->hw.allgather_stretch, 3);

  // What the machine does: half the probe's contention, both ways.
  HardwareModel real = prefetching->hw;
  real.compute_s_per_allgather_byte = 2e-9;
  real.compute_s_per_reduce_scatter_byte = 2e-9;
  real.allgather_stretch = 2;
  real.reduce_scatter_stretch = 2;
  std::vector<std::pair<Schedule, double>> measured;
  ASSERT_NO_FATAL_FAILURE(Measure(prefetching->schedule, real, measured));
  absl::StatusOr<SimResult> probed =
      Simulate(graph_, prefetching->schedule, prefetching->hw);
  ASSERT_TRUE(probed.ok()) << probed.status();
  ASSERT_GT(probed->iteration_s, measured.back().second * 1.01)
      << "the probe's contention must price the plan slower than it runs: "
      << probed->iteration_s;

  InterferenceRefit refit;
  absl::StatusOr<Calibrated> calibrated = CalibrateWithEvidence(
      graph_, hw_, &profile, nullptr, ShardingMode::kZero3, measured, &refit);
  ASSERT_TRUE(calibrated.ok()) << calibrated.status();
  EXPECT_NEAR(refit.scale, 0.5, 0.02);
  EXPECT_LT(refit.error, 1e-4);
  EXPECT_GT(refit.probe_error, refit.error);
  EXPECT_NEAR(calibrated->hw.allgather_stretch, 2, 0.02);
  EXPECT_NEAR(calibrated->hw.reduce_scatter_stretch, 2, 0.02);
  EXPECT_NEAR(calibrated->hw.compute_s_per_allgather_byte, 2e-9, 4e-11);
}

TEST(FitCollectivesTest, TinyProfile_FitsBothKindsThroughTheSamples) {
  HardwareModel hw = HardwareModel::H100(2);
  ASSERT_TRUE(FitCollectives(TinyProfile(), hw).ok());
  ASSERT_FALSE(hw.allgather_fit.empty());
  ASSERT_FALSE(hw.reduce_scatter_fit.empty());
  // All-gathers: (16640 B, 0.1 ms) twice and (250 KiB, 0.3 ms).
  EXPECT_NEAR(hw.AllGatherSeconds(16640), 0.1e-3, 1e-12);
  EXPECT_NEAR(hw.AllGatherSeconds(250 << 10), 0.3e-3, 1e-12);
  // Reduce-scatters: (16640 B, 0.1 ms) and (250 KiB, 0.35 / 0.3 ms).
  EXPECT_NEAR(hw.ReduceScatterSeconds(250 << 10), 0.325e-3, 1e-12);
}

// A collective that ran under compute ran stretched: the fit is of its time
// alone, the part of its run compute ran alongside taken at 1/stretch.
TEST(FitCollectivesTest, RunsUnderCompute_FittedAtTheirTimeAlone) {
  Profile profile = TinyProfile();
  for (CollectiveTiming& c : profile.collectives) {
    const double run = c.run_s > 0 ? c.run_s : c.issue_to_done_s;
    if (c.kind == CollectiveKind::kAllGather) {
      c.computing_s = run;  // under compute throughout
    } else {
      c.computing_s = run / 2;
    }
  }
  HardwareModel unstretched = HardwareModel::H100(2);
  ASSERT_TRUE(FitCollectives(profile, unstretched).ok());
  // No stretch measured: the runs are the times alone.
  EXPECT_NEAR(unstretched.AllGatherSeconds(16640), 0.1e-3, 1e-12);

  profile.allgather_stretch = 2;
  profile.reduce_scatter_stretch = 4;
  HardwareModel hw = HardwareModel::H100(2);
  ASSERT_TRUE(FitCollectives(profile, hw).ok());
  EXPECT_NEAR(hw.AllGatherSeconds(16640), 0.05e-3, 1e-12);
  EXPECT_NEAR(hw.AllGatherSeconds(250 << 10), 0.15e-3, 1e-12);
  // Half of each run under compute at a quarter rate: 1/2 + 1/8 of it.
  EXPECT_NEAR(hw.ReduceScatterSeconds(250 << 10), 0.325e-3 * 0.625, 1e-12);
  // And the model carries the stretches.
  const Graph graph = TinyGraph();
  absl::StatusOr<Calibrated> calibrated = CalibrateToMeasurements(
      graph, HardwareModel::H100(2), &profile, nullptr, ShardingMode::kZero3);
  ASSERT_TRUE(calibrated.ok()) << calibrated.status();
  EXPECT_DOUBLE_EQ(calibrated->hw.allgather_stretch, 2);
  EXPECT_DOUBLE_EQ(calibrated->hw.reduce_scatter_stretch, 4);
  EXPECT_DOUBLE_EQ(calibrated->hw.copy_stretch, 1);
}

TEST(FitCollectivesTest, NoCollectives_KeepsTheAnalyticModel) {
  HardwareModel hw = HardwareModel::H100(16);
  const double before = hw.AllGatherSeconds(1 << 30);
  Profile profile = TinyProfile();
  profile.collectives.clear();
  ASSERT_TRUE(FitCollectives(profile, hw).ok());
  EXPECT_TRUE(hw.allgather_fit.empty());
  EXPECT_DOUBLE_EQ(hw.AllGatherSeconds(1 << 30), before);
}

TEST(FitCollectivesTest, NegativeTime_InvalidArgument) {
  HardwareModel hw = HardwareModel::H100(2);
  Profile profile = TinyProfile();
  profile.collectives[0].issue_to_done_s = -1;
  EXPECT_EQ(FitCollectives(profile, hw).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(PlanTest, TandemOnTinyLlama_PassesSemanticsAndFits) {
  const Graph graph = TinyLlama(4);
  const HardwareModel hw = HardwareModel::H100(4);
  RecordingSink sink;
  PlanOptions options;
  options.sink = &sink;
  absl::StatusOr<PlanResult> result = Plan(graph, hw, options);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_TRUE(CheckScheduleSemantics(graph, result->schedule).ok())
      << CheckScheduleSemantics(graph, result->schedule);
  EXPECT_TRUE(ValidateSchedule(result->schedule, graph).ok());
  EXPECT_TRUE(result->feasible);
  EXPECT_LE(result->sim.peak_bytes, hw.budget());
  EXPECT_THAT(result->schedule.provenance.passes,
              ElementsAre("zero3-insert", "micro-batch-reduce", "offload",
                          "prefetch", "offload-unshard-search"));
  EXPECT_EQ(sink.passes, result->schedule.provenance.passes);
  EXPECT_EQ(result->schedule.graph_hash, graph.StructuralHash());
  EXPECT_EQ(result->schedule.budget_bytes, hw.budget());
  EXPECT_DOUBLE_EQ(result->schedule.prediction.iteration_s,
                   result->sim.iteration_s);
  EXPECT_EQ(result->schedule.prediction.peak_bytes, result->sim.peak_bytes);
  EXPECT_GT(result->plan_wall_s, 0);
  EXPECT_DOUBLE_EQ(result->schedule.provenance.plan_wall_s,
                   result->plan_wall_s);
  // The simulation returned is the schedule's.
  absl::StatusOr<SimResult> again = Simulate(graph, result->schedule, hw);
  ASSERT_TRUE(again.ok());
  EXPECT_DOUBLE_EQ(again->iteration_s, result->sim.iteration_s);
  EXPECT_EQ(again->peak_bytes, result->sim.peak_bytes);
}

TEST(PlanTest, EveryPolicyOnTinyLlama_KeepsEveryInvariant) {
  const Graph graph = TinyLlama(8);
  const HardwareModel hw = HardwareModel::H100(8);
  for (Policy policy : AllPolicies()) {
    PlanOptions options;
    options.policy = policy;
    absl::StatusOr<PlanResult> result = Plan(graph, hw, options);
    ASSERT_TRUE(result.ok()) << PolicyName(policy) << ": " << result.status();
    EXPECT_TRUE(CheckScheduleSemantics(graph, result->schedule).ok())
        << PolicyName(policy);
    EXPECT_TRUE(result->feasible) << PolicyName(policy);
    EXPECT_FALSE(result->schedule.provenance.passes.empty());
  }
}

// Tandem's policy returns the fastest plan that fits and, as its runner-up,
// the fastest other one: a different plan, fitting the budget, predicted no
// faster, simulated as returned; none when no other plan fits (a budget only
// Tandem's offloading fits). TrialCandidate offers it only within the
// margin.
TEST(PlanTest, TandemPolicy_RunnerUpIsTheFastestOtherPlanThatFits) {
  const Graph graph = TinyLlama(4);
  HardwareModel hw = HardwareModel::H100(4);
  PlanOptions on_demand;
  on_demand.policy = Policy::kOnDemand;
  absl::StatusOr<PlanResult> od = Plan(graph, hw, on_demand);
  ASSERT_TRUE(od.ok());
  absl::StatusOr<int64_t> least = SmallestFeasibleBudget(graph, hw);
  ASSERT_TRUE(least.ok());
  int with_runner_up = 0;
  for (const int64_t budget : {int64_t{0}, od->sim.peak_bytes - 1,
                               (od->sim.peak_bytes + *least) / 2, *least}) {
    SCOPED_TRACE(absl::StrCat("budget ", budget));
    hw.budget_bytes = budget;
    absl::StatusOr<PlanResult> result = Plan(graph, hw, PlanOptions());
    ASSERT_TRUE(result.ok()) << result.status();
    // The fastest plan of another policy that fits and differs.
    std::optional<PlanResult> other;
    for (Policy policy : AllPolicies()) {
      PlanOptions options;
      options.policy = policy;
      absl::StatusOr<PlanResult> theirs = Plan(graph, hw, options);
      ASSERT_TRUE(theirs.ok() || policy == Policy::kTandem);
      if (!theirs.ok() || !theirs->feasible ||
          SamePlan(theirs->schedule, result->schedule)) {
        continue;
      }
      if (!other.has_value() ||
          theirs->sim.iteration_s < other->sim.iteration_s) {
        other = *theirs;
      }
    }
    ASSERT_EQ(result->runner_up.has_value(), other.has_value());
    if (!other.has_value()) continue;
    ++with_runner_up;
    const PlanAlternative& second = *result->runner_up;
    EXPECT_DOUBLE_EQ(second.sim.iteration_s, other->sim.iteration_s)
        << second.source;
    EXPECT_FALSE(SamePlan(second.schedule, result->schedule));
    EXPECT_LE(second.sim.peak_bytes, hw.budget());
    EXPECT_GE(second.sim.iteration_s, result->sim.iteration_s);
    EXPECT_EQ(second.schedule.budget_bytes, hw.budget());
    EXPECT_TRUE(CheckScheduleSemantics(graph, second.schedule).ok());
    absl::StatusOr<SimResult> again = Simulate(graph, second.schedule, hw);
    ASSERT_TRUE(again.ok());
    EXPECT_DOUBLE_EQ(again->iteration_s, second.sim.iteration_s);
    const double apart = second.sim.iteration_s / result->sim.iteration_s - 1;
    EXPECT_FALSE(TrialCandidate(*result, 0).has_value());
    ASSERT_TRUE(TrialCandidate(*result, apart + 1e-6).has_value());
    EXPECT_EQ(TrialCandidate(*result, apart + 1e-6)->source, second.source);
    if (apart > 1e-6) {
      EXPECT_FALSE(TrialCandidate(*result, apart - 1e-6).has_value());
    }
  }
  EXPECT_GE(with_runner_up, 1);
}

TEST(PlanTest, ReferencePolicyOverBudget_ReturnsPlanMarkedInfeasible) {
  const Graph graph = TinyLlama(4);
  HardwareModel hw = HardwareModel::H100(4);
  PlanOptions options;
  options.policy = Policy::kOnDemand;
  absl::StatusOr<PlanResult> fits = Plan(graph, hw, options);
  ASSERT_TRUE(fits.ok());
  hw.budget_bytes = fits->sim.peak_bytes - 1;
  absl::StatusOr<PlanResult> over = Plan(graph, hw, options);
  ASSERT_TRUE(over.ok()) << over.status();
  EXPECT_FALSE(over->feasible);
  EXPECT_EQ(over->sim.peak_bytes, fits->sim.peak_bytes);
  EXPECT_TRUE(CheckScheduleSemantics(graph, over->schedule).ok());
}

TEST(PlanTest, InfeasibleBudget_ResourceExhaustedNamingSmallestFeasible) {
  const Graph graph = TinyLlama(4);
  HardwareModel hw = HardwareModel::H100(4);
  absl::StatusOr<int64_t> smallest = SmallestFeasibleBudget(graph, hw);
  ASSERT_TRUE(smallest.ok()) << smallest.status();
  hw.budget_bytes = *smallest - 4096;
  absl::StatusOr<PlanResult> result = Plan(graph, hw, PlanOptions());
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(
      result.status().message(),
      HasSubstr("smallest feasible budget is " + FormatBytes(*smallest)));
}

TEST(PlanTest, SmallestFeasibleBudget_TandemPlanFits) {
  const Graph graph = TinyLlama(4);
  HardwareModel hw = HardwareModel::H100(4);
  absl::StatusOr<int64_t> smallest = SmallestFeasibleBudget(graph, hw);
  ASSERT_TRUE(smallest.ok());
  // Below every plan that keeps the optimizer states on the device.
  PlanOptions on_demand;
  on_demand.policy = Policy::kOnDemand;
  absl::StatusOr<PlanResult> baseline = Plan(graph, hw, on_demand);
  ASSERT_TRUE(baseline.ok());
  EXPECT_LT(*smallest, baseline->sim.peak_bytes);

  hw.budget_bytes = *smallest;
  absl::StatusOr<PlanResult> result = Plan(graph, hw, PlanOptions());
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_TRUE(result->feasible);
  EXPECT_LE(result->sim.peak_bytes, *smallest);
  EXPECT_FALSE(result->schedule.offloads.empty());
  EXPECT_TRUE(CheckScheduleSemantics(graph, result->schedule).ok());
}

TEST(StartingScheduleTest, Zero3IsOnDemand_Zero1IsTheZeroOnePass) {
  const Graph graph = TinyLlama(4);
  const HardwareModel hw = HardwareModel::H100(4);
  absl::StatusOr<Schedule> zero3 =
      StartingSchedule(graph, ShardingMode::kZero3);
  ASSERT_TRUE(zero3.ok()) << zero3.status();
  PlanOptions on_demand;
  on_demand.policy = Policy::kOnDemand;
  absl::StatusOr<PlanResult> planned = Plan(graph, hw, on_demand);
  ASSERT_TRUE(planned.ok());
  EXPECT_EQ(zero3->actions, planned->schedule.actions);
  EXPECT_EQ(zero3->version, 0);
  EXPECT_EQ(zero3->provenance.reason, "baseline");
  absl::StatusOr<Schedule> zero1 =
      StartingSchedule(graph, ShardingMode::kZero1);
  ASSERT_TRUE(zero1.ok()) << zero1.status();
  EXPECT_EQ(zero1->mode, ShardingMode::kZero1);
  EXPECT_TRUE(CheckScheduleSemantics(graph, *zero1).ok());
}

// The runtime measured 40 MB more than the simulator says for the schedule it
// ran: every later plan counts those bytes, and a budget the uncalibrated
// plan just fits makes the calibrated planner choose differently (or say it
// cannot), never a plan that would overrun by 40 MB.
TEST(CalibrateMemoryTest, MeasuredPeakAboveModel_CountedInEveryPlan) {
  Graph graph = TinyLlama(4);
  HardwareModel hw = HardwareModel::H100(4);
  absl::StatusOr<Schedule> ran = StartingSchedule(graph, ShardingMode::kZero3);
  ASSERT_TRUE(ran.ok());
  HardwareModel with_buffers = hw;
  with_buffers.collective_buffers = true;  // CalibrateMemory's model
  absl::StatusOr<SimResult> model = Simulate(graph, *ran, with_buffers);
  ASSERT_TRUE(model.ok());
  constexpr int64_t kExtra = 40 << 20;
  Profile profile;
  profile.peak_bytes = model->peak_bytes + kExtra;
  ASSERT_TRUE(CalibrateMemory(graph, *ran, profile, hw).ok());
  EXPECT_EQ(hw.unmodeled_bytes, kExtra);
  EXPECT_TRUE(hw.collective_buffers);
  absl::StatusOr<SimResult> calibrated = Simulate(graph, *ran, hw);
  ASSERT_TRUE(calibrated.ok());
  EXPECT_EQ(calibrated->peak_bytes, profile.peak_bytes);
  EXPECT_EQ(calibrated->peak_breakdown.unmodeled, kExtra);
  EXPECT_EQ(calibrated->peak_breakdown.total(), calibrated->peak_bytes);

  // The runtime holds what the uncalibrated model (with the collective
  // buffers) counts plus kExtra: that is the independent fact a plan must fit.
  auto runtime_peak = [&](const Schedule& schedule) -> int64_t {
    absl::StatusOr<SimResult> sim = Simulate(graph, schedule, with_buffers);
    EXPECT_TRUE(sim.ok());
    return sim.ok() ? sim->peak_bytes + kExtra : 0;
  };
  // A budget the uncalibrated Tandem plan fits on paper with less than kExtra
  // to spare, so that it would not fit in the runtime.
  HardwareModel plain = with_buffers;
  absl::StatusOr<PlanResult> uncalibrated = Plan(graph, plain, PlanOptions());
  ASSERT_TRUE(uncalibrated.ok());
  plain.budget_bytes = uncalibrated->sim.peak_bytes + kExtra / 2;
  absl::StatusOr<PlanResult> naive = Plan(graph, plain, PlanOptions());
  ASSERT_TRUE(naive.ok());
  ASSERT_GT(runtime_peak(naive->schedule), plain.budget_bytes)
      << "the uncalibrated plan must overrun the runtime for this test to "
         "say anything";
  hw.budget_bytes = plain.budget_bytes;
  absl::StatusOr<PlanResult> result = Plan(graph, hw, PlanOptions());
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_LE(runtime_peak(result->schedule), hw.budget_bytes);

  // The model over-counting, or no peak measured: nothing added.
  profile.peak_bytes = model->peak_bytes / 2;
  ASSERT_TRUE(CalibrateMemory(graph, *ran, profile, hw).ok());
  EXPECT_EQ(hw.unmodeled_bytes, 0);
  profile.peak_bytes = 0;
  ASSERT_TRUE(CalibrateMemory(graph, *ran, profile, hw).ok());
  EXPECT_EQ(hw.unmodeled_bytes, 0);
}

// Each node's own memory as the worker measured it (rise and net) is
// matched node by node: the calibrated simulation of the profiled schedule
// puts exactly the measured rise on top of a node's start, and carries what
// a node left beyond the model to the nodes after it.
TEST(CalibrateMemoryTest, NodeMemory_MatchedNodeByNode) {
  Graph graph = TinyLlama(4);
  HardwareModel hw = HardwareModel::H100(4);
  absl::StatusOr<Schedule> ran = StartingSchedule(graph, ShardingMode::kZero3);
  ASSERT_TRUE(ran.ok());
  HardwareModel with_buffers = hw;
  with_buffers.collective_buffers = true;
  absl::StatusOr<SimResult> model = Simulate(graph, *ran, with_buffers);
  ASSERT_TRUE(model.ok());
  // The first backward node (the loss's) hands a 3 MiB gradient to the next
  // one, which frees it; a forward node needs 5 MiB of temporaries.
  int loss_backward = -1;
  for (size_t i = 0; i < graph.nodes.size(); ++i) {
    if (graph.nodes[i].phase == Phase::kBackward) {
      loss_backward = static_cast<int>(i);
      break;
    }
  }
  ASSERT_GT(loss_backward, 1);
  const int forward = 1;
  constexpr int64_t kHanded = 3 << 20;
  constexpr int64_t kTemporaries = 5 << 20;
  Profile profile;
  profile.peak_bytes = model->peak_bytes;
  for (size_t i = 0; i < graph.nodes.size(); ++i) {
    const NodeTimelineEntry& m = model->nodes[i];
    MemorySample sample;
    sample.node_id = graph.nodes[i].id;
    sample.rise_bytes = m.modeled_rise_bytes;
    sample.net_bytes = m.modeled_net_bytes;
    if (static_cast<int>(i) == forward) sample.rise_bytes += kTemporaries;
    if (static_cast<int>(i) == loss_backward) sample.net_bytes += kHanded;
    if (static_cast<int>(i) == loss_backward + 1) sample.net_bytes -= kHanded;
    if (sample.rise_bytes == 0 && sample.net_bytes == 0) continue;
    profile.memory.push_back(sample);
  }
  ASSERT_TRUE(CalibrateMemory(graph, *ran, profile, hw).ok());
  EXPECT_EQ(graph.nodes[forward].measured_extra_bytes, kTemporaries);
  EXPECT_EQ(graph.nodes[loss_backward].measured_carry_bytes, kHanded);
  EXPECT_EQ(graph.nodes[loss_backward + 1].measured_carry_bytes, -kHanded);
  absl::StatusOr<SimResult> calibrated = Simulate(graph, *ran, hw);
  ASSERT_TRUE(calibrated.ok());
  for (size_t i = 0; i < graph.nodes.size(); ++i) {
    const int64_t handed = static_cast<int>(i) == loss_backward ? kHanded : 0;
    EXPECT_EQ(calibrated->nodes[i].memory_after_bytes,
              model->nodes[i].memory_after_bytes + handed + hw.unmodeled_bytes)
        << "node " << i;
  }
  EXPECT_GE(calibrated->peak_bytes, model->peak_bytes);
  // Calibrating again starts from the model, not from the last calibration.
  ASSERT_TRUE(CalibrateMemory(graph, *ran, profile, hw).ok());
  EXPECT_EQ(graph.nodes[forward].measured_extra_bytes, kTemporaries);
  EXPECT_EQ(graph.nodes[loss_backward].measured_carry_bytes, kHanded);
}

// A profile as a worker would send it for `schedule`: each node's and
// each collective's time from the simulation, and the iteration `slower`
// times the simulated one.
Profile ProfileOf(const Graph& graph, const Schedule& schedule,
                  const HardwareModel& hw, double slower) {
  absl::StatusOr<SimResult> sim = Simulate(graph, schedule, hw);
  EXPECT_TRUE(sim.ok()) << sim.status();
  Profile p;
  p.graph_hash = graph.StructuralHash();
  p.schedule_version = schedule.version;
  p.iteration_s = sim->iteration_s * slower;
  for (const NodeTimelineEntry& n : sim->nodes) {
    NodeTiming t;
    t.node_id = n.node_id;
    t.time_s = n.end_s - n.start_s;
    t.samples = 4;
    p.nodes.push_back(t);
  }
  for (const CollectiveTimelineEntry& c : sim->collectives) {
    if (c.action_index < 0 ||
        c.action_index >= static_cast<int>(schedule.actions.size())) {
      continue;
    }
    const Action& a = schedule.actions[c.action_index];
    CollectiveTiming t;
    t.node_id = a.node_id;
    t.bytes = c.bytes;
    t.issue_to_done_s = c.end_s - c.issue_s;
    t.run_s = c.end_s - c.start_s;
    if (a.kind == ActionKind::kAllGather) {
      t.kind = CollectiveKind::kAllGather;
      t.group_id = a.group_id;
    } else {
      t.kind = CollectiveKind::kReduceScatter;
      t.param_ids = a.param_ids;
    }
    p.collectives.push_back(std::move(t));
  }
  return p;
}

// The iteration a profile measured is more than its nodes' and collectives'
// medians add up to: every measured time is scaled so that the profiled
// schedule simulates to it, and every other schedule's prediction scales
// alike. Far off, the scale is clamped; without a measured iteration there
// is none.
TEST(CalibrateToMeasurementsTest, IterationAboveItsMedians_EveryTimeScaled) {
  Graph graph = TinyLlama(4);
  const HardwareModel hw = HardwareModel::H100(4);
  absl::StatusOr<Schedule> ran = StartingSchedule(graph, ShardingMode::kZero3);
  ASSERT_TRUE(ran.ok());
  Profile profile = ProfileOf(graph, *ran, hw, 1.0);
  absl::StatusOr<Calibrated> plain =
      CalibrateToMeasurements(graph, hw, &profile, &*ran, ShardingMode::kZero3);
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_NEAR(plain->hw.time_scale, 1, 0.02);
  absl::StatusOr<SimResult> base = Simulate(plain->graph, *ran, plain->hw);
  ASSERT_TRUE(base.ok());
  EXPECT_NEAR(base->iteration_s, profile.iteration_s,
              1e-9 * profile.iteration_s);
  absl::StatusOr<PlanResult> planned =
      Plan(plain->graph, plain->hw, PlanOptions());
  ASSERT_TRUE(planned.ok()) << planned.status();
  absl::StatusOr<SimResult> other =
      Simulate(plain->graph, planned->schedule, plain->hw);
  ASSERT_TRUE(other.ok());

  profile.iteration_s *= 1.2;
  absl::StatusOr<Calibrated> scaled =
      CalibrateToMeasurements(graph, hw, &profile, &*ran, ShardingMode::kZero3);
  ASSERT_TRUE(scaled.ok()) << scaled.status();
  EXPECT_NEAR(scaled->hw.time_scale, 1.2 * plain->hw.time_scale, 1e-9);
  absl::StatusOr<SimResult> profiled =
      Simulate(scaled->graph, *ran, scaled->hw);
  ASSERT_TRUE(profiled.ok());
  EXPECT_NEAR(profiled->iteration_s, profile.iteration_s,
              1e-6 * profile.iteration_s);
  absl::StatusOr<SimResult> other_scaled =
      Simulate(scaled->graph, planned->schedule, scaled->hw);
  ASSERT_TRUE(other_scaled.ok());
  EXPECT_NEAR(other_scaled->iteration_s, 1.2 * other->iteration_s,
              1e-6 * other->iteration_s);
  EXPECT_THAT(DescribeHardware(scaled->hw),
              HasSubstr("measured times scaled by"));

  profile.iteration_s *= 10;
  scaled =
      CalibrateToMeasurements(graph, hw, &profile, &*ran, ShardingMode::kZero3);
  ASSERT_TRUE(scaled.ok());
  EXPECT_EQ(scaled->hw.time_scale, HardwareModel::kMaxTimeScale);
  profile.iteration_s = 0;
  scaled =
      CalibrateToMeasurements(graph, hw, &profile, &*ran, ShardingMode::kZero3);
  ASSERT_TRUE(scaled.ok());
  EXPECT_EQ(scaled->hw.time_scale, 1);
  EXPECT_THAT(DescribeHardware(scaled->hw),
              ::testing::Not(HasSubstr("scaled by")));
}

TEST(CalibrateMemoryTest, ScheduleNotOfThisGraph_InvalidArgument) {
  Graph graph = TinyLlama(4);
  HardwareModel hw = HardwareModel::H100(4);
  absl::StatusOr<Schedule> ran = StartingSchedule(graph, ShardingMode::kZero3);
  ASSERT_TRUE(ran.ok());
  ASSERT_FALSE(ran->actions.empty());
  ran->actions.front().node_id = 999999;
  Profile profile;
  profile.peak_bytes = 1 << 30;
  absl::Status status = CalibrateMemory(graph, *ran, profile, hw);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("does not replay"));
}

TEST(PlanTest, HardwareForOtherWorld_InvalidArgument) {
  absl::StatusOr<PlanResult> result =
      Plan(TinyLlama(4), HardwareModel::H100(8), PlanOptions());
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(result.status().message(), HasSubstr("world=4"));
}

TEST(PlanTest, InvalidGraph_InvalidArgument) {
  Graph graph = TinyLlama(4);
  graph.nodes[0].param_ids.push_back(9999);
  absl::StatusOr<PlanResult> result =
      Plan(graph, HardwareModel::H100(4), PlanOptions());
  EXPECT_EQ(result.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(PlanTest, Zero1ForReferencePolicy_InvalidArgument) {
  PlanOptions options;
  options.policy = Policy::kFsdp;
  options.mode = ShardingMode::kZero1;
  absl::StatusOr<PlanResult> result =
      Plan(TinyLlama(4), HardwareModel::H100(4), options);
  ASSERT_FALSE(result.ok());
  EXPECT_THAT(result.status().message(), HasSubstr("tandem"));
}

TEST(PlanTest, Zero1Tandem_PlansZero1Schedule) {
  const Graph graph = TinyLlama(4);
  PlanOptions options;
  options.mode = ShardingMode::kZero1;
  absl::StatusOr<PlanResult> result =
      Plan(graph, HardwareModel::H100(4), options);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->schedule.mode, ShardingMode::kZero1);
  EXPECT_THAT(result->schedule.provenance.passes,
              ElementsAre("zero1", "offload"));
  EXPECT_TRUE(CheckScheduleSemantics(graph, result->schedule).ok());
}

}  // namespace
}  // namespace tandem
