#include "coordinator/passes/gradient_reduction_pass.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>

#include "common/lowering/gradient_reduction.h"
#include "common/lowering/schedule_semantics.h"
#include "common/models/graph_builder.h"
#include "common/models/model_config.h"
#include "coordinator/passes/planning_context.h"
#include "coordinator/passes/unshard_pass.h"
#include "coordinator/passes/zero3_insert_pass.h"
#include "coordinator/planner/planner.h"

namespace tandem {
namespace {

using Role = GradientReductionPass::Role;

Graph Model(const std::string& text) {
  absl::StatusOr<ModelConfig> config = ParseModelConfig(text);
  EXPECT_TRUE(config.ok()) << config.status();
  absl::StatusOr<Graph> graph = BuildModelGraph(*config);
  EXPECT_TRUE(graph.ok()) << graph.status();
  return *graph;
}

// A four-layer llama on 8 ranks accumulating 4 micro-batches: its full
// gradients are a large part of the peak when accumulated.
Graph Accumulating(int grad_accum = 4) {
  return Model(
      "name=acc layers=4 d_model=512 heads=8 kv_heads=8 ffn=1536 vocab=4096 "
      "seq_len=128 micro_batch=1 world=8 dtype=bf16 grad_accum=" +
      std::to_string(grad_accum));
}

int CountReduction(const Graph& g, const Schedule& s, GradientReduction r) {
  const std::vector<GradientReduction> modes = GradientReductions(g, s);
  return static_cast<int>(std::count(modes.begin(), modes.end(), r));
}

class GradientReductionPassTest : public ::testing::Test {
 protected:
  // The on-demand baseline (gradients reduced once) under `budget`.
  void Baseline(const Graph& graph, int64_t budget) {
    graph_ = graph;
    HardwareModel hw = HardwareModel::H100(graph_.world_size);
    hw.budget_bytes = budget;
    context_ = std::make_unique<PlanningContext>(graph_, hw);
    Zero3InsertPass insert;
    ASSERT_TRUE(insert.Run(*context_).ok());
    ASSERT_TRUE(context_->Resimulate().ok());
    once_ = context_->sim();
    HardwareModel unlimited = hw;
    unlimited.budget_bytes = 0;
    PlanningContext all(graph_, unlimited);
    Zero3InsertPass per(GatherGrouping::kPerNode,
                        GradientReduction::kPerMicroBatch);
    ASSERT_TRUE(per.Run(all).ok());
    ASSERT_TRUE(all.Resimulate().ok());
    per_micro_batch_ = all.sim();
    if (graph_.micro_batches > 1) {
      ASSERT_LT(per_micro_batch_.peak_bytes, once_.peak_bytes);
    }
  }

  absl::StatusOr<bool> Run(Role role) {
    GradientReductionPass pass(role);
    absl::StatusOr<bool> changed = pass.Run(*context_);
    EXPECT_TRUE(CheckScheduleSemantics(graph_, context_->schedule()).ok())
        << CheckScheduleSemantics(graph_, context_->schedule());
    return changed;
  }

