// Property test of the planner: over random graphs (small builder configs
// and hand-assembled graphs with random params, nodes, times and sizes) and
// random budgets, every policy's schedule keeps every invariant, a plan
// reported feasible simulates within its budget, Tandem fails only when
// the budget is below the smallest feasible one, and Tandem's plan is
// predicted no slower than any reference policy's plan that fits. Seeded, so a
// failure reproduces; the case's seed is in the message.
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/bytes.h"
#include "common/ir/text_format.h"
#include "common/ir/validate.h"
#include "common/lowering/schedule_semantics.h"
#include "common/models/graph_builder.h"
#include "common/models/model_config.h"
#include "common/sim/simulator.h"
#include "coordinator/planner/planner.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/coordinator/planner/explanation_checks.h"

namespace tandem {
namespace {

using ::testing::HasSubstr;

constexpr int kCases = 100;

template <typename T>
T Pick(std::mt19937_64& rng, const std::vector<T>& options) {
  return options[std::uniform_int_distribution<size_t>(
      0, options.size() - 1)(rng)];
}

int Uniform(std::mt19937_64& rng, int lo, int hi) {
  return std::uniform_int_distribution<int>(lo, hi)(rng);
}

double UniformReal(std::mt19937_64& rng, double lo, double hi) {
  return std::uniform_real_distribution<double>(lo, hi)(rng);
}

// A small config of the built-in model family.
Graph BuilderGraph(std::mt19937_64& rng) {
  ModelConfig c;
  c.name = "random";
  c.arch = Uniform(rng, 0, 3) == 0 ? ModelArch::kMoe : ModelArch::kLlama;
  c.layers = Uniform(rng, 1, 4);
  c.heads = Pick<int32_t>(rng, {2, 4, 8});
  c.d_model = c.heads * Pick<int32_t>(rng, {8, 16, 32});
  c.kv_heads = c.heads / Pick<int32_t>(rng, {1, 2});
  c.ffn = Uniform(rng, 16, 400);
  c.vocab = Uniform(rng, 50, 3000);
  if (c.arch == ModelArch::kMoe) {
    c.experts = Uniform(rng, 2, 4);
    c.top_k = Uniform(rng, 1, c.experts);
  }
  c.seq_len = Pick<int32_t>(rng, {16, 64, 256});
  c.micro_batch = Uniform(rng, 1, 4);
  c.grad_accum = Uniform(rng, 1, 2);
  c.dtype = Pick<DType>(rng, {DType::kF32, DType::kBF16});
  c.activation_checkpointing = Uniform(rng, 0, 1) == 1;
  c.world_size = Pick<int32_t>(rng, {1, 2, 4, 8, 16});
  // Slow devices make the collectives matter against compute.
  c.device_flops = UniformReal(rng, 1e9, 1e12);
  c.device_bytes_per_s = UniformReal(rng, 1e8, 1e11);
  absl::StatusOr<Graph> graph = BuildModelGraph(c);
  EXPECT_TRUE(graph.ok()) << graph.status();
  return *graph;
}

// Random params used by random forward nodes, backward twins in reverse
// (some recomputed, some forward nodes without a twin), per micro-batch,
// then an optimizer node.
Graph HandGraph(std::mt19937_64& rng) {
  Graph g;
  g.name = "hand";
  g.world_size = Pick<int32_t>(rng, {1, 2, 3, 4, 8, 32});
  g.micro_batches = Uniform(rng, 1, 2);
  g.tokens_per_micro_batch = 128;
  const int num_params = Uniform(rng, 1, 12);
  for (int p = 0; p < num_params; ++p) {
    Param param;
    param.id = p;
    param.name = absl::StrCat("p", p, ".weight");
    const int dims = Uniform(rng, 1, 2);
    for (int d = 0; d < dims; ++d) param.shape.push_back(Uniform(rng, 1, 600));
    param.dtype = Pick<DType>(rng, {DType::kF32, DType::kBF16, DType::kF16});
    param.unit = absl::StrCat("unit", Uniform(rng, 0, 3));
    g.params.push_back(param);
  }
  const int forward_nodes = Uniform(rng, 1, 8);
  std::vector<std::vector<int32_t>> uses(forward_nodes);
  for (auto& params : uses) {
    for (int p = 0; p < num_params; ++p) {
      if (Uniform(rng, 0, 3) == 0) params.push_back(p);
    }
  }
  int32_t id = 0;
  for (int mb = 0; mb < g.micro_batches; ++mb) {
    std::vector<Node> forward;
    for (int f = 0; f < forward_nodes; ++f) {
      Node n;
      n.id = id++;
      n.name = absl::StrCat("mb", mb, ".f", f);
      n.phase = Phase::kForward;
      n.micro_batch = mb;
      n.param_ids = uses[f];
      n.time_s = UniformReal(rng, 0, 2e-3);
      n.activation_bytes = Uniform(rng, 0, 1 << 20);
      n.workspace_bytes = Uniform(rng, 0, 1 << 18);
      forward.push_back(n);
      g.nodes.push_back(n);
    }
    for (int f = forward_nodes - 1; f >= 0; --f) {
      if (Uniform(rng, 0, 5) == 0) continue;  // no backward twin
      Node n;
      n.id = id++;
      n.name = forward[f].name + ".bwd";
      n.phase = Phase::kBackward;
      n.micro_batch = mb;
      n.forward_id = forward[f].id;
      n.recompute = Uniform(rng, 0, 1) == 1;
      n.param_ids = forward[f].param_ids;
      n.time_s = UniformReal(rng, 0, 4e-3);
      n.workspace_bytes = Uniform(rng, 0, 1 << 19);
      g.nodes.push_back(n);
    }
  }
  Node opt;
  opt.id = id++;
  opt.name = "optimizer";
  opt.phase = Phase::kOptimizer;
  opt.time_s = UniformReal(rng, 0, 1e-3);
  g.nodes.push_back(opt);
  return g;
}

HardwareModel RandomHardware(std::mt19937_64& rng, int32_t world) {
  HardwareModel hw = HardwareModel::H100(world);
  hw.ranks_per_node = Pick<int32_t>(rng, {1, 2, 8});
  hw.intra_node_bytes_per_s = UniformReal(rng, 1e8, 4e11);
  hw.inter_node_bytes_per_s = UniformReal(rng, 1e8, 5e10);
  hw.host_bytes_per_s = UniformReal(rng, 1e8, 5e10);
  hw.collective_latency_s = UniformReal(rng, 0, 5e-5);
  return hw;
}

class PlannerPropertyTest : public ::testing::TestWithParam<int> {};

TEST_P(PlannerPropertyTest, Plan_RandomGraphAndBudget_KeepsEveryInvariant) {
  const int seed = GetParam();
  std::mt19937_64 rng(seed);
  const Graph graph = seed % 2 == 0 ? BuilderGraph(rng) : HandGraph(rng);
  ASSERT_TRUE(ValidateGraph(graph).ok()) << ValidateGraph(graph);
  HardwareModel hw = RandomHardware(rng, graph.world_size);
  absl::StatusOr<int64_t> smallest = SmallestFeasibleBudget(graph, hw);
  ASSERT_TRUE(smallest.ok()) << smallest.status();
  // From a little below the smallest feasible budget to far above it.
  hw.budget_bytes = static_cast<int64_t>(static_cast<double>(*smallest) *
                                         UniformReal(rng, 0.9, 3.0));
  hw.device_memory_bytes = std::max(hw.device_memory_bytes, hw.budget_bytes);
  SCOPED_TRACE(absl::StrCat("seed ", seed, ", budget ", hw.budget_bytes,
                            ", smallest feasible ", *smallest, "\n",
                            PrintGraph(graph)));

  // Never behind, predicted: Tandem's plan is no slower than any reference
  // policy's plan that fits (planned last, compared below).
  std::vector<std::pair<Policy, double>> reference_times;
  double tandem_s = -1;
  for (Policy policy : AllPolicies()) {
    SCOPED_TRACE(PolicyName(policy));
    PlanOptions options;
    options.policy = policy;
    absl::StatusOr<PlanResult> result = Plan(graph, hw, options);
    if (result.ok() && result->feasible) {
      if (policy == Policy::kTandem) {
        tandem_s = result->sim.iteration_s;
      } else {
        reference_times.emplace_back(policy, result->sim.iteration_s);
      }
    }
    if (policy == Policy::kTandem && hw.budget_bytes < *smallest) {
      ASSERT_FALSE(result.ok());
      EXPECT_EQ(result.status().code(), absl::StatusCode::kResourceExhausted);
      EXPECT_THAT(result.status().message(), HasSubstr(FormatBytes(*smallest)));
      continue;
    }
    ASSERT_TRUE(result.ok()) << result.status();
    const Schedule& schedule = result->schedule;
    EXPECT_TRUE(ValidateSchedule(schedule, graph).ok())
        << ValidateSchedule(schedule, graph);
    EXPECT_TRUE(CheckScheduleSemantics(graph, schedule).ok())
        << CheckScheduleSemantics(graph, schedule) << "\n"
        << PrintSchedule(schedule);
    absl::StatusOr<SimResult> sim = Simulate(graph, schedule, hw);
    ASSERT_TRUE(sim.ok()) << sim.status();
    EXPECT_EQ(sim->peak_bytes, result->sim.peak_bytes);
    EXPECT_EQ(result->feasible, sim->peak_bytes <= hw.budget_bytes);
    if (policy == Policy::kTandem) {
      EXPECT_TRUE(result->feasible);
      EXPECT_LE(sim->peak_bytes, hw.budget_bytes);
    }
    ExpectGainsAddUp(graph, *result, ShardingMode::kZero3);
    // Every policy does the same compute.
    EXPECT_NEAR(sim->compute_s, result->sim.compute_s, 1e-12);
  }

  if (tandem_s >= 0) {
    for (const auto& [policy, seconds] : reference_times) {
      EXPECT_LE(tandem_s, seconds * (1 + 1e-9))
          << "tandem predicted slower than " << PolicyName(policy);
    }
  }

  // Tandem's ZeRO-1 pipeline: a plan that keeps every invariant and fits, or
  // a clear ResourceExhausted.
  PlanOptions zero1;
  zero1.mode = ShardingMode::kZero1;
  absl::StatusOr<PlanResult> result = Plan(graph, hw, zero1);
  if (!result.ok()) {
    EXPECT_EQ(result.status().code(), absl::StatusCode::kResourceExhausted)
        << result.status();
    EXPECT_THAT(result.status().message(),
                HasSubstr("smallest feasible budget"));
  } else {
    EXPECT_EQ(result->schedule.mode, ShardingMode::kZero1);
    EXPECT_TRUE(CheckScheduleSemantics(graph, result->schedule).ok())
        << CheckScheduleSemantics(graph, result->schedule);
    EXPECT_TRUE(result->feasible);
    ExpectGainsAddUp(graph, *result, ShardingMode::kZero1);
  }
}

INSTANTIATE_TEST_SUITE_P(Seeds, PlannerPropertyTest,
                         ::testing::Range(0, kCases));

}  // namespace
}  // namespace tandem
