// tandem-plan: plans one training iteration offline and prints the schedule
// with its predictions, or compares every policy on the same graph.
//
//   tandem-plan (--graph FILE | --model "preset=... key=value ...")
//               [--profile FILE] [--hw "key=value ..."] [--budget BYTES]
//               [--policy NAME] [--zero1] [--schedule FILE] [--compare]
//               [--summary] [--profiled-schedule FILE] [--passes LIST]
//               [--schedule-out FILE] [--explain] [--timeline]
//               [--measured FILE=SECONDS,...] [--headroom BYTES]
//               [--trial-out FILE] [--trial-margin FRACTION]
//   tandem-plan --list-passes
//
// The graph comes from its text form or from the model builder; a profile
// (text form) replaces node times with measurements and fits the collective
// model to the measured collectives. --hw takes ParseHardwareModel's keys on
// the H100 defaults; its world defaults to the graph's. --budget overrides
// the hardware's budget (suffixes B, KiB, MiB, GiB, TiB and KB, MB, GB, TB).
// --schedule evaluates a given schedule (text form) instead of planning one.
// With a profile, the memory the runtime held beyond the simulator's model
// (the profile's peak less the simulated peak of the schedule it was measured
// under) is counted in every plan (CalibrateMemory): that schedule is
// --profiled-schedule, or the starting schedule for a profile of version 0.
// --explain prints, after the predictions, the planner's decisions with
// their simulated gains and binding constraints (FormatExplanation in
// common/ir/explanation.h); with --schedule, the explanation stored in that
// file. --timeline prints the simulated iteration: every node's start, end,
// stall and the memory after it, then every collective and host-tier copy
// (issued, started, done, bytes), to hold against a run's trace where the
// prediction and the measurement part. --measured re-fits the contention
// between transfers and compute (both ways) to schedules already measured on
// the job; --headroom keeps that much more of the budget free (GuardHeadroom
// in coordinator/planner/planner.h): both as the coordinator plans a live job.
// Tandem's policy also prints the runner-up, the fastest other plan that
// fits (a `trial` line); --trial-out writes it (text form) when it is
// predicted within --trial-margin (default 0.10, a job's
// optimize.trial_margin) of the plan, the trial a live job would measure,
// and removes the file when there is none.
// Exit status: 0 on success, 2 on bad input (unknown flag, unreadable file,
// parse error, invalid graph, profile or schedule, infeasible budget).
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "common/bytes.h"
#include "common/flags/command_line.h"
#include "common/flags/flag_checks.h"
#include "common/ir/explanation.h"
#include "common/ir/graph.h"
#include "common/ir/profile.h"
#include "common/ir/schedule.h"
#include "common/ir/text_format.h"
#include "common/ir/validate.h"
#include "common/lowering/schedule_semantics.h"
#include "common/models/graph_builder.h"
#include "common/models/model_config.h"
#include "common/sim/hardware_model.h"
#include "common/sim/simulator.h"
#include "common/status_macros.h"
#include "coordinator/planner/job_plan.h"
#include "coordinator/planner/pass_registry.h"
#include "coordinator/planner/planner.h"

ABSL_FLAG(std::string, graph, "", "iteration graph, text form");
ABSL_FLAG(std::string, model, "",
          "build the graph of a model from builder keys, e.g. "
          "\"preset=llama3-70b world=32 micro_batch=2 seq_len=1024 "
          "checkpointing=true\"");
ABSL_FLAG(std::string, profile, "",
          "measured profile (text form): node times and collective fits");
ABSL_FLAG(std::string, hw, "",
          "hardware overrides: world ranks_per_node intra_gbps inter_gbps "
          "host_gbps latency_us ag_cpu_s_per_gb rs_cpu_s_per_gb "
          "copy_cpu_s_per_gb ag_stretch rs_stretch copy_stretch memory budget "
          "unmodeled (world defaults to the graph's; a profile's measured "
          "figures replace them)");
ABSL_FLAG(std::string, budget, "",
          "memory budget per rank, e.g. 70GiB (B, KiB, MiB, GiB, TiB; KB, MB, "
          "GB, TB)");
ABSL_FLAG(std::string, policy, "tandem",
          "on-demand, deepspeed-zero3, fsdp, deepcompile or tandem");
