// The explanation stored with every plan (common/ir/explanation.h): its
// gains add up to baseline − plan on real planned graphs (built-in models,
// several budgets, both modes, every policy), offload and the least-memory
// fallback explain themselves with the memory that binds them, and the
// explanation survives the text and proto forms.
#include <algorithm>
#include <cctype>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/ir/proto_convert.h"
#include "common/ir/text_format.h"
#include "common/models/graph_builder.h"
#include "common/models/model_config.h"
#include "coordinator/planner/planner.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/coordinator/planner/explanation_checks.h"

namespace tandem {
namespace {

using ::testing::HasSubstr;

Graph ModelGraph(const std::string& text) {
  absl::StatusOr<ModelConfig> config = ParseModelConfig(text);
  EXPECT_TRUE(config.ok()) << config.status();
  absl::StatusOr<Graph> graph = BuildModelGraph(*config);
  EXPECT_TRUE(graph.ok()) << graph.status();
  return *graph;
}

int Count(const Explanation& e, DecisionKind kind) {
  return static_cast<int>(
      std::count_if(e.decisions.begin(), e.decisions.end(),
                    [kind](const Decision& d) { return d.kind == kind; }));
}

enum class Budget {
  // The H100's 80 GiB.
  kUnlimited,
  // Halfway between the smallest feasible budget and the baseline's peak:
  // offload has to run.
  kTight,
  // The smallest feasible budget.
  kSmallest,
};

struct Case {
  std::string model;
  Budget budget = Budget::kUnlimited;
  ShardingMode mode = ShardingMode::kZero3;
  Policy policy = Policy::kTandem;
};

std::string CaseName(const ::testing::TestParamInfo<Case>& info) {
  static constexpr const char* kBudgets[] = {"unlimited", "tight", "smallest"};
  std::string name =
      absl::StrCat(info.param.model, "_", PolicyName(info.param.policy), "_",
                   info.param.mode == ShardingMode::kZero3 ? "zero3" : "zero1",
                   "_", kBudgets[static_cast<int>(info.param.budget)]);
  for (char& c : name) {
    if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
  }
  return name;
}

class ExplanationSumTest : public ::testing::TestWithParam<Case> {};

TEST_P(ExplanationSumTest, Plan_BuiltInModel_GainsAddUpToBaselineDifference) {
  const Case& c = GetParam();
  const Graph graph = ModelGraph(c.model);
  HardwareModel hw = HardwareModel::H100(graph.world_size);
  if (c.budget != Budget::kUnlimited) {
    absl::StatusOr<Schedule> starting = StartingSchedule(graph, c.mode);
    ASSERT_TRUE(starting.ok());
    absl::StatusOr<SimResult> baseline = Simulate(graph, *starting, hw);
    ASSERT_TRUE(baseline.ok());
    absl::StatusOr<int64_t> smallest = SmallestFeasibleBudget(graph, hw);
    ASSERT_TRUE(smallest.ok());
    hw.budget_bytes = c.budget == Budget::kSmallest
                          ? *smallest
                          : (*smallest + baseline->peak_bytes) / 2;
  }
  PlanOptions options;
  options.policy = c.policy;
  options.mode = c.mode;
  absl::StatusOr<PlanResult> result = Plan(graph, hw, options);
  ASSERT_TRUE(result.ok()) << result.status();
  const Explanation& e = result->schedule.explanation;
  ExpectGainsAddUp(graph, *result, c.mode);
  if (c.policy == Policy::kOnDemand) {
    // The baseline itself: nothing to explain.
    EXPECT_TRUE(e.empty()) << FormatExplanation(e, 0, 0);
    return;
  }
  ASSERT_FALSE(e.empty());
  if (c.policy == Policy::kTandem && c.mode == ShardingMode::kZero3 &&
      !result->adopted_policy.has_value()) {
    // Tandem's own passes itemize what they did.
    EXPECT_GT(Count(e, DecisionKind::kPrefetch) +
                  Count(e, DecisionKind::kKeep) +
                  Count(e, DecisionKind::kPersist) +
                  Count(e, DecisionKind::kOffload) +
                  Count(e, DecisionKind::kLeastMemory),
              0);
    if (c.budget != Budget::kUnlimited) {
      EXPECT_GT(Count(e, DecisionKind::kOffload) +
                    Count(e, DecisionKind::kLeastMemory),
                0);
    }
  }
  if (c.mode == ShardingMode::kZero1) {
    EXPECT_EQ(Count(e, DecisionKind::kZero1Buckets), 1);
  }
}

std::vector<Case> Cases() {
  std::vector<Case> cases;
  for (const std::string model :
       {"preset=tiny-llama world=4", "preset=tiny-llama world=8 grad_accum=2",
        "preset=tiny-moe world=4 checkpointing=true",
        "preset=llama3-8b world=16 seq_len=1024 checkpointing=true"}) {
    for (Budget budget :
         {Budget::kUnlimited, Budget::kTight, Budget::kSmallest}) {
      cases.push_back({model, budget, ShardingMode::kZero3, Policy::kTandem});
    }
    cases.push_back(
        {model, Budget::kUnlimited, ShardingMode::kZero1, Policy::kTandem});
    for (Policy policy : {Policy::kOnDemand, Policy::kDeepSpeedZero3,
                          Policy::kFsdp, Policy::kDeepCompile}) {
      cases.push_back(
          {model, Budget::kUnlimited, ShardingMode::kZero3, policy});
    }
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Models, ExplanationSumTest,
                         ::testing::ValuesIn(Cases()), CaseName);

TEST(ExplanationTest, Plan_BudgetBelowBaseline_ExplainsOffloadBoundByMemory) {
  const Graph graph = ModelGraph("preset=tiny-llama world=4");
  HardwareModel hw = HardwareModel::H100(graph.world_size);
  absl::StatusOr<Schedule> starting =
      StartingSchedule(graph, ShardingMode::kZero3);
  ASSERT_TRUE(starting.ok());
  absl::StatusOr<SimResult> baseline = Simulate(graph, *starting, hw);
  ASSERT_TRUE(baseline.ok());
  absl::StatusOr<int64_t> smallest = SmallestFeasibleBudget(graph, hw);
  ASSERT_TRUE(smallest.ok());
  hw.budget_bytes = (*smallest + baseline->peak_bytes) / 2;
  absl::StatusOr<PlanResult> result = Plan(graph, hw, PlanOptions());
  ASSERT_TRUE(result.ok()) << result.status();
  ASSERT_FALSE(result->schedule.offloads.empty());
  const Explanation& e = result->schedule.explanation;
  int offloads = 0;
  for (const Decision& d : e.decisions) {
    if (d.kind != DecisionKind::kOffload || d.pass != "offload") continue;
    ++offloads;
    ASSERT_EQ(d.offload_ids.size(), 1u);
    EXPECT_GT(d.held_bytes, 0);
    EXPECT_THAT(d.what, HasSubstr("optimizer states of"));
    // What forced it: the baseline's peak, over the limit offload plans to.
    EXPECT_EQ(d.binding.kind, BindingKind::kMemory);
    ASSERT_TRUE(d.binding.node_id.has_value());
    EXPECT_EQ(*d.binding.node_id, baseline->peak_node_id);
    EXPECT_EQ(d.binding.bytes, baseline->peak_bytes);
    EXPECT_LE(d.binding.limit_bytes, hw.budget_bytes);
    EXPECT_GT(d.binding.bytes, d.binding.limit_bytes);
  }
  EXPECT_GT(offloads, 0);
  ExpectGainsAddUp(graph, *result, ShardingMode::kZero3);
}

TEST(ExplanationTest, Plan_PipelineThatCannotFit_ExplainsLeastMemoryPlan) {
  // A job's own pipeline without offload cannot get under a budget below
  // the baseline's peak; the planner falls back to the least-memory plan.
  const Graph graph = ModelGraph("preset=tiny-llama world=4");
  HardwareModel hw = HardwareModel::H100(graph.world_size);
  absl::StatusOr<int64_t> smallest = SmallestFeasibleBudget(graph, hw);
  ASSERT_TRUE(smallest.ok());
  hw.budget_bytes = *smallest;
  PlanOptions options;
  options.passes = {"zero3-insert", "prefetch"};
  absl::StatusOr<PlanResult> result = Plan(graph, hw, options);
  ASSERT_TRUE(result.ok()) << result.status();
  const Explanation& e = result->schedule.explanation;
  ASSERT_EQ(e.decisions.size(), 1u) << FormatExplanation(e, 0, 0);
  const Decision& d = e.decisions[0];
  EXPECT_EQ(d.kind, DecisionKind::kLeastMemory);
  EXPECT_EQ(d.pass, "planner");
  EXPECT_EQ(d.offload_ids.size(), result->schedule.offloads.size());
  EXPECT_THAT(d.what, HasSubstr("no plan within the budget"));
  EXPECT_EQ(d.binding.kind, BindingKind::kMemory);
  EXPECT_EQ(d.binding.limit_bytes, *smallest);
  EXPECT_EQ(d.binding.bytes, result->sim.peak_bytes);
  ExpectGainsAddUp(graph, *result, ShardingMode::kZero3);
}

TEST(ExplanationTest, Plan_CustomPasses_ChainThroughEveryPass) {
  const Graph graph = ModelGraph("preset=tiny-llama world=4");
  PlanOptions options;
  options.passes = {"zero3-insert", "prefetch", "unshard"};
  absl::StatusOr<PlanResult> result =
      Plan(graph, HardwareModel::H100(graph.world_size), options);
  ASSERT_TRUE(result.ok()) << result.status();
  const Explanation& e = result->schedule.explanation;
  EXPECT_GT(Count(e, DecisionKind::kPrefetch), 0);
  for (const Decision& d : e.decisions) {
    if (d.kind == DecisionKind::kPrefetch) {
      EXPECT_EQ(d.pass, "prefetch");
      ASSERT_EQ(d.group_ids.size(), 1u);
      ASSERT_TRUE(d.node_id.has_value());
      EXPECT_THAT(d.what, HasSubstr("gathered before n"));
    }
  }
  ExpectGainsAddUp(graph, *result, ShardingMode::kZero3);
}

TEST(ExplanationTest, PlanFromMeasurements_TextAndProtoForms_RoundTrip) {
  const Graph graph = ModelGraph("preset=tiny-llama world=4");
  HardwareModel hw = HardwareModel::H100(graph.world_size);
  hw.budget_bytes = 100 << 20;
  absl::StatusOr<PlanResult> result =
      PlanFromMeasurements(graph, hw, nullptr, nullptr, PlanOptions());
  ASSERT_TRUE(result.ok()) << result.status();
  const Schedule& schedule = result->schedule;
  ASSERT_FALSE(schedule.explanation.empty());

  absl::StatusOr<Schedule> parsed = ParseSchedule(PrintSchedule(schedule));
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->explanation, schedule.explanation);
  EXPECT_EQ(*parsed, schedule);

  absl::StatusOr<Schedule> back = FromProto(ToProto(schedule));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->explanation, schedule.explanation);
  EXPECT_EQ(*back, schedule);
}

TEST(ExplanationTest, FormatExplanation_ListsDecisionsAndTotals) {
  const Graph graph = ModelGraph("preset=tiny-llama world=4");
  absl::StatusOr<PlanResult> result =
      Plan(graph, HardwareModel::H100(graph.world_size), PlanOptions());
  ASSERT_TRUE(result.ok()) << result.status();
  const std::string text =
      FormatExplanation(result->schedule.explanation, result->sim.iteration_s,
                        result->sim.exposed_comm_s);
  EXPECT_THAT(text, HasSubstr("# baseline: iteration"));
  EXPECT_THAT(text, HasSubstr("prefetch"));
  EXPECT_THAT(text, HasSubstr("# total gain"));
  EXPECT_THAT(FormatExplanation(Explanation(), 0, 0),
              HasSubstr("no explanation"));
}

}  // namespace
}  // namespace tandem
