#include "worker/models/builtin_models.h"

#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "ATen/ATen.h"
#include "common/models/graph_builder.h"
#include "common/models/model_config.h"
#include "gtest/gtest.h"
#include "worker/runtime/program.h"

namespace tandem {
namespace {

ModelConfig Config(const char* text) {
  absl::StatusOr<ModelConfig> c = ParseModelConfig(text);
  EXPECT_TRUE(c.ok()) << c.status();
  return *c;
}

// The graph the worker derives from its libtorch model is the builder's.
void ExpectSameGraphAsBuilder(const ModelConfig& config) {
  absl::StatusOr<Program> program = BuildModelProgram(config, 7);
  ASSERT_TRUE(program.ok()) << program.status();
  absl::StatusOr<Graph> derived =
      DeriveGraph(*program, config.world_size, config.grad_accum,
                  int64_t{config.micro_batch} * config.seq_len);
  ASSERT_TRUE(derived.ok()) << derived.status();
  absl::StatusOr<Graph> built = BuildModelGraph(config);
  ASSERT_TRUE(built.ok()) << built.status();

  EXPECT_EQ(derived->StructuralHash(), built->StructuralHash());
  ASSERT_EQ(derived->params.size(), built->params.size());
  for (size_t i = 0; i < built->params.size(); ++i) {
    EXPECT_EQ(derived->params[i], built->params[i])
        << "param " << i << ": worker " << derived->params[i].name
        << ", builder " << built->params[i].name;
  }
  ASSERT_EQ(derived->nodes.size(), built->nodes.size());
  for (size_t i = 0; i < built->nodes.size(); ++i) {
    const Node& a = derived->nodes[i];
    const Node& b = built->nodes[i];
    EXPECT_EQ(a.name, b.name);
    EXPECT_EQ(a.phase, b.phase);
    EXPECT_EQ(a.micro_batch, b.micro_batch);
    EXPECT_EQ(a.forward_id, b.forward_id);
    EXPECT_EQ(a.param_ids, b.param_ids) << a.name;
  }
  ASSERT_TRUE(AnnotateEstimates(*built, *derived).ok());
  EXPECT_EQ(*derived, *built);
}

TEST(BuiltinModelsTest, TinyLlama_GraphEqualsBuilderGraph) {
  ExpectSameGraphAsBuilder(Config("preset=tiny-llama"));
}

TEST(BuiltinModelsTest, TinyMoe_GraphEqualsBuilderGraph) {
  ExpectSameGraphAsBuilder(Config("preset=tiny-moe"));
}

TEST(BuiltinModelsTest, GradAccumAndGqa_GraphEqualsBuilderGraph) {
  ExpectSameGraphAsBuilder(
      Config("layers=3 d_model=48 heads=6 kv_heads=2 ffn=80 vocab=96 "
             "grad_accum=3 world=4"));
}

TEST(BuiltinModelsTest, ParamShapes_MatchTensorsTheForwardAccepts) {
  for (const char* text :
       {"layers=2 d_model=32 heads=4 kv_heads=2 ffn=48 vocab=64",
        "arch=moe layers=1 d_model=32 heads=4 kv_heads=4 ffn=24 vocab=64 "
        "experts=4 top_k=2"}) {
    const ModelConfig config = Config(text);
    absl::StatusOr<Program> program = BuildModelProgram(config, 1);
    ASSERT_TRUE(program.ok()) << program.status();
    std::vector<at::Tensor> full;
    for (const ProgramParam& p : program->params) {
      at::Tensor t = at::empty(p.shape, at::kFloat);
      p.init(t.data_ptr<float>(), t.numel());
      full.push_back(t.requires_grad_());
    }
    std::map<std::string, at::Tensor> values = {
        {"tokens", at::randint(config.vocab, {2, 8}, at::kLong)},
        {"targets", at::randint(config.vocab, {2, 8}, at::kLong)}};
    for (const ProgramNode& node : program->nodes) {
      std::vector<at::Tensor> params;
      for (int32_t id : node.param_ids) params.push_back(full[id]);
      std::vector<at::Tensor> in;
      for (const std::string& name : node.inputs) in.push_back(values.at(name));
      std::vector<at::Tensor> out = node.forward(in, params);
      ASSERT_EQ(out.size(), node.outputs.size());
      for (size_t o = 0; o < out.size(); ++o) values[node.outputs[o]] = out[o];
    }
    at::Tensor act = values.at(program->loss);
    // Small random init: the loss starts near log(vocab).
    EXPECT_NEAR(act.item<double>(), std::log(config.vocab), 0.3) << text;
    act.backward();
    for (size_t i = 0; i < full.size(); ++i) {
      EXPECT_TRUE(full[i].grad().defined()) << program->params[i].name;
    }
  }
}

TEST(BuiltinModelsTest, Init_SameSeedSameValues_DifferentSeedDifferent) {
  const ModelConfig config =
      Config("layers=1 d_model=16 heads=2 kv_heads=2 vocab=32");
  absl::StatusOr<Program> a = BuildModelProgram(config, 5);
  absl::StatusOr<Program> b = BuildModelProgram(config, 5);
  absl::StatusOr<Program> c = BuildModelProgram(config, 6);
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  std::vector<float> va(32 * 16), vb(32 * 16), vc(32 * 16);
  a->params[0].init(va.data(), 32 * 16);
  b->params[0].init(vb.data(), 32 * 16);
  c->params[0].init(vc.data(), 32 * 16);
  EXPECT_EQ(va, vb);
  EXPECT_NE(va, vc);
}

TEST(BuiltinModelsTest, UnsupportedConfigs_RejectedWithFieldNames) {
  ModelConfig config =
      Config("layers=1 d_model=16 heads=2 kv_heads=2 vocab=32");
  config.dtype = DType::kBF16;
  EXPECT_NE(BuildModelProgram(config, 1).status().message().find("dtype"),
            std::string::npos);
  config = Config("layers=1 d_model=12 heads=4 kv_heads=4 vocab=32");
  EXPECT_NE(BuildModelProgram(config, 1).status().message().find("even"),
            std::string::npos);
}

}  // namespace
}  // namespace tandem
