#include "common/lowering/lowering.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "common/ir/validate.h"
#include "common/lowering/anchored_schedule.h"
#include "common/lowering/schedule_semantics.h"
#include "common/models/graph_builder.h"
#include "common/models/model_config.h"

namespace tandem {
namespace {

Graph Tiny(int world) {
  absl::StatusOr<ModelConfig> config =
      ParseModelConfig("preset=tiny-llama world=" + std::to_string(world));
  EXPECT_TRUE(config.ok()) << config.status();
  absl::StatusOr<Graph> graph = BuildModelGraph(*config);
  EXPECT_TRUE(graph.ok()) << graph.status();
  return *graph;
}

TEST(LoweringTest, StartingSchedule_IsRunnableForThisGraph) {
  const Graph graph = Tiny(2);
  for (ShardingMode mode : {ShardingMode::kZero3, ShardingMode::kZero1}) {
    absl::StatusOr<Schedule> s = StartingSchedule(graph, mode);
    ASSERT_TRUE(s.ok()) << s.status();
    // The worker refuses a schedule of another graph: the hash must be set.
    EXPECT_EQ(s->graph_hash, graph.StructuralHash());
    EXPECT_EQ(s->version, 0);
    EXPECT_EQ(s->mode, mode);
    EXPECT_EQ(s->provenance.reason, "baseline");
    EXPECT_TRUE(ValidateSchedule(*s, graph).ok());
    EXPECT_TRUE(CheckScheduleSemantics(graph, *s).ok());
  }
}

TEST(LoweringTest, LowerZero3_PersistentParamsStayOutOfGroups) {
  const Graph graph = Tiny(2);
  const Schedule s = LowerZero3(graph, {graph.params[0].id});
  EXPECT_THAT(s.persistent_param_ids, ::testing::ElementsAre(0));
  for (const GatherGroup& g : s.groups) {
    EXPECT_THAT(g.param_ids, ::testing::Not(::testing::Contains(0)));
  }
  EXPECT_TRUE(CheckScheduleSemantics(graph, s).ok());
  // Per unit: fewer, larger groups than per node.
  EXPECT_LT(LowerZero3(graph, {}, GatherGrouping::kPerUnit).groups.size(),
            LowerZero3(graph, {}).groups.size());
}

TEST(LoweringTest, LowerZero1_EveryParamReplicatedAndReducedOnce) {
  const Graph graph = Tiny(2);
  const Schedule s = LowerZero1(graph, 1);  // 1-byte buckets: one per node
  EXPECT_EQ(s.persistent_param_ids.size(), graph.params.size());
  EXPECT_TRUE(FindReduceViolations(graph, s).empty());
  EXPECT_GT(s.groups.size(), 1u);
}

TEST(AnchoredScheduleTest, SpliceStateOffloads_CopiesGoOutsideTheirSlots) {
  const Graph graph = Tiny(2);
  const GraphIndex index(graph);
  Schedule s = LowerZero3(graph, {});
  const int last = static_cast<int>(graph.nodes.size()) - 1;
  SpliceStateOffloads(graph, index,
                      {{{graph.params[0].id},
                        100,
                        AnchoredSchedule::AfterSlot(0),
                        AnchoredSchedule::BeforeSlot(last)}},
                      s);
  ASSERT_EQ(s.offloads.size(), 1u);
  EXPECT_EQ(s.offloads[0].bytes, 100);
  AnchoredSchedule slots(graph, index, s);
  const std::vector<Action>& after_first =
      slots.slot(AnchoredSchedule::AfterSlot(0));
  ASSERT_FALSE(after_first.empty());
  EXPECT_EQ(after_first.back().kind, ActionKind::kOffload);
  const std::vector<Action>& before_last =
      slots.slot(AnchoredSchedule::BeforeSlot(last));
  ASSERT_FALSE(before_last.empty());
  EXPECT_EQ(before_last.front().kind, ActionKind::kReload);
  // Splicing again replaces the plan instead of adding to it.
  SpliceStateOffloads(graph, index, {}, s);
  EXPECT_TRUE(s.offloads.empty());
  for (const Action& a : s.actions) {
    EXPECT_NE(a.kind, ActionKind::kOffload);
    EXPECT_NE(a.kind, ActionKind::kReload);
  }
}

}  // namespace
}  // namespace tandem
