#include "worker/spec/job_spec_yaml.h"

#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace tandem {
namespace {

TEST(JobSpecYamlTest, ExampleSpec_LoadsWithAllSections) {
  absl::StatusOr<v1::JobSpec> spec =
      LoadJobSpec(TANDEM_SOURCE_DIR "/deploy/local/tiny-llama.yaml");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->name(), "tiny-llama");
  EXPECT_EQ(spec->model().preset(), "llama");
  EXPECT_EQ(spec->model().layers(), 4);
  EXPECT_EQ(spec->model().d_model(), 256);
  EXPECT_EQ(spec->model().ffn(), 704);
  EXPECT_EQ(spec->data().kind(), "synthetic");
  EXPECT_EQ(spec->batch().micro_batch(), 4);
  EXPECT_EQ(spec->batch().seq_len(), 128);
  EXPECT_EQ(spec->train().steps(), 10);
  EXPECT_DOUBLE_EQ(spec->train().lr(), 1e-3);
  EXPECT_EQ(spec->parallel().world_size(), 2);
  EXPECT_EQ(spec->parallel().zero_stage(), 3);
  ASSERT_EQ(spec->optimize().passes_size(), 3);
  EXPECT_EQ(spec->optimize().passes(1), "prefetch");
  EXPECT_DOUBLE_EQ(spec->optimize().drift_threshold(), 0.1);
}

TEST(JobSpecYamlTest, Types_ParsedPerField) {
  absl::StatusOr<v1::JobSpec> spec = ParseJobSpecYaml(R"(
name: t
model: {preset: moe, experts: 4, top_k: 2, dtype: bf16, activation_checkpointing: true}
data: {kind: tokens, path: /data/x.bin, token_bytes: 4, seed: 18446744073709551615}
memory: {budget_bytes: 1.5GiB}
optimize: {passes: prefetch}
)");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->model().dtype(), v1::DTYPE_BF16);
  EXPECT_TRUE(spec->model().activation_checkpointing());
  EXPECT_EQ(spec->data().seed(), 18446744073709551615ULL);
  EXPECT_EQ(spec->memory().budget_bytes(), int64_t{3} << 29);
  ASSERT_EQ(spec->optimize().passes_size(), 1);
}

// The schedule keys of a standalone worker's spec (common/job/
// lr_schedule.h): parsed with their types, the default filled and the values
// checked by LoadJobSpec.
TEST(JobSpecYamlTest, LrSchedule_ParsedDefaultedAndValidated) {
  absl::StatusOr<v1::JobSpec> spec = ParseJobSpecYaml(
      "train: {steps: 10, lr_schedule: cosine, warmup_steps: 3, "
      "min_lr: 1e-5}");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->train().lr_schedule(), "cosine");
  EXPECT_EQ(spec->train().warmup_steps(), 3);
  EXPECT_DOUBLE_EQ(spec->train().min_lr(), 1e-5);
  EXPECT_NE(ParseJobSpecYaml("train: {warmup_steps: ten}")
                .status()
                .message()
                .find("train.warmup_steps: expected an integer, got 'ten'"),
            std::string::npos);

  char path[] = "/tmp/tandem_spec_XXXXXX.yaml";
  close(mkstemps(path, 5));
  auto load = [&](const std::string& train) {
    const std::string text = absl::StrCat(
        "name: x\nmodel: {preset: tiny-llama}\n"
        "batch: {micro_batch: 1, seq_len: 8}\ntrain: {steps: 10",
        train, "}\n");
    std::ofstream(path) << text;
    return LoadJobSpec(path);
  };
  absl::StatusOr<v1::JobSpec> defaulted = load("");
  ASSERT_TRUE(defaulted.ok()) << defaulted.status();
  EXPECT_EQ(defaulted->train().lr_schedule(), "constant");
  absl::StatusOr<v1::JobSpec> bad =
      load(", lr_schedule: linear, warmup_steps: 10");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find(
                "train.warmup_steps must be < train.steps (10)"),
            std::string::npos)
      << bad.status();
  std::remove(path);
}