ABSL_FLAG(std::string, passes, "",
          "run these passes (comma-separated pass-registry names, as a job's "
          "optimize.passes) instead of the policy");
ABSL_FLAG(bool, list_passes, false, "print every pass with its parameters");
ABSL_FLAG(std::string, schedule_out, "",
          "also write the planned schedule (text form) to this file");
ABSL_FLAG(bool, zero1, false, "plan a ZeRO-1 job (tandem only)");
ABSL_FLAG(std::string, schedule, "",
          "evaluate this schedule (text form) instead of planning");
ABSL_FLAG(bool, compare, false, "one row per policy instead of a schedule");
ABSL_FLAG(bool, summary, false, "print the predictions without the schedule");
ABSL_FLAG(bool, explain, false,
          "also print the planner's decisions: what each did, the pass, its "
          "simulated gain and cost, what binds it");
ABSL_FLAG(bool, timeline, false,
          "also print the simulated iteration: each node's start, end, stall "
          "and memory after it, and each collective's and copy's issue, "
          "start, end and bytes");
ABSL_FLAG(std::string, profiled_schedule, "",
          "the schedule the profile was measured under (default for a "
          "version-0 profile: the starting schedule); the memory the runtime "
          "held beyond the model is then counted in every plan");
ABSL_FLAG(std::string, measured, "",
          "FILE=SECONDS[,FILE=SECONDS...]: schedules (text form) already run "
          "on this job and their measured iteration times (slowest rank's "
          "median); the contention between transfers and compute (what "
          "each takes from the other) is re-fitted to them before planning, as "
          "the coordinator does with a live job's "
          "measurements");
ABSL_FLAG(std::string, trial_out, "",
          "write the runner-up (text form) here when it is worth a trial: "
          "predicted within --trial-margin of the plan, as a live job "
          "measures it; the file is removed when there is none");
ABSL_FLAG(double, trial_margin, 0.10,
          "the runner-up is a trial when predicted at most this much slower "
          "(0.10 = 10%; a job's optimize.trial_margin)");
ABSL_FLAG(std::string, headroom, "",
          "more of the budget left free (BYTES), as the coordinator keeps "
          "after a plan tripped the memory guard (its peaks over its "
          "prediction plus their spread)");

