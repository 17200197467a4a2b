#include "common/job/job_spec.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/job/lr_schedule.h"

namespace tandem {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;

v1::JobSpec TinySpec() {
  v1::JobSpec spec;
  spec.set_name("tiny");
  v1::ModelSpec& m = *spec.mutable_model();
  m.set_preset("llama");
  m.set_layers(2);
  m.set_d_model(64);
  m.set_heads(4);
  m.set_ffn(128);
  m.set_vocab(256);
  spec.mutable_batch()->set_micro_batch(2);
  spec.mutable_batch()->set_seq_len(16);
  spec.mutable_train()->set_steps(5);
  spec.mutable_parallel()->set_world_size(2);
  ApplyJobSpecDefaults(spec);
  return spec;
}

TEST(JobSpecTest, Defaults_FillUnsetFields) {
  const v1::JobSpec spec = TinySpec();
  EXPECT_EQ(spec.model().kv_heads(), 4);
  EXPECT_EQ(spec.data().kind(), "synthetic");
  EXPECT_EQ(spec.batch().grad_accum(), 1);
  EXPECT_EQ(spec.parallel().zero_stage(), 3);
  EXPECT_DOUBLE_EQ(spec.optimize().drift_threshold(), 0.1);
  EXPECT_EQ(spec.optimize().drift_window(), 5);
  EXPECT_DOUBLE_EQ(spec.optimize().trial_margin(), 0.10);
  EXPECT_EQ(spec.comm().chunk_bytes(), 0);  // automatic
  EXPECT_EQ(spec.comm().max_in_flight(), 4);
  // The benchmarked pipeline: the tandem policy, not a pass list.
  EXPECT_EQ(spec.optimize().policy(), "tandem");
  EXPECT_EQ(spec.optimize().passes_size(), 0);
  EXPECT_TRUE(ValidateJobSpec(spec).ok()) << ValidateJobSpec(spec);
}

TEST(JobSpecTest, Defaults_NamedPreset_FillsSizes) {
  v1::JobSpec spec;
  spec.set_name("p");
  spec.mutable_model()->set_preset("tiny-llama");
  spec.mutable_batch()->set_micro_batch(1);
  spec.mutable_batch()->set_seq_len(8);
  spec.mutable_train()->set_steps(1);
  ApplyJobSpecDefaults(spec);
  EXPECT_EQ(spec.model().d_model(), 256);
  EXPECT_TRUE(ValidateJobSpec(spec).ok()) << ValidateJobSpec(spec);
}

TEST(JobSpecTest, Defaults_OwnPasses_KeepThemWithoutPolicy) {
  v1::JobSpec spec;
  spec.mutable_optimize()->add_passes("zero3-insert");
  ApplyJobSpecDefaults(spec);
  EXPECT_EQ(spec.optimize().policy(), "");
  ASSERT_EQ(spec.optimize().passes_size(), 1);
}

TEST(JobSpecTest, Validate_PlanCheck_ReportsItsProblemsWithTheOthers) {
  v1::JobSpec spec = TinySpec();
  spec.mutable_train()->set_steps(0);
  const PlanSpecCheck check = [](const v1::OptimizeSpec& o, int32_t stage) {
    return std::vector<std::string>{
        absl::StrCat("optimize.policy '", o.policy(), "' at stage ", stage)};
  };
  const absl::Status status = ValidateJobSpec(spec, check);
  EXPECT_THAT(std::string(status.message()),
              AllOf(HasSubstr("train.steps must be >= 1"),
                    HasSubstr("optimize.policy 'tandem' at stage 3")));
  // Without a check (the worker), optimize.passes is not looked at.
  spec.mutable_train()->set_steps(1);
  spec.mutable_optimize()->add_passes("no-such-pass");
  EXPECT_TRUE(ValidateJobSpec(spec).ok());
}

TEST(JobSpecTest, ModelConfig_MatchesSpec) {
  auto c = ModelConfigFromJobSpec(TinySpec());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->arch, ModelArch::kLlama);
  EXPECT_EQ(c->layers, 2);
  EXPECT_EQ(c->micro_batch, 2);
  EXPECT_EQ(c->seq_len, 16);
  EXPECT_EQ(c->world_size, 2);
}

// Mixed precision: model.dtype, train.master_dtype, train.reduce_dtype.
TEST(JobSpecTest, Precision_Defaults_ReduceFollowsModelDType) {
  const v1::JobSpec f32 = TinySpec();
  EXPECT_EQ(f32.model().dtype(), v1::DTYPE_F32);
  EXPECT_EQ(f32.train().master_dtype(), v1::DTYPE_F32);
  EXPECT_EQ(f32.train().reduce_dtype(), v1::DTYPE_F32);

  v1::JobSpec bf16;
  bf16.mutable_model()->set_dtype(v1::DTYPE_BF16);
  ApplyJobSpecDefaults(bf16);
  EXPECT_EQ(bf16.train().master_dtype(), v1::DTYPE_F32);
  EXPECT_EQ(bf16.train().reduce_dtype(), v1::DTYPE_BF16);
  // A reduce dtype given stays.
  v1::JobSpec given;
  given.mutable_model()->set_dtype(v1::DTYPE_BF16);
  given.mutable_train()->set_reduce_dtype(v1::DTYPE_F32);
  ApplyJobSpecDefaults(given);
  EXPECT_EQ(given.train().reduce_dtype(), v1::DTYPE_F32);
}

