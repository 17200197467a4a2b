#include "common/ir/graph.h"

#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "tests/unit/common/test_graphs.h"

namespace tandem {
namespace {

using testing::TwoLayerGraph;

TEST(ParamTest, Numel_Shape_IsProduct) {
  Param p{0, "w", {3, 4, 5}, DType::kBF16, ""};
  EXPECT_EQ(p.numel(), 60);
  EXPECT_EQ(p.bytes(), 120);
}

TEST(ParamTest, ShardNumel_NotDivisible_PadsUp) {
  Param p{0, "w", {16}, DType::kF32, ""};
  EXPECT_EQ(p.shard_numel(1), 16);
  EXPECT_EQ(p.shard_numel(2), 8);
  EXPECT_EQ(p.shard_numel(3), 6);  // padded to 18
  EXPECT_EQ(p.shard_numel(32), 1);
}

TEST(ParamTest, Numel_Overflow_Saturates) {
  Param p{0, "w", {int64_t{1} << 40, int64_t{1} << 40}, DType::kF32, ""};
  EXPECT_EQ(p.numel(), INT64_MAX);
}

TEST(DTypeTest, NamesRoundTrip) {
  for (DType d : {DType::kF32, DType::kBF16, DType::kF16}) {
    EXPECT_EQ(ParseDType(DTypeName(d)), d);
  }
  EXPECT_EQ(DTypeBytes(DType::kF32), 4);
  EXPECT_EQ(DTypeBytes(DType::kBF16), 2);
  EXPECT_FALSE(ParseDType("fp32").has_value());
}

TEST(GraphTest, OptimizerStateBytesPerElement_ByDtype) {
  EXPECT_EQ(OptimizerStateBytesPerElement(DType::kF32), 8);
  EXPECT_EQ(OptimizerStateBytesPerElement(DType::kBF16), 12);
  EXPECT_EQ(OptimizerStateBytesPerElement(DType::kF16), 12);
}

TEST(GraphTest, StructuralHash_FixedGraph_IsStableAcrossReleases) {
  // Schedules persisted by the coordinator name graphs by this hash: a change
  // to the hash function orphans them. Update only with a format bump.
  EXPECT_EQ(TwoLayerGraph().StructuralHash(), "3a2c5952d9ab1c8f");
}

TEST(GraphTest, StructuralHash_IsSixteenHexDigits) {
  const std::string h = TwoLayerGraph().StructuralHash();
  ASSERT_EQ(h.size(), 16u);
  EXPECT_EQ(h.find_first_not_of("0123456789abcdef"), std::string::npos);
}

struct Mutation {
  const char* what;
  std::function<void(Graph&)> apply;
};

class HashChangesTest : public ::testing::TestWithParam<Mutation> {};

TEST_P(HashChangesTest, StructuralHash_StructuralChange_Changes) {
  Graph g = TwoLayerGraph();
  const std::string before = g.StructuralHash();
  GetParam().apply(g);
  EXPECT_NE(g.StructuralHash(), before) << GetParam().what;
}

INSTANTIATE_TEST_SUITE_P(
    AllStructure, HashChangesTest,
    ::testing::Values(
        Mutation{"param name", [](Graph& g) { g.params[1].name = "x"; }},
        Mutation{"param shape",
                 [](Graph& g) {
                   g.params[1].shape = {16, 17};
                 }},
        Mutation{"param rank", [](Graph& g) { g.params[1].shape = {256}; }},
        Mutation{"param dtype",
                 [](Graph& g) { g.params[1].dtype = DType::kBF16; }},
        Mutation{"param order",
                 [](Graph& g) { std::swap(g.params[1], g.params[2]); }},
        Mutation{"param removed", [](Graph& g) { g.params.pop_back(); }},
        Mutation{"node name", [](Graph& g) { g.nodes[1].name = "l0"; }},
        Mutation{"node phase",
                 [](Graph& g) { g.nodes[3].phase = Phase::kBackward; }},
        Mutation{"node order",
                 [](Graph& g) { std::swap(g.nodes[1], g.nodes[2]); }},
        Mutation{"node params", [](Graph& g) { g.nodes[1].param_ids = {1}; }},
        Mutation{"twin", [](Graph& g) { g.nodes[5].forward_id = 1; }},
        Mutation{"recompute", [](Graph& g) { g.nodes[5].recompute = true; }},
        Mutation{"micro-batch", [](Graph& g) { g.nodes[0].micro_batch = 1; }},
        Mutation{"micro_batches", [](Graph& g) { g.micro_batches = 2; }}),
    [](const auto& info) {
      std::string name = info.param.what;
      for (char& c : name) {
        if (!isalnum(static_cast<unsigned char>(c))) c = '_';
      }
      return name;
    });

TEST(GraphTest, StructuralHash_EstimatesAndWorld_DoNotChangeIt) {
  Graph g = TwoLayerGraph();
  const std::string before = g.StructuralHash();
  g.name = "renamed";
  g.world_size = 7;
  g.tokens_per_micro_batch = 1;
  g.params[0].unit = "other";
  for (Node& n : g.nodes) {
    n.time_s *= 3;
    n.flops += 1;
    n.activation_bytes += 8;
    n.workspace_bytes = 99;
  }
  EXPECT_EQ(g.StructuralHash(), before);
}

// A reduce dtype counts only where it changes what a trained param's
// gradient is reduced in: graphs from before it existed keep their hash.
TEST(GraphTest, StructuralHash_ReduceDType_CountsWhereItDiffers) {
  Graph g = TwoLayerGraph();
  for (Param& p : g.params) p.dtype = DType::kBF16;
  const std::string bf16 = g.StructuralHash();
  g.reduce_dtype = DType::kBF16;
  EXPECT_EQ(g.StructuralHash(), bf16);
  g.reduce_dtype = DType::kF32;
  EXPECT_NE(g.StructuralHash(), bf16);
  EXPECT_EQ(g.GradReduceDType(g.params[0]), DType::kF32);
  EXPECT_EQ(g.ReduceScatterBytes(g.params[0]),
            2 * g.params[0].shard_numel(g.world_size) * g.world_size * 2);
  // All f32: an f32 reduce is what they had.
  Graph f32 = TwoLayerGraph();
  for (Param& p : f32.params) p.dtype = DType::kF32;
  const std::string before = f32.StructuralHash();
  f32.reduce_dtype = DType::kF32;
  EXPECT_EQ(f32.StructuralHash(), before);
}

TEST(GraphTest, Find_KnownAndUnknownIds) {
  const Graph g = TwoLayerGraph();
  ASSERT_NE(g.FindParam(3), nullptr);
  EXPECT_EQ(g.FindParam(3)->name, "layers.1.w");
  EXPECT_EQ(g.FindParam(42), nullptr);
  ASSERT_NE(g.FindNode(8), nullptr);
  EXPECT_EQ(g.FindNode(8)->phase, Phase::kOptimizer);
  EXPECT_EQ(g.TotalParamNumel(), 1600 + 256 + 15 + 256);
}

TEST(GraphIndexTest, Positions_MatchVectorOrder) {
  Graph g = TwoLayerGraph();
  g.nodes[0].id = 1'000'000'000;  // sparse ids must not allocate densely
  const GraphIndex index(g);
  EXPECT_EQ(index.NodePos(1'000'000'000), 0);
  EXPECT_EQ(index.NodePos(8), 8);
  EXPECT_EQ(index.NodePos(0), -1);
  EXPECT_EQ(index.ParamPos(2), 2);
  EXPECT_EQ(index.ParamPos(-1), -1);
}

// The skeleton the worker and the coordinator both lay out: the same
// nodes as TwoLayerGraph's (names, phases, params, twins), so the same hash.
TEST(GraphTest, AppendIterationNodes_IsTheIterationSkeleton) {
  const Graph want = TwoLayerGraph();
  Graph g = want;
  g.nodes.clear();
  AppendIterationNodes({{"embed", {0}, false, 4096},
                        {"layers.0", {1, 2}, false, 8192},
                        {"layers.1", {3}, false, 0},
                        {"loss", {}, false, 0}},
                       g);
  ASSERT_EQ(g.nodes.size(), want.nodes.size());
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    SCOPED_TRACE(want.nodes[i].name);
    EXPECT_EQ(g.nodes[i].id, want.nodes[i].id);
    EXPECT_EQ(g.nodes[i].name, want.nodes[i].name);
    EXPECT_EQ(g.nodes[i].phase, want.nodes[i].phase);
    EXPECT_EQ(g.nodes[i].forward_id, want.nodes[i].forward_id);
    EXPECT_EQ(g.nodes[i].param_ids, want.nodes[i].param_ids);
  }
  EXPECT_EQ(g.StructuralHash(), want.StructuralHash());
  EXPECT_EQ(g.nodes[1].activation_bytes, 8192);
  EXPECT_EQ(g.nodes[6].activation_bytes, 0);  // layers.0.bwd

  // Two micro-batches, the first unit recomputed: mbK. prefixes, each
  // micro-batch's twins pointing at its own forward nodes, one optimizer.
  Graph two;
  two.micro_batches = 2;
  AppendIterationNodes({{"a", {0}, true, 10}, {"b", {}, false, 20}}, two);
  std::vector<std::string> names;
  for (const Node& n : two.nodes) names.push_back(n.name);
  EXPECT_EQ(names, (std::vector<std::string>{
                       "mb0.a", "mb0.b", "mb0.b.bwd", "mb0.a.bwd", "mb1.a",
                       "mb1.b", "mb1.b.bwd", "mb1.a.bwd", "optimizer"}));
  EXPECT_EQ(two.nodes[7].forward_id, 4);
  EXPECT_EQ(two.nodes[7].micro_batch, 1);
  EXPECT_TRUE(two.nodes[7].recompute);
  EXPECT_FALSE(two.nodes[6].recompute);
  EXPECT_EQ(two.nodes[8].phase, Phase::kOptimizer);
}

}  // namespace
}  // namespace tandem