namespace tandem {
namespace {

constexpr int kExitBadInput = 2;

constexpr char kUsage[] =
    "usage: tandem-plan (--graph FILE | --model \"preset=NAME key=value "
    "...\")\n"
    "                   [--profile FILE] [--hw \"key=value ...\"] [--budget "
    "BYTES]\n"
    "                   [--policy NAME] [--zero1] [--schedule FILE] "
    "[--compare] [--summary]\n"
    "                   [--profiled-schedule FILE] [--passes LIST] "
    "[--explain] [--timeline]\n"
    "                   [--measured FILE=SECONDS,...] [--headroom BYTES]\n"
    "                   [--schedule-out FILE] [--trial-out FILE] "
    "[--trial-margin FRACTION]\n"
    "       tandem-plan --list-passes\n"
    "Plans one training iteration as the coordinator does and prints the "
    "schedule\nwith its predictions, or compares every policy (--compare). "
    "Exit status: 0 on\nsuccess, 2 on bad input.\n";

CommandLineSpec Spec() { return {"tandem-plan", kUsage}; }

struct Args {
  std::string graph_path;
  std::string model;
  std::string profile_path;
  std::string hw;
  std::optional<int64_t> budget;
  Policy policy = Policy::kTandem;
  std::vector<std::string> passes;
  std::string schedule_out;
  std::string schedule_path;
  std::string profiled_schedule_path;
  // --measured: schedule files and their measured iteration seconds.
  std::vector<std::pair<std::string, double>> measured;
  std::optional<int64_t> headroom;
  std::string trial_out;
  double trial_margin = 0.10;
  bool zero1 = false;
  bool compare = false;
  bool summary = false;
  bool explain = false;
  bool timeline = false;
  bool list_passes = false;
};

int Fail(absl::string_view message) {
  absl::FPrintF(stderr, "tandem-plan: %s\n", message);
  return kExitBadInput;
}

// Reads the parsed flags into `args` and checks them against each other.
// Returns an error message, or "" when they make sense.
std::string ReadArgs(Args& args) {
  args.list_passes = absl::GetFlag(FLAGS_list_passes);
  if (args.list_passes) return "";
  args.graph_path = absl::GetFlag(FLAGS_graph);
  args.model = absl::GetFlag(FLAGS_model);
  args.profile_path = absl::GetFlag(FLAGS_profile);
  args.hw = absl::GetFlag(FLAGS_hw);
  args.schedule_out = absl::GetFlag(FLAGS_schedule_out);
  args.schedule_path = absl::GetFlag(FLAGS_schedule);
  args.profiled_schedule_path = absl::GetFlag(FLAGS_profiled_schedule);
  args.zero1 = absl::GetFlag(FLAGS_zero1);
  args.compare = absl::GetFlag(FLAGS_compare);
  args.summary = absl::GetFlag(FLAGS_summary);
  args.explain = absl::GetFlag(FLAGS_explain);
  args.timeline = absl::GetFlag(FLAGS_timeline);
  args.trial_out = absl::GetFlag(FLAGS_trial_out);
  args.trial_margin = absl::GetFlag(FLAGS_trial_margin);
  if (!(std::isfinite(args.trial_margin) && args.trial_margin >= 0 &&
        args.trial_margin <= 1)) {
    return absl::StrCat(
        "--trial-margin must be between 0 and 1 (0.10 = 10%), "
        "got ",
        args.trial_margin);
  }
  for (auto [name, text, out] :
       {std::tuple{"--budget", absl::GetFlag(FLAGS_budget), &args.budget},
        std::tuple{"--headroom", absl::GetFlag(FLAGS_headroom),
                   &args.headroom}}) {
    if (text.empty()) continue;
    absl::StatusOr<int64_t> bytes = ParseByteCount(text, name);
    if (!bytes.ok()) return std::string(bytes.status().message());
    *out = *bytes;
  }
  const std::string policy = absl::GetFlag(FLAGS_policy);
  const std::optional<Policy> parsed_policy = ParsePolicy(policy);
  if (!parsed_policy.has_value()) {
    std::vector<absl::string_view> names;
    for (Policy p : AllPolicies()) names.push_back(PolicyName(p));
    return std::string(CheckOneOf("--policy", policy, names).message());
  }
  args.policy = *parsed_policy;
  args.passes =
      absl::StrSplit(absl::GetFlag(FLAGS_passes), ',', absl::SkipWhitespace());
  for (const std::string& pass : args.passes) {
    if (absl::Status s = PassRegistry::Default().Check(pass); !s.ok()) {
      return absl::StrCat("--passes: ", s.message());
    }
  }
  if (args.graph_path.empty() == args.model.empty()) {
    return "give exactly one of --graph FILE and --model TEXT";
  }
  if (args.compare && !args.passes.empty()) {
    return "--compare plans every policy; it does not take --passes";
  }
  if (args.compare && args.explain) {
    return "--compare prints one row per policy; plan one policy to "
           "--explain it";
  }
  if (args.compare && args.timeline) {
    return "--compare prints one row per policy; plan one policy to print "
           "its --timeline";
  }
  if (args.compare && !args.schedule_path.empty()) {
    return "--compare plans every policy; it does not take --schedule";
  }
  if (!args.trial_out.empty() &&
      (args.compare || !args.schedule_path.empty() || !args.passes.empty() ||
       args.policy != Policy::kTandem)) {
    return "--trial-out writes the runner-up of Tandem's policy; plan it "
           "(no --compare, --schedule or --passes, --policy tandem)";
  }
  if (!args.profiled_schedule_path.empty() && args.profile_path.empty()) {
    return "--profiled-schedule needs --profile";
  }
  const std::string measured = absl::GetFlag(FLAGS_measured);
  if (!measured.empty()) {
    if (args.profile_path.empty()) return "--measured needs --profile";
    for (absl::string_view item : absl::StrSplit(measured, ',')) {
      std::pair<std::string, std::string> kv =
          absl::StrSplit(item, absl::MaxSplits('=', 1));
      double seconds = 0;
      if (kv.first.empty() || !absl::SimpleAtod(kv.second, &seconds) ||
          !(seconds > 0)) {
        return absl::StrCat(
            "--measured: '", item,
            "' is not FILE=SECONDS with SECONDS > 0, e.g. v1.sched=0.42");
      }
      args.measured.emplace_back(kv.first, seconds);
    }
  }
  return "";
}

absl::StatusOr<std::string> ReadFile(const std::string& path,
                                     absl::string_view what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::NotFoundError(absl::StrCat("cannot read ", what, " file '",
                                            path, "'; check the path"));
  }
  std::stringstream buffer;
  buffer << in.rdbuf();
  if (in.bad()) {
    return absl::DataLossError(
        absl::StrCat("error reading ", what, " file '", path, "'"));
  }
  return buffer.str();
}

absl::StatusOr<Graph> LoadGraph(const Args& args) {
  if (!args.model.empty()) {
    absl::StatusOr<ModelConfig> config = ParseModelConfig(args.model);
    if (!config.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--model: ", config.status().message()));
    }
    absl::StatusOr<Graph> graph = BuildModelGraph(*config);
    if (!graph.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--model: ", graph.status().message()));
    }
    return graph;
  }
  absl::StatusOr<std::string> text = ReadFile(args.graph_path, "graph");
  if (!text.ok()) return text.status();
  absl::StatusOr<Graph> graph = ParseGraph(*text);
  if (!graph.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(args.graph_path, ": ", graph.status().message()));
  }
  if (absl::Status valid = ValidateGraph(*graph); !valid.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(args.graph_path, ": invalid graph: ", valid.message()));
  }
  return graph;
}

