// plan_bench: the planner at paper scale (issue 3). Plans every policy on the
// DeepCompile paper's grid and reports simulated iteration time, exposed
// communication, peak memory, the ratio to the schedule's own lower bound
// max(Σcompute, Σcomm, Σcopy) and the planning wall time, then checks the
// targets:
//   - tandem within 1.10x of its lower bound on every feasible configuration;
//   - tandem never slower than a feasible reference policy;
//   - geometric-mean speedup >= 1.05x over deepcompile, >= 1.3x over fsdp;
//   - every tandem schedule within budget;
//   - a Llama-3 70B graph planned in under 1 s;
//   - on the gradient-accumulation sweep, every tandem schedule within budget
//     and tandem never slower than a feasible reference policy.
//
//   plan_bench [--json] [--model PRESET] [--quick]
//
// Exits 1 when a target is missed (2 on bad arguments). --quick prints only
// the targets (the grid and the sweep plan in a few seconds): ctest runs
// it, so a change that misses a target fails the suite.
// Grid: Llama-3 70B and Mixtral 8x7B on 32 ranks (4 nodes x 8 H100 80 GiB),
// micro-batch 1/2/4 x sequence 512/1024/2048, activation checkpointing on;
// and Llama-3 70B on 16 ranks at micro-batch 4, sequence 2048, where the
// optimizer states must be offloaded: the on-demand baseline peaks at
// 89.9 GiB of 80 GiB, 49.3 GiB of it Adam moments and fp32 masters. bf16 params
// and gradients, fp32 master weights and Adam moments (the simulator's
// OptimizerStateBytesPerElement). --json prints one object per line per
// configuration and policy instead of the table; --model keeps one preset.
// Gradient-accumulation sweep (the DeepCompile paper's): Llama-3 70B and
// Mixtral 8x7B on 32 ranks, micro-batch 1, sequence 2048, checkpointing on,
// grad_accum 1/2/4/8. Accumulating every gradient unsharded does not fit
// there (Llama-3 70B at grad_accum 2 and more: 171 GiB on demand); the
// reference policies reduce every micro-batch, as FSDP and DeepSpeed do, and
// Tandem chooses per group (micro-batch-reduce, coordinator/passes).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "common/flags/command_line.h"
#include "common/flags/flag_checks.h"
#include "common/ir/graph.h"
#include "common/models/graph_builder.h"
#include "common/models/model_config.h"
#include "common/sim/hardware_model.h"
#include "coordinator/planner/planner.h"

ABSL_FLAG(bool, json, false,
          "one JSON object per line per configuration and policy instead of "
          "the table");
ABSL_FLAG(std::string, model, "",
          "plan only this preset's configurations: llama3-70b or "
          "mixtral-8x7b");
ABSL_FLAG(bool, quick, false,
          "print only the targets; exit 1 on a miss (ctest "
          "plan_bench_targets)");

