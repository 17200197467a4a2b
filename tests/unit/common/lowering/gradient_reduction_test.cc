// Gradient reduction under gradient accumulation: the two patterns a
// schedule may use (reduce once after the last micro-batch, or once per
// micro-batch), what the semantic check accepts and rejects, the lowering of
// both, the rewrite between them, and what the simulator charges for each.
#include "common/lowering/gradient_reduction.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "common/lowering/lowering.h"
#include "common/lowering/schedule_semantics.h"
#include "common/models/graph_builder.h"
#include "common/models/model_config.h"
#include "common/sim/hardware_model.h"
#include "common/sim/simulator.h"

namespace tandem {
namespace {

using ::testing::HasSubstr;

Graph Accumulating(int grad_accum, const std::string& dtype = "f32") {
  absl::StatusOr<ModelConfig> config = ParseModelConfig(
      "preset=tiny-llama world=4 grad_accum=" + std::to_string(grad_accum) +
      " dtype=" + dtype);
  EXPECT_TRUE(config.ok()) << config.status();
  absl::StatusOr<Graph> graph = BuildModelGraph(*config);
  EXPECT_TRUE(graph.ok()) << graph.status();
  return *graph;
}

// Number of REDUCE_SCATTERs naming `id`.
int Reduces(const Schedule& s, int32_t id) {
  int n = 0;
  for (const Action& a : s.actions) {
    if (a.kind != ActionKind::kReduceScatter) continue;
    n += static_cast<int>(
        std::count(a.param_ids.begin(), a.param_ids.end(), id));
  }
  return n;
}

TEST(GradientReductionTest, Productions_OneRunPerMicroBatch) {
  const Graph g = Accumulating(3);
  const auto productions = GradientProductions(g);
  ASSERT_EQ(productions.size(), g.params.size());
  for (const auto& runs : productions) {
    ASSERT_EQ(runs.size(), 3u);
    for (int k = 0; k < 3; ++k) {
      EXPECT_EQ(runs[k].micro_batch, k);
      EXPECT_LE(runs[k].first_pos, runs[k].last_pos);
      if (k > 0) EXPECT_LT(runs[k - 1].last_pos, runs[k].first_pos);
    }
  }
}

TEST(GradientReductionTest, LowerZero3_BothPatternsPassTheCheck) {
  const Graph g = Accumulating(3);
  const Schedule once = LowerZero3(g, {});
  const Schedule per = LowerZero3(g, {}, GatherGrouping::kPerNode,
                                  GradientReduction::kPerMicroBatch);
  EXPECT_TRUE(CheckScheduleSemantics(g, once).ok())
      << CheckScheduleSemantics(g, once);
  EXPECT_TRUE(CheckScheduleSemantics(g, per).ok())
      << CheckScheduleSemantics(g, per);
  for (const Param& p : g.params) {
    EXPECT_EQ(Reduces(once, p.id), 1) << p.name;
    EXPECT_EQ(Reduces(per, p.id), 3) << p.name;
  }
  for (GradientReduction r : GradientReductions(g, once)) {
    EXPECT_EQ(r, GradientReduction::kOnce);
  }
  for (GradientReduction r : GradientReductions(g, per)) {
    EXPECT_EQ(r, GradientReduction::kPerMicroBatch);
  }
  // One micro-batch: both are the same schedule.
  const Graph single = Accumulating(1);
  EXPECT_EQ(LowerZero3(single, {}),
            LowerZero3(single, {}, GatherGrouping::kPerNode,
                       GradientReduction::kPerMicroBatch));
}

TEST(GradientReductionTest, SetGradientReduction_RoundTripsAndMixes) {
  const Graph g = Accumulating(2);
  const Schedule once = LowerZero3(g, {});
  const Schedule per = LowerZero3(g, {}, GatherGrouping::kPerNode,
                                  GradientReduction::kPerMicroBatch);
  std::vector<int32_t> all;
  for (const Param& p : g.params) all.push_back(p.id);

  Schedule s = once;
  SetGradientReduction(g, all, GradientReduction::kPerMicroBatch, s);
  // Each param joins the REDUCE_SCATTER after its producing node, as the
  // lowering places it (the order inside one collective may differ).
  ASSERT_EQ(s.actions.size(), per.actions.size());
  for (size_t i = 0; i < s.actions.size(); ++i) {
    Action a = s.actions[i];
    Action b = per.actions[i];
    std::sort(a.param_ids.begin(), a.param_ids.end());
    std::sort(b.param_ids.begin(), b.param_ids.end());
    EXPECT_EQ(a, b) << i;
  }
  SetGradientReduction(g, all, GradientReduction::kOnce, s);
  EXPECT_TRUE(CheckScheduleSemantics(g, s).ok());
  for (const Param& p : g.params) EXPECT_EQ(Reduces(s, p.id), 1);

  // Half and half: still one valid pattern per param.
  std::vector<int32_t> half;
  for (size_t i = 0; i < g.params.size(); i += 2)
    half.push_back(g.params[i].id);
  s = once;
  SetGradientReduction(g, half, GradientReduction::kPerMicroBatch, s);
  EXPECT_TRUE(CheckScheduleSemantics(g, s).ok())
      << CheckScheduleSemantics(g, s);
  const std::vector<GradientReduction> modes = GradientReductions(g, s);
  for (size_t i = 0; i < g.params.size(); ++i) {
    EXPECT_EQ(modes[i], i % 2 == 0 ? GradientReduction::kPerMicroBatch
                                   : GradientReduction::kOnce);
  }
}

// Index of the first REDUCE_SCATTER naming `id`.
size_t FirstReduceOf(const Schedule& s, int32_t id) {
  for (size_t i = 0; i < s.actions.size(); ++i) {
    const Action& a = s.actions[i];
    if (a.kind == ActionKind::kReduceScatter &&
        std::count(a.param_ids.begin(), a.param_ids.end(), id) > 0) {
      return i;
    }
  }
  ADD_FAILURE() << "p" << id << " is never reduced";
  return 0;
}

TEST(GradientReductionTest, Check_RejectsMissingDoubleAndMixedContributions) {
  const Graph g = Accumulating(3);
  const int32_t id = g.params[1].id;
  const auto runs = GradientProductions(g)[1];
  const Schedule per = LowerZero3(g, {}, GatherGrouping::kPerNode,
                                  GradientReduction::kPerMicroBatch);

  // Two of three micro-batches reduced: micro-batch 2 would be lost (or, read
  // the other way, 0 and 1 reduced twice).
  Schedule s = per;
  s.actions.push_back(s.actions[FirstReduceOf(s, id)]);
  absl::Status status = CheckReduceOnce(g, s);
  EXPECT_THAT(std::string(status.message()), HasSubstr("reduced 4 times"));
  EXPECT_THAT(std::string(status.message()),
              HasSubstr("or once per micro-batch (3)"));

  s = per;
  s.actions[FirstReduceOf(s, id)].param_ids = {id};
  s.actions.erase(s.actions.begin() + FirstReduceOf(s, id));
  std::vector<Violation> found = FindReduceViolations(g, s);
  ASSERT_FALSE(found.empty());
  EXPECT_EQ(found[0].kind, ViolationKind::kReduceCount);

  // Micro-batch 0's reduce-scatter moved into micro-batch 1's backward,
  // after its first producer: it would take part of micro-batch 1 too.
  s = per;
  Action& first = s.actions[FirstReduceOf(s, id)];
  first.param_ids.erase(
      std::find(first.param_ids.begin(), first.param_ids.end(), id));
  s.actions.push_back({ActionKind::kReduceScatter,
                       g.nodes[runs[1].first_pos].id,
                       AnchorPosition::kAfter,
                       0,
                       {id},
                       0});
  found = FindReduceViolations(g, s);
  ASSERT_EQ(found.size(), 1u) << found[0].message;
  EXPECT_EQ(found[0].kind, ViolationKind::kReduceMixesMicroBatches);
  EXPECT_THAT(found[0].message, HasSubstr("part of two micro-batches"));

  // ... and before its first producer of micro-batch 1 it is fine.
  s.actions.back().position = AnchorPosition::kBefore;
  EXPECT_TRUE(FindReduceViolations(g, s).empty());

  // A per-micro-batch reduce-scatter before its micro-batch is complete.
  s = per;
  Action& early = s.actions[FirstReduceOf(s, id)];
  early.param_ids.erase(
      std::find(early.param_ids.begin(), early.param_ids.end(), id));
  s.actions.push_back({ActionKind::kReduceScatter,
                       g.nodes[runs[0].first_pos].id,
                       AnchorPosition::kBefore,
                       0,
                       {id},
                       0});
  found = FindReduceViolations(g, s);
  ASSERT_EQ(found.size(), 1u);
  EXPECT_EQ(found[0].kind, ViolationKind::kReduceTooEarly);
  EXPECT_THAT(found[0].message, HasSubstr("micro-batch 0"));

  // A single reduce-scatter after micro-batch 0 only: too early for "once".
  s = LowerZero3(g, {});
  Action& lone = s.actions[FirstReduceOf(s, id)];
  lone.param_ids.erase(
      std::find(lone.param_ids.begin(), lone.param_ids.end(), id));
  s.actions.push_back({ActionKind::kReduceScatter,
                       g.nodes[runs[0].last_pos].id,
                       AnchorPosition::kAfter,
                       0,
                       {id},
                       0});
  found = FindReduceViolations(g, s);
  ASSERT_EQ(found.size(), 1u);
  EXPECT_EQ(found[0].kind, ViolationKind::kReduceTooEarly);
}

// Per micro-batch, the full gradients live within one micro-batch (less
// memory) and K times the bytes cross the link; a bf16 param's shard
// accumulator is fp32.
TEST(GradientReductionTest, Simulator_PerMicroBatchTradesLinkBytesForMemory) {
  for (const char* dtype : {"f32", "bf16"}) {
    const Graph g = Accumulating(4, dtype);
    const HardwareModel hw = HardwareModel::H100(4);
    absl::StatusOr<SimResult> once = Simulate(g, LowerZero3(g, {}), hw);
    absl::StatusOr<SimResult> per =
        Simulate(g,
                 LowerZero3(g, {}, GatherGrouping::kPerNode,
                            GradientReduction::kPerMicroBatch),
                 hw);
    ASSERT_TRUE(once.ok() && per.ok());
    int64_t full = 0, padded = 0, shard_elems = 0;
    for (const Param& p : g.params) {
      full += p.bytes();
      padded += p.shard_numel(4) * 4 * DTypeBytes(p.dtype);
      shard_elems += p.shard_numel(4);
    }
    double once_rs = 0, per_rs = 0;
    int64_t once_bytes = 0, per_bytes = 0;
    for (const CollectiveTimelineEntry& c : once->collectives) {
      if (c.kind != ActionKind::kReduceScatter) continue;
      once_rs += c.end_s - c.start_s;
      once_bytes += c.bytes;
    }
    for (const CollectiveTimelineEntry& c : per->collectives) {
      if (c.kind != ActionKind::kReduceScatter) continue;
      per_rs += c.end_s - c.start_s;
      per_bytes += c.bytes;
    }
    EXPECT_EQ(once_bytes, padded) << dtype;
    EXPECT_EQ(per_bytes, 4 * padded) << dtype;
    EXPECT_GT(per_rs, 3 * once_rs) << dtype;
    // Accumulated once, every full gradient is alive at the peak (in the last
    // micro-batch); per micro-batch, at most one micro-batch's.
    EXPECT_LT(per->peak_bytes, once->peak_bytes) << dtype;
    const int64_t accumulator =
        std::string(dtype) == "bf16" ? shard_elems * 2 : 0;
    EXPECT_EQ(once->peak_breakdown.gradients,
              full + shard_elems * DTypeBytes(g.params[0].dtype))
        << dtype;
    EXPECT_LE(per->peak_breakdown.gradients,
              full + shard_elems * DTypeBytes(g.params[0].dtype) + accumulator)
        << dtype;
    EXPECT_GE(per->peak_breakdown.gradients,
              shard_elems * DTypeBytes(g.params[0].dtype) + accumulator)
        << dtype;
  }
}

// bf16 params reduced in f32: the reduce-scatters move f32 and the gradient
// shards are f32 (reduced once, or accumulated per micro-batch); in bf16
// they move half the bytes, and only an accumulated shard is f32.
TEST(GradientReductionTest, Simulator_ReduceDType_SetsLinkAndShardBytes) {
  for (const char* reduce : {"bf16", "f32"}) {
    absl::StatusOr<ModelConfig> config =
        ParseModelConfig(std::string("preset=tiny-llama world=4 grad_accum=2 "
                                     "dtype=bf16 reduce_dtype=") +
                         reduce);
    ASSERT_TRUE(config.ok()) << config.status();
    absl::StatusOr<Graph> g = BuildModelGraph(*config);
    ASSERT_TRUE(g.ok()) << g.status();
    const int64_t elem = std::string(reduce) == "f32" ? 4 : 2;
    int64_t full = 0, shard_elems = 0;
    for (const Param& p : g->params) {
      full += p.bytes();
      shard_elems += p.shard_numel(4);
    }
    const HardwareModel hw = HardwareModel::H100(4);
    absl::StatusOr<SimResult> once = Simulate(*g, LowerZero3(*g, {}), hw);
    absl::StatusOr<SimResult> per =
        Simulate(*g,
                 LowerZero3(*g, {}, GatherGrouping::kPerNode,
                            GradientReduction::kPerMicroBatch),
                 hw);
    ASSERT_TRUE(once.ok() && per.ok());
    int64_t once_bytes = 0;
    for (const CollectiveTimelineEntry& c : once->collectives) {
      if (c.kind == ActionKind::kReduceScatter) once_bytes += c.bytes;
    }
    EXPECT_EQ(once_bytes, shard_elems * 4 * elem) << reduce;
    EXPECT_EQ(once->peak_breakdown.gradients, full + shard_elems * elem)
        << reduce;
    // Accumulated per micro-batch: fp32 shards whatever the reduce dtype.
    EXPECT_GE(per->peak_breakdown.gradients, shard_elems * 4) << reduce;
    EXPECT_LE(per->peak_breakdown.gradients, full + shard_elems * 4) << reduce;
  }
}

}  // namespace
}  // namespace tandem