TEST(JobSpecTest, Precision_AcceptedCombinations_ReachTheModelConfig) {
  struct Combo {
    v1::DType model, reduce;
    DType config_dtype, config_reduce;
  };
  for (const Combo& c : {
           Combo{v1::DTYPE_F32, v1::DTYPE_F32, DType::kF32, DType::kF32},
           Combo{v1::DTYPE_BF16, v1::DTYPE_F32, DType::kBF16, DType::kF32},
           Combo{v1::DTYPE_BF16, v1::DTYPE_BF16, DType::kBF16, DType::kBF16},
       }) {
    v1::JobSpec spec = TinySpec();
    spec.mutable_model()->set_dtype(c.model);
    spec.mutable_train()->set_reduce_dtype(c.reduce);
    spec.mutable_train()->set_master_dtype(v1::DTYPE_F32);
    EXPECT_TRUE(ValidateJobSpec(spec).ok()) << ValidateJobSpec(spec);
    absl::StatusOr<ModelConfig> config = ModelConfigFromJobSpec(spec);
    ASSERT_TRUE(config.ok()) << config.status();
    EXPECT_EQ(config->dtype, c.config_dtype);
    EXPECT_EQ(config->reduce_dtype, c.config_reduce);
  }
  // bf16 with the reduce dtype left to its default.
  v1::JobSpec spec = TinySpec();
  spec.mutable_model()->set_dtype(v1::DTYPE_BF16);
  spec.mutable_train()->clear_reduce_dtype();
  ApplyJobSpecDefaults(spec);
  EXPECT_TRUE(ValidateJobSpec(spec).ok()) << ValidateJobSpec(spec);
  EXPECT_EQ(ModelConfigFromJobSpec(spec)->reduce_dtype, DType::kBF16);
  // Unset (no defaults applied): ModelConfig's nullopt, model.dtype's.
  spec.mutable_train()->clear_reduce_dtype();
  EXPECT_EQ(ModelConfigFromJobSpec(spec)->reduce_dtype, std::nullopt);
}

// f16: accepted where the hardware is not declared cpu, with dynamic loss
// scaling and GradScaler's arguments by default; the ranks' devices are
// checked when they register (CheckRankDevice).
TEST(JobSpecTest, F16_AcceptedWithDynamicLossScaling) {
  for (const char* device : {"", "cuda"}) {
    SCOPED_TRACE(device);
    v1::JobSpec spec = TinySpec();
    spec.mutable_model()->set_dtype(v1::DTYPE_F16);
    spec.mutable_train()->clear_reduce_dtype();
    spec.mutable_train()->clear_loss_scale();  // TinySpec's f32 default
    spec.mutable_hardware()->set_device(device);
    ApplyJobSpecDefaults(spec);
    EXPECT_TRUE(ValidateJobSpec(spec).ok()) << ValidateJobSpec(spec);
    const v1::LossScaleSpec& ls = spec.train().loss_scale();
    EXPECT_EQ(ls.mode(), "dynamic");
    EXPECT_EQ(ls.init_scale(), 65536.0);
    EXPECT_EQ(ls.growth_factor(), 2.0);
    EXPECT_EQ(ls.backoff_factor(), 0.5);
    EXPECT_EQ(ls.growth_interval(), 2000);
    EXPECT_EQ(spec.train().reduce_dtype(), v1::DTYPE_F16);
    EXPECT_EQ(ModelConfigFromJobSpec(spec)->dtype, DType::kF16);
  }
  // Other dtypes: none unless asked for; given arguments stay.
  v1::JobSpec f32 = TinySpec();
  EXPECT_EQ(f32.train().loss_scale().mode(), "none");
  EXPECT_EQ(f32.train().loss_scale().init_scale(), 0);
  v1::LossScaleSpec& ls = *f32.mutable_train()->mutable_loss_scale();
  ls.set_mode("dynamic");
  ls.set_init_scale(1024);
  ls.set_growth_interval(50);
  ApplyJobSpecDefaults(f32);
  EXPECT_TRUE(ValidateJobSpec(f32).ok()) << ValidateJobSpec(f32);
  EXPECT_EQ(f32.train().loss_scale().init_scale(), 1024);
  EXPECT_EQ(f32.train().loss_scale().growth_interval(), 50);
  EXPECT_EQ(f32.train().loss_scale().backoff_factor(), 0.5);
}

TEST(JobSpecTest, CheckRankDevice_F16NeedsCudaAndDeclaredDevicesMatch) {
  v1::JobSpec spec = TinySpec();
  EXPECT_TRUE(CheckRankDevice(spec, "cpu", "rank 0").ok());
  EXPECT_TRUE(CheckRankDevice(spec, "cuda:1", "rank 0").ok());
  spec.mutable_model()->set_dtype(v1::DTYPE_F16);
  EXPECT_TRUE(CheckRankDevice(spec, "cuda:0", "rank 0").ok());
  const absl::Status cpu = CheckRankDevice(spec, "cpu", "rank 1 on host-a");
  EXPECT_EQ(cpu.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(cpu.message(),
            "rank 1 on host-a reports device cpu, but model.dtype f16 needs "
            "a CUDA device on every rank (libtorch has no f16 kernels on the "
            "CPU): use bf16 (the same memory, f32's exponent range), or run "
            "the ranks on GPUs (tandem-worker --device cuda)");
  EXPECT_THAT(std::string(CheckRankDevice(spec, "", "rank 0").message()),
              HasSubstr("rank 0 reports no device"));
  spec.mutable_model()->set_dtype(v1::DTYPE_F32);
  spec.mutable_hardware()->set_device("cuda");
  EXPECT_EQ(CheckRankDevice(spec, "cpu", "rank 0").message(),
            "rank 0 trains on device cpu, but the job's hardware.device is "
            "cuda: start the rank on a GPU (tandem-worker --device cuda), or "
            "change hardware.device");
  spec.mutable_hardware()->set_device("cpu");
  EXPECT_EQ(CheckRankDevice(spec, "cuda:0", "rank 0").code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(CheckRankDevice(spec, "cpu", "rank 0").ok());
}

struct PrecisionCase {
  const char* what;
  std::function<void(v1::JobSpec&)> apply;
  const char* message;  // the whole status message
};

class JobSpecPrecisionErrorTest
    : public ::testing::TestWithParam<PrecisionCase> {};

TEST_P(JobSpecPrecisionErrorTest, Refused_SaysWhatToWriteInstead) {
  v1::JobSpec spec = TinySpec();
  GetParam().apply(spec);
  const absl::Status s = ValidateJobSpec(spec);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), GetParam().message);
}

