// Frozen params through every policy's pipeline and both sharding modes, at
// budgets that make the passes offload, unshard and reduce per micro-batch:
// every plan keeps the invariants, never reduces a frozen param, never
// offloads its (absent) optimizer state, and is priced without them.
#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/ir/validate.h"
#include "common/lowering/lowering.h"
#include "common/lowering/schedule_semantics.h"
#include "common/models/graph_builder.h"
#include "common/models/model_config.h"
#include "common/sim/simulator.h"
#include "coordinator/planner/planner.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tandem {
namespace {

// tiny-llama with two micro-batches, the embedding and the first block
// frozen (a fine-tuning job).
Graph FrozenTiny(std::vector<int32_t>* frozen) {
  absl::StatusOr<ModelConfig> config =
      ParseModelConfig("preset=tiny-llama world=4 grad_accum=2");
  EXPECT_TRUE(config.ok()) << config.status();
  absl::StatusOr<Graph> graph = BuildModelGraph(*config);
  EXPECT_TRUE(graph.ok()) << graph.status();
  for (Param& p : graph->params) {
    if (p.name == "embed.weight" || absl::StartsWith(p.name, "layers.0.")) {
      p.trainable = false;
      frozen->push_back(p.id);
    }
  }
  return *graph;
}

bool Contains(const std::vector<int32_t>& ids, int32_t id) {
  return std::find(ids.begin(), ids.end(), id) != ids.end();
}

void ExpectFrozenRespected(const Graph& graph, const Schedule& s,
                           const std::vector<int32_t>& frozen,
                           const std::string& what) {
  Schedule published = s;
  published.version = std::max<int64_t>(s.version, 0);
  EXPECT_TRUE(ValidateSchedule(published, graph).ok())
      << what << ": " << ValidateSchedule(published, graph);
  EXPECT_TRUE(CheckScheduleSemantics(graph, s).ok())
      << what << ": " << CheckScheduleSemantics(graph, s);
  for (const Action& a : s.actions) {
    if (a.kind != ActionKind::kReduceScatter) continue;
    for (int32_t id : a.param_ids) {
      EXPECT_FALSE(Contains(frozen, id)) << what << ": reduces p" << id;
    }
  }
  for (const OffloadEntry& o : s.offloads) {
    for (int32_t id : o.param_ids) {
      EXPECT_FALSE(Contains(frozen, id)) << what << ": offloads p" << id;
    }
  }
}

TEST(FrozenParamsPipelineTest,
     EveryPolicyAndBudget_KeepsFrozenParamsUnreduced) {
  std::vector<int32_t> frozen;
  const Graph graph = FrozenTiny(&frozen);
  ASSERT_GT(frozen.size(), 1u);
  // The budgets below make the passes do what could touch frozen params.
  int with_offloads = 0;
  int with_persistent = 0;
  int per_micro_batch = 0;
  for (ShardingMode mode : {ShardingMode::kZero3, ShardingMode::kZero1}) {
    HardwareModel hw = HardwareModel::H100(graph.world_size);
    absl::StatusOr<Schedule> start = StartingSchedule(graph, mode);
    ASSERT_TRUE(start.ok()) << start.status();
    absl::StatusOr<SimResult> baseline = Simulate(graph, *start, hw);
    ASSERT_TRUE(baseline.ok());
    absl::StatusOr<int64_t> smallest = SmallestFeasibleBudget(graph, hw, mode);
    ASSERT_TRUE(smallest.ok()) << smallest.status();
    // Unbounded, roomy (unshard), and between the least memory and the
    // baseline (offload, per-micro-batch reduction).
    for (int64_t budget : {int64_t{0}, 4 * baseline->peak_bytes,
                           (*smallest + baseline->peak_bytes) / 2}) {
      hw.budget_bytes = budget;
      for (Policy policy : AllPolicies()) {
        // The reference policies plan ZeRO-3 jobs only.
        if (mode == ShardingMode::kZero1 && policy != Policy::kTandem) continue;
        PlanOptions options;
        options.policy = policy;
        options.mode = mode;
        const std::string what =
            absl::StrCat(PolicyName(policy), " ", ShardingModeName(mode),
                         " budget ", budget);
        absl::StatusOr<PlanResult> result = Plan(graph, hw, options);
        ASSERT_TRUE(result.ok()) << what << ": " << result.status();
        ExpectFrozenRespected(graph, result->schedule, frozen, what);
        const Schedule& plan = result->schedule;
        with_offloads += plan.offloads.empty() ? 0 : 1;
        with_persistent +=
            mode == ShardingMode::kZero3 && !plan.persistent_param_ids.empty();
        for (const Action& a : plan.actions) {
          // One in the first micro-batch: reduced per micro-batch.
          if (a.kind == ActionKind::kReduceScatter &&
              a.node_id < static_cast<int32_t>(graph.nodes.size()) / 2) {
            ++per_micro_batch;
          }
        }
      }
    }
  }
  EXPECT_GT(with_offloads, 0);
  EXPECT_GT(with_persistent, 0);
  EXPECT_GT(per_micro_batch, 0);
}

TEST(FrozenParamsPipelineTest, FrozenGraph_SmallestBudgetDropsTheirStates) {
  std::vector<int32_t> frozen;
  const Graph frozen_graph = FrozenTiny(&frozen);
  Graph trained = frozen_graph;
  for (Param& p : trained.params) p.trainable = true;
  const HardwareModel hw = HardwareModel::H100(trained.world_size);
  absl::StatusOr<int64_t> trained_min = SmallestFeasibleBudget(trained, hw);
  absl::StatusOr<int64_t> frozen_min = SmallestFeasibleBudget(frozen_graph, hw);
  ASSERT_TRUE(trained_min.ok() && frozen_min.ok());
  // At least their gradient shards: the least-memory plan offloads every
  // state anyway, so states do not count at its peak.
  int64_t grad_shards = 0;
  for (int32_t id : frozen) {
    const Param& p = frozen_graph.params[id];
    grad_shards += p.shard_numel(trained.world_size) * DTypeBytes(p.dtype);
  }
  EXPECT_GE(*trained_min - *frozen_min, grad_shards);
}

}  // namespace
}  // namespace tandem