absl::StatusOr<HardwareModel> LoadHardware(const Args& args,
                                           const Graph& graph) {
  bool has_world = false;
  for (absl::string_view token :
       absl::StrSplit(args.hw, absl::ByAnyChar(" ,"), absl::SkipEmpty())) {
    if (absl::StartsWith(token, "world=")) has_world = true;
  }
  const std::string text =
      has_world ? args.hw
                : absl::StrCat("world=", graph.world_size, " ", args.hw);
  absl::StatusOr<HardwareModel> hw = ParseHardwareModel(text);
  if (!hw.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--hw: ", hw.status().message()));
  }
  if (args.budget.has_value()) {
    if (*args.budget > hw->device_memory_bytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--budget ", FormatBytes(*args.budget), " exceeds the device memory ",
          FormatBytes(hw->device_memory_bytes),
          "; lower it or raise memory= in --hw"));
    }
    hw->budget_bytes = *args.budget;
  }
  return hw;
}

void PrintPredictions(absl::string_view title, const Graph& graph,
                      const SimResult& sim, int64_t budget, double plan_wall_s,
                      bool feasible) {
  const double ratio =
      sim.lower_bound_s > 0 ? sim.iteration_s / sim.lower_bound_s : 0;
  absl::PrintF("# %s\n", title);
  absl::PrintF("iteration_s     %.6f\n", sim.iteration_s);
  absl::PrintF("compute_s       %.6f\n", sim.compute_s);
  absl::PrintF("comm_s          %.6f\n", sim.comm_s);
  absl::PrintF("exposed_comm_s  %.6f\n", sim.exposed_comm_s);
  absl::PrintF("copy_s          %.6f\n", sim.copy_s);
  absl::PrintF("overlap_ratio   %.4f\n", sim.overlap_ratio);
  absl::PrintF("peak            %s of budget %s (%.1f%%)%s\n",
               FormatBytes(sim.peak_bytes), FormatBytes(budget),
               budget > 0 ? 100.0 * static_cast<double>(sim.peak_bytes) /
                                static_cast<double>(budget)
                          : 0.0,
               feasible ? "" : "  OVER BUDGET");
  if (sim.peak_breakdown.unmodeled > 0) {
    absl::PrintF("unmodeled_bytes %d\n", sim.peak_breakdown.unmodeled);
  }
  // Where the peak is and what makes it up (common/sim/simulator.h's
  // memory rules): what to look at when a run peaks elsewhere.
  const MemoryBreakdown& b = sim.peak_breakdown;
  const int32_t at = sim.peak_node_id;
  absl::PrintF(
      "peak_at         n%d %s: sharded %d, persistent %d, gathered %d, "
      "activations %d, gradients %d, optimizer states %d, collective "
      "buffers %d, unmodeled %d (B)\n",
      at,
      at >= 0 && at < static_cast<int32_t>(graph.nodes.size())
          ? graph.nodes[at].name
          : std::string("?"),
      b.sharded_params, b.persistent_params, b.gathered_params, b.activations,
      b.gradients, b.optimizer_states, b.collective_buffers, b.unmodeled);
  absl::PrintF("lower_bound_s   %.6f\n", sim.lower_bound_s);
  absl::PrintF("ratio           %.4f\n", ratio);
  absl::PrintF("plan_wall_s     %.6f\n", plan_wall_s);
}