INSTANTIATE_TEST_SUITE_P(
    Precision, JobSpecPrecisionErrorTest,
    ::testing::Values(
        PrecisionCase{
            "master_bf16",
            [](v1::JobSpec& s) {
              s.mutable_model()->set_dtype(v1::DTYPE_BF16);
              s.mutable_train()->set_master_dtype(v1::DTYPE_BF16);
            },
            "invalid job spec: train.master_dtype must be f32, got bf16: the "
            "shards keep the master weights and Adam moments in f32 whatever "
            "model.dtype is; write f32 or remove it"},
        PrecisionCase{"master_unknown",
                      [](v1::JobSpec& s) {
                        s.mutable_train()->set_master_dtype(
                            static_cast<v1::DType>(9));
                      },
                      "invalid job spec: train.master_dtype must be f32, got "
                      "9: the shards keep the master weights and Adam moments "
                      "in f32 whatever model.dtype is; write f32 or remove "
                      "it"},
        PrecisionCase{
            "reduce_bf16_of_f32",
            [](v1::JobSpec& s) {
              s.mutable_train()->set_reduce_dtype(v1::DTYPE_BF16);
            },
            "invalid job spec: train.reduce_dtype bf16 would round the f32 "
            "gradients of model.dtype f32: use f32, or set model.dtype bf16"},
        PrecisionCase{"reduce_f16_of_f32",
                      [](v1::JobSpec& s) {
                        s.mutable_train()->set_reduce_dtype(v1::DTYPE_F16);
                      },
                      "invalid job spec: train.reduce_dtype f16 would round "
                      "the f32 gradients of model.dtype f32: use f32"},
        PrecisionCase{"reduce_f16_of_bf16",
                      [](v1::JobSpec& s) {
                        s.mutable_model()->set_dtype(v1::DTYPE_BF16);
                        s.mutable_train()->set_reduce_dtype(v1::DTYPE_F16);
                      },
                      "invalid job spec: train.reduce_dtype f16 must be f32 "
                      "or model.dtype (bf16), the dtype the gradients are "
                      "computed in: use f32 or bf16"},
        PrecisionCase{"reduce_unknown",
                      [](v1::JobSpec& s) {
                        s.mutable_train()->set_reduce_dtype(
                            static_cast<v1::DType>(9));
                      },
                      "invalid job spec: train.reduce_dtype must be f32, bf16 "
                      "or f16, got 9"},
        PrecisionCase{
            "model_f16_on_declared_cpu",
            [](v1::JobSpec& s) {
              s.mutable_model()->set_dtype(v1::DTYPE_F16);
              s.mutable_hardware()->set_device("cpu");
            },
            "invalid job spec: model.dtype f16 needs CUDA devices, but "
            "hardware.device is cpu, where libtorch has no f16 kernels: use "
            "bf16 (the same memory, f32's exponent range), or run the ranks "
            "on GPUs"},
        PrecisionCase{"loss_scale_mode_typo",
                      [](v1::JobSpec& s) {
                        s.mutable_train()->mutable_loss_scale()->set_mode(
                            "dynamc");
                      },
                      "invalid job spec: train.loss_scale.mode must be "
                      "dynamic or none, got 'dynamc' (did you mean "
                      "'dynamic'?)"},
        PrecisionCase{
            "loss_scale_fields_without_scaling",
            [](v1::JobSpec& s) {
              s.mutable_train()->mutable_loss_scale()->set_growth_interval(100);
            },
            "invalid job spec: train.loss_scale sets init_scale, "
            "growth_factor, backoff_factor or growth_interval, but "
            "its mode is none: remove them, or set mode: dynamic"},
        PrecisionCase{"loss_scale_bad_arguments",
                      [](v1::JobSpec& s) {
                        v1::LossScaleSpec& ls =
                            *s.mutable_train()->mutable_loss_scale();
                        ls.set_mode("dynamic");
                        ls.set_init_scale(-1);
                        ls.set_growth_factor(1);
                        ls.set_backoff_factor(1.5);
                        ls.set_growth_interval(-3);
                      },
                      "invalid job spec: train.loss_scale.init_scale must be "
                      "a positive fp32 value (0: GradScaler's 65536), got -1; "
                      "train.loss_scale.growth_factor must be > 1 (0: 2), got "
                      "1; train.loss_scale.backoff_factor must be in (0, 1) "
                      "(0: 0.5), got 1.5; train.loss_scale.growth_interval "
                      "must be >= 0, got -3"},
        PrecisionCase{
            "hardware_device_typo",
            [](v1::JobSpec& s) { s.mutable_hardware()->set_device("gpu"); },
            "invalid job spec: hardware.device must be cpu or cuda "
            "(or left out), got 'gpu' (did you mean 'cuda'?)"},
        PrecisionCase{"model_unknown",
                      [](v1::JobSpec& s) {
                        s.mutable_model()->set_dtype(static_cast<v1::DType>(9));
                        s.mutable_train()->set_reduce_dtype(
                            static_cast<v1::DType>(9));
                      },
                      "invalid job spec: model.dtype must be f32, bf16 or "
                      "f16, got 9"}),
    [](const auto& info) { return std::string(info.param.what); });

struct SpecCase {
  const char* what;
  std::function<void(v1::JobSpec&)> apply;
  const char* expect;
};

class JobSpecErrorTest : public ::testing::TestWithParam<SpecCase> {};

TEST_P(JobSpecErrorTest, Invalid_NamesTheField) {
  v1::JobSpec spec = TinySpec();
  GetParam().apply(spec);
  const absl::Status s = ValidateJobSpec(spec);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr(GetParam().expect));
}

