#include "worker/models/builtin_models.h"

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "ATen/ATen.h"
#include "absl/strings/str_cat.h"
#include "common/models/graph_builder.h"
#include "common/models/model_config.h"
#include "gtest/gtest.h"
#include "tests/unit/common/test_safetensors.h"
#include "worker/models/init_from.h"
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
    EXPECT_EQ(a.recompute, b.recompute) << a.name;
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

// Mixed precision: bf16 params, and the reduce dtype where it differs.
TEST(BuiltinModelsTest, MixedPrecision_GraphEqualsBuilderGraph) {
  for (const char* text : {"preset=tiny-llama dtype=bf16",
                           "preset=tiny-moe dtype=bf16 reduce_dtype=f32",
                           "preset=tiny-llama dtype=bf16 reduce_dtype=bf16"}) {
    SCOPED_TRACE(text);
    const ModelConfig config = Config(text);
    ExpectSameGraphAsBuilder(config);
    absl::StatusOr<Graph> built = BuildModelGraph(config);
    ASSERT_TRUE(built.ok());
    EXPECT_EQ(built->params[0].dtype, DType::kBF16);
    EXPECT_EQ(built->GradReduceDType(built->params[0]),
              config.reduce_dtype.value_or(DType::kBF16));
  }
}

// Activation checkpointing: the attn and mlp/moe nodes are marked
// recompute, and so are their backward twins in the derived graph, as the
// builder marks them.
TEST(BuiltinModelsTest, Checkpointing_GraphEqualsBuilderGraph) {
  for (const char* text :
       {"preset=tiny-llama checkpointing=true",
        "preset=tiny-moe checkpointing=true grad_accum=2",
        "layers=3 d_model=48 heads=6 kv_heads=2 ffn=80 vocab=96 grad_accum=3 "
        "world=4 checkpointing=true"}) {
    SCOPED_TRACE(text);
    const ModelConfig config = Config(text);
    ExpectSameGraphAsBuilder(config);
    absl::StatusOr<Program> program = BuildModelProgram(config, 7);
    ASSERT_TRUE(program.ok()) << program.status();
    int recomputed = 0;
    for (const ProgramNode& node : program->nodes) {
      const bool block = node.name.find(".attn") != std::string::npos ||
                         node.name.find(".mlp") != std::string::npos ||
                         node.name.find(".moe") != std::string::npos;
      EXPECT_EQ(node.recompute, block) << node.name;
      recomputed += node.recompute ? 1 : 0;
    }
    EXPECT_EQ(recomputed, 2 * config.layers);
    absl::StatusOr<Graph> derived =
        DeriveGraph(*program, config.world_size, config.grad_accum,
                    int64_t{config.micro_batch} * config.seq_len);
    ASSERT_TRUE(derived.ok()) << derived.status();
    int twins = 0;
    for (const Node& n : derived->nodes) {
      if (n.recompute) {
        EXPECT_EQ(n.phase, Phase::kBackward) << n.name;
        ++twins;
      }
    }
    EXPECT_EQ(twins, 2 * config.layers * config.grad_accum);
    // Without checkpointing the hash differs: recompute is structural.
    ModelConfig plain = config;
    plain.activation_checkpointing = false;
    absl::StatusOr<Graph> built = BuildModelGraph(plain);
    ASSERT_TRUE(built.ok());
    EXPECT_NE(derived->StructuralHash(), built->StructuralHash());
  }
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
  // f16 builds (it runs where the device has f16 kernels: the job spec
  // and the worker check the device, CheckRankDevice).
  config.dtype = DType::kF16;
  absl::StatusOr<Program> f16 = BuildModelProgram(config, 1);
  ASSERT_TRUE(f16.ok()) << f16.status();
  EXPECT_EQ(f16->dtype, DType::kF16);
  config.dtype = DType::kBF16;
  absl::StatusOr<Program> bf16 = BuildModelProgram(config, 1);
  ASSERT_TRUE(bf16.ok()) << bf16.status();
  EXPECT_EQ(bf16->dtype, DType::kBF16);
  EXPECT_EQ(bf16->reduce_dtype, DType::kBF16);
  config.reduce_dtype = DType::kF32;
  EXPECT_EQ(BuildModelProgram(config, 1)->reduce_dtype, DType::kF32);
  config = Config("layers=1 d_model=12 heads=4 kv_heads=4 vocab=32");
  EXPECT_NE(BuildModelProgram(config, 1).status().message().find("even"),
            std::string::npos);
}

}  // namespace
}  // namespace tandem

