#include "common/models/model_config.h"

#include <cmath>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/string_view.h"
#include "gtest/gtest.h"

namespace tandem {
namespace {

::testing::AssertionResult HasSubstr(absl::string_view text,
                                     absl::string_view part) {
  if (absl::StrContains(text, part)) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << "'" << text << "' does not contain '" << part << "'";
}

TEST(ModelPresetTest, Llama3_8B_HasPublishedShape) {
  absl::StatusOr<ModelConfig> c = ModelPreset("llama3-8b");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->name, "llama3-8b");
  EXPECT_EQ(c->arch, ModelArch::kLlama);
  EXPECT_EQ(c->layers, 32);
  EXPECT_EQ(c->d_model, 4096);
  EXPECT_EQ(c->heads, 32);
  EXPECT_EQ(c->kv_heads, 8);
  EXPECT_EQ(c->ffn, 14336);
  EXPECT_EQ(c->vocab, 128256);
  EXPECT_EQ(c->dtype, DType::kBF16);
  EXPECT_EQ(c->head_dim(), 128);
}

TEST(ModelPresetTest, Llama3_70B_HasPublishedShape) {
  absl::StatusOr<ModelConfig> c = ModelPreset("llama3-70b");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->layers, 80);
  EXPECT_EQ(c->d_model, 8192);
  EXPECT_EQ(c->heads, 64);
  EXPECT_EQ(c->kv_heads, 8);
  EXPECT_EQ(c->ffn, 28672);
  EXPECT_EQ(c->vocab, 128256);
}

TEST(ModelPresetTest, Mixtral_HasPublishedShape) {
  absl::StatusOr<ModelConfig> c = ModelPreset("mixtral-8x7b");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->arch, ModelArch::kMoe);
  EXPECT_EQ(c->layers, 32);
  EXPECT_EQ(c->d_model, 4096);
  EXPECT_EQ(c->ffn, 14336);
  EXPECT_EQ(c->vocab, 32000);
  EXPECT_EQ(c->experts, 8);
  EXPECT_EQ(c->top_k, 2);
}

TEST(ModelPresetTest, AllPresets_AreValid) {
  for (const std::string& name : ModelPresetNames()) {
    absl::StatusOr<ModelConfig> c = ModelPreset(name);
    ASSERT_TRUE(c.ok()) << name << ": " << c.status();
    EXPECT_EQ(c->name, name);
    EXPECT_TRUE(ValidateModelConfig(*c).ok()) << name;
  }
}

TEST(ModelPresetTest, Names_ListAllFive) {
  EXPECT_EQ(ModelPresetNames(),
            (std::vector<std::string>{"llama3-8b", "llama3-70b", "mixtral-8x7b",
                                      "tiny-llama", "tiny-moe"}));
}

TEST(ModelPresetTest, UnknownName_IsNotFoundAndListsPresets) {
  absl::StatusOr<ModelConfig> c = ModelPreset("gpt5");
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(HasSubstr(c.status().message(), "'gpt5'"));
  EXPECT_TRUE(HasSubstr(c.status().message(), "tiny-llama"));
}

TEST(ParseModelConfigTest, Empty_GivesDefaults) {
  absl::StatusOr<ModelConfig> c = ParseModelConfig("");
  ASSERT_TRUE(c.ok()) << c.status();
  const ModelConfig defaults;
  EXPECT_EQ(c->name, defaults.name);
  EXPECT_EQ(c->layers, defaults.layers);
  EXPECT_EQ(c->d_model, defaults.d_model);
}

TEST(ParseModelConfigTest, AllKeys_SetTheirFields) {
  absl::StatusOr<ModelConfig> c = ParseModelConfig(
      "arch=moe layers=3 d_model=96 heads=6 kv_heads=2 ffn=200 vocab=500 "
      "experts=4 top_k=2 seq_len=64 micro_batch=2 grad_accum=3 dtype=bf16 "
      "checkpointing=true world=8 device_flops=1.5e14 "
      "device_bytes_per_s=9e11 name=mine");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->arch, ModelArch::kMoe);
  EXPECT_EQ(c->layers, 3);
  EXPECT_EQ(c->d_model, 96);
  EXPECT_EQ(c->heads, 6);
  EXPECT_EQ(c->kv_heads, 2);
  EXPECT_EQ(c->ffn, 200);
  EXPECT_EQ(c->vocab, 500);
  EXPECT_EQ(c->experts, 4);
  EXPECT_EQ(c->top_k, 2);
  EXPECT_EQ(c->seq_len, 64);
  EXPECT_EQ(c->micro_batch, 2);
  EXPECT_EQ(c->grad_accum, 3);
  EXPECT_EQ(c->dtype, DType::kBF16);
  EXPECT_TRUE(c->activation_checkpointing);
  EXPECT_EQ(c->world_size, 8);
  EXPECT_DOUBLE_EQ(c->device_flops, 1.5e14);
  EXPECT_DOUBLE_EQ(c->device_bytes_per_s, 9e11);
  EXPECT_EQ(c->name, "mine");
  EXPECT_TRUE(ValidateModelConfig(*c).ok());
}

