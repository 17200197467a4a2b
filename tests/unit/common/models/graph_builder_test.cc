#include "common/models/graph_builder.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/string_view.h"
#include "common/ir/graph.h"
#include "common/ir/text_format.h"
#include "common/ir/validate.h"
#include "common/models/model_config.h"
#include "gtest/gtest.h"

namespace tandem {
namespace {

ModelConfig Parse(absl::string_view text) {
  absl::StatusOr<ModelConfig> c = ParseModelConfig(text);
  EXPECT_TRUE(c.ok()) << c.status();
  return c.ok() ? *c : ModelConfig();
}

Graph Build(const ModelConfig& config) {
  absl::StatusOr<Graph> g = BuildModelGraph(config);
  EXPECT_TRUE(g.ok()) << g.status();
  return g.ok() ? *g : Graph();
}

Graph Build(absl::string_view text) { return Build(Parse(text)); }

// `base` with the overrides in `extra`.
ModelConfig With(absl::string_view base, absl::string_view extra) {
  absl::StatusOr<ModelConfig> c = ParseModelConfig(extra, Parse(base));
  EXPECT_TRUE(c.ok()) << c.status();
  return c.ok() ? *c : ModelConfig();
}

std::vector<std::string> NodeNames(const Graph& g) {
  std::vector<std::string> names;
  for (const Node& n : g.nodes) names.push_back(n.name);
  return names;
}

const Node& NodeNamed(const Graph& g, absl::string_view name) {
  for (const Node& n : g.nodes) {
    if (n.name == name) return n;
  }
  ADD_FAILURE() << "no node " << name;
  static const Node kMissing;
  return kMissing;
}

std::vector<std::string> ParamNames(const Graph& g,
                                    const std::vector<int32_t>& ids) {
  std::vector<std::string> names;
  for (int32_t id : ids) {
    const Param* p = g.FindParam(id);
    names.push_back(p == nullptr ? "?" : p->name);
  }
  return names;
}

// A small llama: d 16, 4 heads of 4, 2 kv heads, 2 layers.
constexpr char kSmallLlama[] =
    "name=small layers=2 d_model=16 heads=4 kv_heads=2 ffn=40 vocab=50 "
    "seq_len=8 micro_batch=2";
constexpr char kSmallMoe[] =
    "name=smoe arch=moe layers=1 d_model=16 heads=4 kv_heads=2 ffn=24 "
    "vocab=50 experts=4 top_k=2 seq_len=8 micro_batch=2";

void ExpectParamCountNear(absl::string_view preset, double published) {
  absl::StatusOr<ModelConfig> c = ModelPreset(preset);
  ASSERT_TRUE(c.ok());
  const Graph g = Build(*c);
  const double n = static_cast<double>(g.TotalParamNumel());
  EXPECT_NEAR(n / published, 1.0, 0.005) << preset << ": " << n;
}

TEST(BuildModelGraphTest, Llama3_8B_ParamCountMatchesPublished) {
  ExpectParamCountNear("llama3-8b", 8.03e9);
}

TEST(BuildModelGraphTest, Llama3_70B_ParamCountMatchesPublished) {
  ExpectParamCountNear("llama3-70b", 70.6e9);
}

TEST(BuildModelGraphTest, Mixtral8x7B_ParamCountMatchesPublished) {
  ExpectParamCountNear("mixtral-8x7b", 46.7e9);
}

TEST(BuildModelGraphTest, TinyPresets_HaveDocumentedParamCounts) {
  EXPECT_EQ(Build(*ModelPreset("tiny-llama")).TotalParamNumel(), 5'310'720);
  EXPECT_EQ(Build(*ModelPreset("tiny-moe")).TotalParamNumel(), 1'410'688);
}

TEST(BuildModelGraphTest, SmallLlama_ParamsHaveExactNamesShapesAndUnits) {
  const Graph g = Build(kSmallLlama);
  struct Expected {
    std::string name;
    std::vector<int64_t> shape;
    std::string unit;
  };
  std::vector<Expected> expected = {{"embed.weight", {50, 16}, "embed"}};
  for (int i = 0; i < 2; ++i) {
    const std::string l = "layers." + std::to_string(i);
    std::vector<Expected> layer = {
        {l + ".attn_norm.weight", {16}, l},
        {l + ".attn.wq.weight", {16, 16}, l},
        {l + ".attn.wk.weight", {8, 16}, l},
        {l + ".attn.wv.weight", {8, 16}, l},
        {l + ".attn.wo.weight", {16, 16}, l},
        {l + ".mlp_norm.weight", {16}, l},
        {l + ".mlp.w_gate.weight", {40, 16}, l},
        {l + ".mlp.w_up.weight", {40, 16}, l},
        {l + ".mlp.w_down.weight", {16, 40}, l},
    };
    expected.insert(expected.end(), layer.begin(), layer.end());
  }
  expected.push_back({"norm.weight", {16}, "head"});
  expected.push_back({"lm_head.weight", {50, 16}, "head"});

  ASSERT_EQ(g.params.size(), expected.size());
  for (size_t i = 0; i < expected.size(); ++i) {
    const Param& p = g.params[i];
    EXPECT_EQ(p.id, static_cast<int32_t>(i));
    EXPECT_EQ(p.name, expected[i].name);
    EXPECT_EQ(p.shape, expected[i].shape) << p.name;
    EXPECT_EQ(p.unit, expected[i].unit) << p.name;
    EXPECT_EQ(p.dtype, DType::kF32) << p.name;
  }
  // 2 * 50 * 16 + 2 * (2 * 16 + 2 * 256 + 2 * 128 + 3 * 640) + 16
  EXPECT_EQ(g.TotalParamNumel(), 1600 + 2 * 2720 + 16);
}

TEST(BuildModelGraphTest, SmallMoe_ExpertParamsAreStackedWithoutWeightSuffix) {
  const Graph g = Build(kSmallMoe);
  std::vector<std::string> names;
  std::vector<std::vector<int64_t>> shapes;
  for (const Param& p : g.params) {
    names.push_back(p.name);
    shapes.push_back(p.shape);
  }
  EXPECT_EQ(names,
            (std::vector<std::string>{
                "embed.weight", "layers.0.attn_norm.weight",
                "layers.0.attn.wq.weight", "layers.0.attn.wk.weight",
                "layers.0.attn.wv.weight", "layers.0.attn.wo.weight",
                "layers.0.mlp_norm.weight", "layers.0.moe.router.weight",
                "layers.0.moe.w_gate", "layers.0.moe.w_up",
                "layers.0.moe.w_down", "norm.weight", "lm_head.weight"}));
  EXPECT_EQ(shapes[7], (std::vector<int64_t>{4, 16}));
  EXPECT_EQ(shapes[8], (std::vector<int64_t>{4, 24, 16}));
  EXPECT_EQ(shapes[9], (std::vector<int64_t>{4, 24, 16}));
  EXPECT_EQ(shapes[10], (std::vector<int64_t>{4, 16, 24}));
}

TEST(BuildModelGraphTest, SmallLlama_GraphFieldsComeFromConfig) {
  const Graph g = Build(With(kSmallLlama, "world=4"));
  EXPECT_EQ(g.name, "small");
  EXPECT_EQ(g.world_size, 4);
  EXPECT_EQ(g.micro_batches, 1);
  EXPECT_EQ(g.tokens_per_micro_batch, 16);
}

TEST(BuildModelGraphTest, SmallLlama_NodesRunForwardThenMirroredBackward) {
  const Graph g = Build(kSmallLlama);
  EXPECT_EQ(
      NodeNames(g),
      (std::vector<std::string>{
          "embed", "layers.0.attn", "layers.0.mlp", "layers.1.attn",
          "layers.1.mlp", "norm", "lm_head", "loss", "loss.bwd", "lm_head.bwd",
          "norm.bwd", "layers.1.mlp.bwd", "layers.1.attn.bwd",
          "layers.0.mlp.bwd", "layers.0.attn.bwd", "embed.bwd", "optimizer"}));
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    const Node& n = g.nodes[i];
    EXPECT_EQ(n.id, static_cast<int32_t>(i));
    EXPECT_EQ(n.micro_batch, 0);
    EXPECT_FALSE(n.recompute) << n.name;
    const Phase want = i < 8    ? Phase::kForward
                       : i < 16 ? Phase::kBackward
                                : Phase::kOptimizer;
    EXPECT_EQ(n.phase, want) << n.name;
    if (n.phase == Phase::kBackward) {
      // Twins mirror around the middle: node 8 pairs with 7, 15 with 0.
      ASSERT_TRUE(n.forward_id.has_value()) << n.name;
      EXPECT_EQ(*n.forward_id, static_cast<int32_t>(15 - i)) << n.name;
      EXPECT_EQ(n.param_ids, g.nodes[15 - i].param_ids) << n.name;
    } else {
      EXPECT_FALSE(n.forward_id.has_value()) << n.name;
    }
  }
}

TEST(BuildModelGraphTest, SmallLlama_NodesReadTheirBlocksParams) {
  const Graph g = Build(kSmallLlama);
  EXPECT_EQ(ParamNames(g, NodeNamed(g, "embed").param_ids),
            (std::vector<std::string>{"embed.weight"}));
  EXPECT_EQ(ParamNames(g, NodeNamed(g, "layers.1.attn").param_ids),
            (std::vector<std::string>{
                "layers.1.attn_norm.weight", "layers.1.attn.wq.weight",
                "layers.1.attn.wk.weight", "layers.1.attn.wv.weight",
                "layers.1.attn.wo.weight"}));
  EXPECT_EQ(ParamNames(g, NodeNamed(g, "layers.0.mlp").param_ids),
            (std::vector<std::string>{
                "layers.0.mlp_norm.weight", "layers.0.mlp.w_gate.weight",
                "layers.0.mlp.w_up.weight", "layers.0.mlp.w_down.weight"}));
  EXPECT_EQ(ParamNames(g, NodeNamed(g, "norm").param_ids),
            (std::vector<std::string>{"norm.weight"}));
  EXPECT_EQ(ParamNames(g, NodeNamed(g, "lm_head.bwd").param_ids),
            (std::vector<std::string>{"lm_head.weight"}));
  EXPECT_TRUE(NodeNamed(g, "loss").param_ids.empty());
  EXPECT_TRUE(NodeNamed(g, "optimizer").param_ids.empty());
}

TEST(BuildModelGraphTest, SmallMoe_UsesMoeNodesWithRouterAndExperts) {
  const Graph g = Build(kSmallMoe);
  EXPECT_EQ(NodeNames(g), (std::vector<std::string>{
                              "embed", "layers.0.attn", "layers.0.moe", "norm",
                              "lm_head", "loss", "loss.bwd", "lm_head.bwd",
                              "norm.bwd", "layers.0.moe.bwd",
                              "layers.0.attn.bwd", "embed.bwd", "optimizer"}));
  EXPECT_EQ(
      ParamNames(g, NodeNamed(g, "layers.0.moe").param_ids),
      (std::vector<std::string>{
          "layers.0.mlp_norm.weight", "layers.0.moe.router.weight",
          "layers.0.moe.w_gate", "layers.0.moe.w_up", "layers.0.moe.w_down"}));
}

TEST(BuildModelGraphTest, GradAccum2_RunsPrefixedPassesThenOneOptimizer) {
  const Graph g = Build(With(kSmallLlama, "layers=1 grad_accum=2"));
  EXPECT_EQ(g.micro_batches, 2);
  ASSERT_EQ(g.nodes.size(), 25u);
  EXPECT_EQ(NodeNames(g), (std::vector<std::string>{"mb0.embed",
                                                    "mb0.layers.0.attn",
                                                    "mb0.layers.0.mlp",
                                                    "mb0.norm",
                                                    "mb0.lm_head",
                                                    "mb0.loss",
                                                    "mb0.loss.bwd",
                                                    "mb0.lm_head.bwd",
                                                    "mb0.norm.bwd",
                                                    "mb0.layers.0.mlp.bwd",
                                                    "mb0.layers.0.attn.bwd",
                                                    "mb0.embed.bwd",
                                                    "mb1.embed",
                                                    "mb1.layers.0.attn",
                                                    "mb1.layers.0.mlp",
                                                    "mb1.norm",
                                                    "mb1.lm_head",
                                                    "mb1.loss",
                                                    "mb1.loss.bwd",
                                                    "mb1.lm_head.bwd",
                                                    "mb1.norm.bwd",
                                                    "mb1.layers.0.mlp.bwd",
                                                    "mb1.layers.0.attn.bwd",
                                                    "mb1.embed.bwd",
                                                    "optimizer"}));
  for (int i = 0; i < 12; ++i) EXPECT_EQ(g.nodes[i].micro_batch, 0);
  for (int i = 12; i < 24; ++i) EXPECT_EQ(g.nodes[i].micro_batch, 1);
  EXPECT_EQ(NodeNamed(g, "mb1.embed.bwd").forward_id,
            NodeNamed(g, "mb1.embed").id);
  EXPECT_EQ(NodeNamed(g, "mb1.embed").flops, NodeNamed(g, "mb0.embed").flops);
  EXPECT_EQ(NodeNamed(g, "mb1.layers.0.mlp").activation_bytes,
            NodeNamed(g, "mb0.layers.0.mlp").activation_bytes);
  EXPECT_TRUE(ValidateGraph(g).ok()) << ValidateGraph(g);
}

TEST(BuildModelGraphTest, Checkpointing_RecomputesBlocksAndKeepsOnlyInputs) {
  const ModelConfig plain_config = Parse(kSmallLlama);
  const ModelConfig ckpt_config = With(kSmallLlama, "checkpointing=true");
  const Graph plain = Build(plain_config);
  const Graph ckpt = Build(ckpt_config);
  ASSERT_EQ(NodeNames(plain), NodeNames(ckpt));
  const int64_t input_bytes = 16 * 16 * 4;  // T * d * f32
  for (size_t i = 0; i < ckpt.nodes.size(); ++i) {
    const Node& n = ckpt.nodes[i];
    const Node& p = plain.nodes[i];
    const bool block =
        absl::StrContains(n.name, ".attn") || absl::StrContains(n.name, ".mlp");
    if (n.phase == Phase::kBackward) {
      EXPECT_EQ(n.recompute, block) << n.name;
      EXPECT_EQ(n.activation_bytes, 0) << n.name;
      const Node& fwd = plain.nodes[*n.forward_id];
      // The loss's backward holds two fp32 logit-sized tensors (T x vocab),
      // checkpointed or not.
      const int64_t loss_ws =
          absl::StrContains(n.name, "loss") ? 2 * 16 * 50 * 4 : 0;
      EXPECT_EQ(n.workspace_bytes, (block ? fwd.activation_bytes : 0) + loss_ws)
          << n.name;
      EXPECT_DOUBLE_EQ(n.flops, (block ? 3 : 2) * fwd.flops) << n.name;
      EXPECT_EQ(p.workspace_bytes, loss_ws) << n.name;
    } else if (n.phase == Phase::kForward) {
      EXPECT_FALSE(n.recompute);
      EXPECT_EQ(n.activation_bytes, block ? input_bytes : p.activation_bytes)
          << n.name;
      EXPECT_DOUBLE_EQ(n.flops, p.flops) << n.name;
    }
  }
  EXPECT_NE(plain.StructuralHash(), ckpt.StructuralHash());
  EXPECT_TRUE(ValidateGraph(ckpt).ok()) << ValidateGraph(ckpt);
}

TEST(BuildModelGraphTest, SmallLlama_ActivationBytesFollowFormulas) {
  // T = 16 tokens (b 2, s 8), d 16, heads 4 of hd 4, ffn 40, vocab 50, f32;
  // RMSNorm keeps 3d + 1 = 49 per token.
  const Graph g = Build(kSmallLlama);
  EXPECT_EQ(NodeNamed(g, "embed").activation_bytes, 16 * 8);
  // Plus the b * heads * s^2 probabilities, the s^2 mask, the rotary tables.
  EXPECT_EQ(
      NodeNamed(g, "layers.0.attn").activation_bytes,
      16 * (49 + 16 + 4 * 16) * 4 + 2 * 4 * 8 * 8 * 4 + 8 * 8 + 16 * 8 * 2);
  EXPECT_EQ(NodeNamed(g, "layers.0.mlp").activation_bytes,
            16 * (49 + 16 + 4 * 40) * 4);
  EXPECT_EQ(NodeNamed(g, "norm").activation_bytes, 16 * 49 * 4);
  EXPECT_EQ(NodeNamed(g, "lm_head").activation_bytes, 16 * 16 * 4);
  EXPECT_EQ(NodeNamed(g, "loss").activation_bytes, 16 * 50 * 4);
  EXPECT_EQ(NodeNamed(g, "loss.bwd").activation_bytes, 0);
}

TEST(BuildModelGraphTest, SmallMoe_ActivationBytesCountRoutedTokens) {
  const Graph g = Build(With(kSmallMoe, "dtype=bf16"));
  // T * (RMSNorm's 8d + 4 + 2d, the normed input 2d, fp32 router
  // probabilities and their sum (experts + 1) * 4) + T * top_k * ((3d + 4ffn
  // + 1) * 2 + 4 + 32)
  EXPECT_EQ(NodeNamed(g, "layers.0.moe").activation_bytes,
            16 * (8 * 16 + 4 + 2 * 16 + 2 * 16 + 5 * 4) +
                16 * 2 * ((48 + 96 + 1) * 2 + 4 + 32));
  // Below fp32 the embedding's backward accumulates in an fp32 [vocab, d].
  EXPECT_EQ(NodeNamed(g, "embed.bwd").workspace_bytes, 50 * 16 * 4);
  EXPECT_EQ(NodeNamed(Build(kSmallMoe), "embed.bwd").workspace_bytes, 0);
}

TEST(BuildModelGraphTest, SmallLlama_FlopsFollowFormulas) {
  // b 2, s 8, T 16, d 16, q 16, kv 8, ffn 40, vocab 50.
  const Graph g = Build(kSmallLlama);
  const double t = 16, d = 16, kv = 8, ffn = 40, vocab = 50;
  const double attn = 2 * t * d * d + 4 * t * d * kv + 2 * t * d * d +
                      2 * 2 * 8.0 * 8 * d + 5 * t * d;
  EXPECT_DOUBLE_EQ(NodeNamed(g, "layers.0.attn").flops, attn);
  EXPECT_DOUBLE_EQ(NodeNamed(g, "layers.0.mlp").flops,
                   6 * t * d * ffn + 4 * t * ffn + 5 * t * d);
  EXPECT_DOUBLE_EQ(NodeNamed(g, "lm_head").flops, 2 * t * d * vocab);
  EXPECT_DOUBLE_EQ(NodeNamed(g, "loss").flops, 4 * t * vocab);
  EXPECT_DOUBLE_EQ(NodeNamed(g, "norm").flops, 4 * t * d);
  EXPECT_DOUBLE_EQ(NodeNamed(g, "embed").flops, 0);
  EXPECT_DOUBLE_EQ(NodeNamed(g, "layers.0.mlp.bwd").flops,
                   2 * NodeNamed(g, "layers.0.mlp").flops);
  // AdamW: 10 FLOPs per element of this rank's shards.
  EXPECT_DOUBLE_EQ(NodeNamed(g, "optimizer").flops,
                   10.0 * static_cast<double>(g.TotalParamNumel()));
}

TEST(BuildModelGraphTest, SmallMoe_FlopsCountRouterAndTopKExperts) {
  const Graph g = Build(kSmallMoe);
  const double t = 16, d = 16, ffn = 24;
  EXPECT_DOUBLE_EQ(
      NodeNamed(g, "layers.0.moe").flops,
      2 * t * d * 4 + 2 * (6 * t * d * ffn + 4 * t * ffn) + 5 * t * d);
}

TEST(BuildModelGraphTest, Llama3_8B_TrainingFlopsAreAboutSixNT) {
  const ModelConfig c = *ModelPreset("llama3-8b");
  const Graph g = Build(c);
  const GraphSummary s = SummarizeGraph(g);
  const double six_nt = 6.0 * static_cast<double>(s.params) *
                        static_cast<double>(g.tokens_per_micro_batch);
  EXPECT_NEAR((s.forward_flops + s.backward_flops) / six_nt, 1.0, 0.25);
  EXPECT_DOUBLE_EQ(s.backward_flops, 2 * s.forward_flops);
}

TEST(BuildModelGraphTest, Llama3_70B_CheckpointingCostsAboutEightNT) {
  ModelConfig c = *ModelPreset("llama3-70b");
  c.activation_checkpointing = true;
  const Graph g = Build(c);
  const GraphSummary s = SummarizeGraph(g);
  const double nt = static_cast<double>(s.params) *
                    static_cast<double>(g.tokens_per_micro_batch);
  EXPECT_NEAR((s.forward_flops + s.backward_flops) / (8 * nt), 1.0, 0.25);
  // Checkpointing trades memory for compute: far less saved.
  const GraphSummary plain = SummarizeGraph(Build(*ModelPreset("llama3-70b")));
  EXPECT_LT(s.forward_activation_bytes, plain.forward_activation_bytes / 4);
  EXPECT_GT(s.backward_flops, plain.backward_flops);
}

TEST(BuildModelGraphTest, Times_FollowTheRoofline) {
  const ModelConfig c = *ModelPreset("llama3-8b");
  const Graph g = Build(c);
  // Large matmuls are compute-bound.
  const Node& mlp = NodeNamed(g, "layers.0.mlp");
  EXPECT_DOUBLE_EQ(mlp.time_s, mlp.flops / c.device_flops);
  // Norm and embed are memory-bound: slower than their FLOPs alone.
  const Node& norm = NodeNamed(g, "norm");
  EXPECT_GT(norm.time_s, norm.flops / c.device_flops);
  // T * d * bf16: read input, write output, save RMSNorm's 8d + 4 (fp32)
  // and 2d (bf16) bytes per token; plus the weight.
  EXPECT_DOUBLE_EQ(norm.time_s, (2.0 * 4096 * 4096 * 2 +
                                 4096.0 * (10 * 4096 + 4) + 4096 * 2) /
                                    c.device_bytes_per_s);
  EXPECT_GT(NodeNamed(g, "embed").time_s, 0);
  EXPECT_GT(NodeNamed(g, "optimizer").time_s, 0);
}

TEST(BuildModelGraphTest, Optimizer_TouchesShardStateOnce) {
  ModelConfig c = *ModelPreset("llama3-8b");
  c.world_size = 8;
  const Graph g = Build(c);
  double shard = 0;
  for (const Param& p : g.params) shard += p.shard_numel(8);
  const Node& opt = g.nodes.back();
  EXPECT_EQ(opt.name, "optimizer");
  EXPECT_EQ(opt.phase, Phase::kOptimizer);
  EXPECT_DOUBLE_EQ(opt.flops, 10 * shard);
  // bf16 param and grad, fp32 master and two moments, read and written.
  EXPECT_DOUBLE_EQ(opt.time_s,
                   shard * 2 * (2 + 2 + 4 + 8) / c.device_bytes_per_s);
}

TEST(BuildModelGraphTest, AllPresets_PassValidateGraph) {
  for (const std::string& name : ModelPresetNames()) {
    for (const char* extra :
         {"", "checkpointing=true", "grad_accum=3 world=16"}) {
      absl::StatusOr<ModelConfig> c =
          ParseModelConfig(std::string("preset=") + name + " " + extra);
      ASSERT_TRUE(c.ok()) << c.status();
      const Graph g = Build(*c);
      EXPECT_EQ(g.name, name);
      const absl::Status status = ValidateGraph(g);
      EXPECT_TRUE(status.ok()) << name << " " << extra << ": " << status;
    }
  }
}

TEST(BuildModelGraphTest, TinyPresets_RoundTripThroughTextFormat) {
  for (const char* name : {"tiny-llama", "tiny-moe"}) {
    ModelConfig c = *ModelPreset(name);
    c.grad_accum = 2;
    c.activation_checkpointing = true;
    const Graph g = Build(c);
    absl::StatusOr<Graph> parsed = ParseGraph(PrintGraph(g));
    ASSERT_TRUE(parsed.ok()) << name << ": " << parsed.status();
    EXPECT_TRUE(*parsed == g) << name;
  }
}

TEST(BuildModelGraphTest, InvalidConfig_ReturnsValidationError) {
  ModelConfig c = Parse(kSmallLlama);
  c.kv_heads = 3;
  absl::StatusOr<Graph> g = BuildModelGraph(c);
  ASSERT_FALSE(g.ok());
  EXPECT_EQ(g.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(g.status().message(), "kv_heads (3) must divide heads (4)");
}

TEST(BuildModelGraphTest, StructuralHash_ChangesWithLayers) {
  EXPECT_NE(Build(kSmallLlama).StructuralHash(),
            Build(With(kSmallLlama, "layers=3")).StructuralHash());
}

TEST(BuildModelGraphTest, StructuralHash_IgnoresDeviceRatesAndWorld) {
  const Graph base = Build(kSmallLlama);
  const Graph other = Build(
      With(kSmallLlama, "device_flops=1e12 device_bytes_per_s=1e9 world=8"));
  EXPECT_NE(base.nodes[1].time_s, other.nodes[1].time_s);
  EXPECT_EQ(base.StructuralHash(), other.StructuralHash());
}

TEST(BuildModelGraphTest, SameConfig_BuildsEqualGraphs) {
  EXPECT_EQ(Build(kSmallMoe), Build(kSmallMoe));
}

TEST(SummarizeGraphTest, SmallLlama_TotalsMatchNodeSums) {
  const Graph g = Build(With(kSmallLlama, "checkpointing=true"));
  const GraphSummary s = SummarizeGraph(g);
  double fwd = 0, bwd = 0, opt = 0, fwd_t = 0, bwd_t = 0, opt_t = 0;
  int64_t act = 0, ws = 0;
  for (const Node& n : g.nodes) {
    if (n.phase == Phase::kForward) {
      fwd += n.flops;
      fwd_t += n.time_s;
      act += n.activation_bytes;
    } else if (n.phase == Phase::kBackward) {
      bwd += n.flops;
      bwd_t += n.time_s;
    } else {
      opt += n.flops;
      opt_t += n.time_s;
    }
    ws = std::max(ws, n.workspace_bytes);
  }
  EXPECT_EQ(s.params, g.TotalParamNumel());
  EXPECT_EQ(s.param_bytes, 4 * g.TotalParamNumel());
  EXPECT_EQ(s.nodes, 17);
  EXPECT_DOUBLE_EQ(s.forward_flops, fwd);
  EXPECT_DOUBLE_EQ(s.backward_flops, bwd);
  EXPECT_DOUBLE_EQ(s.optimizer_flops, opt);
  EXPECT_DOUBLE_EQ(s.forward_time_s, fwd_t);
  EXPECT_DOUBLE_EQ(s.backward_time_s, bwd_t);
  EXPECT_DOUBLE_EQ(s.optimizer_time_s, opt_t);
  EXPECT_EQ(s.forward_activation_bytes, act);
  EXPECT_EQ(s.max_workspace_bytes, ws);
  // The largest workspace is a recomputed mlp: T * (4d + 1 + 4 ffn) * 4.
  EXPECT_EQ(s.max_workspace_bytes, 16 * (4 * 16 + 1 + 4 * 40) * 4);
}

TEST(SummarizeGraphTest, EmptyGraph_IsAllZero) {
  const GraphSummary s = SummarizeGraph(Graph());
  EXPECT_EQ(s.params, 0);
  EXPECT_EQ(s.nodes, 0);
  EXPECT_DOUBLE_EQ(s.forward_flops, 0);
  EXPECT_EQ(s.max_workspace_bytes, 0);
}

}  // namespace
}  // namespace tandem
