#include "worker/standalone/standalone_trainer.h"

#include <cstdint>
#include <cstdio>
#include <fstream>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "ATen/Parallel.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/string_view.h"
#include "common/ir/proto_convert.h"
#include "common/ir/text_format.h"
#include "common/job/job_spec.h"
#include "common/status_macros.h"
#include "worker/runtime/executor.h"
#include "worker/runtime/iteration_timeline.h"
#include "worker/runtime/memory_meter.h"
#include "worker/runtime/profiler.h"
#include "worker/runtime/program.h"
#include "worker/runtime/standard_schedules.h"
#include "worker/trainer/training_job.h"

namespace tandem {
namespace {

absl::StatusOr<Schedule> LoadSchedule(const std::string& path,
                                      const Graph& graph, int zero_stage,
                                      absl::string_view flag = "--schedule") {
  if (path.empty()) return BaselineSchedule(graph, zero_stage);
  std::ifstream in(path);
  if (!in) {
    return absl::NotFoundError(
        absl::StrCat(flag, ": cannot read '", path, "'"));
  }
  std::stringstream text;
  text << in.rdbuf();
  absl::StatusOr<Schedule> schedule = ParseSchedule(text.str());
  if (!schedule.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, " ", path, ": ", schedule.status().message()));
  }
  return schedule;
}

absl::Status WriteProfile(const Profile& profile, const std::string& path) {
  std::ofstream out(path, std::ios::binary);
  if (!out) {
    return absl::UnavailableError(
        absl::StrCat("--profile-out: cannot write '", path, "'"));
  }
  if (absl::EndsWith(path, ".pb")) {
    ToProto(profile).SerializeToOstream(&out);
  } else {
    out << PrintProfile(profile);
  }
  return out.good() ? absl::OkStatus()
                    : absl::UnavailableError(absl::StrCat(
                          "--profile-out: write to '", path, "' failed"));
}

// --trace-out's file for `rank` (StandaloneOptions::trace_out).
std::string PerRankPath(absl::string_view path, int rank, int world) {
  if (absl::StrContains(path, "{rank}")) {
    return absl::StrReplaceAll(path, {{"{rank}", absl::StrCat(rank)}});
  }
  if (world <= 1) return std::string(path);
  return absl::StrCat(path, ".rank", rank);
}

}  // namespace

absl::Status RunStandalone(const StandaloneOptions& options,
                           std::ostream& out) {
  SetComputeThreads(options.threads);
  ASSIGN_OR_RETURN(MemoryMeter* const meter, ActivateRuntime(options.runtime));
  ASSIGN_OR_RETURN(TrainingJobOptions job_options,
                   TrainingJobOptionsFor(options.runtime, options.offload_dir));
  // Symlinks resolved and checked before anything the spec names is opened.
  ASSIGN_OR_RETURN(const v1::JobSpec spec, ResolveJobPaths(options.spec));
  const int rank = options.rendezvous.rank;
  const int world = options.rendezvous.world_size;
  ASSIGN_OR_RETURN(ModelParts model, PrepareModel(spec, world));
  if (!options.graph_out.empty()) {
    std::ofstream graph(options.graph_out, std::ios::binary);
    graph << PrintGraph(model.graph);
    if (!graph.good()) {
      return absl::UnavailableError(
          absl::StrCat("--graph-out: cannot write '", options.graph_out, "'"));
    }
  }
  ASSIGN_OR_RETURN(Schedule schedule,
                   LoadSchedule(options.schedule_path, model.graph,
                                spec.parallel().zero_stage()));
  RETURN_IF_ERROR(CheckRunnableSchedule(model.graph, schedule));
  std::optional<Schedule> alternate;
  if (!options.alternate_path.empty()) {
    if (options.block_steps < 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--block-steps must be >= 1, got ", options.block_steps));
    }
    ASSIGN_OR_RETURN(alternate,
                     LoadSchedule(options.alternate_path, model.graph,
                                  spec.parallel().zero_stage(), "--alternate"));
    if (alternate->version <= schedule.version) {
      alternate->version = schedule.version + 1;
    }
    RETURN_IF_ERROR(CheckRunnableSchedule(model.graph, *alternate));
  }
  const Schedule first = schedule;

  RendezvousOptions rendezvous = options.rendezvous;
  rendezvous.backend = options.runtime.backend;
  ASSIGN_OR_RETURN(c10::intrusive_ptr<c10d::ProcessGroup> group,
                   CreateProcessGroup(rendezvous));
  ASSIGN_OR_RETURN(std::unique_ptr<TrainingJob> job,
                   TrainingJob::Start(spec, &model, rank, world, group,
                                      std::move(schedule), meter, job_options));
  if (options.observer != nullptr) {
    options.observer->OnStart(spec.name().empty() ? "standalone" : spec.name(),
                              rank, world);
    job->set_observer(options.observer);
  }
  if (alternate.has_value()) {
    // A comparison with no end: the alternate from the first agreed
    // boundary, then the first schedule, block by block.
    RETURN_IF_ERROR(job->executor().OfferSchedule(
        *std::move(alternate), /*not_before_iteration=*/0, first,
        options.block_steps, /*block_pairs=*/0));
  }
  for (int64_t step = job->first_step(); step < spec.train().steps(); ++step) {
    ASSIGN_OR_RETURN(StepStats s, job->Step(step));
    out << StepJson(s, rank) << "\n";
    out.flush();
    RETURN_IF_ERROR(CheckFiniteLoss(spec, s));
    // The process's first steps pay one-time costs no later step pays: the
    // profile leaves them out, as an agent's windows do, but keeps at least
    // the last step (worker/README.md, "Profiling").
    if (step < job->first_step() + kUnprofiledProcessSteps &&
        step + 1 < spec.train().steps()) {
      job->executor().profiler().Reset();
    }
  }
  ASSIGN_OR_RETURN(const std::string final_json, job->FinalJson());
  out << final_json << "\n";
  out.flush();
  if (!options.profile_out.empty()) {
    RETURN_IF_ERROR(
        WriteProfile(job->executor().profiler().Snapshot(
                         job->executor().graph().StructuralHash(), rank),
                     options.profile_out));
  }
  if (!options.trace_out.empty()) {
    const std::string path = PerRankPath(options.trace_out, rank, world);
    std::ofstream trace(path, std::ios::binary);
    trace << ChromeTraceJson(job->executor().profiler().timeline().last(), rank,
                             &model.graph);
    if (!trace.good()) {
      return absl::UnavailableError(
          absl::StrCat("--trace-out: cannot write '", path, "'"));
    }
  }
  return absl::OkStatus();
}

}  // namespace tandem
