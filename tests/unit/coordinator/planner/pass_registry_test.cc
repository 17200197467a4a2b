#include "coordinator/planner/pass_registry.h"

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/job/job_spec.h"
#include "common/models/graph_builder.h"
#include "common/models/model_config.h"
#include "coordinator/passes/zero1_pass.h"
#include "coordinator/planner/job_plan.h"
#include "coordinator/planner/planner.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tandem {
namespace {

using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

Graph Model(const std::string& keys) {
  absl::StatusOr<ModelConfig> config = ParseModelConfig(keys);
  EXPECT_TRUE(config.ok()) << config.status();
  absl::StatusOr<Graph> graph = BuildModelGraph(*config);
  EXPECT_TRUE(graph.ok()) << graph.status();
  return *graph;
}

TEST(PassRegistryTest, EveryPolicysPasses_AreRegistered) {
  for (Policy policy : AllPolicies()) {
    for (ShardingMode mode : {ShardingMode::kZero3, ShardingMode::kZero1}) {
      for (const std::string& spec : PolicyPasses(policy, mode)) {
        EXPECT_TRUE(PassRegistry::Default().Check(spec).ok())
            << PolicyName(policy) << ": " << spec;
      }
    }
  }
  EXPECT_THAT(PolicyPasses(Policy::kTandem, ShardingMode::kZero3),
              ElementsAre("zero3-insert", "micro-batch-reduce", "offload",
                          "prefetch", "offload-unshard-search"));
}

TEST(PassRegistryTest, Make_WithParameter_BuildsThatPass) {
  absl::StatusOr<std::unique_ptr<PlanningPass>> pass =
      PassRegistry::Default().Make("zero1:bucket_bytes=16MiB");
  ASSERT_TRUE(pass.ok()) << pass.status();
  const auto* zero1 = dynamic_cast<const Zero1Pass*>(pass->get());
  ASSERT_NE(zero1, nullptr);
  EXPECT_EQ(zero1->bucket_bytes(), int64_t{16} << 20);
  EXPECT_EQ((*pass)->name(), "zero1");
}

TEST(PassRegistryTest, BadSpecs_SayWhatToFix) {
  const PassRegistry& registry = PassRegistry::Default();
  EXPECT_THAT(std::string(registry.Check("prefetsh").message()),
              AllOf(HasSubstr("'prefetsh' is not a pass"),
                    HasSubstr("offload-lend"), HasSubstr("fsdp-prefetch")));
  EXPECT_THAT(std::string(registry.Check("zero1:bucket=1").message()),
              HasSubstr("has no parameter 'bucket'; use bucket_bytes"));
  EXPECT_THAT(std::string(registry.Check("prefetch:x=1").message()),
              HasSubstr("it takes none"));
  EXPECT_THAT(
      std::string(registry.Check("zero3-insert:grouping=layer").message()),
      HasSubstr("expected one of node, unit"));
  EXPECT_THAT(
      std::string(
          registry.Check("fsdp-prefetch:max_gathered_units=0").message()),
      HasSubstr("expected an integer >= 1"));
  EXPECT_THAT(std::string(registry.Check("zero1:bucket_bytes").message()),
              HasSubstr("needs a value"));
}

TEST(PlanTest, PolicyPassesByName_PlanLikeThePolicy) {
  const Graph graph = Model("preset=tiny-llama world=4 checkpointing=true");
  HardwareModel hw = HardwareModel::H100(4);
  for (Policy policy : AllPolicies()) {
    PlanOptions by_policy;
    by_policy.policy = policy;
    absl::StatusOr<PlanResult> a = Plan(graph, hw, by_policy);
    ASSERT_TRUE(a.ok()) << a.status();
    PlanOptions by_name;
    by_name.passes = PolicyPasses(policy, ShardingMode::kZero3);
    absl::StatusOr<PlanResult> b = Plan(graph, hw, by_name);
    ASSERT_TRUE(b.ok()) << b.status();
    a->schedule.provenance.plan_wall_s = 0;
    b->schedule.provenance.plan_wall_s = 0;
    EXPECT_EQ(a->schedule, b->schedule) << PolicyName(policy);
  }
}

TEST(PlanTest, NothingFits_OneMinimumAndWhatWouldFit) {
  const Graph graph = Model("preset=tiny-llama world=2");
  HardwareModel hw = HardwareModel::H100(2);
  hw.budget_bytes = 1 << 20;
  absl::StatusOr<int64_t> smallest = SmallestFeasibleBudget(graph, hw);
  ASSERT_TRUE(smallest.ok());
  absl::StatusOr<PlanResult> result = Plan(graph, hw, PlanOptions());
  ASSERT_EQ(result.status().code(), absl::StatusCode::kResourceExhausted);
  const std::string message(result.status().message());
  EXPECT_THAT(message,
              AllOf(HasSubstr(absl::StrCat("(", *smallest, " B)")),
                    HasSubstr("raise memory.budget_bytes"),
                    HasSubstr("shard over more ranks"),
                    HasSubstr("turn on model.activation_checkpointing")));
  // A job's own pipeline gets the same minimum.
  PlanOptions own;
  own.passes = {"zero3-insert", "prefetch"};
  absl::StatusOr<PlanResult> custom = Plan(graph, hw, own);
  ASSERT_EQ(custom.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(custom.status().message()),
              HasSubstr(absl::StrCat("(", *smallest, " B)")));
}

TEST(JobPlanTest, CheckOptimizeSpec_FieldErrors) {
  v1::OptimizeSpec o;
  o.set_policy("tandem");
  EXPECT_THAT(CheckOptimizeSpec(o, 3), IsEmpty());
  o.set_policy("fsdp");
  EXPECT_THAT(CheckOptimizeSpec(o, 3), IsEmpty());
  EXPECT_THAT(CheckOptimizeSpec(o, 1),
              ElementsAre(HasSubstr("plans ZeRO-3 jobs only")));
  o.set_policy("zero-infinity");
  EXPECT_THAT(CheckOptimizeSpec(o, 3),
              ElementsAre(AllOf(HasSubstr("optimize.policy 'zero-infinity'"),
                                HasSubstr("deepcompile"))));
  o.set_policy("");
  o.add_passes("zero3-insert");
  o.add_passes("offload-lend");
  o.add_passes("unshard:k=2");
  EXPECT_THAT(CheckOptimizeSpec(o, 3),
              ElementsAre(HasSubstr("optimize.passes[2]: pass unshard has no "
                                    "parameter 'k'")));
  o.set_policy("tandem");
  EXPECT_THAT(CheckOptimizeSpec(o, 3),
              ::testing::Contains(HasSubstr("are both set")));
}

TEST(JobPlanTest, PlanOptionsFromSpec_PolicyOrPasses) {
  v1::JobSpec spec;
  spec.mutable_parallel()->set_world_size(2);
  spec.mutable_optimize()->set_policy("deepcompile");
  PlanOptions options = PlanOptionsFromSpec(spec);
  EXPECT_EQ(options.policy, Policy::kDeepCompile);
  EXPECT_THAT(options.passes, IsEmpty());
  spec.mutable_optimize()->clear_policy();
  spec.mutable_optimize()->add_passes("zero1");
  spec.mutable_parallel()->set_zero_stage(1);
  options = PlanOptionsFromSpec(spec);
  EXPECT_THAT(options.passes, ElementsAre("zero1"));
  EXPECT_EQ(options.mode, ShardingMode::kZero1);
}

TEST(JobPlanTest, HardwareForJob_CpuHostsShareTheirMemory) {
  v1::JobSpec spec;
  spec.mutable_parallel()->set_world_size(4);
  const int64_t host = int64_t{8} << 30;
  const JobHardware job = HardwareForJob(spec, {{"a", "cpu", host},
                                                {"a", "cpu", host},
                                                {"b", "cpu", host},
                                                {"b", "cpu", host / 2}});
  EXPECT_EQ(job.hw.world_size, 4);
  EXPECT_EQ(job.hw.ranks_per_node, 2);
  // Host b reports 4 GiB shared by 2 ranks: 2 GiB each, the smallest share.
  EXPECT_EQ(job.hw.device_memory_bytes, int64_t{2} << 30);
  EXPECT_EQ(job.hw.budget(), int64_t{2} << 30);
  EXPECT_DOUBLE_EQ(job.hw.host_bytes_per_s, kAssumedCpuHostBytesPerS);
  EXPECT_THAT(job.assumptions, IsEmpty());
  EXPECT_THAT(DescribeHardware(job.hw),
              HasSubstr("host link 5 GB/s (assumed)"));
}

TEST(JobPlanTest, HardwareForJob_GpusKeepTheirMemoryAndDeclaredWins) {
  v1::JobSpec spec;
  spec.mutable_parallel()->set_world_size(2);
  spec.mutable_memory()->set_budget_bytes(int64_t{30} << 30);
  const int64_t gpu = int64_t{40} << 30;
  JobHardware job =
      HardwareForJob(spec, {{"a", "cuda:0", gpu}, {"a", "cuda:1", gpu}});
  EXPECT_EQ(job.hw.device_memory_bytes, gpu);
  EXPECT_EQ(job.hw.budget(), int64_t{30} << 30);
  EXPECT_DOUBLE_EQ(job.hw.host_bytes_per_s, kAssumedGpuHostBytesPerS);

  v1::HardwareSpec& declared = *spec.mutable_hardware();
  declared.set_ranks_per_node(8);
  declared.set_host_gbps(12.5);
  declared.set_inter_node_gbps(25);
  declared.set_device_memory_bytes(int64_t{80} << 30);
  job = HardwareForJob(spec, {{"a", "cuda:0", gpu}, {"a", "cuda:1", gpu}});
  EXPECT_EQ(job.hw.ranks_per_node, 8);
  EXPECT_EQ(job.hw.device_memory_bytes, int64_t{80} << 30);
  EXPECT_DOUBLE_EQ(job.hw.host_bytes_per_s, 12.5e9);
  EXPECT_DOUBLE_EQ(job.hw.inter_node_bytes_per_s, 25e9);
  EXPECT_THAT(job.assumptions, IsEmpty());
}

// bench/e2e's tiny-llama (tests/e2e: 2 ranks, 4 x 128 tokens, vocab 4096).
v1::JobSpec E2eTinyLlama(int64_t budget) {
  v1::JobSpec spec;
  v1::ModelSpec& m = *spec.mutable_model();
  m.set_preset("llama");
  m.set_layers(4);
  m.set_d_model(256);
  m.set_heads(8);
  m.set_kv_heads(8);
  m.set_ffn(704);
  m.set_vocab(4096);
  spec.mutable_batch()->set_micro_batch(4);
  spec.mutable_batch()->set_seq_len(128);
  spec.mutable_batch()->set_grad_accum(1);
  spec.mutable_parallel()->set_world_size(2);
  spec.mutable_memory()->set_budget_bytes(budget);
  return spec;
}

// A budget accepted at submit never fails for memory: the least-memory
// schedule (the guard's fallback, which may use the budget itself) fits it,
// counted with the loss backward's two fp32 logit-sized tensors. That
// schedule measured 105.35 MB on this model (bench/e2e, 2026-11-29); 105 MB
// passed at submit before (the model counted 88.57 MB) and failed on the
// fallback.
TEST(JobPlanTest, CheckBudgetFits_AtLeastTheMeasuredLeastMemoryPeak) {
  const absl::Status low = CheckBudgetFits(E2eTinyLlama(105'000'000));
  ASSERT_EQ(low.code(), absl::StatusCode::kInvalidArgument) << low;
  EXPECT_THAT(low.message(), AllOf(HasSubstr("least-memory schedule"),
                                   HasSubstr("set memory.budget_bytes: ")));
  // The budget it names holds the measured peak, and is accepted.
  const std::string text(low.message());
  const size_t at = text.find("set memory.budget_bytes: ") +
                    std::string("set memory.budget_bytes: ").size();
  const int64_t named_mib = std::stoll(text.substr(at));
  const int64_t named = named_mib << 20;
  EXPECT_GE(static_cast<double>(named), 105.35e6);
  EXPECT_TRUE(CheckBudgetFits(E2eTinyLlama(named)).ok());
  // No budget: nothing to check.
  EXPECT_TRUE(CheckBudgetFits(E2eTinyLlama(0)).ok());
}

TEST(GraphBuilderTest, LossBackward_HoldsTwoFp32LogitTensors) {
  absl::StatusOr<ModelConfig> config = ModelConfigFromJobSpec(E2eTinyLlama(0));
  ASSERT_TRUE(config.ok()) << config.status();
  absl::StatusOr<Graph> graph = BuildModelGraph(*config);
  ASSERT_TRUE(graph.ok()) << graph.status();
  int found = 0;
  for (const Node& n : graph->nodes) {
    if (absl::StrContains(n.name, "loss") && n.phase == Phase::kBackward) {
      EXPECT_EQ(n.workspace_bytes, int64_t{2} * 4 * 128 * 4096 * 4) << n.name;
      ++found;
    }
  }
  EXPECT_GT(found, 0);
}

TEST(CalibrateTest, HostCopies_SetTheHostLink) {
  const Graph graph = Model("preset=tiny-llama world=2");
  Profile profile;
  profile.graph_hash = graph.StructuralHash();
  profile.schedule_version = 3;  // no calibration of memory needed here
  profile.host_copy_bytes = int64_t{64} << 20;
  profile.host_copy_s = 0.032;
  HardwareModel hw = HardwareModel::H100(2);
  absl::StatusOr<Calibrated> c = CalibrateToMeasurements(
      graph, hw, &profile, nullptr, ShardingMode::kZero3);
  ASSERT_TRUE(c.ok()) << c.status();
  // 64 MiB in 32 ms: 2.097 GB/s, not the 50 GB/s the model started with.
  EXPECT_NEAR(c->hw.host_bytes_per_s, 67108864 / 0.032, 1);
  EXPECT_TRUE(c->hw.host_link_measured);
  EXPECT_NEAR(c->hw.HostCopySeconds(int64_t{64} << 20), 0.032, 1e-12);
  EXPECT_THAT(DescribeHardware(c->hw), HasSubstr("(measured)"));
  // No copies in the window: the host link stays as it was.
  profile.host_copy_bytes = 0;
  c = CalibrateToMeasurements(graph, hw, &profile, nullptr,
                              ShardingMode::kZero3);
  ASSERT_TRUE(c.ok());
  EXPECT_DOUBLE_EQ(c->hw.host_bytes_per_s, hw.host_bytes_per_s);
  EXPECT_FALSE(c->hw.host_link_measured);
}

TEST(JobPlanTest, HardwareForJob_NothingReported_SaysItAssumedNoLimit) {
  v1::JobSpec spec;
  spec.mutable_parallel()->set_world_size(2);
  const JobHardware job = HardwareForJob(spec, {});
  EXPECT_EQ(job.hw.ranks_per_node, 2);
  EXPECT_THAT(job.assumptions,
              ::testing::Contains(HasSubstr("no memory limit")));
  EXPECT_THAT(DescribeHardware(job.hw), HasSubstr("2 ranks, 2 per node"));
}

}  // namespace
}  // namespace tandem
