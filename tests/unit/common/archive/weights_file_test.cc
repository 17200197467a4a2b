// Weight files (common/archive/weights_file.h), the built-in models'
// Hugging Face names (common/models/hf_names.h) and model.init_from in the
// job spec.
#include "common/archive/weights_file.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/job/job_spec.h"
#include "common/models/hf_names.h"
#include "tests/unit/common/test_safetensors.h"

namespace tandem {
namespace {

using ::testing::HasSubstr;

ModelConfig Config(bool moe) {
  ModelConfig c;
  c.arch = moe ? ModelArch::kMoe : ModelArch::kLlama;
  c.layers = 2;
  c.d_model = 64;
  c.heads = 4;
  c.kv_heads = 2;
  c.ffn = 96;
  c.vocab = 256;
  c.experts = moe ? 4 : 0;
  c.top_k = moe ? 2 : 0;
  c.seq_len = 16;
  c.micro_batch = 2;
  c.world_size = 1;
  return c;
}

TEST(HuggingFaceNameTest, Llama_EveryParamHasItsTransformersName) {
  absl::StatusOr<std::vector<WeightTensor>> tensors =
      BuiltinWeightTensors(Config(false));
  ASSERT_TRUE(tensors.ok()) << tensors.status();
  std::set<std::string> names;
  for (const WeightTensor& t : *tensors) names.insert(t.export_name);
  EXPECT_EQ(names.size(), tensors->size());
  // LlamaForCausalLM's state_dict for 2 layers.
  std::set<std::string> want = {"model.embed_tokens.weight",
                                "model.norm.weight", "lm_head.weight"};
  for (int i = 0; i < 2; ++i) {
    const std::string l = absl::StrCat("model.layers.", i, ".");
    for (const char* n :
         {"input_layernorm.weight", "self_attn.q_proj.weight",
          "self_attn.k_proj.weight", "self_attn.v_proj.weight",
          "self_attn.o_proj.weight", "post_attention_layernorm.weight",
          "mlp.gate_proj.weight", "mlp.up_proj.weight",
          "mlp.down_proj.weight"}) {
      want.insert(l + n);
    }
  }
  EXPECT_EQ(names, want);
  // Shapes are transformers' too ([out, in]; k/v of the kv heads).
  for (const WeightTensor& t : *tensors) {
    if (t.export_name == "model.layers.1.self_attn.k_proj.weight") {
      EXPECT_EQ(t.shape, (std::vector<int64_t>{32, 64}));
      EXPECT_EQ(t.param, "layers.1.attn.wk.weight");
    }
    if (t.export_name == "model.layers.0.mlp.down_proj.weight") {
      EXPECT_EQ(t.shape, (std::vector<int64_t>{64, 96}));
    }
  }
}

TEST(HuggingFaceNameTest, Moe_MixtralNames_ExpertsStacked) {
  absl::StatusOr<std::vector<WeightTensor>> tensors =
      BuiltinWeightTensors(Config(true));
  ASSERT_TRUE(tensors.ok()) << tensors.status();
  std::set<std::string> names;
  for (const WeightTensor& t : *tensors) names.insert(t.export_name);
  EXPECT_TRUE(names.count("model.layers.1.block_sparse_moe.gate.weight"));
  EXPECT_TRUE(
      names.count("model.layers.1.block_sparse_moe.experts.*.w1.weight"));
  EXPECT_TRUE(
      names.count("model.layers.1.block_sparse_moe.experts.*.w2.weight"));
  EXPECT_TRUE(
      names.count("model.layers.1.block_sparse_moe.experts.*.w3.weight"));
  EXPECT_TRUE(names.count("model.layers.1.post_attention_layernorm.weight"));
  EXPECT_FALSE(names.count("model.layers.1.mlp.gate_proj.weight"));
}

TEST(HuggingFaceNameTest, UnknownName_Refused) {
  for (const char* bad : {"layers.x.attn.wq.weight", "layers.0.attn.wz.weight",
                          "embed", "layers..attn.wq.weight", ""}) {
    EXPECT_FALSE(HuggingFaceName(bad).ok()) << bad;
  }
  EXPECT_EQ(*HuggingFaceName("layers.12.mlp.w_up.weight"),
            "model.layers.12.mlp.up_proj.weight");
}

// A header as the parser gives it: offsets absolute, tensors in file order.
SafetensorsHeader Header(const std::vector<Tensor>& tensors) {
  const std::string bytes = SafetensorsBytes(tensors);
  absl::StatusOr<SafetensorsHeader> h =
      ParseSafetensorsHeader(bytes, bytes.size(), "test");
  EXPECT_TRUE(h.ok()) << h.status();
  return h.ok() ? *h : SafetensorsHeader{};
}

const std::vector<WeightTensor> kParams = {
    {"w", {2, 3}, "model.w"},
    {"experts", {3, 2}, "model.e.*.w"},
};

TEST(MatchWeightsTest, EveryParamFound_StackedOnePiecePerIndex) {
  const SafetensorsHeader h = Header({{"model.e.1.w", "BF16", {2}, 4},
                                      {"model.w", "F32", {2, 3}, 24},
                                      {"model.e.0.w", "F16", {2}, 4},
                                      {"model.e.2.w", "F32", {2}, 8}});
  absl::StatusOr<std::vector<std::vector<WeightPiece>>> m =
      MatchWeights(h, kParams, "'f'");
  ASSERT_TRUE(m.ok()) << m.status();
  ASSERT_EQ(m->size(), 2u);
  ASSERT_EQ((*m)[0].size(), 1u);
  EXPECT_EQ((*m)[0][0].dtype, "float32");
  EXPECT_EQ((*m)[0][0].end - (*m)[0][0].begin, 24u);
  ASSERT_EQ((*m)[1].size(), 3u);
  // In index order, whatever the file's order.
  EXPECT_EQ((*m)[1][0].dtype, "float16");
  EXPECT_EQ((*m)[1][1].dtype, "bfloat16");
  EXPECT_EQ((*m)[1][2].dtype, "float32");
  EXPECT_EQ((*m)[1][1].begin, h.Find("model.e.1.w")->begin);
}

TEST(MatchWeightsTest, FirstTensorAtFault_Named) {
  const Tensor w{"model.w", "F32", {2, 3}, 24};
  const Tensor e0{"model.e.0.w", "F32", {2}, 8};
  const Tensor e1{"model.e.1.w", "F32", {2}, 8};
  const Tensor e2{"model.e.2.w", "F32", {2}, 8};
  struct Case {
    std::vector<Tensor> tensors;
    std::string error;
  };
  const Case cases[] = {
      {{w, e0, e2},
       "'f' has no tensor 'model.e.1.w' (the model's param 'experts', [2])"},
      {{{"model.w", "F32", {3, 2}, 24}, e0, e1, e2},
       "'f': tensor 'model.w' has shape [3, 2], but the model's param 'w' "
       "needs [2, 3]"},
      {{{"model.w", "I32", {2, 3}, 24}, e0, e1, e2},
       "tensor 'model.w' is int32; weights must be float32, bfloat16 or "
       "float16"},
      {{w, e0, e1, e2, {"model.rotary_emb.inv_freq", "F32", {4}, 16}},
       "'f' holds tensor 'model.rotary_emb.inv_freq' [4], which is no param "
       "of this model"},
  };
  for (const Case& c : cases) {
    absl::StatusOr<std::vector<std::vector<WeightPiece>>> m =
        MatchWeights(Header(c.tensors), kParams, "'f'");
    ASSERT_FALSE(m.ok()) << c.error;
    EXPECT_EQ(m.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(m.status().message(), HasSubstr(c.error));
  }
}

TEST(MatchWeightsTest, CheckpointTensorsText_OneLinePerParam) {
  EXPECT_EQ(CheckpointTensorsText(kParams),
            "w\tfloat32\t2,3\tmodel.w\nexperts\tfloat32\t3,2\tmodel.e.*.w\n");
  EXPECT_EQ(CheckpointTensorsText({{"s", {}, "s"}}), "s\tfloat32\t\ts\n");
}

// model.init_from in the job spec: checked at submit against the model.
class InitFromSpecTest : public ::testing::Test {
 protected:
  void TearDown() override { std::remove(path_.c_str()); }
  v1::JobSpec Spec() {
    v1::JobSpec spec;
    spec.set_name("init");
    v1::ModelSpec& m = *spec.mutable_model();
    m.set_preset("llama");
    m.set_layers(2);
    m.set_d_model(64);
    m.set_heads(4);
    m.set_kv_heads(2);
    m.set_ffn(96);
    m.set_vocab(256);
    m.set_init_from(path_);
    spec.mutable_batch()->set_micro_batch(2);
    spec.mutable_batch()->set_seq_len(16);
    spec.mutable_train()->set_steps(3);
    ApplyJobSpecDefaults(spec);
    return spec;
  }
  // Every param of Config(false) as bf16, but `skip`; `extra` appended.
  void Write(const std::string& skip = "", std::vector<Tensor> extra = {}) {
    std::vector<Tensor> tensors;
    absl::StatusOr<std::vector<WeightTensor>> params =
        BuiltinWeightTensors(Config(false));
    ASSERT_TRUE(params.ok()) << params.status();
    for (const WeightTensor& t : *params) {
      if (t.export_name == skip) continue;
      int64_t numel = 1;
      for (int64_t d : t.shape) numel *= d;
      tensors.push_back({t.export_name, "BF16", t.shape, numel * 2});
    }
    tensors.insert(tensors.end(), extra.begin(), extra.end());
    std::ofstream(path_, std::ios::binary | std::ios::trunc)
        << SafetensorsBytes(tensors);
  }
  const std::string path_ = absl::StrCat(::testing::TempDir(), "init_from_",
                                         getpid(), ".safetensors");
};

TEST_F(InitFromSpecTest, MatchingFile_Passes) {
  Write();
  EXPECT_TRUE(ValidateJobSpec(Spec()).ok()) << ValidateJobSpec(Spec());
}

TEST_F(InitFromSpecTest, Problems_NameTheFieldAndTheTensor) {
  v1::JobSpec spec = Spec();
  spec.mutable_model()->set_init_from(path_ + ".missing");
  EXPECT_THAT(ValidateJobSpec(spec).message(),
              HasSubstr("model.init_from: '" + path_ +
                        ".missing': No such file or directory"));

  Write("model.layers.1.mlp.up_proj.weight");
  EXPECT_THAT(ValidateJobSpec(Spec()).message(),
              HasSubstr("model.init_from: '" + path_ +
                        "' has no tensor 'model.layers.1.mlp.up_proj.weight'"));

  // Another config: ffn 128 where the file has 96.
  Write();
  spec = Spec();
  spec.mutable_model()->set_ffn(128);
  EXPECT_THAT(ValidateJobSpec(spec).message(),
              HasSubstr("tensor 'model.layers.0.mlp.gate_proj.weight' has "
                        "shape [96, 64], but the model's param "
                        "'layers.0.mlp.w_gate.weight' needs [128, 64]"));

  std::ofstream(path_, std::ios::binary | std::ios::trunc) << "not a file";
  EXPECT_THAT(ValidateJobSpec(Spec()).message(),
              HasSubstr("is not a valid safetensors file"));
}

}  // namespace
}  // namespace tandem
