#include "common/job/job_spec.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"

namespace tandem {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

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

INSTANTIATE_TEST_SUITE_P(
    AllFields, JobSpecErrorTest,
    ::testing::Values(
        SpecCase{
            "world0",
            [](v1::JobSpec& s) { s.mutable_parallel()->set_world_size(0); },
            "parallel.world_size must be >= 1 and <= 4096, got 0"},
        SpecCase{"noname", [](v1::JobSpec& s) { s.clear_name(); },
                 "name must be set"},
        SpecCase{"badname", [](v1::JobSpec& s) { s.set_name("a b"); },
                 "may hold only letters"},
        SpecCase{"preset",
                 [](v1::JobSpec& s) { s.mutable_model()->set_preset("gpt"); },
                 "model.preset must be llama, moe or one of"},
        SpecCase{"layers",
                 [](v1::JobSpec& s) { s.mutable_model()->set_layers(-1); },
                 "model.layers must be >= 1, got -1"},
        SpecCase{"heads",
                 [](v1::JobSpec& s) { s.mutable_model()->set_heads(3); },
                 "model: "},
        SpecCase{"datakind",
                 [](v1::JobSpec& s) { s.mutable_data()->set_kind("csv"); },
                 "data.kind must be synthetic, tokens or tensors, got 'csv'"},
        SpecCase{"datapath",
                 [](v1::JobSpec& s) { s.mutable_data()->set_kind("tokens"); },
                 "data.path must name the token file"},
        SpecCase{"tokenbytes",
                 [](v1::JobSpec& s) { s.mutable_data()->set_token_bytes(3); },
                 "data.token_bytes must be 2 (uint16) or 4 (uint32), got 3"},
        SpecCase{"seq",
                 [](v1::JobSpec& s) { s.mutable_batch()->set_seq_len(-4); },
                 "batch.seq_len must be >= 1, got -4"},
        SpecCase{"steps",
                 [](v1::JobSpec& s) { s.mutable_train()->set_steps(0); },
                 "train.steps must be >= 1, got 0"},
        SpecCase{"lr", [](v1::JobSpec& s) { s.mutable_train()->set_lr(-1); },
                 "train.lr must be > 0, got -1"},
        SpecCase{"beta",
                 [](v1::JobSpec& s) { s.mutable_train()->set_beta2(1.5); },
                 "train.beta2 must be in [0, 1)"},
        SpecCase{
            "stage",
            [](v1::JobSpec& s) { s.mutable_parallel()->set_zero_stage(2); },
            "parallel.zero_stage must be 1 or 3, got 2"},
        SpecCase{
            "budget",
            [](v1::JobSpec& s) { s.mutable_memory()->set_budget_bytes(-5); },
            "memory.budget_bytes must be >= 0, got -5"},
        SpecCase{"hardware",
                 [](v1::JobSpec& s) {
                   s.mutable_hardware()->set_inter_node_gbps(-1);
                 },
                 "hardware.inter_node_gbps must be >= 0 (0: measured)"},
        SpecCase{"device_memory",
                 [](v1::JobSpec& s) {
                   s.mutable_hardware()->set_device_memory_bytes(1000);
                   s.mutable_memory()->set_budget_bytes(2000);
                 },
                 "memory.budget_bytes (2000) must not exceed "
                 "hardware.device_memory_bytes (1000)"},
        SpecCase{"drift",
                 [](v1::JobSpec& s) {
                   s.mutable_optimize()->set_drift_threshold(-0.1);
                 },
                 "optimize.drift_threshold must be > 0"},
        SpecCase{"ckpt",
                 [](v1::JobSpec& s) {
                   s.mutable_checkpoint()->set_dir("/tmp/x");
                   s.mutable_checkpoint()->set_every(-1);
                 },
                 "checkpoint.every must be >= 1 when checkpoint.dir is set"},
        SpecCase{"chunk",
                 [](v1::JobSpec& s) { s.mutable_comm()->set_chunk_bytes(100); },
                 "comm.chunk_bytes must be 0 (automatic) or >= 4096, got 100"},
        SpecCase{
            "inflight",
            [](v1::JobSpec& s) { s.mutable_comm()->set_max_in_flight(65); },
            "comm.max_in_flight must be between 1 and 64, got 65"}),
    [](const auto& info) { return std::string(info.param.what); });

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