TEST(ParseModelConfigTest, PresetAnywhere_IsAppliedFirst) {
  absl::StatusOr<ModelConfig> c = ParseModelConfig(
      "micro_batch=2,seq_len=1024, preset=llama3-70b world=32");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->name, "llama3-70b");
  EXPECT_EQ(c->layers, 80);
  EXPECT_EQ(c->micro_batch, 2);
  EXPECT_EQ(c->seq_len, 1024);
  EXPECT_EQ(c->world_size, 32);
}

TEST(ParseModelConfigTest, WithBase_KeepsBaseFields) {
  absl::StatusOr<ModelConfig> base = ModelPreset("tiny-moe");
  ASSERT_TRUE(base.ok());
  absl::StatusOr<ModelConfig> c = ParseModelConfig("layers=5", *base);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->name, "tiny-moe");
  EXPECT_EQ(c->arch, ModelArch::kMoe);
  EXPECT_EQ(c->experts, base->experts);
  EXPECT_EQ(c->layers, 5);
}

TEST(ParseModelConfigTest, CheckpointingSpellings_ParseAsBooleans) {
  for (const char* yes : {"true", "1", "yes", "on", "TRUE"}) {
    absl::StatusOr<ModelConfig> c =
        ParseModelConfig(std::string("checkpointing=") + yes);
    ASSERT_TRUE(c.ok()) << yes;
    EXPECT_TRUE(c->activation_checkpointing) << yes;
  }
  absl::StatusOr<ModelConfig> c =
      ParseModelConfig("checkpointing=true checkpointing=false");
  EXPECT_FALSE(c.ok());
  c = ParseModelConfig("checkpointing=off");
  ASSERT_TRUE(c.ok());
  EXPECT_FALSE(c->activation_checkpointing);
}

struct ParseErrorCase {
  const char* text;
  const char* message;
};

class ParseModelConfigErrorTest
    : public ::testing::TestWithParam<ParseErrorCase> {};

TEST_P(ParseModelConfigErrorTest, BadText_IsInvalidArgumentWithMessage) {
  absl::StatusOr<ModelConfig> c = ParseModelConfig(GetParam().text);
  ASSERT_FALSE(c.ok()) << GetParam().text;
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(HasSubstr(c.status().message(), GetParam().message));
}

INSTANTIATE_TEST_SUITE_P(
    Errors, ParseModelConfigErrorTest,
    ::testing::Values(
        ParseErrorCase{"layer=4",
                       "unknown key 'layer' (expected one of preset, arch, "
                       "layers"},
        ParseErrorCase{"layer=4", "Did you mean 'layers'?"},
        ParseErrorCase{"layers", "expected key=value, got 'layers'"},
        ParseErrorCase{"=4", "expected key=value, got '=4'"},
        ParseErrorCase{"layers=", "layers: empty value"},
        ParseErrorCase{"layers=4 layers=5", "key 'layers' is given twice"},
        ParseErrorCase{"layers=four", "layers: 'four' is not an integer"},
        ParseErrorCase{"layers=4.5", "layers: '4.5' is not an integer"},
        ParseErrorCase{"d_model=99999999999",
                       "d_model: '99999999999' is out of range (-2147483648 to "
                       "2147483647)"},
        ParseErrorCase{"ffn=-2147483649", "ffn: '-2147483649' is out of range"},
        ParseErrorCase{"vocab=2147483648",
                       "vocab: '2147483648' is out of range"},
        ParseErrorCase{"arch=gpt", "arch: unknown architecture 'gpt'"},
        ParseErrorCase{"dtype=fp8", "dtype: unknown dtype 'fp8'"},
        ParseErrorCase{"checkpointing=maybe",
                       "checkpointing: 'maybe' is not a boolean"},
        ParseErrorCase{"device_flops=fast",
                       "device_flops: 'fast' is not a finite number"},
        ParseErrorCase{"device_flops=inf",
                       "device_flops: 'inf' is not a finite number"},
        ParseErrorCase{"preset=llama9",
                       "preset: unknown model preset 'llama9'"}));

