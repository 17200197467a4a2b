#include "coordinator/passes/unshard_pass.h"

#include <algorithm>
#include <cstdint>
#include <memory>
#include <vector>

#include "coordinator/analysis/schedule_invariants.h"
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
  // b and c (10e6 bytes, 24 ms of gathers) beat a and b (9e6, 22 ms).
  EXPECT_EQ(ScheduleBody(context_->schedule()),
            "group g0 p0\n"
            "persistent p1,p2\n"
            "before n0 allgather g0\n"
            "before n0 wait g0\n"
            "after n0 release g0\n"
            "after n5 reduce_scatter p2\n"
            "after n6 reduce_scatter p1\n"
            "before n7 allgather g0\n"
            "before n7 wait g0\n"
            "after n7 release g0\n"
            "after n7 reduce_scatter p0\n");
  EXPECT_TRUE(CheckScheduleSemantics(graph_, context_->schedule()).ok());
  ASSERT_TRUE(context_->Resimulate().ok());
  EXPECT_EQ(context_->sim().peak_bytes, kKnapsackPeak + 10000000);
  // Four gathers of 6 ms each are gone from a communication-bound plan; the
  // fused refresh of b and c after the optimizer (11 ms) comes instead.
  EXPECT_NEAR(baseline_.comm_s - context_->sim().comm_s, 0.024 - 0.011, 1e-9);
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
  EXPECT_TRUE(context_->schedule().groups.empty());
  EXPECT_EQ(context_->schedule().persistent_param_ids,
            (std::vector<int32_t>{0, 1, 2}));
  EXPECT_TRUE(CheckScheduleSemantics(graph_, context_->schedule()).ok());
  ASSERT_TRUE(context_->Resimulate().ok());
  EXPECT_LE(context_->sim().peak_bytes, context_->budget());
  // The three reduce-scatters and one refresh of all params (15 ms) are
  // left on the wire.
  EXPECT_NEAR(context_->sim().comm_s, 0.017 + 0.015, 1e-9);
}

}  // namespace
}  // namespace tandem