INSTANTIATE_TEST_SUITE_P(AllFields, JobSpecErrorTest,
                         ::
                             testing::Values(SpecCase{"world0",
                                                      [](v1::JobSpec& s) {
                                                        s.mutable_parallel()
                                                            ->set_world_size(0);
                                                      },
                                                      "parallel.world_size "
                                                      "must be >= 1 and <= "
                                                      "4096, got 0"},
                                             SpecCase{"noname",
                                                      [](v1::JobSpec& s) {
                                                        s.clear_name();
                                                      },
                                                      "name must be set"},
                                             SpecCase{"badname",
                                                      [](v1::JobSpec& s) {
                                                        s.set_name("a b");
                                                      },
                                                      "may hold only letters"},
                                             SpecCase{"preset",
                                                      [](v1::JobSpec& s) {
                                                        s.mutable_model()
                                                            ->set_preset("gpt");
                                                      },
                                                      "model.preset must be "
                                                      "llama, moe or one of"},
                                             SpecCase{"layers",
                                                      [](v1::JobSpec& s) {
                                                        s.mutable_model()
                                                            ->set_layers(-1);
                                                      },
                                                      "model.layers must be >= "
                                                      "1, got -1"},
                                             SpecCase{
                                                 "heads",
                                                 [](v1::JobSpec& s) {
                                                   s.mutable_model()->set_heads(
                                                       3);
                                                 },
                                                 "model: "},
                                             SpecCase{
                                                 "datakind",
                                                 [](v1::JobSpec& s) {
                                                   s.mutable_data()->set_kind(
                                                       "csv");
                                                 },
                                                 "data.kind must be synthetic, "
                                                 "tokens or tensors, got "
                                                 "'csv'"},
                                             // Absurd sizes and rates are
                                             // refused at submit, not at the
                                             // first allocation.
                                             SpecCase{
                                                 "vocab_huge",
                                                 [](v1::JobSpec& s) {
                                                   s.mutable_model()->set_vocab(
                                                       2147483647);
                                                 },
                                                 "model.vocab must be <= "
                                                 "16777216 (the largest real "
                                                 "vocabularies are about 256k "
                                                 "tokens), got 2147483647"},
                                             SpecCase{"d_model_huge",
                                                      [](v1::JobSpec& s) {
                                                        s.mutable_model()
                                                            ->set_d_model(
                                                                1 << 30);
                                                      },
                                                      "model.d_model must be "
                                                      "<= 131072"},
                                             SpecCase{"seq_len_huge",
                                                      [](v1::JobSpec& s) {
                                                        s.mutable_batch()
                                                            ->set_seq_len(
                                                                1 << 30);
                                                      },
                                                      "batch.seq_len must be "
                                                      "<= 4194304"},
                                             SpecCase{
                                                 "lr_huge",
                                                 [](v1::JobSpec& s) {
                                                   s.mutable_train()->set_lr(
                                                       1e308);
                                                 },
                                                 "train.lr must be <= 10 "
                                                 "(AdamW's useful rates are "
                                                 "far "
                                                 "below 1), got 1e+308"},
                                             // A job's files never live among
                                             // the system's.
                                             SpecCase{
                                                 "data_path_system",
                                                 [](v1::JobSpec& s) {
                                                   s.mutable_data()->set_kind(
                                                       "tokens");
                                                   s.mutable_data()->set_path(
                                                       "/etc/shadow");
                                                 },
                                                 "data.path '/etc/shadow' is "
                                                 "under /etc, a system "
                                                 "directory; "
                                                 "point it at the job's own "
                                                 "files"},
                                             SpecCase{
                                                 "data_path_dotdot",
                                                 [](v1::JobSpec& s) {
                                                   s.mutable_data()->set_kind(
                                                       "tokens");
                                                   s.mutable_data()->set_path(
                                                       "/tmp/../proc/self/mem");
                                                 },
                                                 "data.path "
                                                 "'/tmp/../proc/self/mem' is "
                                                 "under /proc"},
                                             SpecCase{"checkpoint_dir_system",
                                                      [](v1::JobSpec& s) {
                                                        s.mutable_checkpoint()
                                                            ->set_dir("/etc");
                                                        s.mutable_checkpoint()
                                                            ->set_every(5);
                                                      },
                                                      "checkpoint.dir '/etc' "
                                                      "is under /etc, a system "
                                                      "directory; "
                                                      "point it at the job's "
                                                      "own directory"},
                                             SpecCase{
                                                 "checkpoint_dir_usr",
                                                 [](v1::JobSpec& s) {
                                                   s.mutable_checkpoint()
                                                       ->set_dir("/usr/lib/x");
                                                   s.mutable_checkpoint()
                                                       ->set_every(5);
                                                 },
                                                 "checkpoint.dir '/usr/lib/x' "
                                                 "is under /usr"},
                                             SpecCase{"checkpoint_dir_root",
                                                      [](v1::JobSpec& s) {
                                                        s.mutable_checkpoint()
                                                            ->set_dir("/");
                                                        s.mutable_checkpoint()
                                                            ->set_every(5);
                                                      },
                                                      "checkpoint.dir '/' is "
                                                      "the root directory"},
                                             SpecCase{
                                                 "init_from_system",
                                                 [](v1::JobSpec& s) {
                                                   s.mutable_model()
                                                       ->set_init_from(
                                                           "/dev/zero");
                                                 },
                                                 "model.init_from '/dev/zero' "
                                                 "is under /dev"},
                                             SpecCase{
                                                 "datapath",
                                                 [](v1::JobSpec& s) {
                                                   s.mutable_data()->set_kind(
                                                       "tokens");
                                                 },
                                                 "data.path must name the "
                                                 "token file"},
                                             SpecCase{"tokenbytes",
                                                      [](v1::JobSpec& s) {
                                                        s.mutable_data()
                                                            ->set_token_bytes(
                                                                3);
                                                      },
                                                      "data.token_bytes must "
                                                      "be 2 (uint16) or 4 "
                                                      "(uint32), got 3"},
                                             SpecCase{"seq",
                                                      [](v1::JobSpec& s) {
                                                        s.mutable_batch()
                                                            ->set_seq_len(-4);
                                                      },
                                                      "batch.seq_len must be "
                                                      ">= 1, got -4"},
                                             SpecCase{
                                                 "steps",
                                                 [](v1::JobSpec& s) {
                                                   s.mutable_train()->set_steps(
                                                       0);
                                                 },
                                                 "train.steps must be >= 1, "
                                                 "got 0"},
                                             SpecCase{
                                                 "lr",
                                                 [](v1::JobSpec& s) {
                                                   s.mutable_train()->set_lr(
                                                       -1);
                                                 },
                                                 "train.lr must be > 0, got "
                                                 "-1"},
                                             SpecCase{"lr_schedule",
                                                      [](v1::JobSpec& s) {
                                                        s.mutable_train()
                                                            ->set_lr_schedule(
                                                                "cosin");
                                                      },
                                                      "train.lr_schedule must "
                                                      "be one of constant, "
                                                      "cosine, linear, "
                                                      "got 'cosin'"},
                                             SpecCase{"warmup_negative",
                                                      [](v1::JobSpec& s) {
                                                        s.mutable_train()
                                                            ->set_warmup_steps(
                                                                -1);
                                                      },
                                                      "train.warmup_steps must "
                                                      "be >= 0 (0: no "
                                                      "warm-up), got -1"},
                                             SpecCase{"warmup_whole_run",
                                                      [](v1::JobSpec& s) {
                                                        s.mutable_train()
                                                            ->set_lr_schedule(
                                                                "cosine");
                                                        s.mutable_train()
                                                            ->set_warmup_steps(
                                                                5);
                                                      },
                                                      "train.warmup_steps must "
                                                      "be < train.steps (5) so "
                                                      "that the "
                                                      "run reaches train.lr, "
                                                      "got 5"},
                                             SpecCase{"min_lr_negative",
                                                      [](v1::JobSpec& s) {
                                                        s.mutable_train()
                                                            ->set_lr_schedule(
                                                                "linear");
                                                        s.mutable_train()
                                                            ->set_min_lr(-1e-5);
                                                      },
                                                      "train.min_lr must be >= "
                                                      "0, got -1e-05"},
                                             SpecCase{"min_lr_above_lr",
                                                      [](v1::JobSpec& s) {
                                                        s.mutable_train()
                                                            ->set_lr_schedule(
                                                                "cosine");
                                                        s.mutable_train()
                                                            ->set_min_lr(0.01);
                                                      },
                                                      "train.min_lr must be <= "
                                                      "train.lr (0.001), the "
                                                      "peak it "
                                                      "decays from, got 0.01"},
                                             SpecCase{"min_lr_constant",
                                                      [](v1::JobSpec& s) {
                                                        s.mutable_train()
                                                            ->set_min_lr(1e-4);
                                                      },
                                                      "train.min_lr is the "
                                                      "floor of a decaying "
                                                      "schedule, unused by "
                                                      "train.lr_schedule "
                                                      "constant: set "
                                                      "lr_schedule to cosine "
                                                      "or "
                                                      "linear, or remove "
                                                      "min_lr (got 0.0001)"},
                                             SpecCase{"beta",
                                                      [](v1::JobSpec& s) {
                                                        s.mutable_train()
                                                            ->set_beta2(1.5);
                                                      },
                                                      "train.beta2 must be in "
                                                      "[0, 1)"},
                                             SpecCase{"stage",
                                                      [](v1::JobSpec& s) {
                                                        s.mutable_parallel()
                                                            ->set_zero_stage(2);
                                                      },
                                                      "parallel.zero_stage "
                                                      "must be 1 or 3, got 2"},
                                             SpecCase{"budget",
                                                      [](v1::JobSpec& s) {
                                                        s.mutable_memory()
                                                            ->set_budget_bytes(
                                                                -5);
                                                      },
                                                      "memory.budget_bytes "
                                                      "must be >= 0, got -5"},
                                             SpecCase{
                                                 "hardware",
                                                 [](v1::JobSpec& s) {
                                                   s.mutable_hardware()
                                                       ->set_inter_node_gbps(
                                                           -1);
                                                 },
                                                 "hardware.inter_node_gbps "
                                                 "must be >= 0 (0: measured)"},
                                             SpecCase{
                                                 "device_memory",
                                                 [](v1::JobSpec& s) {
                                                   s.mutable_hardware()
                                                       ->set_device_memory_bytes(
                                                           1000);
                                                   s.mutable_memory()
                                                       ->set_budget_bytes(2000);
                                                 },
                                                 "memory.budget_bytes (2000) "
                                                 "must not exceed "
                                                 "hardware.device_memory_bytes "
                                                 "(1000)"},
                                             SpecCase{"drift",
                                                      [](v1::JobSpec& s) {
                                                        s.mutable_optimize()
                                                            ->set_drift_threshold(
                                                                -0.1);
                                                      },
                                                      "optimize.drift_"
                                                      "threshold must be > 0"},
                                             SpecCase{"trial",
                                                      [](v1::JobSpec& s) {
                                                        s.mutable_optimize()
                                                            ->set_trial_margin(
                                                                1.5);
                                                      },
                                                      "optimize.trial_margin "
                                                      "must be between 0"},
                                             SpecCase{"ckpt",
                                                      [](v1::JobSpec& s) {
                                                        s.mutable_checkpoint()
                                                            ->set_dir("/tmp/x");
                                                        s.mutable_checkpoint()
                                                            ->set_every(-1);
                                                      },
                                                      "checkpoint.every must "
                                                      "be >= 1 when "
                                                      "checkpoint.dir is set"},
                                             SpecCase{"chunk",
                                                      [](v1::JobSpec& s) {
                                                        s.mutable_comm()
                                                            ->set_chunk_bytes(
                                                                100);
                                                      },
                                                      "comm.chunk_bytes must "
                                                      "be 0 (automatic) or >= "
                                                      "4096, got 100"},
                                             SpecCase{
                                                 "inflight",
                                                 [](v1::JobSpec& s) {
                                                   s.mutable_comm()
                                                       ->set_max_in_flight(65);
                                                 },
                                                 "comm.max_in_flight must be "
                                                 "between 1 and 64, got 65"}),
                         [](const auto& info) {
                           return std::string(info.param.what);
                         });