// Reads a schedule (text form) and checks it against the graph; errors name
// the file.
absl::StatusOr<Schedule> LoadScheduleFile(const std::string& path,
                                          const Graph& graph) {
  ASSIGN_OR_RETURN(std::string text, ReadFile(path, "schedule"));
  absl::StatusOr<Schedule> schedule = ParseSchedule(text);
  if (!schedule.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": ", schedule.status().message()));
  }
  for (absl::Status status : {ValidateSchedule(*schedule, graph),
                              CheckScheduleSemantics(graph, *schedule)}) {
    if (!status.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": invalid schedule: ", status.message()));
    }
  }
  return schedule;
}

// --timeline: the simulated iteration, node by node, then the transfers.
void PrintTimeline(const Graph& graph, const Schedule& schedule,
                   const SimResult& sim) {
  absl::PrintF(
      "# timeline: node start_s end_s stall_s memory_after_B rise_B net_B "
      "(the node's own, as modeled)\n");
  for (const NodeTimelineEntry& n : sim.nodes) {
    absl::PrintF("node n%d %s %.6f %.6f %.6f %d %d %d\n", n.node_id,
                 graph.nodes[n.node_id].name, n.start_s, n.end_s, n.stall_s,
                 n.memory_after_bytes, n.modeled_rise_bytes,
                 n.modeled_net_bytes);
  }
  absl::PrintF("# timeline: kind action anchor issue_s start_s end_s bytes\n");
  auto print = [&](const CollectiveTimelineEntry& c) {
    // A persistent param's refresh after the step belongs to no action.
    const bool anchored =
        c.action_index >= 0 &&
        c.action_index < static_cast<int>(schedule.actions.size());
    const std::string where =
        anchored ? absl::StrCat(schedule.actions[c.action_index].position ==
                                        AnchorPosition::kBefore
                                    ? "before n"
                                    : "after n",
                                schedule.actions[c.action_index].node_id)
                 : std::string("after the step (refresh)");
    absl::PrintF("%s %s %s %.6f %.6f %.6f %d\n", ActionKindName(c.kind),
                 anchored ? absl::StrCat("a", c.action_index) : "-", where,
                 c.issue_s, c.start_s, c.end_s, c.bytes);
  };
  for (const CollectiveTimelineEntry& c : sim.collectives) print(c);
  for (const CollectiveTimelineEntry& c : sim.copies) print(c);
}

// Evaluates a given schedule: validates it against the graph, checks its
// semantics and simulates it.
int EvaluateSchedule(const Args& args, const Graph& graph,
                     const HardwareModel& hw) {
  absl::StatusOr<Schedule> schedule =
      LoadScheduleFile(args.schedule_path, graph);
  if (!schedule.ok()) return Fail(schedule.status().message());
  absl::StatusOr<SimResult> sim = Simulate(graph, *schedule, hw);
  if (!sim.ok()) {
    return Fail(absl::StrCat(args.schedule_path, ": ", sim.status().message()));
  }
  if (!args.summary) std::fputs(PrintSchedule(*schedule).c_str(), stdout);
  PrintPredictions(absl::StrCat("predictions of ", args.schedule_path), graph,
                   *sim, hw.budget(), 0, sim->peak_bytes <= hw.budget());
  if (args.timeline) PrintTimeline(graph, *schedule, *sim);
  if (args.explain) {
    absl::PrintF("# explanation stored in %s\n", args.schedule_path);
    std::fputs(FormatExplanation(schedule->explanation,
                                 schedule->prediction.iteration_s,
                                 schedule->prediction.exposed_comm_s)
                   .c_str(),
               stdout);
  }
  return 0;
}

