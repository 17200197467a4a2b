// tandem-plan: plans one training iteration offline and prints the schedule
// with its predictions, or compares every policy on the same graph.
//
//   tandem-plan (--graph FILE | --model "preset=... key=value ...")
//               [--profile FILE] [--hw "key=value ..."] [--budget BYTES]
//               [--policy NAME] [--zero1] [--schedule FILE] [--compare]
//               [--summary] [--profiled-schedule FILE] [--passes LIST]
//               [--schedule-out FILE] [--explain]
//               [--measured FILE=SECONDS,...] [--headroom BYTES]
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
// file. --measured re-fits what transfers take from compute to schedules
// already measured on the job; --headroom keeps that much more of the budget
// free (GuardHeadroom in coordinator/planner/planner.h): both as the
// coordinator plans a live job.
// Exit status: 0 on success, 2 on bad input (unknown flag, unreadable file,
// parse error, invalid graph, profile or schedule, infeasible budget).
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

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
    "[--explain]\n"
    "                   [--measured FILE=SECONDS,...] [--headroom BYTES]\n"
    "       tandem-plan --list-passes\n"
    "  --graph FILE     iteration graph, text form\n"
    "  --model TEXT     build the graph of a model, e.g. \"preset=llama3-70b "
    "world=32\n"
    "                   micro_batch=2 seq_len=1024 checkpointing=true\"\n"
    "  --profile FILE   measured profile (text form): node times and "
    "collective fits\n"
    "  --hw TEXT        hardware overrides: world ranks_per_node intra_gbps "
    "inter_gbps\n"
    "                   host_gbps latency_us memory budget unmodeled (world "
    "defaults to "
    "the graph's)\n"
    "  --budget BYTES   memory budget per rank, e.g. 70GiB\n"
    "  --policy NAME    on-demand, deepspeed-zero3, fsdp, deepcompile or "
    "tandem (default)\n"
    "  --passes LIST    run these passes (comma-separated pass-registry "
    "names,\n"
    "                   as a job's optimize.passes) instead of the policy\n"
    "  --list-passes    print every pass with its parameters\n"
    "  --schedule-out FILE\n"
    "                   also write the planned schedule (text form) to FILE\n"
    "  --zero1          plan a ZeRO-1 job (tandem only)\n"
    "  --schedule FILE  evaluate this schedule (text form) instead of "
    "planning\n"
    "  --compare        one row per policy instead of a schedule\n"
    "  --summary        print the predictions without the schedule\n"
    "  --explain        also print the planner's decisions: what each did, "
    "the pass,\n"
    "                   its simulated gain and cost, what binds it\n"
    "  --profiled-schedule FILE\n"
    "                   the schedule the profile was measured under (default "
    "for a\n"
    "                   version-0 profile: the starting schedule); the memory "
    "the\n"
    "                   runtime held beyond the model is then counted in "
    "every plan\n"
    "  --measured FILE=SECONDS[,FILE=SECONDS...]\n"
    "                   schedules (text form) already run on this job and "
    "their measured\n"
    "                   iteration times (slowest rank's median): what "
    "transfers take\n"
    "                   from compute is re-fitted to them before planning, "
    "as the\n"
    "                   coordinator does with a live job's measurements\n"
    "  --headroom BYTES more of the budget left free, as the coordinator "
    "keeps after a plan\n"
    "                   tripped the memory guard (its peaks over its "
    "prediction plus\n"
    "                   their spread)\n";

struct Args {
  std::string graph_path;
  std::string model;
  std::string profile_path;
  std::string hw;
  std::string budget;
  std::string policy = "tandem";
  std::string passes;
  std::string schedule_out;
  std::string schedule_path;
  std::string profiled_schedule_path;
  std::string measured;
  std::string headroom;
  bool zero1 = false;
  bool compare = false;
  bool summary = false;
  bool explain = false;
  bool help = false;
  bool list_passes = false;
};

int Fail(absl::string_view message) {
  absl::FPrintF(stderr, "tandem-plan: %s\n", message);
  return kExitBadInput;
}

int FailUsage(absl::string_view message) {
  absl::FPrintF(stderr, "tandem-plan: %s\n%s", message, kUsage);
  return kExitBadInput;
}

