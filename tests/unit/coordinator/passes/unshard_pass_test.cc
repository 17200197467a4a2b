#include "coordinator/passes/unshard_pass.h"

#include <algorithm>
#include <cstdint>
#include <memory>
#include <vector>

#include "common/lowering/schedule_semantics.h"
#include "coordinator/passes/planning_context.h"
#include "coordinator/passes/zero3_insert_pass.h"
#include "gtest/gtest.h"
#include "tests/unit/coordinator/passes/pass_test_util.h"

namespace tandem {
namespace {

using ::tandem::testing::LoadPassGraph;
using ::tandem::testing::PassTestHardware;
using ::tandem::testing::ScheduleBody;

// unshard_knapsack.txt's baseline peak (the head's workspace, no block
// gathered): budget = peak + 10e6 leaves room for exactly two blocks of
// 5e6 bytes, or the 4e6 one and one 5e6 one.
constexpr int64_t kKnapsackPeak = 69947136;
// unshard_hold.txt's baseline peak, in the head (nothing gathered): its
// 40 MiB workspace, param and gradient shards (2 x 2002000), f32 Adam states
// (8 x 500500) and three forward activations of 1 KiB.
constexpr int64_t kHoldPeak = 41943040 + 2 * 2002000 + 4004000 + 3 * 1024;

TEST(SolveKnapsackTest, SolveKnapsack_GreedyRatioOrderMisfits_PicksBetterPair) {
  // Best ratio first would take item 0 (2.5 per unit), then item 1, and stop
  // at item 2 with 22; the two larger items give 24.
  EXPECT_EQ(SolveKnapsack({10, 12, 12}, {4, 5, 5}, 10),
            (std::vector<int>{1, 2}));
}

TEST(SolveKnapsackTest, SolveKnapsack_NothingFits_ReturnsEmpty) {
  EXPECT_TRUE(SolveKnapsack({1, 2}, {11, 12}, 10).empty());
  EXPECT_TRUE(SolveKnapsack({0, -1}, {1, 1}, 10).empty());
}

TEST(SolveKnapsackTest, SolveKnapsack_ManyItems_MatchesExactOptimum) {
  // 40 items (the dynamic program): whole gigabytes from 3 to 9, valued one
  // latency plus their size, so small items have the best ratio.
  constexpr int64_t kGB = 1000000000;
  std::vector<double> values;
  std::vector<int64_t> costs;
  for (int i = 0; i < 40; ++i) {
    const int64_t gb = 3 + (i * 5) % 7;
    costs.push_back(gb * kGB);
    values.push_back(1.0 + static_cast<double>(gb));
  }
  const int64_t capacity_gb = 100;
  const std::vector<int> chosen =
      SolveKnapsack(values, costs, capacity_gb * kGB);

  int64_t cost = 0;
  double value = 0;
  for (int i : chosen) {
    cost += costs[i];
    value += values[i];
  }
  EXPECT_LE(cost, capacity_gb * kGB);
  // Exact optimum by a dynamic program over whole gigabytes.
  std::vector<double> best(capacity_gb + 1, 0.0);
  for (size_t i = 0; i < values.size(); ++i) {
    const int64_t w = costs[i] / kGB;
    for (int64_t c = capacity_gb; c >= w; --c) {
      best[c] = std::max(best[c], best[c - w] + values[i]);
    }
  }
  EXPECT_DOUBLE_EQ(value, best[capacity_gb]);
}

class UnshardPassTest : public ::testing::Test {
 protected:
  void Baseline(int64_t budget) {
    absl::StatusOr<Graph> graph = LoadPassGraph("unshard_knapsack.txt");
    ASSERT_TRUE(graph.ok()) << graph.status();
    graph_ = *graph;
    PlannerOptions options;
    options.memory_margin = 0;
    context_ = std::make_unique<PlanningContext>(
        graph_, PassTestHardware(/*latency_s=*/1e-3, budget), options);
    Zero3InsertPass insert;
    ASSERT_TRUE(insert.Run(*context_).ok());
    ASSERT_TRUE(context_->Resimulate().ok());
    baseline_ = context_->sim();
  }