  Graph graph_;
  std::unique_ptr<PlanningContext> context_;
  SimResult once_;
  SimResult per_micro_batch_;
};

TEST_F(GradientReductionPassTest, Names) {
  EXPECT_EQ(GradientReductionPass(Role::kFit).name(), "micro-batch-reduce");
  EXPECT_EQ(GradientReductionPass(Role::kLend).name(),
            "micro-batch-reduce-lend");
  EXPECT_EQ(GradientReductionPass(Role::kReturn).name(),
            "micro-batch-reduce-return");
}

TEST_F(GradientReductionPassTest, Fit_OneMicroBatch_ChangesNothing) {
  Baseline(Accumulating(1), /*budget=*/1);
  const Schedule before = context_->schedule();
  for (Role role : {Role::kFit, Role::kLend, Role::kReturn}) {
    absl::StatusOr<bool> changed = Run(role);
    ASSERT_TRUE(changed.ok()) << changed.status();
    EXPECT_FALSE(*changed);
  }
  EXPECT_EQ(context_->schedule(), before);
}

TEST_F(GradientReductionPassTest, Fit_PlanFits_ChangesNothing) {
  Baseline(Accumulating(), /*budget=*/0);
  const Schedule before = context_->schedule();
  absl::StatusOr<bool> changed = Run(Role::kFit);
  ASSERT_TRUE(changed.ok()) << changed.status();
  EXPECT_FALSE(*changed);
  EXPECT_EQ(context_->schedule(), before);
}

// Halfway between the two peaks (plus the 2% margin): some groups, not all,
// are reduced per micro-batch, and the plan fits.
TEST_F(GradientReductionPassTest, Fit_OverBudget_SwitchesFewestThatFit) {
  const Graph graph = Accumulating();
  Baseline(graph, 0);
  const int64_t middle = (once_.peak_bytes + per_micro_batch_.peak_bytes) / 2;
  Baseline(graph, static_cast<int64_t>(static_cast<double>(middle) / 0.98));
  absl::StatusOr<bool> changed = Run(Role::kFit);
  ASSERT_TRUE(changed.ok()) << changed.status();
  EXPECT_TRUE(*changed);
  EXPECT_LE(context_->sim().peak_bytes, middle + 1);
  const int per = CountReduction(graph_, context_->schedule(),
                                 GradientReduction::kPerMicroBatch);
  const int once =
      CountReduction(graph_, context_->schedule(), GradientReduction::kOnce);
  EXPECT_GT(per, 0);
  EXPECT_GT(once, 0);
  // More link bytes than before, fewer than reducing everything per
  // micro-batch.
  EXPECT_GT(context_->sim().comm_s, once_.comm_s);
  EXPECT_LT(context_->sim().comm_s, per_micro_batch_.comm_s);
}

// Below even the all-per-micro-batch peak: everything is switched, offload
// takes it from there.
TEST_F(GradientReductionPassTest, Fit_NothingFits_SwitchesEverything) {
  const Graph graph = Accumulating();
  Baseline(graph, 0);
  Baseline(graph, per_micro_batch_.peak_bytes / 2);
  absl::StatusOr<bool> changed = Run(Role::kFit);
  ASSERT_TRUE(changed.ok()) << changed.status();
  EXPECT_TRUE(*changed);
  EXPECT_EQ(context_->sim().peak_bytes, per_micro_batch_.peak_bytes);
  EXPECT_EQ(
      CountReduction(graph_, context_->schedule(), GradientReduction::kOnce),
      0);
}

// Lend switches every gradient on a communication-bound plan; return with
// nothing to spend it on takes all of it back, and the plan is as fast as
// before.
TEST_F(GradientReductionPassTest, LendThenReturn_GivesBackUnusedMemory) {
  Baseline(Accumulating(), /*budget=*/0);
  ASSERT_GT(once_.comm_s, once_.compute_s);
  const Schedule before = context_->schedule();
  absl::StatusOr<bool> lent = Run(Role::kLend);
  ASSERT_TRUE(lent.ok()) << lent.status();
  EXPECT_TRUE(*lent);
  EXPECT_EQ(context_->sim().peak_bytes, per_micro_batch_.peak_bytes);
  absl::StatusOr<bool> returned = Run(Role::kReturn);
  ASSERT_TRUE(returned.ok()) << returned.status();
  EXPECT_TRUE(*returned);
  EXPECT_EQ(CountReduction(graph_, context_->schedule(),
                           GradientReduction::kPerMicroBatch),
            0);
  EXPECT_DOUBLE_EQ(context_->sim().iteration_s, once_.iteration_s);
  EXPECT_EQ(context_->sim().peak_bytes, once_.peak_bytes);
}

// Lend, unshard, return under a budget between the two peaks: unshard spends
// the lent memory, return keeps within the budget, and the plan is faster
// than reducing every gradient per micro-batch with nothing unsharded.
TEST_F(GradientReductionPassTest, LendUnshardReturn_StaysWithinBudget) {
  const Graph graph = Accumulating();
  Baseline(graph, 0);
  const int64_t budget = (once_.peak_bytes + per_micro_batch_.peak_bytes) / 2;
  Baseline(graph, budget);
  ASSERT_TRUE(Run(Role::kFit).ok());
  ASSERT_TRUE(Run(Role::kLend).ok());
  context_->set_peak_at_pass_start(context_->sim().peak_bytes);
  UnshardPass unshard;
  ASSERT_TRUE(unshard.Run(*context_).ok());
  ASSERT_TRUE(context_->Resimulate().ok());
  ASSERT_TRUE(Run(Role::kReturn).ok());
  EXPECT_LE(context_->sim().peak_bytes, budget);
  EXPECT_LT(context_->sim().iteration_s, per_micro_batch_.iteration_s);
}

// The case: Llama-3 70B on 32 ranks, grad_accum 4, sequence 2048,
// checkpointing. Accumulating every gradient needs about 147 GiB; Tandem
// fits 80 GiB by reducing gradients per micro-batch where it must, and the
// reference policies, which reduce every micro-batch, fit too.
TEST(GradientReductionPlanTest, Llama70bGradAccum4_FitsEightyGiB) {
  const Graph graph = Model(
      "preset=llama3-70b world=32 micro_batch=1 seq_len=2048 "
      "checkpointing=true grad_accum=4");
  const HardwareModel hw = HardwareModel::H100(32);
  for (Policy policy : AllPolicies()) {
    SCOPED_TRACE(PolicyName(policy));
    PlanOptions options;
    options.policy = policy;
    absl::StatusOr<PlanResult> plan = Plan(graph, hw, options);
    ASSERT_TRUE(plan.ok()) << plan.status();
    EXPECT_TRUE(CheckScheduleSemantics(graph, plan->schedule).ok());
    if (policy == Policy::kOnDemand) {
      EXPECT_FALSE(plan->feasible);  // accumulates every gradient
      continue;
    }
    EXPECT_TRUE(plan->feasible);
    EXPECT_LE(plan->sim.peak_bytes, hw.budget());
    const int per = CountReduction(graph, plan->schedule,
                                   GradientReduction::kPerMicroBatch);
    if (policy == Policy::kTandem) {
      EXPECT_GT(per, 0);
    } else {
      EXPECT_EQ(per, static_cast<int>(graph.params.size()));
    }
  }
}

}  // namespace
}  // namespace tandem
