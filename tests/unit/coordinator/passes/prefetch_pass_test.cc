#include "coordinator/passes/prefetch_pass.h"

#include <cstdint>

#include "common/lowering/schedule_semantics.h"
#include "coordinator/passes/planning_context.h"
#include "coordinator/passes/zero1_pass.h"
#include "coordinator/passes/zero3_insert_pass.h"
#include "gtest/gtest.h"
#include "tests/unit/coordinator/passes/pass_test_util.h"

namespace tandem {
namespace {

using ::tandem::testing::LoadPassGraph;
using ::tandem::testing::PassTestHardware;
using ::tandem::testing::ScheduleBody;

// The baseline of prefetch_chain.txt: 28 ms (19 ms of compute, every one of
// the nine 1 ms collectives exposed), peak 11145728 bytes.
constexpr double kChainBaselineS = 0.028;
constexpr int64_t kChainBaselinePeak = 11145728;

class PrefetchPassTest : public ::testing::Test {
 protected:
  // Loads `fixture`, plans the baseline and re-simulates it.
  void Baseline(const char* fixture, const HardwareModel& hw,
                PlannerOptions options = {}) {
    absl::StatusOr<Graph> graph = LoadPassGraph(fixture);
    ASSERT_TRUE(graph.ok()) << graph.status();
    graph_ = *graph;
    context_ = std::make_unique<PlanningContext>(graph_, hw, options);
    Zero3InsertPass insert;
    ASSERT_TRUE(insert.Run(*context_).ok());
    ASSERT_TRUE(context_->Resimulate().ok());
    baseline_ = context_->sim();
  }

  // Runs prefetch, checks the invariants and the budget, re-simulates.
  bool RunPrefetch() {
    PrefetchPass prefetch;
    absl::StatusOr<bool> changed = prefetch.Run(*context_);
    EXPECT_TRUE(changed.ok()) << changed.status();
    EXPECT_TRUE(CheckScheduleSemantics(graph_, context_->schedule()).ok())
        << CheckScheduleSemantics(graph_, context_->schedule());
    EXPECT_TRUE(context_->Resimulate().ok());
    EXPECT_LE(context_->sim().peak_bytes,
              std::max(context_->budget(), baseline_.peak_bytes));
    return changed.ok() && *changed;
  }