int Compare(const Graph& graph, const HardwareModel& hw, ShardingMode mode) {
  absl::PrintF("# graph %s, %d ranks, budget %s\n", graph.name,
               graph.world_size, FormatBytes(hw.budget()));
  absl::PrintF("%-16s %12s %13s %7s %14s %10s %8s %11s\n", "policy",
               "iteration_s", "lower_bound_s", "ratio", "exposed_comm_s",
               "peak_GiB", "feasible", "plan_wall_s");
  std::string failure;
  for (Policy policy : AllPolicies()) {
    if (mode == ShardingMode::kZero1 && policy != Policy::kTandem) {
      absl::PrintF("%-16s n/a (plans ZeRO-3 jobs only)\n", PolicyName(policy));
      continue;
    }
    PlanOptions options;
    options.policy = policy;
    options.mode = mode;
    absl::StatusOr<PlanResult> result = Plan(graph, hw, options);
    if (!result.ok()) {
      absl::PrintF(
          "%-16s %s\n", PolicyName(policy),
          result.status().code() == absl::StatusCode::kResourceExhausted
              ? "infeasible (see below)"
              : "error (see below)");
      if (failure.empty()) {
        failure =
            absl::StrCat(PolicyName(policy), ": ", result.status().message());
      }
      continue;
    }
    const SimResult& sim = result->sim;
    absl::PrintF(
        "%-16s %12.6f %13.6f %7.4f %14.6f %10.3f %8s %11.6f\n",
        PolicyName(policy), sim.iteration_s, sim.lower_bound_s,
        sim.lower_bound_s > 0 ? sim.iteration_s / sim.lower_bound_s : 0.0,
        sim.exposed_comm_s, static_cast<double>(sim.peak_bytes) / (1 << 30),
        result->feasible ? "yes" : "no", result->plan_wall_s);
  }
  if (!failure.empty()) return Fail(failure);
  return 0;
}