struct ValidateErrorCase {
  const char* text;
  const char* message;
};

class ValidateModelConfigErrorTest
    : public ::testing::TestWithParam<ValidateErrorCase> {};

TEST_P(ValidateModelConfigErrorTest, BadField_IsInvalidArgumentNamingIt) {
  absl::StatusOr<ModelConfig> c = ParseModelConfig(GetParam().text);
  ASSERT_TRUE(c.ok()) << c.status();
  absl::Status status = ValidateModelConfig(*c);
  ASSERT_FALSE(status.ok()) << GetParam().text;
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(HasSubstr(status.message(), GetParam().message));
}

INSTANTIATE_TEST_SUITE_P(
    Errors, ValidateModelConfigErrorTest,
    ::testing::Values(
        ValidateErrorCase{"layers=0", "layers must be >= 1, got 0"},
        ValidateErrorCase{"d_model=-64", "d_model must be >= 1, got -64"},
        ValidateErrorCase{"heads=0", "heads must be >= 1, got 0"},
        ValidateErrorCase{"kv_heads=0", "kv_heads must be >= 1, got 0"},
        ValidateErrorCase{"ffn=0", "ffn must be >= 1, got 0"},
        ValidateErrorCase{"vocab=0", "vocab must be >= 1, got 0"},
        ValidateErrorCase{"seq_len=0", "seq_len must be >= 1, got 0"},
        ValidateErrorCase{"micro_batch=0", "micro_batch must be >= 1, got 0"},
        ValidateErrorCase{"grad_accum=0", "grad_accum must be >= 1, got 0"},
        ValidateErrorCase{"world=0", "world must be >= 1, got 0"},
        ValidateErrorCase{"heads=6 kv_heads=6 d_model=64",
                          "heads (6) must divide d_model (64)"},
        ValidateErrorCase{"heads=8 kv_heads=3 d_model=64",
                          "kv_heads (3) must divide heads (8)"},
        ValidateErrorCase{"arch=moe experts=2 top_k=3",
                          "top_k (3) must be in [1, experts=2]"},
        ValidateErrorCase{"arch=moe experts=2 top_k=0",
                          "top_k (0) must be in [1, experts=2]"},
        ValidateErrorCase{"arch=moe", "experts (arch=moe) must be >= 1, got 0"},
        ValidateErrorCase{"arch=llama experts=8 top_k=2",
                          "experts (8) and top_k (2) apply only to arch=moe"},
        ValidateErrorCase{"device_flops=0",
                          "device_flops must be a finite number > 0"},
        ValidateErrorCase{"device_bytes_per_s=-1",
                          "device_bytes_per_s must be a finite number > 0"},
        ValidateErrorCase{"name=a#b", "name 'a#b' may not contain"},
        ValidateErrorCase{"d_model=2000000000 heads=1 kv_heads=1 vocab=2000000",
                          "model too large"},
        ValidateErrorCase{"seq_len=2000000000 micro_batch=2000000000",
                          "batch too large"},
        ValidateErrorCase{"layers=100000 grad_accum=100", "graph too large"}));

TEST(ValidateModelConfigTest, EmptyName_IsRejected) {
  ModelConfig c;
  c.name = "";
  absl::Status status = ValidateModelConfig(c);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(HasSubstr(status.message(), "name must not be empty"));
}

TEST(ValidateModelConfigTest, NameWithSpace_IsRejected) {
  ModelConfig c;
  c.name = "my model";
  EXPECT_TRUE(
      HasSubstr(ValidateModelConfig(c).message(), "may not contain spaces"));
}

TEST(ValidateModelConfigTest, NanDeviceFlops_IsRejected) {
  ModelConfig c;
  c.device_flops = std::nan("");
  EXPECT_TRUE(HasSubstr(ValidateModelConfig(c).message(),
                        "device_flops must be a finite number > 0"));
}

TEST(ValidateModelConfigTest, Defaults_AreValid) {
  EXPECT_TRUE(ValidateModelConfig(ModelConfig()).ok());
}

}  // namespace
}  // namespace tandem