  Graph graph_;
  std::unique_ptr<PlanningContext> context_;
  SimResult baseline_;
};

TEST_F(UnshardPassTest, Run_RoomForTwoOfThreeBlocks_UnshardsKnapsackChoice) {
  Baseline(kKnapsackPeak + 10000000);
  ASSERT_EQ(baseline_.peak_bytes, kKnapsackPeak);
  UnshardPass unshard;

  absl::StatusOr<bool> changed = unshard.Run(*context_);

  ASSERT_TRUE(changed.ok()) << changed.status();
  EXPECT_TRUE(*changed);
  // b and c (10e6 bytes, 12 ms of backward gathers saved) beat a and b
  // (9e6, 11 ms). Both are kept (bandwidth-bound: 5 ms of transfer against
  // 1 ms of latency), gathered before their forward node and released after
  // their backward node; their forward releases and backward gathers and
  // waits are gone.
  EXPECT_EQ(ScheduleBody(context_->schedule()),
            "group g0 p0\n"
            "group g1 p1\n"
            "group g2 p2\n"
            "before n0 allgather g0\n"
            "before n0 wait g0\n"
            "after n0 release g0\n"
            "before n1 allgather g1\n"
            "before n1 wait g1\n"
            "before n2 allgather g2\n"
            "before n2 wait g2\n"
            "after n5 release g2\n"
            "after n5 reduce_scatter p2\n"
            "after n6 release g1\n"
            "after n6 reduce_scatter p1\n"
            "before n7 allgather g0\n"
            "before n7 wait g0\n"
            "after n7 release g0\n"
            "after n7 reduce_scatter p0\n");
  EXPECT_TRUE(CheckScheduleSemantics(graph_, context_->schedule()).ok());
  ASSERT_TRUE(context_->Resimulate().ok());
  EXPECT_EQ(context_->sim().peak_bytes, kKnapsackPeak + 10000000);
  // The two backward gathers of 6 ms each are gone from a
  // communication-bound plan, and no refresh after the optimizer comes
  // instead (nothing is persistent).
  EXPECT_NEAR(baseline_.comm_s - context_->sim().comm_s, 0.012, 1e-9);
  EXPECT_LT(context_->sim().iteration_s, baseline_.iteration_s);
}

TEST_F(UnshardPassTest, Run_NoHeadroom_ReturnsFalse) {
  Baseline(kKnapsackPeak);
  const Schedule before = context_->schedule();
  UnshardPass unshard;

  absl::StatusOr<bool> changed = unshard.Run(*context_);

  ASSERT_TRUE(changed.ok()) << changed.status();
  EXPECT_FALSE(*changed);
  EXPECT_EQ(context_->schedule(), before);
}

TEST_F(UnshardPassTest, Run_RoomForEverything_UnshardsAllGroups) {
  Baseline(kKnapsackPeak + 20000000);
  UnshardPass unshard;

  absl::StatusOr<bool> changed = unshard.Run(*context_);

  ASSERT_TRUE(changed.ok()) << changed.status();
  EXPECT_TRUE(*changed);
  // All three blocks are kept (each bandwidth-bound), none persistent: one
  // gather each, before its forward node, and one release after its
  // backward node.
  EXPECT_EQ(ScheduleBody(context_->schedule()),
            "group g0 p0\n"
            "group g1 p1\n"
            "group g2 p2\n"
            "before n0 allgather g0\n"
            "before n0 wait g0\n"
            "before n1 allgather g1\n"
            "before n1 wait g1\n"
            "before n2 allgather g2\n"
            "before n2 wait g2\n"
            "after n5 release g2\n"
            "after n5 reduce_scatter p2\n"
            "after n6 release g1\n"
            "after n6 reduce_scatter p1\n"
            "after n7 release g0\n"
            "after n7 reduce_scatter p0\n");
  EXPECT_TRUE(context_->schedule().persistent_param_ids.empty());
  EXPECT_TRUE(CheckScheduleSemantics(graph_, context_->schedule()).ok());
  ASSERT_TRUE(context_->Resimulate().ok());
  EXPECT_LE(context_->sim().peak_bytes, context_->budget());
  // The three reduce-scatters (17 ms) and the three forward gathers (5, 6
  // and 6 ms) are left on the wire.
  EXPECT_NEAR(context_->sim().comm_s, 0.017 + 0.017, 1e-9);
  EXPECT_LT(context_->sim().iteration_s, baseline_.iteration_s);
}

TEST(UnshardPassHoldTest, Run_BlockAndNorm_KeepsBlockAndPersistsNorm) {
  absl::StatusOr<Graph> graph = LoadPassGraph("unshard_hold.txt");
  ASSERT_TRUE(graph.ok()) << graph.status();
  PlannerOptions options;
  options.memory_margin = 0;
  // Room for both: the block's 4e6 bytes and the norm's 4e3.
  PlanningContext context(
      *graph, PassTestHardware(/*latency_s=*/1e-3, kHoldPeak + 4004000),
      options);
  Zero3InsertPass insert;
  ASSERT_TRUE(insert.Run(context).ok());
  ASSERT_TRUE(context.Resimulate().ok());
  ASSERT_EQ(context.sim().peak_bytes, kHoldPeak);
  const SimResult baseline = context.sim();
  UnshardPass unshard;

  absl::StatusOr<bool> changed = unshard.Run(context);

  ASSERT_TRUE(changed.ok()) << changed.status();
  EXPECT_TRUE(*changed);
  // The block (gather 4 ms + 1 ms latency) is kept from n0 to a.bwd: its
  // backward gather is saved. The norm (4 us + 1 ms) is persistent: both
  // gathers saved, and its refresh after the step adds only 4 us.
  EXPECT_EQ(ScheduleBody(context.schedule()),
            "group g0 p0\n"
            "persistent p1\n"
            "before n0 allgather g0\n"
            "before n0 wait g0\n"
            "after n4 reduce_scatter p1\n"
            "after n5 release g0\n"
            "after n5 reduce_scatter p0\n");
  EXPECT_TRUE(CheckScheduleSemantics(*graph, context.schedule()).ok());
  ASSERT_TRUE(context.Resimulate().ok());
  EXPECT_LE(context.sim().peak_bytes, context.budget());
  // Gone: the block's backward gather (5 ms) and the norm's two gathers
  // (2 x 1.004 ms); added: the refresh of the norm (1.004 ms).
  EXPECT_NEAR(baseline.comm_s - context.sim().comm_s, 0.005 + 0.001004, 1e-9);
  EXPECT_LT(context.sim().iteration_s, baseline.iteration_s);
}

}  // namespace
}  // namespace tandem