// The path checks refuse only system trees: a job's own directories, a
// directory merely named like one, and relative paths pass.
TEST(JobSpecTest, Paths_OutsideSystemTrees_Accepted) {
  for (const char* dir : {"/tmp/ckpt", "/shared/etc/ckpt", "/etcetera",
                          "/home/me/runs", "ckpt/relative", "/var/tmp/x"}) {
    v1::JobSpec spec = TinySpec();
    spec.mutable_checkpoint()->set_dir(dir);
    spec.mutable_checkpoint()->set_every(5);
    EXPECT_TRUE(ValidateJobSpec(spec).ok())
        << dir << ": " << ValidateJobSpec(spec);
  }
}

// restart.min_world below world_size resumes smaller (coordinator/README.md,
// "Elastic restarts"); it needs restarts, and stays within the world.
TEST(JobSpecTest, RestartMinWorld_WithinWorldAndWithRestarts) {
  v1::JobSpec spec = TinySpec();
  spec.mutable_parallel()->set_world_size(4);
  spec.mutable_restart()->set_max_restarts(2);
  spec.mutable_restart()->set_min_world(2);
  spec.mutable_restart()->set_rejoin_timeout_s(30);
  EXPECT_TRUE(ValidateJobSpec(spec).ok()) << ValidateJobSpec(spec);
  spec.mutable_restart()->set_min_world(5);
  EXPECT_THAT(std::string(ValidateJobSpec(spec).message()),
              HasSubstr("restart.min_world must be 1..parallel.world_size "
                        "(4), or 0 for world_size, got 5"));
  spec.mutable_restart()->set_min_world(2);
  spec.mutable_restart()->set_max_restarts(0);
  EXPECT_THAT(std::string(ValidateJobSpec(spec).message()),
              HasSubstr("applies to restarts: set restart.max_restarts"));
  spec.mutable_restart()->set_max_restarts(1);
  spec.mutable_restart()->set_rejoin_timeout_s(-1);
  EXPECT_THAT(std::string(ValidateJobSpec(spec).message()),
              HasSubstr("restart.rejoin_timeout_s must be 0..86400"));
}