  Graph graph_;
  std::unique_ptr<PlanningContext> context_;
  SimResult baseline_;
};

TEST_F(PrefetchPassTest, Run_ChainGraph_HoistsEachGatherOnlyAsFarAsNeeded) {
  Baseline("prefetch_chain.txt", PassTestHardware());
  ASSERT_DOUBLE_EQ(baseline_.iteration_s, kChainBaselineS);
  ASSERT_EQ(baseline_.peak_bytes, kChainBaselinePeak);

  EXPECT_TRUE(RunPrefetch());

  // Forward: g1 (needed at 3 ms) must start before n0 ends; g2 (needed at
  // 5 ms) is hidden when issued before n1, so it waits there. Backward: g2
  // cannot move past its forward release; g1 goes one node ahead, g0 right
  // behind c.bwd's reduce-scatter.
  EXPECT_EQ(ScheduleBody(context_->schedule()),
            "group g0 p0\n"
            "group g1 p1\n"
            "group g2 p2\n"
            "before n0 allgather g0\n"
            "before n0 allgather g1\n"
            "before n0 wait g0\n"
            "after n0 release g0\n"
            "before n1 allgather g2\n"
            "before n1 wait g1\n"
            "after n1 release g1\n"
            "before n2 wait g2\n"
            "after n2 release g2\n"
            "before n3 allgather g2\n"
            "before n3 allgather g1\n"
            "before n3 wait g2\n"
            "after n3 release g2\n"
            "after n3 reduce_scatter p2\n"
            "before n4 allgather g0\n"
            "before n4 wait g1\n"
            "after n4 release g1\n"
            "after n4 reduce_scatter p1\n"
            "before n5 wait g0\n"
            "after n5 release g0\n"
            "after n5 reduce_scatter p0\n");
  // Left exposed: the first gather, the regather of c after its forward
  // release, and the last reduce-scatter before the optimizer.
  EXPECT_DOUBLE_EQ(context_->sim().iteration_s, 0.022);
  EXPECT_DOUBLE_EQ(context_->sim().exposed_comm_s, 0.003);
  EXPECT_EQ(context_->sim().peak_bytes, 12145728);
}

TEST_F(PrefetchPassTest, Run_BudgetAtBaselinePeak_PullsGathersBackWithin) {
  Baseline("prefetch_chain.txt", PassTestHardware(0, kChainBaselinePeak));

  EXPECT_TRUE(RunPrefetch());

  // The backward prefetches would hold a second buffer at the backward
  // peak: they are pulled back to their use; the forward ones stay.
  EXPECT_EQ(ScheduleBody(context_->schedule()),
            "group g0 p0\n"
            "group g1 p1\n"
            "group g2 p2\n"
            "before n0 allgather g0\n"
            "before n0 allgather g1\n"
            "before n0 wait g0\n"
            "after n0 release g0\n"
            "before n1 allgather g2\n"
            "before n1 wait g1\n"
            "after n1 release g1\n"
            "before n2 wait g2\n"
            "after n2 release g2\n"
            "before n3 allgather g2\n"
            "before n3 wait g2\n"
            "after n3 release g2\n"
            "after n3 reduce_scatter p2\n"
            "before n4 allgather g1\n"
            "before n4 wait g1\n"
            "after n4 release g1\n"
            "after n4 reduce_scatter p1\n"
            "before n5 allgather g0\n"
            "before n5 wait g0\n"
            "after n5 release g0\n"
            "after n5 reduce_scatter p0\n");
  EXPECT_EQ(context_->sim().peak_bytes, kChainBaselinePeak);
  EXPECT_DOUBLE_EQ(context_->sim().iteration_s, 0.026);
}

TEST_F(PrefetchPassTest, Run_SecondTime_KeepsThePlan) {
  Baseline("prefetch_chain.txt", PassTestHardware());
  ASSERT_TRUE(RunPrefetch());
  const Schedule first = context_->schedule();

  EXPECT_FALSE(RunPrefetch());

  EXPECT_EQ(context_->schedule(), first);
}

TEST_F(PrefetchPassTest, Run_SmallNeighbouringNorms_FusesTheirGathers) {
  Baseline("prefetch_fusion.txt", PassTestHardware(/*latency_s=*/1e-3));

  EXPECT_TRUE(RunPrefetch());

  // g1 absorbs g2: one gather, waited for at the first use (norm1 forward,
  // norm2 backward), released after the last.
  EXPECT_EQ(ScheduleBody(context_->schedule()),
            "group g0 p0\n"
            "group g1 p1,p2\n"
            "group g3 p3\n"
            "before n0 allgather g0\n"
            "before n0 allgather g1\n"
            "before n0 allgather g3\n"
            "before n0 wait g0\n"
            "after n0 release g0\n"
            "before n1 wait g1\n"
            "after n2 release g1\n"
            "before n3 wait g3\n"
            "after n3 release g3\n"
            "before n4 allgather g3\n"
            "before n4 allgather g1\n"
            "before n4 allgather g0\n"
            "before n4 wait g3\n"
            "after n4 release g3\n"
            "after n4 reduce_scatter p3\n"
            "before n5 wait g1\n"
            "after n5 reduce_scatter p2\n"
            "after n6 release g1\n"
            "after n6 reduce_scatter p1\n"
            "before n7 wait g0\n"
            "after n7 release g0\n"
            "after n7 reduce_scatter p0\n");
  // Two latencies fewer on the communication stream.
  EXPECT_NEAR(baseline_.comm_s - context_->sim().comm_s, 0.002, 1e-9);
  EXPECT_DOUBLE_EQ(context_->sim().iteration_s, 0.0316);
}

TEST_F(PrefetchPassTest, Run_FusionGainOutOfReach_KeepsGroupsApart) {
  PlannerOptions options;
  // Fusing two latency-bound gathers saves just under half: never 60%.
  options.fusion_gain = 0.6;
  Baseline("prefetch_fusion.txt", PassTestHardware(1e-3), options);

  EXPECT_TRUE(RunPrefetch());

  EXPECT_EQ(context_->schedule().groups.size(), 4u);
  EXPECT_DOUBLE_EQ(context_->sim().comm_s, baseline_.comm_s);
}

TEST_F(PrefetchPassTest, Run_SingleRank_ReturnsFalse) {
  HardwareModel hw = PassTestHardware();
  hw.world_size = 1;
  Baseline("prefetch_chain.txt", hw);
  const Schedule before = context_->schedule();

  // Nothing moves over the wire, so nothing needs hiding.
  EXPECT_FALSE(RunPrefetch());

  EXPECT_EQ(context_->schedule(), before);
}

TEST_F(PrefetchPassTest, Run_Zero1Schedule_ReturnsFalse) {
  Baseline("prefetch_chain.txt", PassTestHardware());
  Zero1Pass zero1;
  ASSERT_TRUE(zero1.Run(*context_).ok());
  ASSERT_TRUE(context_->Resimulate().ok());
  const Schedule before = context_->schedule();

  EXPECT_FALSE(RunPrefetch());

  EXPECT_EQ(context_->schedule(), before);
}

}  // namespace
}  // namespace tandem
