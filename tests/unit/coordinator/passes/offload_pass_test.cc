#include "coordinator/passes/offload_pass.h"

#include <cstdint>
#include <memory>

#include "absl/strings/match.h"
#include "coordinator/analysis/schedule_invariants.h"
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

// offload_states.txt under zero3-insert: peak 40097152 bytes in backward;
// with every state on the host (reloaded before the optimizer) 32097152.
constexpr int64_t kStatesPeak = 40097152;
constexpr int64_t kFloorPeak = 32097152;

class OffloadPassTest : public ::testing::Test {
 protected:
  void Baseline(int64_t budget, bool zero1 = false) {
    absl::StatusOr<Graph> graph = LoadPassGraph("offload_states.txt");
    ASSERT_TRUE(graph.ok()) << graph.status();
    graph_ = *graph;
    context_ = std::make_unique<PlanningContext>(
        graph_, PassTestHardware(/*latency_s=*/0, budget));
    if (zero1) {
      Zero1Pass pass(/*bucket_bytes=*/3000000);
      ASSERT_TRUE(pass.Run(*context_).ok());
    } else {
      Zero3InsertPass pass;
      ASSERT_TRUE(pass.Run(*context_).ok());
    }
    ASSERT_TRUE(context_->Resimulate().ok());
    baseline_ = context_->sim();
  }

  Graph graph_;
  std::unique_ptr<PlanningContext> context_;
  SimResult baseline_;
};

TEST_F(OffloadPassTest, Run_PlanFits_ReturnsFalse) {
  Baseline(/*budget=*/0);
  const Schedule before = context_->schedule();
  OffloadPass offload;

  absl::StatusOr<bool> changed = offload.Run(*context_);

  ASSERT_TRUE(changed.ok()) << changed.status();
  EXPECT_FALSE(*changed);
  EXPECT_EQ(context_->schedule(), before);
}

TEST_F(OffloadPassTest, Run_StatesDoNotFit_OffloadsLargestParamOnly) {
  Baseline(/*budget=*/36000000);
  ASSERT_EQ(baseline_.peak_bytes, kStatesPeak);
  OffloadPass offload;

  absl::StatusOr<bool> changed = offload.Run(*context_);

  ASSERT_TRUE(changed.ok()) << changed.status();
  EXPECT_TRUE(*changed);
  // a's 8e6 bytes of states cover the 4.8e6 over the target; b and c
  // together (3e6) would not. Out after the first node; back for the
  // optimizer: chained back from its start (45 ms of compute) the copy
  // would start during a.bwd, where the peak is, so it waits for the
  // optimizer, whose stall the last reduce-scatter sets anyway.
  EXPECT_EQ(ScheduleBody(context_->schedule()),
            "group g0 p0\n"
            "group g1 p1\n"
            "group g2 p2\n"
            "offload o0 p0 bytes=8000000\n"
            "before n0 allgather g0\n"
            "before n0 wait g0\n"
            "after n0 release g0\n"
            "after n0 offload o0\n"
            "before n1 allgather g1\n"
            "before n1 wait g1\n"
            "after n1 release g1\n"
            "before n2 allgather g2\n"
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
            "after n5 reduce_scatter p0\n"
            "before n6 reload o0\n");
  EXPECT_TRUE(CheckScheduleSemantics(graph_, context_->schedule()).ok());
  ASSERT_TRUE(context_->Resimulate().ok());
  EXPECT_EQ(context_->sim().peak_bytes, kFloorPeak);
  EXPECT_DOUBLE_EQ(context_->sim().copy_s, 0.016);
  EXPECT_DOUBLE_EQ(context_->sim().iteration_s, baseline_.iteration_s);
}

TEST_F(OffloadPassTest, Run_Zero1StatesDoNotFit_Offloads) {
  Baseline(/*budget=*/38000000, /*zero1=*/true);
  ASSERT_GT(baseline_.peak_bytes, context_->budget());
  OffloadPass offload;

  absl::StatusOr<bool> changed = offload.Run(*context_);

  ASSERT_TRUE(changed.ok()) << changed.status();
  EXPECT_TRUE(*changed);
  ASSERT_TRUE(context_->Resimulate().ok());
  EXPECT_LE(context_->sim().peak_bytes, context_->budget());
  EXPECT_EQ(context_->schedule().mode, ShardingMode::kZero1);
  ASSERT_EQ(context_->schedule().offloads.size(), 1u);
  EXPECT_EQ(context_->schedule().offloads[0].param_ids,
            (std::vector<int32_t>{0}));
}

TEST_F(OffloadPassTest, Run_BudgetBelowFloor_NamesSmallestFeasibleBudget) {
  Baseline(/*budget=*/30000000);
  OffloadPass offload;

  absl::StatusOr<bool> changed = offload.Run(*context_);

  ASSERT_FALSE(changed.ok());
  EXPECT_EQ(changed.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(changed.status().message(),
            "budget 0.03 GiB is infeasible: even with all optimizer states "
            "offloaded the peak is 0.03 GiB; the smallest feasible budget is "
            "0.03 GiB (use memory.budget_bytes >= 32097152)");
}

TEST_F(OffloadPassTest, Run_BudgetAtFloor_Fits) {
  Baseline(/*budget=*/kFloorPeak);
  OffloadPass offload;

  absl::StatusOr<bool> changed = offload.Run(*context_);

  ASSERT_TRUE(changed.ok()) << changed.status();
  EXPECT_TRUE(*changed);
  ASSERT_TRUE(context_->Resimulate().ok());
  EXPECT_LE(context_->sim().peak_bytes, kFloorPeak);
  EXPECT_TRUE(CheckScheduleSemantics(graph_, context_->schedule()).ok());
}

}  // namespace
}  // namespace tandem