// A preset typed wrong is one error with a hint, not six: the sizes it
// would have filled are not reported missing.
TEST(JobSpecTest, PresetTypo_OneErrorWithAHint) {
  v1::JobSpec spec;
  spec.set_name("typo");
  spec.mutable_model()->set_preset("tiny-lama");
  spec.mutable_batch()->set_micro_batch(2);
  spec.mutable_batch()->set_seq_len(16);
  spec.mutable_train()->set_steps(5);
  ApplyJobSpecDefaults(spec);
  const std::string message(ValidateJobSpec(spec).message());
  EXPECT_THAT(message, HasSubstr("got 'tiny-lama' (did you mean "
                                 "'tiny-llama'?)"));
  for (const char* follow_on : {"model.layers", "model.d_model", "model.heads",
                                "model.ffn", "model.vocab"}) {
    EXPECT_THAT(message, Not(HasSubstr(follow_on))) << message;
  }
  spec.mutable_model()->set_preset("llama");
  spec.mutable_data()->set_kind("synthetc");
  EXPECT_THAT(std::string(ValidateJobSpec(spec).message()),
              HasSubstr("got 'synthetc' (did you mean 'synthetic'?)"));
}

TEST(JobSpecTest, StartTimeout_NonNegativeAndBounded) {
  v1::JobSpec spec = TinySpec();
  spec.mutable_parallel()->set_start_timeout_s(60);
  EXPECT_TRUE(ValidateJobSpec(spec).ok()) << ValidateJobSpec(spec);
  for (const double bad : {-1.0, 1e9, std::nan("")}) {
    spec.mutable_parallel()->set_start_timeout_s(bad);
    EXPECT_THAT(std::string(ValidateJobSpec(spec).message()),
                HasSubstr("parallel.start_timeout_s must be 0..604800 "
                          "seconds (0: 900)"));
  }
}

// Operator roots (--data-roots, --checkpoint-roots): judged on the
// lexically normal path, a root's sibling with the same prefix is outside
// it, and no roots means no restriction beyond the next test's.
TEST(JobSpecTest, PathRoots_UnderRootAccepted_OthersNamed) {
  JobPathRoots roots;
  roots.read = {"/data"};
  roots.write = {"/ckpt"};
  v1::JobSpec spec = TinySpec();
  spec.mutable_checkpoint()->set_dir("/ckpt/./run2/");
  spec.mutable_model()->set_init_from("/data/base");
  EXPECT_TRUE(CheckJobPathRoots(spec, roots).ok())
      << CheckJobPathRoots(spec, roots);
  spec.mutable_checkpoint()->set_dir("/ckpt-other/run");
  spec.mutable_model()->set_init_from("/ckpt/run");  // under a write root
  const absl::Status s = CheckJobPathRoots(spec, roots);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("checkpoint.dir '/ckpt-other/run' is not under a "
                        "checkpoint root this coordinator allows (/ckpt)"));
  EXPECT_THAT(std::string(s.message()), Not(HasSubstr("model.init_from")));
  EXPECT_TRUE(CheckJobPathRoots(spec, JobPathRoots()).ok());
}

// A root this host sees is checked on disk at submit: a missing file is
// refused then (not when the workers start), and so is a symbolic link
// under a root that leads out of every root. A checkpoint directory may not
// exist yet; a root this host does not have is judged on the path alone.
TEST(JobSpecTest, PathRoots_RootOnThisHost_FilesCheckedAtSubmit) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::path(::testing::TempDir()) / "path_roots_disk";
  fs::remove_all(dir);
  fs::create_directories(dir / "data");
  fs::create_directories(dir / "ckpt");
  fs::create_directories(dir / "elsewhere");
  std::ofstream(dir / "data" / "train.bin") << "tokens";
  std::ofstream(dir / "elsewhere" / "secret.bin") << "secret";
  fs::create_symlink(dir / "elsewhere" / "secret.bin",
                     dir / "data" / "escape.bin");
  fs::create_symlink(dir / "data" / "train.bin", dir / "ckpt" / "link.bin");
  JobPathRoots roots;
  roots.read = {(dir / "data").string()};
  roots.write = {(dir / "ckpt").string()};
  v1::JobSpec spec = TinySpec();
  spec.mutable_data()->set_path((dir / "data" / "train.bin").string());
  spec.mutable_checkpoint()->set_dir((dir / "ckpt" / "run-not-yet").string());
  spec.mutable_model()->set_init_from((dir / "ckpt" / "link.bin").string());
  EXPECT_TRUE(CheckJobPathRoots(spec, roots).ok())
      << CheckJobPathRoots(spec, roots);

  spec.mutable_data()->set_path((dir / "data" / "missing.bin").string());
  absl::Status s = CheckJobPathRoots(spec, roots);
  EXPECT_THAT(std::string(s.message()),
              HasSubstr(absl::StrCat("data.path '", (dir / "data").string(),
                                     "/missing.bin' does not exist")));

  spec.mutable_data()->set_path((dir / "data" / "escape.bin").string());
  s = CheckJobPathRoots(spec, roots);
  EXPECT_THAT(std::string(s.message()),
              AllOf(HasSubstr("escape.bin' leads out of the data roots"),
                    HasSubstr("elsewhere/secret.bin")));
  EXPECT_THAT(std::string(s.message()), Not(HasSubstr("secret\n")));
  fs::remove_all(dir);
}