// train.master_dtype and train.reduce_dtype read as model.dtype does, and
// LoadJobSpec fills and checks them (common/job/job_spec.h).
TEST(JobSpecYamlTest, PrecisionDTypes_ParsedDefaultedAndValidated) {
  absl::StatusOr<v1::JobSpec> spec = ParseJobSpecYaml(
      "model: {dtype: bf16}\n"
      "train: {master_dtype: F32, reduce_dtype: DTYPE_F32}");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->model().dtype(), v1::DTYPE_BF16);
  EXPECT_EQ(spec->train().master_dtype(), v1::DTYPE_F32);
  EXPECT_EQ(spec->train().reduce_dtype(), v1::DTYPE_F32);
  for (const char* key : {"master_dtype", "reduce_dtype"}) {
    const absl::Status bad =
        ParseJobSpecYaml(absl::StrCat("train: {", key, ": f64}")).status();
    EXPECT_EQ(bad.message(),
              absl::StrCat("train.", key,
                           ": expected one of f32, bf16, f16, got 'f64' "
                           "(line 1)"));
  }

  char path[] = "/tmp/tandem_spec_XXXXXX.yaml";
  close(mkstemps(path, 5));
  auto load = [&](const char* model, const char* train) {
    std::ofstream(path) << absl::StrCat(
        "name: x\nmodel: {preset: tiny-llama", model,
        "}\nbatch: {micro_batch: 1, seq_len: 8}\ntrain: {steps: 10", train,
        "}\n");
    return LoadJobSpec(path);
  };
  struct Accepted {
    const char* model;
    const char* train;
    v1::DType reduce;
  };
  const Accepted accepted[] = {
      {"", "", v1::DTYPE_F32},
      {", dtype: bf16", "", v1::DTYPE_BF16},
      {", dtype: bf16", ", reduce_dtype: f32", v1::DTYPE_F32},
      {", dtype: bf16", ", reduce_dtype: bf16", v1::DTYPE_BF16},
      {", dtype: f32", ", reduce_dtype: f32, master_dtype: f32", v1::DTYPE_F32},
      {", dtype: f16", "", v1::DTYPE_F16},
      {", dtype: f16", ", loss_scale: {init_scale: 1024, growth_interval: 100}",
       v1::DTYPE_F16},
  };
  for (const Accepted& a : accepted) {
    absl::StatusOr<v1::JobSpec> loaded = load(a.model, a.train);
    ASSERT_TRUE(loaded.ok()) << a.model << a.train << ": " << loaded.status();
    EXPECT_EQ(loaded->train().master_dtype(), v1::DTYPE_F32);
    EXPECT_EQ(loaded->train().reduce_dtype(), a.reduce) << a.model << a.train;
    EXPECT_EQ(loaded->train().loss_scale().mode(),
              a.reduce == v1::DTYPE_F16 ? "dynamic" : "none");
  }
  absl::StatusOr<v1::JobSpec> scaled = load(
      ", dtype: f16", ", loss_scale: {init_scale: 1024, growth_interval: 100}");
  ASSERT_TRUE(scaled.ok());
  EXPECT_EQ(scaled->train().loss_scale().init_scale(), 1024);
  EXPECT_EQ(scaled->train().loss_scale().growth_interval(), 100);
  EXPECT_EQ(scaled->train().loss_scale().growth_factor(), 2);
  struct Refused {
    const char* model;
    const char* train;
    const char* message;
  };
  const Refused refused[] = {
      {", dtype: bf16", ", master_dtype: bf16",
       "train.master_dtype must be f32, got bf16: the shards keep the master "
       "weights and Adam moments in f32 whatever model.dtype is; write f32 or "
       "remove it"},
      {"", ", reduce_dtype: bf16",
       "train.reduce_dtype bf16 would round the f32 gradients of model.dtype "
       "f32: use f32, or set model.dtype bf16"},
      {", dtype: f16", ", loss_scale: {mode: dynamc}",
       "train.loss_scale.mode must be dynamic or none, got 'dynamc' (did you "
       "mean 'dynamic'?)"},
  };
  for (const Refused& r : refused) {
    const absl::Status bad = load(r.model, r.train).status();
    EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(bad.message(),
              absl::StrCat(path, ": invalid job spec: ", r.message));
  }
  std::remove(path);
}