namespace tandem {
namespace {

constexpr char kUsage[] =
    "usage: plan_bench [--json] [--model PRESET] [--quick]\n"
    "Plans every policy on the DeepCompile paper's grid and checks the "
    "planner's targets.\nExit status: 0 when every target is met, 1 on a "
    "miss, 2 on bad arguments.\n";

struct BenchConfig {
  std::string preset;
  int32_t ranks = 32;
  int32_t micro_batch = 1;
  int32_t seq_len = 512;
  int32_t grad_accum = 1;
};

struct Row {
  BenchConfig config;
  Policy policy = Policy::kTandem;
  bool planned = false;  // false: the planner refused (error below)
  std::string error;
  bool feasible = false;
  double iteration_s = 0;
  double lower_bound_s = 0;
  double exposed_comm_s = 0;
  double compute_s = 0;
  double comm_s = 0;
  double copy_s = 0;
  int64_t peak_bytes = 0;
  int64_t budget_bytes = 0;
  double plan_wall_s = 0;
  // AnyPlanBound() of the configuration.
  double any_plan_bound_s = 0;
  double ratio() const {
    return lower_bound_s > 0 ? iteration_s / lower_bound_s : 0;
  }
};

std::vector<BenchConfig> Grid() {
  std::vector<BenchConfig> grid;
  for (const char* preset : {"llama3-70b", "mixtral-8x7b"}) {
    for (int32_t mb : {1, 2, 4}) {
      for (int32_t seq : {512, 1024, 2048}) {
        grid.push_back({preset, 32, mb, seq});
      }
    }
  }
  grid.push_back({"llama3-70b", 16, 4, 2048});
  return grid;
}

std::vector<BenchConfig> GradAccumSweep() {
  std::vector<BenchConfig> sweep;
  for (const char* preset : {"llama3-70b", "mixtral-8x7b"}) {
    for (int32_t ga : {1, 2, 4, 8}) sweep.push_back({preset, 32, 1, 2048, ga});
  }
  return sweep;
}

std::string ConfigName(const BenchConfig& c) {
  std::string name = absl::StrFormat("%s/%d mb%d s%d", c.preset, c.ranks,
                                     c.micro_batch, c.seq_len);
  if (c.grad_accum > 1) absl::StrAppendFormat(&name, " ga%d", c.grad_accum);
  return name;
}

absl::StatusOr<Graph> BuildGraph(const BenchConfig& c) {
  absl::StatusOr<ModelConfig> config = ParseModelConfig(absl::StrFormat(
      "preset=%s world=%d micro_batch=%d seq_len=%d grad_accum=%d "
      "checkpointing=true",
      c.preset, c.ranks, c.micro_batch, c.seq_len, c.grad_accum));
  if (!config.ok()) return config.status();
  return BuildModelGraph(*config);
}

// A lower bound on the iteration time of every schedule of `graph` that
// fits the budget, in the simulator's model (grad_accum 1): no plan computes
// less than Σ node time, and no plan communicates less than one
// reduce-scatter of every gradient plus two all-gathers of every param
// (its forward and its backward use), except for the bytes kept gathered
// across the turn from forward to backward (kept, or persistent and
// refreshed after the step: one gather either way). Those bytes are live
// at the turn next to the param and gradient shards and every forward
// activation, so they are at most budget − shards − gradient shards −
// activations (optimizer states may all be on the host). Latencies count
// zero. Used to tell targets the model cannot reach from ones the planner
// misses.
double AnyPlanBound(const Graph& graph, const HardwareModel& hw) {
  const int world = std::max(graph.world_size, 1);
  double compute = 0;
  int64_t activations = 0;
  for (const Node& node : graph.nodes) {
    compute += node.time_s;
    if (node.phase == Phase::kForward) activations += node.activation_bytes;
  }
  int64_t full = 0, padded = 0, shards = 0;
  for (const Param& p : graph.params) {
    full += p.bytes();
    const int64_t shard = p.shard_numel(world) * DTypeBytes(p.dtype);
    shards += shard;
    padded += shard * world;
  }
  const double headroom =
      static_cast<double>(hw.budget() - 2 * shards - activations);
  const double kept =
      std::clamp(headroom / static_cast<double>(full), 0.0, 1.0);
  // Bytes-proportional part of the ring model (the latency counts zero).
  const double per_byte =
      hw.AllGatherSeconds(int64_t{1} << 40) / 1099511627776.0 -
      hw.collective_latency_s / 1099511627776.0;
  const double comm = static_cast<double>(padded) * (3 - kept) * per_byte;
  return std::max(compute, comm);
}

Row PlanOne(const BenchConfig& c, const Graph& graph, Policy policy) {
  Row row;
  row.config = c;
  row.policy = policy;
  const HardwareModel hw = HardwareModel::H100(c.ranks);
  row.budget_bytes = hw.budget();
  // The bound assumes one micro-batch (its activations all live at once).
  row.any_plan_bound_s = c.grad_accum == 1 ? AnyPlanBound(graph, hw) : 0;
  PlanOptions options;
  options.policy = policy;
  absl::StatusOr<PlanResult> result = Plan(graph, hw, options);
  if (!result.ok()) {
    row.error = std::string(result.status().message());
    return row;
  }
  row.planned = true;
  row.feasible = result->feasible;
  row.iteration_s = result->sim.iteration_s;
  row.lower_bound_s = result->sim.lower_bound_s;
  row.exposed_comm_s = result->sim.exposed_comm_s;
  row.compute_s = result->sim.compute_s;
  row.comm_s = result->sim.comm_s;
  row.copy_s = result->sim.copy_s;
  row.peak_bytes = result->sim.peak_bytes;
  row.plan_wall_s = result->plan_wall_s;
  return row;
}

std::string JsonEscape(absl::string_view s) {
  std::string out;
  for (char ch : s) {
    if (ch == '"' || ch == '\\') {
      out.push_back('\\');
      out.push_back(ch);
    } else if (static_cast<unsigned char>(ch) < 0x20) {
      absl::StrAppendFormat(&out, "\\u%04x", ch);
    } else {
      out.push_back(ch);
    }
  }
  return out;
}

void PrintJson(const Row& r) {
  std::string line = absl::StrFormat(
      "{\"model\":\"%s\",\"ranks\":%d,\"micro_batch\":%d,\"seq_len\":%d,"
      "\"grad_accum\":%d,"
      "\"policy\":\"%s\",\"feasible\":%s,\"iteration_s\":%.9g,"
      "\"lower_bound_s\":%.9g,\"ratio\":%.6g,\"exposed_comm_s\":%.9g,"
      "\"compute_s\":%.9g,\"comm_s\":%.9g,\"copy_s\":%.9g,"
      "\"peak_bytes\":%d,\"budget_bytes\":%d,\"plan_wall_s\":%.6g,"
      "\"any_plan_bound_s\":%.9g",
      r.config.preset, r.config.ranks, r.config.micro_batch, r.config.seq_len,
      r.config.grad_accum, PolicyName(r.policy), r.feasible ? "true" : "false",
      r.iteration_s, r.lower_bound_s, r.ratio(), r.exposed_comm_s, r.compute_s,
      r.comm_s, r.copy_s, r.peak_bytes, r.budget_bytes, r.plan_wall_s,
      r.any_plan_bound_s);
  if (!r.planned) {
    absl::StrAppend(&line, ",\"error\":\"", JsonEscape(r.error), "\"");
  }
  absl::PrintF("%s}\n", line);
}

double GiB(int64_t bytes) { return static_cast<double>(bytes) / (1 << 30); }

void PrintTableHeader() {
  absl::PrintF("%-30s %-16s %9s %9s %6s %9s %9s %9s %5s %8s\n", "config",
               "policy", "iter_s", "bound_s", "ratio", "exposed_s", "copy_s",
               "peak_GiB", "fits", "plan_s");
}

void PrintTableRow(const Row& r) {
  if (!r.planned) {
    absl::PrintF("%-30s %-16s  no plan: %s\n", ConfigName(r.config),
                 PolicyName(r.policy), r.error.substr(0, 120));
    return;
  }
  absl::PrintF("%-30s %-16s %9.3f %9.3f %6.3f %9.3f %9.3f %9.2f %5s %8.4f\n",
               ConfigName(r.config), PolicyName(r.policy), r.iteration_s,
               r.lower_bound_s, r.ratio(), r.exposed_comm_s, r.copy_s,
               GiB(r.peak_bytes), r.feasible ? "yes" : "NO", r.plan_wall_s);
}

// Checks the targets over all rows; prints one line each. Returns whether
// every target was met.
const char* Verdict(bool met) { return met ? "MET" : "NOT MET"; }

// The "never slower" target line; `slower` names the cases that missed it.
void PrintNeverSlower(const std::vector<std::string>& slower) {
  absl::PrintF("  tandem never slower than a feasible reference policy: %s%s\n",
               Verdict(slower.empty()),
               slower.empty()
                   ? ""
                   : absl::StrCat(" (", slower.size(),
                                  " cases, first: ", slower[0], ")"));
}

bool PrintSummary(const std::vector<Row>& rows) {
  std::map<std::string, std::map<Policy, const Row*>> by_config;
  std::vector<std::string> order;
  for (const Row& r : rows) {
    const std::string name = ConfigName(r.config);
    if (!by_config.count(name)) order.push_back(name);
    by_config[name][r.policy] = &r;
  }

  double worst_ratio = 0;
  std::string worst_ratio_config;
  int tandem_feasible = 0, tandem_total = 0;
  std::vector<std::string> slower;
  double log_dc = 0, log_fsdp = 0, log_dc_all = 0;
  double log_dc_best = 0, log_fsdp_best = 0;
  int n_dc = 0, n_fsdp = 0, n_dc_all = 0;
  double max_wall_70b = 0;
  std::map<Policy, std::vector<std::string>> over_budget;
  for (const std::string& name : order) {
    const auto& policies = by_config[name];
    auto it = policies.find(Policy::kTandem);
    if (it == policies.end()) continue;
    const Row& t = *it->second;
    ++tandem_total;
    if (t.planned && t.feasible) ++tandem_feasible;
    if (t.planned && t.config.preset == "llama3-70b") {
      max_wall_70b = std::max(max_wall_70b, t.plan_wall_s);
    }
    if (!t.planned || !t.feasible) continue;
    if (t.ratio() > worst_ratio) {
      worst_ratio = t.ratio();
      worst_ratio_config = name;
    }
    for (const auto& [policy, ref] : policies) {
      if (policy == Policy::kTandem) continue;
      if (policy == Policy::kDeepCompile && ref->planned) {
        log_dc_all += std::log(ref->iteration_s / t.iteration_s);
        ++n_dc_all;
      }
      if (!ref->planned || !ref->feasible) {
        over_budget[policy].push_back(name);
        continue;
      }
      if (t.iteration_s > ref->iteration_s * (1 + 1e-9)) {
        slower.push_back(absl::StrFormat("%s vs %s (%.4f s > %.4f s)", name,
                                         PolicyName(policy), t.iteration_s,
                                         ref->iteration_s));
      }
      const double speedup = ref->iteration_s / t.iteration_s;
      const double best = ref->iteration_s / t.any_plan_bound_s;
      if (policy == Policy::kDeepCompile) {
        log_dc += std::log(speedup);
        log_dc_best += std::log(best);
        ++n_dc;
      } else if (policy == Policy::kFsdp) {
        log_fsdp += std::log(speedup);
        log_fsdp_best += std::log(best);
        ++n_fsdp;
      }
    }
  }
  const double geo_dc = n_dc > 0 ? std::exp(log_dc / n_dc) : 0;
  const double geo_fsdp = n_fsdp > 0 ? std::exp(log_fsdp / n_fsdp) : 0;

  absl::PrintF("\nTargets\n");
  absl::PrintF(
      "  tandem within 1.10x of its lower bound on every feasible config: %s "
      "(worst %.3fx, %s)\n",
      Verdict(worst_ratio <= 1.10), worst_ratio, worst_ratio_config);
  PrintNeverSlower(slower);
  absl::PrintF(
      "  geomean speedup over deepcompile >= 1.05x: %s (%.3fx over %d "
      "configs)\n",
      Verdict(geo_dc >= 1.05), geo_dc, n_dc);
  absl::PrintF(
      "    (%.3fx over %d configs counting deepcompile's over-budget plans "
      "too)\n",
      n_dc_all > 0 ? std::exp(log_dc_all / n_dc_all) : 0.0, n_dc_all);
  absl::PrintF(
      "  geomean speedup over fsdp >= 1.3x: %s (%.3fx over %d configs)\n",
      Verdict(geo_fsdp >= 1.3), geo_fsdp, n_fsdp);
  absl::PrintF(
      "  no plan in this model could do better than %.3fx over deepcompile "
      "and %.3fx over fsdp\n    (geomeans of the reference time over "
      "AnyPlanBound, the same configs)\n",
      n_dc > 0 ? std::exp(log_dc_best / n_dc) : 0.0,
      n_fsdp > 0 ? std::exp(log_fsdp_best / n_fsdp) : 0.0);
  absl::PrintF("  every tandem schedule within budget: %s (%d of %d)\n",
               Verdict(tandem_feasible == tandem_total), tandem_feasible,
               tandem_total);
  absl::PrintF("  llama3-70b planned in < 1 s: %s (slowest %.3f s)\n",
               Verdict(max_wall_70b < 1.0), max_wall_70b);
  const bool all_met = worst_ratio <= 1.10 && slower.empty() &&
                       geo_dc >= 1.05 && geo_fsdp >= 1.3 &&
                       tandem_feasible == tandem_total && max_wall_70b < 1.0;
  if (!over_budget.empty()) {
    absl::PrintF("  reference plans over budget (left out of comparisons):\n");
    for (const auto& [policy, configs] : over_budget) {
      absl::PrintF("    %s: %s\n", PolicyName(policy),
                   absl::StrJoin(configs, ", "));
    }
  }
  return all_met;
}

// The gradient-accumulation sweep's table and targets: per configuration,
// Tandem's time and peak and its speedup over each reference policy ("OOM"
// where that policy's plan exceeds the budget). Returns whether every
// Tandem plan fits and none is slower than a reference plan that fits.
bool PrintSweepSummary(const std::vector<Row>& rows) {
  std::map<std::string, std::map<Policy, const Row*>> by_config;
  std::vector<std::string> order;
  for (const Row& r : rows) {
    const std::string name = ConfigName(r.config);
    if (!by_config.count(name)) order.push_back(name);
    by_config[name][r.policy] = &r;
  }
  const Policy refs[] = {Policy::kDeepSpeedZero3, Policy::kFsdp,
                         Policy::kDeepCompile};
  absl::PrintF(
      "\nGradient accumulation sweep (32 ranks, micro-batch 1, seq 2048, "
      "checkpointing)\n%-30s %9s %9s %5s %12s %12s %12s\n",
      "config", "tandem_s", "peak_GiB", "fits", "vs deepspeed", "vs fsdp",
      "vs deepcomp");
  int fits = 0, total = 0;
  std::vector<std::string> slower;
  double log_speedup[3] = {0, 0, 0};
  int n_speedup[3] = {0, 0, 0};
  for (const std::string& name : order) {
    const auto& policies = by_config[name];
    auto it = policies.find(Policy::kTandem);
    if (it == policies.end()) continue;
    const Row& t = *it->second;
    ++total;
    if (!t.planned) {
      absl::PrintF("%-30s  no plan: %s\n", name, t.error.substr(0, 100));
      continue;
    }
    if (t.feasible) ++fits;
    std::string line =
        absl::StrFormat("%-30s %9.3f %9.2f %5s", name, t.iteration_s,
                        GiB(t.peak_bytes), t.feasible ? "yes" : "NO");
    for (int k = 0; k < 3; ++k) {
      auto ref = policies.find(refs[k]);
      if (ref == policies.end() || !ref->second->planned) {
        absl::StrAppendFormat(&line, " %12s", "-");
        continue;
      }
      const Row& r = *ref->second;
      const double speedup = r.iteration_s / t.iteration_s;
      if (!r.feasible) {
        absl::StrAppendFormat(&line, " %12s", "OOM");
        continue;
      }
      absl::StrAppendFormat(&line, " %11.3fx", speedup);
      if (t.feasible) {
        log_speedup[k] += std::log(speedup);
        ++n_speedup[k];
      }
      if (t.iteration_s > r.iteration_s * (1 + 1e-9)) {
        slower.push_back(
            absl::StrFormat("%s vs %s", name, PolicyName(refs[k])));
      }
    }
    absl::PrintF("%s\n", line);
  }
  absl::PrintF("\nGradient accumulation sweep targets\n");
  absl::PrintF("  every tandem schedule within budget: %s (%d of %d)\n",
               Verdict(fits == total), fits, total);
  PrintNeverSlower(slower);
  absl::PrintF(
      "  geomean speedup over deepspeed-zero3 %.3fx, fsdp %.3fx, deepcompile "
      "%.3fx (over the configs where each fits)\n",
      n_speedup[0] > 0 ? std::exp(log_speedup[0] / n_speedup[0]) : 0.0,
      n_speedup[1] > 0 ? std::exp(log_speedup[1] / n_speedup[1]) : 0.0,
      n_speedup[2] > 0 ? std::exp(log_speedup[2] / n_speedup[2]) : 0.0);
  return fits == total && slower.empty();
}

int Main(int argc, char** argv) {
  const CommandLineSpec spec{"plan_bench", kUsage};
  ParseCommandLineOrExit(spec, argc, argv);
  const bool json = absl::GetFlag(FLAGS_json);
  const bool quick = absl::GetFlag(FLAGS_quick);
  const std::string only = absl::GetFlag(FLAGS_model);
  ExitIfInvalid(spec,
                {only.empty() ? absl::OkStatus()
                              : CheckOneOf("--model", only,
                                           {"llama3-70b", "mixtral-8x7b"})});

  if (!json && !quick) PrintTableHeader();
  // Plans every policy on each of `configs`, printing rows as they come.
  auto run = [&](const std::vector<BenchConfig>& configs,
                 std::vector<Row>& out) -> bool {
    for (const BenchConfig& config : configs) {
      if (!only.empty() && config.preset != only) continue;
      absl::StatusOr<Graph> graph = BuildGraph(config);
      if (!graph.ok()) {
        absl::FPrintF(stderr, "plan_bench: %s: %s\n", ConfigName(config),
                      graph.status().message());
        return false;
      }
      for (Policy policy : AllPolicies()) {
        out.push_back(PlanOne(config, *graph, policy));
        if (json) {
          PrintJson(out.back());
        } else if (!quick) {
          PrintTableRow(out.back());
        }
        std::fflush(stdout);
      }
      if (!json && !quick) absl::PrintF("\n");
    }
    return true;
  };
  std::vector<Row> rows;
  std::vector<Row> sweep;
  if (!run(Grid(), rows) || !run(GradAccumSweep(), sweep)) return 1;
  if (json) return 0;
  const bool grid_met = PrintSummary(rows);
  const bool sweep_met = PrintSweepSummary(sweep);
  return grid_met && sweep_met ? 0 : 1;
}

}  // namespace
}  // namespace tandem

int main(int argc, char** argv) { return tandem::Main(argc, argv); }