int Main(int argc, char** argv) {
  ParseCommandLineOrExit(Spec(), argc, argv);
  Args args;
  if (std::string error = ReadArgs(args); !error.empty()) {
    ExitWithUsageError(Spec(), error);
  }
  if (args.list_passes) {
    std::fputs(PassRegistry::Default().Describe().c_str(), stdout);
    return 0;
  }

  const ShardingMode mode =
      args.zero1 ? ShardingMode::kZero1 : ShardingMode::kZero3;
  absl::StatusOr<Graph> graph = LoadGraph(args);
  if (!graph.ok()) return Fail(graph.status().message());
  absl::StatusOr<HardwareModel> hw = LoadHardware(args, *graph);
  if (!hw.ok()) return Fail(hw.status().message());
  std::optional<Profile> profile;
  std::optional<Schedule> profiled;
  if (!args.profile_path.empty()) {
    absl::StatusOr<std::string> text = ReadFile(args.profile_path, "profile");
    if (!text.ok()) return Fail(text.status().message());
    absl::StatusOr<Profile> parsed = ParseProfile(*text);
    // Checked against the graph once, here: the planner trusts its input.
    const absl::Status valid =
        parsed.ok() ? ValidateProfile(*parsed, *graph) : parsed.status();
    if (!valid.ok()) {
      return Fail(absl::StrCat(args.profile_path, ": ", valid.message()));
    }
    profile = *std::move(parsed);
    if (!args.profiled_schedule_path.empty()) {
      absl::StatusOr<Schedule> ran =
          LoadScheduleFile(args.profiled_schedule_path, *graph);
      if (!ran.ok()) return Fail(ran.status().message());
      profiled = *std::move(ran);
    }
  }
  // Schedules already measured on this job (--measured): evidence the
  // interference model is re-fitted to, as for a live job.
  std::vector<std::pair<Schedule, double>> measured;
  for (const auto& [path, seconds] : args.measured) {
    absl::StatusOr<Schedule> ran = LoadScheduleFile(path, *graph);
    if (!ran.ok()) {
      return Fail(absl::StrCat("--measured: ", ran.status().message()));
    }
    measured.emplace_back(*std::move(ran), seconds);
  }
  // The planner's own calibration: what the coordinator does with a profile
  // (and with the measured schedules).
  absl::StatusOr<Calibrated> calibrated =
      CalibrateWithEvidence(*graph, *hw, profile ? &*profile : nullptr,
                            profiled ? &*profiled : nullptr, mode, measured);
  if (!calibrated.ok()) {
    return Fail(
        absl::StrCat(args.profile_path, ": ", calibrated.status().message()));
  }
  if (profile.has_value() && !calibrated->memory_calibrated) {
    absl::FPrintF(stderr,
                  "tandem-plan: note: memory not calibrated: the profile "
                  "was measured under schedule v%d; pass "
                  "--profiled-schedule FILE to count what the runtime held "
                  "beyond the model\n",
                  profile->schedule_version);
  }
  absl::PrintF("# hardware: %s\n", DescribeHardware(calibrated->hw));

  if (!args.schedule_path.empty()) {
    return EvaluateSchedule(args, calibrated->graph, calibrated->hw);
  }
  if (args.compare) return Compare(calibrated->graph, calibrated->hw, mode);

  PlanOptions options;
  options.policy = args.policy;
  options.mode = mode;
  options.passes = args.passes;
  options.measured = std::move(measured);
  options.extra_headroom_bytes = args.headroom.value_or(0);
  // Exactly the coordinator's call (PlanningManager::PlanOne).
  absl::StatusOr<PlanResult> result =
      PlanFromMeasurements(*graph, *hw, profile ? &*profile : nullptr,
                           profiled ? &*profiled : nullptr, options);
  if (!result.ok()) return Fail(result.status().message());
  if (!args.summary) {
    std::fputs(PrintSchedule(result->schedule).c_str(), stdout);
  }
  if (!args.schedule_out.empty()) {
    std::ofstream out(args.schedule_out, std::ios::binary | std::ios::trunc);
    out << PrintSchedule(result->schedule);
    if (!out.flush()) {
      return Fail(absl::StrCat("cannot write --schedule-out file '",
                               args.schedule_out, "'"));
    }
  }
  PrintPredictions(
      absl::StrCat(
          "predictions (",
          args.passes.empty()
              ? absl::StrCat("policy ", PolicyName(args.policy))
              : absl::StrCat("passes ", absl::StrJoin(args.passes, " ")),
          ", graph ", graph->name, ", ", graph->world_size, " ranks)"),
      *graph, result->sim, hw->budget(), result->plan_wall_s, result->feasible);
  // The pipeline's plan did not fit: say so, rather than let the
  // least-memory plan pass for the pipeline's.
  for (const Decision& d : result->schedule.explanation.decisions) {
    if (d.kind == DecisionKind::kLeastMemory) {
      absl::PrintF("fallback        least-memory: %s\n", d.what);
    }
  }
  if (result->runner_up.has_value()) {
    const PlanAlternative& second = *result->runner_up;
    absl::PrintF("trial           %s %.6f (%+.1f%%), peak %d B%s\n",
                 second.source, second.sim.iteration_s,
                 100 * (second.sim.iteration_s / result->sim.iteration_s - 1),
                 second.sim.peak_bytes,
                 TrialCandidate(*result, args.trial_margin).has_value()
                     ? ""
                     : "  beyond --trial-margin: not tried");
  } else if (args.policy == Policy::kTandem && args.passes.empty()) {
    absl::PrintF("trial           none (no other plan fits)\n");
  }
  if (!args.trial_out.empty()) {
    std::optional<PlanAlternative> trial =
        TrialCandidate(*result, args.trial_margin);
    if (!trial.has_value()) {
      std::remove(args.trial_out.c_str());
    } else {
      std::ofstream out(args.trial_out, std::ios::binary | std::ios::trunc);
      out << PrintSchedule(trial->schedule);
      if (!out.flush()) {
        return Fail(absl::StrCat("cannot write --trial-out file '",
                                 args.trial_out, "'"));
      }
    }
  }
  if (args.timeline) PrintTimeline(*graph, result->schedule, result->sim);
  if (args.explain) {
    absl::PrintF("# explanation\n");
    std::fputs(
        FormatExplanation(result->schedule.explanation, result->sim.iteration_s,
                          result->sim.exposed_comm_s)
            .c_str(),
        stdout);
  }
  return 0;
}

}  // namespace
}  // namespace tandem

int main(int argc, char** argv) { return tandem::Main(argc, argv); }