namespace tandem {
namespace {

// model.init_from: each param takes its values from the weight file, by
// Hugging Face name, converted to fp32 from the file's dtype; a MoE expert
// stack is assembled from one tensor per expert, in expert order.
TEST(InitFromTest, WeightFile_ParamsTakeItsValues_AnyFloatDType) {
  const ModelConfig config = Config(
      "arch=moe layers=1 d_model=8 heads=2 kv_heads=1 ffn=6 vocab=16 experts=3 "
      "top_k=2 seq_len=4 micro_batch=1 dtype=f32");
  absl::StatusOr<Program> program = BuildModelProgram(config, 7);
  ASSERT_TRUE(program.ok()) << program.status();
  // Each tensor's values: its index in the file * 100 + position, in a
  // dtype that holds them exactly (bf16 keeps 8 bits of mantissa: small
  // values only).
  const char* dtypes[] = {"F32", "BF16", "F16"};
  std::vector<Tensor> tensors;
  std::map<std::string, at::Tensor> values;
  int index = 0;
  for (const ProgramParam& p : program->params) {
    const size_t star = p.export_name.find('*');
    const int64_t count = star == std::string::npos ? 1 : p.shape[0];
    std::vector<int64_t> shape = p.shape;
    if (count > 1 || star != std::string::npos) shape.erase(shape.begin());
    for (int64_t e = 0; e < count; ++e) {
      const std::string name =
          star == std::string::npos
              ? p.export_name
              : absl::StrCat(p.export_name.substr(0, star), e,
                             p.export_name.substr(star + 1));
      const char* dtype = dtypes[index % 3];
      at::Tensor v = at::arange(at::IntArrayRef(shape).empty()
                                    ? 1
                                    : c10::multiply_integers(shape),
                                at::kFloat)
                         .remainder(64)
                         .add(index % 16)
                         .reshape(shape);
      const at::ScalarType type = dtype == std::string("F32")    ? at::kFloat
                                  : dtype == std::string("BF16") ? at::kBFloat16
                                                                 : at::kHalf;
      const at::Tensor stored = v.to(type).contiguous();
      tensors.push_back(
          {name, dtype, shape, stored.nbytes(),
           std::string(static_cast<const char*>(stored.data_ptr()),
                       stored.nbytes())});
      values[name] = v;
      ++index;
    }
  }
  const std::string path = absl::StrCat(::testing::TempDir(), "init_from_",
                                        getpid(), ".safetensors");
  std::ofstream(path, std::ios::binary | std::ios::trunc)
      << SafetensorsBytes(tensors);
  ASSERT_TRUE(InitFromWeightsFile(path, *program).ok());
  for (const ProgramParam& p : program->params) {
    at::Tensor got = at::empty(p.shape, at::kFloat);
    p.init(got.data_ptr<float>(), got.numel());
    const size_t star = p.export_name.find('*');
    at::Tensor want;
    if (star == std::string::npos) {
      want = values.at(p.export_name);
    } else {
      std::vector<at::Tensor> experts;
      for (int64_t e = 0; e < p.shape[0]; ++e) {
        experts.push_back(values.at(absl::StrCat(
            p.export_name.substr(0, star), e, p.export_name.substr(star + 1))));
      }
      want = at::stack(experts);
    }
    EXPECT_TRUE(at::equal(got, want)) << p.name << " (" << p.export_name << ")";
  }
  // Another model's file: the first tensor at fault is named.
  absl::StatusOr<Program> wider = BuildModelProgram(
      Config("arch=moe layers=1 d_model=8 heads=2 kv_heads=1 ffn=8 vocab=16 "
             "experts=3 top_k=2 seq_len=4 micro_batch=1"),
      7);
  ASSERT_TRUE(wider.ok());
  const absl::Status refused = InitFromWeightsFile(path, *wider);
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(refused.message().find(
                "tensor 'model.layers.0.block_sparse_moe.experts.0.w1.weight' "
                "has shape [6, 8], but the model's param "
                "'layers.0.moe.w_gate' needs [8, 8]"),
            std::string::npos)
      << refused;
  std::remove(path.c_str());
}

}  // namespace
}  // namespace tandem