// Whatever the client sends, with or without roots: a relative path (the
// probe's "../../../../../../etc/shadow" was read by the worker) or one with
// a ".." component is refused for every path field, before anything opens
// it. A name merely containing dots is fine.
TEST(JobSpecTest, Paths_RelativeOrDotDot_RefusedWithoutRoots) {
  struct Case {
    const char* field;
    std::string path;
    const char* want;  // "" = accepted
  };
  const std::vector<Case> cases = {
      {"data.path", "../../../../../../etc/shadow", "is relative"},
      {"data.path", "data/train.bin", "is relative"},
      {"data.path", "/shared/data/../../etc/shadow", "contains '..'"},
      {"model.path", "/shared/m/..", "contains '..'"},
      {"model.init_from", "weights.bin", "is relative"},
      {"checkpoint.dir", "/shared/ckpt/../../root", "contains '..'"},
      {"checkpoint.dir", "ckpt", "is relative"},
      {"data.path", "/shared/data/a..b/x...bin", ""},
      {"checkpoint.dir", "/shared/ckpt/run.1", ""},
  };
  for (const JobPathRoots& roots :
       {JobPathRoots(), JobPathRoots{{"/shared"}, {"/shared"}}}) {
    for (const Case& c : cases) {
      SCOPED_TRACE(
          absl::StrCat(c.field, " ", c.path, " roots ", roots.read.size()));
      v1::JobSpec spec = TinySpec();
      const std::string field = c.field;
      if (field == "data.path") spec.mutable_data()->set_path(c.path);
      if (field == "model.path") spec.mutable_model()->set_path(c.path);
      if (field == "model.init_from") {
        spec.mutable_model()->set_init_from(c.path);
      }
      if (field == "checkpoint.dir") spec.mutable_checkpoint()->set_dir(c.path);
      const absl::Status s = CheckJobPathRoots(spec, roots);
      if (std::string(c.want).empty()) {
        EXPECT_TRUE(s.ok()) << s;
        continue;
      }
      EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
      EXPECT_THAT(std::string(s.message()),
                  AllOf(HasSubstr(absl::StrCat(c.field, " '", c.path, "' ")),
                        HasSubstr(c.want)));
    }
  }
}

// The worker resolves symlinks before it opens anything: a link in the
// job's own directory that leads into /etc is refused, naming where it
// leads; an ordinary file resolves to its real path, and a checkpoint
// directory not made yet resolves through the part that exists.
TEST(JobSpecTest, ResolveJobPaths_SymlinkIntoSystem_Refused) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::path(::testing::TempDir()) / "resolve_paths";
  fs::remove_all(dir);
  fs::create_directories(dir / "real");
  std::ofstream(dir / "real" / "train.safetensors") << "x";
  fs::create_symlink(dir / "real", dir / "alias");
  fs::create_symlink("/etc/passwd", dir / "innocent.safetensors");
  v1::JobSpec spec = TinySpec();
  spec.mutable_data()->set_path((dir / "alias" / "train.safetensors").string());
  spec.mutable_checkpoint()->set_dir((dir / "alias" / "ckpt" / "run").string());
  absl::StatusOr<v1::JobSpec> ok = ResolveJobPaths(spec);
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->data().path(),
            fs::canonical(dir / "real" / "train.safetensors").string());
  EXPECT_EQ(ok->checkpoint().dir(),
            (fs::canonical(dir / "real") / "ckpt" / "run").string());

  spec.mutable_data()->set_path((dir / "innocent.safetensors").string());
  spec.mutable_model()->set_init_from((dir / "innocent.safetensors").string());
  const absl::Status bad = ResolveJobPaths(spec).status();
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(
      std::string(bad.message()),
      AllOf(HasSubstr("data.path '" + (dir / "innocent.safetensors").string() +
                      "' resolves to '/etc/passwd', under /etc"),
            HasSubstr("model.init_from '"), Not(HasSubstr("root:"))));
  fs::remove_all(dir);
}

// train.grad_clip: left out, it defaults to 1.0; an explicit 0 disables
// clipping and stays 0 (it used to become 1.0).
TEST(JobSpecTest, GradClip_ExplicitZeroKept_UnsetDefaultsToOne) {
  v1::JobSpec unset = TinySpec();
  unset.mutable_train()->clear_grad_clip();
  ApplyJobSpecDefaults(unset);
  EXPECT_EQ(unset.train().grad_clip(), 1.0);
  v1::JobSpec zero = TinySpec();
  zero.mutable_train()->set_grad_clip(0);
  ApplyJobSpecDefaults(zero);
  EXPECT_TRUE(zero.train().has_grad_clip());
  EXPECT_EQ(zero.train().grad_clip(), 0.0);
  EXPECT_TRUE(ValidateJobSpec(zero).ok()) << ValidateJobSpec(zero);
}

TEST(JobSpecTest, OnNonfinite_DefaultsToStop_OthersRefused) {
  v1::JobSpec spec = TinySpec();
  EXPECT_EQ(spec.train().on_nonfinite(), "stop");
  spec.mutable_train()->set_on_nonfinite("continue");
  EXPECT_TRUE(ValidateJobSpec(spec).ok()) << ValidateJobSpec(spec);
  spec.mutable_train()->set_on_nonfinite("ignore");
  EXPECT_THAT(std::string(ValidateJobSpec(spec).message()),
              HasSubstr("train.on_nonfinite must be stop (the default: a NaN "
                        "or infinite loss fails the job) or continue, got "
                        "'ignore'"));
}

TEST(JobSpecTest, LrSchedule_DefaultsToConstant_DecaysValidate) {
  v1::JobSpec spec = TinySpec();
  EXPECT_EQ(spec.train().lr_schedule(), "constant");
  EXPECT_EQ(spec.train().warmup_steps(), 0);
  EXPECT_EQ(spec.train().min_lr(), 0);
  // Warm-up to the last step but one, a floor equal to the peak: the
  // extremes allowed.
  spec.mutable_train()->set_lr_schedule("cosine");
  spec.mutable_train()->set_warmup_steps(4);
  spec.mutable_train()->set_min_lr(spec.train().lr());
  EXPECT_TRUE(ValidateJobSpec(spec).ok()) << ValidateJobSpec(spec);
  spec.mutable_train()->set_lr_schedule("constant");
  spec.mutable_train()->set_min_lr(0);
  EXPECT_TRUE(ValidateJobSpec(spec).ok()) << ValidateJobSpec(spec);
}