// Returns an error message, or "" when the arguments parse.
std::string ParseArgs(int argc, char** argv, Args& args) {
  struct Flag {
    absl::string_view name;
    std::string* value;
  };
  const Flag valued[] = {
      {"--graph", &args.graph_path},
      {"--model", &args.model},
      {"--profile", &args.profile_path},
      {"--hw", &args.hw},
      {"--budget", &args.budget},
      {"--policy", &args.policy},
      {"--passes", &args.passes},
      {"--schedule-out", &args.schedule_out},
      {"--schedule", &args.schedule_path},
      {"--profiled-schedule", &args.profiled_schedule_path},
      {"--measured", &args.measured},
      {"--headroom", &args.headroom},
  };
  struct Switch {
    absl::string_view name;
    bool* value;
  };
  const Switch switches[] = {{"--zero1", &args.zero1},
                             {"--compare", &args.compare},
                             {"--summary", &args.summary},
                             {"--list-passes", &args.list_passes},
                             {"--explain", &args.explain},
                             {"--help", &args.help},
                             {"-h", &args.help}};
  for (int i = 1; i < argc; ++i) {
    const absl::string_view arg = argv[i];
    absl::string_view name = arg;
    std::optional<absl::string_view> value;
    if (absl::StartsWith(arg, "--")) {
      if (const size_t eq = arg.find('='); eq != absl::string_view::npos) {
        name = arg.substr(0, eq);
        value = arg.substr(eq + 1);
      }
    }
    bool known = false;
    for (const Switch& s : switches) {
      if (name != s.name) continue;
      if (value.has_value()) return absl::StrCat(name, " takes no value");
      *s.value = true;
      known = true;
    }
    for (const Flag& f : valued) {
      if (name != f.name) continue;
      if (!value.has_value()) {
        if (i + 1 >= argc) return absl::StrCat(name, " needs a value");
        value = argv[++i];
      }
      *f.value = std::string(*value);
      known = true;
    }
    if (!known) return absl::StrCat("unknown argument '", arg, "'");
  }
  if (args.help || args.list_passes) return "";
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
  if (args.compare && !args.schedule_path.empty()) {
    return "--compare plans every policy; it does not take --schedule";
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
  if (!args.budget.empty()) {
    absl::StatusOr<int64_t> budget = ParseByteCount(args.budget, "--budget");
    if (!budget.ok()) return budget.status();
    if (*budget > hw->device_memory_bytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--budget ", FormatBytes(*budget), " exceeds the device memory ",
          FormatBytes(hw->device_memory_bytes),
          "; lower it or raise memory= in --hw"));
    }
    hw->budget_bytes = *budget;
  }
  return hw;
}

void PrintPredictions(absl::string_view title, const SimResult& sim,
                      int64_t budget, double plan_wall_s, bool feasible) {
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
  PrintPredictions(absl::StrCat("predictions of ", args.schedule_path), *sim,
                   hw.budget(), 0, sim->peak_bytes <= hw.budget());
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
  Args args;
  if (std::string error = ParseArgs(argc, argv, args); !error.empty()) {
    return FailUsage(error);
  }
  if (args.help) {
    std::fputs(kUsage, stdout);
    return 0;
  }
  if (args.list_passes) {
    std::fputs(PassRegistry::Default().Describe().c_str(), stdout);
    return 0;
  }
  const std::vector<std::string> passes =
      absl::StrSplit(args.passes, ',', absl::SkipWhitespace());
  for (const std::string& pass : passes) {
    if (absl::Status s = PassRegistry::Default().Check(pass); !s.ok()) {
      return FailUsage(absl::StrCat("--passes: ", s.message()));
    }
  }
  const std::optional<Policy> policy = ParsePolicy(args.policy);
  if (!policy.has_value()) {
    std::vector<std::string> names;
    for (Policy p : AllPolicies()) names.emplace_back(PolicyName(p));
    return FailUsage(absl::StrCat("unknown policy '", args.policy,
                                  "' (expected one of ",
                                  absl::StrJoin(names, ", "), ")"));
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
    if (!parsed.ok()) {
      return Fail(
          absl::StrCat(args.profile_path, ": ", parsed.status().message()));
    }
    profile = *std::move(parsed);
    if (!args.profiled_schedule_path.empty()) {
      absl::StatusOr<Schedule> ran =
          LoadScheduleFile(args.profiled_schedule_path, *graph);
      if (!ran.ok()) return Fail(ran.status().message());
      profiled = *std::move(ran);
    }
  } else if (!args.profiled_schedule_path.empty()) {
    return FailUsage("--profiled-schedule needs --profile");
  }
  // Schedules already measured on this job (--measured): evidence the
  // interference model is re-fitted to, as for a live job.
  std::vector<std::pair<Schedule, double>> measured;
  if (!args.measured.empty()) {
    if (!profile.has_value()) return FailUsage("--measured needs --profile");
    for (absl::string_view item : absl::StrSplit(args.measured, ',')) {
      std::pair<std::string, std::string> kv =
          absl::StrSplit(item, absl::MaxSplits('=', 1));
      double seconds = 0;
      if (kv.first.empty() || !absl::SimpleAtod(kv.second, &seconds) ||
          !(seconds > 0)) {
        return FailUsage(absl::StrCat(
            "--measured: '", item,
            "' is not FILE=SECONDS with SECONDS > 0, e.g. v1.sched=0.42"));
      }
      absl::StatusOr<Schedule> ran = LoadScheduleFile(kv.first, *graph);
      if (!ran.ok()) {
        return Fail(absl::StrCat("--measured: ", ran.status().message()));
      }
      measured.emplace_back(*std::move(ran), seconds);
    }
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
  options.policy = *policy;
  options.mode = mode;
  options.passes = passes;
  options.measured = std::move(measured);
  if (!args.headroom.empty()) {
    absl::StatusOr<int64_t> headroom =
        ParseByteCount(args.headroom, "--headroom");
    if (!headroom.ok()) return FailUsage(headroom.status().message());
    options.extra_headroom_bytes = *headroom;
  }
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
      absl::StrCat("predictions (",
                   passes.empty()
                       ? absl::StrCat("policy ", PolicyName(*policy))
                       : absl::StrCat("passes ", absl::StrJoin(passes, " ")),
                   ", graph ", graph->name, ", ", graph->world_size, " ranks)"),
      result->sim, hw->budget(), result->plan_wall_s, result->feasible);
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