struct BadCase {
  const char* yaml;
  const char* expected;
};

TEST(JobSpecYamlTest, BadSpecs_FieldLevelErrors) {
  const BadCase cases[] = {
      {"model: {layers: four}",
       "model.layers: expected a 32-bit integer, got 'four'"},
      {"model: {layer: 4}",
       "model.layer: unknown key (expected one of preset, layers"},
      {"trian: {steps: 1}", "trian: unknown key"},
      {"train: {lr: fast}", "train.lr: expected a finite number"},
      {"model: 4", "model: expected a mapping"},
      {"optimize: {passes: [a, {b: 1}]}",
       "optimize.passes[1]: expected a value"},
      {"memory: {budget_bytes: 2XB}",
       "memory.budget_bytes: expected a byte count"},
      {"model: {dtype: f64}", "model.dtype: expected one of f32, bf16, f16"},
      {"name: [", "not valid YAML"},
  };
  for (const BadCase& c : cases) {
    absl::StatusOr<v1::JobSpec> spec = ParseJobSpecYaml(c.yaml);
    ASSERT_FALSE(spec.ok()) << c.yaml;
    EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(spec.status().message().find(c.expected), std::string::npos)
        << c.yaml << " gave: " << spec.status().message();
  }
}

TEST(JobSpecYamlTest, LoadJobSpec_ValidatesValues) {
  char path[] = "/tmp/tandem_spec_XXXXXX.yaml";
  const int fd = mkstemps(path, 5);
  const std::string text = "name: x\nbatch: {micro_batch: 0, seq_len: 8}\n";
  ASSERT_EQ(write(fd, text.data(), text.size()),
            static_cast<ssize_t>(text.size()));
  close(fd);
  absl::StatusOr<v1::JobSpec> spec = LoadJobSpec(path);
  EXPECT_FALSE(spec.ok());
  EXPECT_NE(spec.status().message().find("batch.micro_batch"),
            std::string::npos)
      << spec.status();
  std::remove(path);
  EXPECT_EQ(LoadJobSpec("/nonexistent.yaml").status().code(),
            absl::StatusCode::kNotFound);
}

// Relative file paths resolve against the spec file's directory; absolute
// ones are kept.
TEST(JobSpecYamlTest, LoadJobSpec_RelativePathsFromTheSpecFile) {
  char dir[] = "/tmp/tandem_spec_dir_XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  const std::string spec_path = std::string(dir) + "/job.yaml";
  std::ofstream(std::string(dir) + "/tokens.bin", std::ios::binary)
      << std::string(4096, '\0');
  std::ofstream(spec_path)
      << "name: x\nmodel: {preset: llama, layers: 1, d_model: 8, heads: 1, "
         "ffn: 8, vocab: 16}\nbatch: {micro_batch: 1, seq_len: 8}\n"
         "data: {kind: tokens, path: tokens.bin}\n"
         "checkpoint: {dir: /tmp/abs-ckpt, every: 1}\ntrain: {steps: 1}\n";
  absl::StatusOr<v1::JobSpec> spec = LoadJobSpec(spec_path);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->data().path(), std::string(dir) + "/tokens.bin");
  EXPECT_EQ(spec->checkpoint().dir(), "/tmp/abs-ckpt");
  std::remove((std::string(dir) + "/tokens.bin").c_str());
  std::remove(spec_path.c_str());
  rmdir(dir);
}

}  // namespace
}  // namespace tandem
