#include "coordinator/passes/offload_pass.h"

#include <cstdint>
#include <memory>

#include "absl/strings/match.h"
#include "common/lowering/schedule_semantics.h"
#include "coordinator/passes/planning_context.h"
#include "coordinator/passes/unshard_pass.h"
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

// offload_lend.txt under zero3-insert: peak 38975616 bytes at the head's
// workspace; 27 ms of communication against 9 ms of compute.
constexpr int64_t kLendPeak = 38975616;

class OffloadLendTest : public ::testing::Test {
 protected:
  void Baseline(int64_t budget) {
    absl::StatusOr<Graph> graph = LoadPassGraph("offload_lend.txt");
    ASSERT_TRUE(graph.ok()) << graph.status();
    graph_ = *graph;
    PlannerOptions options;
    options.memory_margin = 0;
    context_ = std::make_unique<PlanningContext>(
        graph_, PassTestHardware(/*latency_s=*/0, budget), options);
    Zero3InsertPass pass;
    ASSERT_TRUE(pass.Run(*context_).ok());
    ASSERT_TRUE(context_->Resimulate().ok());
    baseline_ = context_->sim();
  }

  Graph graph_;
  std::unique_ptr<PlanningContext> context_;
  SimResult baseline_;
};

TEST_F(OffloadLendTest, Lend_ComputeBoundPlan_ReturnsFalse) {
  // offload_states.txt: 33 ms of communication against 47 ms of compute.
  absl::StatusOr<Graph> graph = LoadPassGraph("offload_states.txt");
  ASSERT_TRUE(graph.ok()) << graph.status();
  PlanningContext context(*graph, PassTestHardware());
  Zero3InsertPass insert;
  ASSERT_TRUE(insert.Run(context).ok());
  ASSERT_TRUE(context.Resimulate().ok());
  const Schedule before = context.schedule();
  OffloadPass lend(OffloadPass::Role::kLend);

  absl::StatusOr<bool> changed = lend.Run(context);

  ASSERT_TRUE(changed.ok()) << changed.status();
  EXPECT_FALSE(*changed);
  EXPECT_EQ(context.schedule(), before);
  EXPECT_EQ(lend.name(), "offload-lend");
}

TEST_F(OffloadLendTest, LendUnshardReturn_StatesMakeRoomForTwoBlocks) {
  // 1e6 bytes over the on-demand peak: only c (1e6) could be kept without
  // lending; with a's, b's and c's states (9e6) on the host at the turn, b
  // and c are kept.
  Baseline(kLendPeak + 1000000);
  ASSERT_EQ(baseline_.peak_bytes, kLendPeak);
  OffloadPass lend(OffloadPass::Role::kLend);
  UnshardPass unshard;
  OffloadPass give_back(OffloadPass::Role::kReturn);

  absl::StatusOr<bool> lent = lend.Run(*context_);
  ASSERT_TRUE(lent.ok()) << lent.status();
  EXPECT_TRUE(*lent);
  // 9e6 bytes of states out at the turn, 4e6 of them (a's) back already:
  // a's reload is chained back from the optimizer with every copy counted
  // three times (4e6 bytes: 12 ms), which lands before n1 on this 36 ms
  // timeline.
  EXPECT_EQ(context_->sim().peak_bytes, kLendPeak - 4001024);
  EXPECT_DOUBLE_EQ(context_->sim().iteration_s, baseline_.iteration_s);
  absl::StatusOr<bool> unsharded = unshard.Run(*context_);
  ASSERT_TRUE(unsharded.ok()) << unsharded.status();
  EXPECT_TRUE(*unsharded);
  // Nothing left over to return: 1 KiB of headroom, no entry that small.
  absl::StatusOr<bool> returned = give_back.Run(*context_);
  ASSERT_TRUE(returned.ok()) << returned.status();
  EXPECT_FALSE(*returned);

  // Offloads after the first node; reloads chained back from the
  // optimizer, largest first; b (g1) kept from n1 to n6 and c (g2) from n2
  // to n5, a (g0) gathered twice.
  EXPECT_EQ(ScheduleBody(context_->schedule()),
            "group g0 p0\n"
            "group g1 p1\n"
            "group g2 p2\n"
            "offload o0 p0 bytes=4000000\n"
            "offload o1 p1 bytes=4000000\n"
            "offload o2 p2 bytes=1000000\n"
            "before n0 allgather g0\n"
            "before n0 wait g0\n"
            "after n0 release g0\n"
            "after n0 offload o0\n"
            "after n0 offload o1\n"
            "after n0 offload o2\n"
            "before n1 reload o0\n"
            "before n1 allgather g1\n"
            "before n1 wait g1\n"
            "before n2 allgather g2\n"
            "before n2 wait g2\n"
            "after n5 release g2\n"
            "after n5 reduce_scatter p2\n"
            "before n6 reload o1\n"
            "after n6 release g1\n"
            "after n6 reduce_scatter p1\n"
            "before n7 reload o2\n"
            "before n7 allgather g0\n"
            "before n7 wait g0\n"
            "after n7 release g0\n"
            "after n7 reduce_scatter p0\n");
  EXPECT_TRUE(CheckScheduleSemantics(graph_, context_->schedule()).ok());
  // The lent plan's peak plus b's and c's full bytes (5e6), 1 KiB under
  // the budget.
  EXPECT_EQ(context_->sim().peak_bytes, kLendPeak - 4001024 + 5000000);
  // Two backward gathers of 4 ms and 1 ms saved; the 18 ms of copies
  // overlap.
  EXPECT_NEAR(baseline_.iteration_s - context_->sim().iteration_s, 0.006, 1e-9);
  EXPECT_NEAR(context_->sim().copy_s, 0.018, 1e-9);
}

TEST_F(OffloadLendTest, Return_NothingUsesTheLentRoom_RestoresThePlan) {
  Baseline(/*budget=*/0);
  const Schedule before = context_->schedule();
  OffloadPass lend(OffloadPass::Role::kLend);
  OffloadPass give_back(OffloadPass::Role::kReturn);
  ASSERT_TRUE(lend.Run(*context_).ok());
  ASSERT_FALSE(context_->schedule().offloads.empty());

  absl::StatusOr<bool> returned = give_back.Run(*context_);

  ASSERT_TRUE(returned.ok()) << returned.status();
  EXPECT_TRUE(*returned);
  // Every entry fits back under the budget: the on-demand plan again.
  EXPECT_EQ(context_->schedule(), before);
  EXPECT_EQ(give_back.name(), "offload-return");
}

}  // namespace
}  // namespace tandem