TEST(JobSpecTest, SeveralErrors_AreAllListed) {
  v1::JobSpec spec = TinySpec();
  spec.mutable_parallel()->set_world_size(0);
  spec.mutable_batch()->set_seq_len(0);
  const std::string msg(ValidateJobSpec(spec).message());
  EXPECT_THAT(msg, HasSubstr("parallel.world_size"));
  EXPECT_THAT(msg, HasSubstr("batch.seq_len"));
}

}  // namespace
}  // namespace tandem

// ------------------------------------------- LearningRate (lr_schedule.h)

namespace tandem {
namespace {

v1::TrainSpec Train(const char* schedule, int64_t steps, int64_t warmup,
                    double lr, double min_lr) {
  v1::TrainSpec t;
  t.set_lr_schedule(schedule);
  t.set_steps(steps);
  t.set_warmup_steps(warmup);
  t.set_lr(lr);
  t.set_min_lr(min_lr);
  return t;
}

TEST(LearningRateTest, Constant_NoWarmup_IsLrThroughout) {
  const v1::TrainSpec t = Train("constant", 10, 0, 3e-4, 0);
  for (int64_t s : {0, 1, 9, 10, 1000}) {
    EXPECT_DOUBLE_EQ(LearningRate(t, s), 3e-4) << s;
  }
  // Before defaults, an empty schedule is constant.
  EXPECT_DOUBLE_EQ(LearningRate(Train("", 10, 0, 3e-4, 0), 7), 3e-4);
}

TEST(LearningRateTest, Warmup_ClimbsToLrAtStepW_ThenConstant) {
  const v1::TrainSpec t = Train("constant", 10, 3, 1.0, 0);
  EXPECT_DOUBLE_EQ(LearningRate(t, 0), 0.25);
  EXPECT_DOUBLE_EQ(LearningRate(t, 1), 0.5);
  EXPECT_DOUBLE_EQ(LearningRate(t, 2), 0.75);
  EXPECT_DOUBLE_EQ(LearningRate(t, 3), 1.0);
  EXPECT_DOUBLE_EQ(LearningRate(t, 9), 1.0);
  EXPECT_DOUBLE_EQ(LearningRate(t, 50), 1.0);
  // A negative step is step 0.
  EXPECT_DOUBLE_EQ(LearningRate(t, -3), 0.25);
}

TEST(LearningRateTest, Cosine_NoWarmup_ReachesFloorAtStepN) {
  const double pi = std::acos(-1.0);
  const v1::TrainSpec t = Train("cosine", 10, 0, 1.0, 0.1);
  EXPECT_DOUBLE_EQ(LearningRate(t, 0), 1.0);
  EXPECT_DOUBLE_EQ(LearningRate(t, 5), 0.55);  // halfway
  // The last step runs one decay step above the floor; step N is the floor.
  EXPECT_DOUBLE_EQ(LearningRate(t, 9),
                   0.1 + 0.9 * (1 + std::cos(pi * 9 / 10)) / 2);
  EXPECT_GT(LearningRate(t, 9), 0.1);
  EXPECT_DOUBLE_EQ(LearningRate(t, 10), 0.1);
  // Beyond N it stays at the floor (torch's cosine would climb back).
  EXPECT_DOUBLE_EQ(LearningRate(t, 15), 0.1);
  EXPECT_DOUBLE_EQ(LearningRate(t, 1000), 0.1);
  for (int64_t s = 1; s <= 10; ++s) {
    EXPECT_LT(LearningRate(t, s), LearningRate(t, s - 1)) << s;
  }
}

TEST(LearningRateTest, Cosine_AfterWarmup_StartsAtLr) {
  const double pi = std::acos(-1.0);
  const v1::TrainSpec t = Train("cosine", 12, 4, 2e-3, 1e-4);
  EXPECT_DOUBLE_EQ(LearningRate(t, 0), 2e-3 / 5);
  EXPECT_DOUBLE_EQ(LearningRate(t, 3), 2e-3 * 4 / 5);
  EXPECT_DOUBLE_EQ(LearningRate(t, 4), 2e-3);
  EXPECT_DOUBLE_EQ(LearningRate(t, 6),
                   1e-4 + (2e-3 - 1e-4) * (1 + std::cos(pi * 2 / 8)) / 2);
  EXPECT_DOUBLE_EQ(LearningRate(t, 12), 1e-4);
}

TEST(LearningRateTest, Linear_WarmupThenStraightLineToFloor) {
  const v1::TrainSpec t = Train("linear", 6, 2, 1.0, 0.2);
  EXPECT_DOUBLE_EQ(LearningRate(t, 0), 1.0 / 3);
  EXPECT_DOUBLE_EQ(LearningRate(t, 1), 2.0 / 3);
  EXPECT_DOUBLE_EQ(LearningRate(t, 2), 1.0);
  EXPECT_DOUBLE_EQ(LearningRate(t, 3), 0.8);
  EXPECT_DOUBLE_EQ(LearningRate(t, 5), 0.4);
  EXPECT_DOUBLE_EQ(LearningRate(t, 6), 0.2);
  EXPECT_DOUBLE_EQ(LearningRate(t, 7), 0.2);
  // A floor of 0: the last step still trains.
  EXPECT_DOUBLE_EQ(LearningRate(Train("linear", 4, 0, 1.0, 0), 3), 0.25);
}

TEST(LearningRateTest, WarmupToLastStepButOne_LastStepAtLr) {
  for (const char* schedule : {"cosine", "linear", "constant"}) {
    const v1::TrainSpec t = Train(schedule, 5, 4, 1.0, 0.0);
    for (int64_t s = 0; s < 4; ++s) {
      EXPECT_DOUBLE_EQ(LearningRate(t, s), (s + 1) / 5.0) << schedule << s;
    }
    EXPECT_DOUBLE_EQ(LearningRate(t, 4), 1.0) << schedule;
  }
  EXPECT_DOUBLE_EQ(LearningRate(Train("cosine", 5, 4, 1.0, 0.0), 5), 0.0);
  EXPECT_DOUBLE_EQ(LearningRate(Train("linear", 5, 4, 1.0, 0.0), 5), 0.0);
}

TEST(LearningRateTest, FloorEqualToLr_IsConstantAfterWarmup) {
  const v1::TrainSpec t = Train("cosine", 8, 2, 1e-3, 1e-3);
  for (int64_t s = 2; s < 20; ++s) EXPECT_DOUBLE_EQ(LearningRate(t, s), 1e-3);
}

}  // namespace
}  // namespace tandem
