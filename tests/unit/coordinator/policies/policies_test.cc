// The reference policies' passes on
// tests/testdata/policies/two_layer_graph.txt, each against the exact schedule
// its published rules give (the
// *_expected.txt fixtures say why, step by step).
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "common/ir/text_format.h"
#include "common/ir/validate.h"
#include "common/lowering/schedule_semantics.h"
#include "common/sim/hardware_model.h"
#include "coordinator/passes/planning_context.h"
#include "coordinator/passes/zero3_insert_pass.h"
#include "coordinator/policies/deepspeed_persistence_pass.h"
#include "coordinator/policies/deepspeed_prefetch_pass.h"
#include "coordinator/policies/fsdp_prefetch_pass.h"
#include "coordinator/policies/greedy_prefetch_pass.h"
#include "coordinator/policies/greedy_unshard_pass.h"
#include "coordinator/policies/memory_only_offload_pass.h"
#include "coordinator/policies/program_memory.h"
#include "coordinator/policies/split_gather_groups_pass.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tandem {
namespace {

using ::testing::ElementsAre;

std::string ReadTestData(const std::string& name) {
  const std::string path =
      std::string(TANDEM_TESTDATA_DIR) + "/policies/" + name;
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << "cannot read " << path;
  std::stringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

Graph TwoLayerGraph() {
  absl::StatusOr<Graph> graph = ParseGraph(ReadTestData("two_layer_graph.txt"));
  EXPECT_TRUE(graph.ok()) << graph.status();
  EXPECT_TRUE(ValidateGraph(*graph).ok());
  return *graph;
}

HardwareModel Hardware(const std::string& text) {
  absl::StatusOr<HardwareModel> hw = ParseHardwareModel(text);
  EXPECT_TRUE(hw.ok()) << hw.status();
  return *hw;
}

// Runs `passes` in order on a fresh context, re-simulating after each as the
// pipeline does.
std::unique_ptr<PlanningContext> RunPasses(
    const Graph& graph, const HardwareModel& hw,
    std::vector<std::unique_ptr<PlanningPass>> passes) {
  auto context = std::make_unique<PlanningContext>(graph, hw);
  EXPECT_TRUE(context->Resimulate().ok());
  for (auto& pass : passes) {
    absl::StatusOr<bool> changed = pass->Run(*context);
    EXPECT_TRUE(changed.ok()) << pass->name() << ": " << changed.status();
    EXPECT_TRUE(context->Resimulate().ok());
  }
  return context;
}

template <typename... Ts>
std::vector<std::unique_ptr<PlanningPass>> Passes(Ts&&... passes) {
  std::vector<std::unique_ptr<PlanningPass>> out;
  (out.push_back(std::make_unique<std::decay_t<Ts>>(std::forward<Ts>(passes))),
   ...);
  return out;
}

// Compares the plan (groups, persistent set, offloads, actions) with the
// expected schedule fixture, as text so a mismatch reads as a diff.
void ExpectSchedule(const Graph& graph, const Schedule& actual,
                    const std::string& expected_file) {
  absl::StatusOr<Schedule> expected =
      ParseSchedule(ReadTestData(expected_file));
  ASSERT_TRUE(expected.ok()) << expected.status();
  Schedule plan = *expected;
  plan.groups = actual.groups;
  plan.persistent_param_ids = actual.persistent_param_ids;
  plan.offloads = actual.offloads;
  plan.actions = actual.actions;
  EXPECT_EQ(PrintSchedule(plan), PrintSchedule(*expected)) << expected_file;
  EXPECT_TRUE(ValidateSchedule(actual, graph).ok());
  EXPECT_TRUE(CheckScheduleSemantics(graph, actual).ok())
      << CheckScheduleSemantics(graph, actual);
}

std::vector<ActionKind> Kinds(const std::vector<Action>& actions) {
  std::vector<ActionKind> kinds;
  for (const Action& a : actions) kinds.push_back(a.kind);
  return kinds;
}

TEST(SplitGatherGroupsPassTest, Run_MultiParamGroups_OneGroupPerParamInOrder) {
  const Graph graph = TwoLayerGraph();
  PlanningContext context(graph, Hardware("world=4"));
  ASSERT_TRUE(Zero3InsertPass().Run(context).ok());
  ASSERT_TRUE(SplitGatherGroupsPass().Run(context).value());
  const Schedule& s = context.schedule();
  ASSERT_EQ(s.groups.size(), 8u);
  for (size_t g = 0; g < s.groups.size(); ++g) {
    EXPECT_EQ(s.groups[g].id, static_cast<int32_t>(g));
    EXPECT_THAT(s.groups[g].param_ids, ElementsAre(static_cast<int32_t>(g)));
  }
  // n1 used group {p1, p2}: now two gathers and two waits, param order.
  std::vector<Action> before_n1;
  for (const Action& a : s.actions) {
    if (a.node_id == 1 && a.position == AnchorPosition::kBefore) {
      before_n1.push_back(a);
    }
  }
  ASSERT_EQ(before_n1.size(), 4u);
  EXPECT_THAT(Kinds(before_n1),
              ElementsAre(ActionKind::kAllGather, ActionKind::kAllGather,
                          ActionKind::kWait, ActionKind::kWait));
  EXPECT_EQ(before_n1[0].group_id, 1);
  EXPECT_EQ(before_n1[1].group_id, 2);
  EXPECT_TRUE(CheckScheduleSemantics(graph, s).ok());
  // Already one param per group: nothing to do.
  EXPECT_FALSE(SplitGatherGroupsPass().Run(context).value());
}

TEST(DeepSpeedPersistencePassTest, Run_ParamsUnderThreshold_BecomePersistent) {
  const Graph graph = TwoLayerGraph();
  PlanningContext context(graph, Hardware("world=4"));
  ASSERT_TRUE(Zero3InsertPass().Run(context).ok());
  ASSERT_TRUE(DeepSpeedPersistencePass().Run(context).value());
  const Schedule& s = context.schedule();
  EXPECT_THAT(s.persistent_param_ids, ElementsAre(1, 4));
  for (const GatherGroup& g : s.groups) {
    for (int32_t p : g.param_ids) {
      EXPECT_NE(p, 1);
      EXPECT_NE(p, 4);
    }
  }
  EXPECT_TRUE(CheckScheduleSemantics(graph, s).ok());
  // A threshold above every param makes all of them persistent and leaves no
  // gather at all.
  ASSERT_TRUE(DeepSpeedPersistencePass(int64_t{1} << 40).Run(context).value());
  EXPECT_TRUE(s.groups.empty());
  for (const Action& a : s.actions) {
    EXPECT_EQ(a.kind, ActionKind::kReduceScatter);
  }
}

TEST(DeepSpeedPrefetchPassTest, Run_TwoLayerGraph_MatchesExpectedSchedule) {
  const Graph graph = TwoLayerGraph();
  auto context =
      RunPasses(graph, Hardware("world=4"),
                Passes(DeepSpeedPersistencePass(), Zero3InsertPass(),
                       SplitGatherGroupsPass(),
                       DeepSpeedPrefetchPass(/*bucket_numel=*/200000,
                                             /*max_live_numel=*/600000,
                                             /*max_reuse_numel=*/300000)));
  ExpectSchedule(graph, context->schedule(), "deepspeed_zero3_expected.txt");
}

TEST(DeepSpeedPrefetchPassTest, Run_NoLiveHeadroom_LeavesPlanUnchanged) {
  const Graph graph = TwoLayerGraph();
  auto context = RunPasses(graph, Hardware("world=4"),
                           Passes(DeepSpeedPersistencePass(), Zero3InsertPass(),
                                  SplitGatherGroupsPass()));
  // Every param is larger than max live minus what is already gathered, and
  // the reuse window is empty.
  EXPECT_FALSE(DeepSpeedPrefetchPass(/*bucket_numel=*/200000,
                                     /*max_live_numel=*/262144,
                                     /*max_reuse_numel=*/0)
                   .Run(*context)
                   .value());
}

TEST(FsdpPrefetchPassTest, Run_TwoLayerGraph_MatchesExpectedSchedule) {
  const Graph graph = TwoLayerGraph();
  auto context = RunPasses(
      graph, Hardware("world=4"),
      Passes(Zero3InsertPass(GatherGrouping::kPerUnit), FsdpPrefetchPass()));
  ExpectSchedule(graph, context->schedule(), "fsdp_expected.txt");
}

TEST(FsdpPrefetchPassTest, Run_OneUnitAtATime_KeepsGathersOnDemand) {
  const Graph graph = TwoLayerGraph();
  auto context = RunPasses(graph, Hardware("world=4"),
                           Passes(Zero3InsertPass(GatherGrouping::kPerUnit)));
  EXPECT_FALSE(
      FsdpPrefetchPass(/*max_gathered_units=*/1).Run(*context).value());
}

TEST(GreedyPrefetchPassTest, Run_TightBudget_MatchesExpectedSchedule) {
  const Graph graph = TwoLayerGraph();
  auto context =
      RunPasses(graph, Hardware("world=4 latency_us=0 budget=22MiB"),
                Passes(DeepSpeedPersistencePass(), Zero3InsertPass(),
                       SplitGatherGroupsPass(), GreedyPrefetchPass()));
  ExpectSchedule(graph, context->schedule(),
                 "deepcompile_prefetch_expected.txt");
  EXPECT_LE(context->sim().peak_bytes, context->budget());
}

TEST(GreedyPrefetchPassTest, Run_AmpleMemory_HoistsEveryGatherToSegmentStart) {
  const Graph graph = TwoLayerGraph();
  auto context =
      RunPasses(graph, Hardware("world=4"),
                Passes(DeepSpeedPersistencePass(), Zero3InsertPass(),
                       SplitGatherGroupsPass(), GreedyPrefetchPass()));
  const GraphIndex index(graph);
  std::vector<int32_t> gathered_at;
  for (const Action& a : context->schedule().actions) {
    if (a.kind != ActionKind::kAllGather) continue;
    EXPECT_EQ(a.position, AnchorPosition::kBefore);
    gathered_at.push_back(a.node_id);
  }
  // Six gathers before the forward's first node, six before the backward's.
  EXPECT_THAT(gathered_at, ElementsAre(0, 0, 0, 0, 0, 0, 6, 6, 6, 6, 6, 6));
  EXPECT_TRUE(CheckScheduleSemantics(graph, context->schedule()).ok());
}

TEST(GreedyUnshardPassTest, Run_Headroom_TakesByTimePerByteAndStopsAtMisfit) {
  const Graph graph = TwoLayerGraph();
  auto context =
      RunPasses(graph, Hardware("world=4 budget=28.5MiB"),
                Passes(DeepSpeedPersistencePass(), Zero3InsertPass(),
                       SplitGatherGroupsPass(), GreedyUnshardPass()));
  ExpectSchedule(graph, context->schedule(),
                 "deepcompile_unshard_expected.txt");
}

TEST(GreedyUnshardPassTest, Run_FirstCandidateDoesNotFit_TakesNothing) {
  const Graph graph = TwoLayerGraph();
  // Without latency every param costs the same time per byte, so the 4 MiB
  // embedding comes first; it does not fit 0.9 x 26 - 20 = 3.4 MiB and the
  // pass stops there, though the 1 MiB weights would fit.
  auto context = RunPasses(graph, Hardware("world=4 latency_us=0 budget=26MiB"),
                           Passes(DeepSpeedPersistencePass(), Zero3InsertPass(),
                                  SplitGatherGroupsPass()));
  EXPECT_FALSE(GreedyUnshardPass().Run(*context).value());
  EXPECT_THAT(context->schedule().persistent_param_ids, ElementsAre(1, 4));
}

TEST(MemoryOnlyOffloadPassTest, Run_StatesDoNotFit_MatchesExpectedSchedule) {
  const Graph graph = TwoLayerGraph();
  auto context =
      RunPasses(graph, Hardware("world=4 budget=24.5MiB"),
                Passes(DeepSpeedPersistencePass(), Zero3InsertPass(),
                       SplitGatherGroupsPass(), MemoryOnlyOffloadPass()));
  ExpectSchedule(graph, context->schedule(),
                 "deepcompile_offload_expected.txt");
  EXPECT_LE(context->sim().peak_bytes, context->budget());
}

TEST(MemoryOnlyOffloadPassTest, Run_TighterBudget_ReloadsAfterLastBackward) {
  const Graph graph = TwoLayerGraph();
  auto context =
      RunPasses(graph, Hardware("world=4 budget=22MiB"),
                Passes(DeepSpeedPersistencePass(), Zero3InsertPass(),
                       SplitGatherGroupsPass(), MemoryOnlyOffloadPass()));
  const Schedule& s = context->schedule();
  // 15.0 MiB + states must fit 17.6 MiB: p0 (2 MiB), p1 (512 B) and p2
  // (512 KiB) leave; the backward never has room, so all return after n11.
  ASSERT_EQ(s.offloads.size(), 3u);
  EXPECT_THAT(s.offloads[0].param_ids, ElementsAre(0));
  EXPECT_THAT(s.offloads[1].param_ids, ElementsAre(1));
  EXPECT_THAT(s.offloads[2].param_ids, ElementsAre(2));
  EXPECT_EQ(s.offloads[0].bytes, 2 << 20);
  for (const Action& a : s.actions) {
    if (a.kind == ActionKind::kOffload) {
      EXPECT_EQ(a.node_id, 0);
      EXPECT_EQ(a.position, AnchorPosition::kBefore);
    } else if (a.kind == ActionKind::kReload) {
      EXPECT_EQ(a.node_id, 11);
      EXPECT_EQ(a.position, AnchorPosition::kAfter);
    }
  }
  EXPECT_LE(context->sim().peak_bytes, context->budget());
}

TEST(MemoryOnlyOffloadPassTest, Run_EverythingFits_ReturnsFalse) {
  const Graph graph = TwoLayerGraph();
  auto context =
      RunPasses(graph, Hardware("world=4"), Passes(Zero3InsertPass()));
  EXPECT_FALSE(MemoryOnlyOffloadPass().Run(*context).value());
  EXPECT_TRUE(context->schedule().offloads.empty());
}

TEST(EstimateProgramMemoryTest, Estimate_OnDemandPlan_CountsEachKind) {
  const Graph graph = TwoLayerGraph();
  PlanningContext context(graph, Hardware("world=4"));
  ASSERT_TRUE(Zero3InsertPass().Run(context).ok());
  const ProgramMemory memory = EstimateProgramMemory(graph, context.schedule());
  ASSERT_EQ(memory.during.size(), graph.nodes.size());
  // Static: 2.5 MiB of param shards, 2.5 MiB of gradient shards and 5 MiB
  // of f32 Adam moments (8 B per shard element), plus the two norms' 256 B
  // shards, gradient shards and 2 KiB of states.
  const int64_t fixed = (10 << 20) + 2 * 256 + 2 * 256 + 2 * 64 * 8;
  // n0: the 4 MiB embedding gathered and its 1 MiB activation at its end.
  EXPECT_EQ(memory.during[0], fixed + (4 << 20) + (1 << 20));
  // n6 (head.bwd): six activations, the 2 MiB head and its 2 MiB gradient.
  EXPECT_EQ(memory.during[6], fixed + (6 << 20) + (2 << 20) + (2 << 20));
  EXPECT_EQ(memory.states[6], (5 << 20) + 2 * 64 * 8);
  // The optimizer: only the static part.
  EXPECT_EQ(memory.during[12], fixed);
}

}  // namespace
}  // namespace tandem
