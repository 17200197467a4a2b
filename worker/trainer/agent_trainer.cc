#include "worker/trainer/agent_trainer.h"

#include <ATen/Parallel.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/ir/proto_convert.h"
#include "common/job/job_spec.h"
#include "common/lowering/least_memory.h"
#include "common/status_macros.h"
#include "worker/agent/worker_agent.h"
#include "worker/runtime/communicator.h"
#include "worker/runtime/iteration_timeline.h"
#include "worker/runtime/process_group.h"
#include "worker/runtime/profiler.h"
#include "worker/runtime/standard_schedules.h"
#include "worker/trainer/coordinator_store.h"
#include "worker/trainer/training_job.h"

namespace tandem {
namespace {

// How long a rank whose collective failed waits for the coordinator to fail
// the job (naming the lost rank), and how long a finished rank waits for the
// job's end to be confirmed.
constexpr std::chrono::milliseconds kPeerLossVerdictWait{120000};
constexpr std::chrono::milliseconds kCompletionWait{60000};

// Wraps every forward node so that, from `from_step` on, it takes `ms`
// longer: compute drift a test can inject without touching the model.
void InjectSlowdown(Program& program, double ms, int64_t from_step,
                    const std::atomic<int64_t>* step) {
  for (ProgramNode& node : program.nodes) {
    auto forward = std::move(node.forward);
    node.forward = [forward = std::move(forward), ms, from_step, step](
                       absl::Span<const at::Tensor> inputs,
                       absl::Span<const at::Tensor> params) {
      if (step->load() >= from_step) {
        std::this_thread::sleep_for(
            std::chrono::microseconds(static_cast<int64_t>(ms * 1000)));
      }
      return forward(inputs, params);
    };
  }
}

std::string SignalName(int signal) {
  switch (signal) {
    case SIGTERM:
      return "SIGTERM";
    case SIGINT:
      return "SIGINT";
    case SIGHUP:
      return "SIGHUP";
    default:
      return absl::StrCat("signal ", signal);
  }
}

std::string StoppedBySignal(int rank, int signal) {
  // SIGHUP: the launcher's end (tandem-worker --exit-with-parent) or a
  // closed terminal; SIGTERM: Slurm's scancel, most often.
  absl::string_view why = signal == SIGTERM ? " (scancel?)"
                          : signal == SIGHUP
                              ? ": its launcher is gone (tandem launch was "
                                "killed, or its terminal closed)"
                              : "";
  return absl::StrCat("rank ", rank, " stopped by signal ", SignalName(signal),
                      why);
}

// Offers every schedule the coordinator pushed since the last call.
absl::Status OfferPending(WorkerAgent& agent, Executor& executor) {
  while (std::optional<v1::ScheduleUpdate> update = agent.TakeSchedule()) {
    absl::StatusOr<Schedule> schedule = FromProto(update->schedule());
    absl::Status s = schedule.status();
    // A comparison: the incumbent alternates with it.
    std::optional<Schedule> incumbent;
    if (s.ok() && update->has_incumbent()) {
      absl::StatusOr<Schedule> parsed = FromProto(update->incumbent());
      s = parsed.status();
      if (s.ok()) incumbent = *std::move(parsed);
    }
    if (s.ok()) {
      s = executor.OfferSchedule(*std::move(schedule), update->effective_step(),
                                 std::move(incumbent), update->block_steps(),
                                 update->block_pairs());
    }
    if (!s.ok()) {
      // A plan this worker cannot run is the coordinator's bug, not a reason
      // to stop training: keep the current schedule and say so.
      agent.ReportError(absl::StrCat("schedule v", update->schedule().version(),
                                     " refused: ", s.message()),
                        /*fatal=*/false);
    }
  }
  return absl::OkStatus();
}

// Waits until every rank of the job registered and connected
// (RegisterResponse.start_key), polling through coordinator outages;
// returns early, with the reason, when the job stops or restarts or
// `stopped` says so.
absl::Status WaitForStart(CoordinatorClient& client, WorkerAgent& agent,
                          const std::string& job_id,
                          const v1::RegisterResponse& registered,
                          const std::function<absl::Status()>& stopped) {
  constexpr std::chrono::minutes kStartTimeout(5);
  const auto deadline = std::chrono::steady_clock::now() + kStartTimeout;
  for (;;) {
    RETURN_IF_ERROR(stopped());
    if (std::optional<std::string> stop = agent.StopReason()) {
      return absl::FailedPreconditionError(*stop);
    }
    absl::StatusOr<std::optional<std::string>> v =
        client.KvGet(registered.start_key(), std::chrono::seconds(1));
    if (v.ok() && v->has_value()) return absl::OkStatus();
    if (!v.ok()) {
      if (v.status().code() != absl::StatusCode::kUnavailable &&
          v.status().code() != absl::StatusCode::kDeadlineExceeded) {
        return v.status();
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
    if (std::chrono::steady_clock::now() >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat(
          "job ", job_id, ": not every rank registered and connected within ",
          kStartTimeout.count() * 60, " s of rank ", registered.rank(),
          " (`tandem status ", job_id,
          "` lists those that did); did every rank "
          "start and reach the coordinator?"));
    }
  }
}

absl::Status Train(const AgentTrainerOptions& options, MemoryMeter* meter,
                   WorkerAgent& agent, CoordinatorClient& client,
                   const v1::RegisterResponse& registered, std::ostream& out) {
  // Symlinks resolved and checked before anything the spec names is opened.
  ASSIGN_OR_RETURN(const v1::JobSpec spec, ResolveJobPaths(registered.spec()));
  const int rank = registered.rank();
  const int world = registered.world_size();
  ASSIGN_OR_RETURN(ModelParts model, PrepareModel(spec, world));
  std::atomic<int64_t> current_step{0};
  if (options.slow_node_ms > 0) {
    InjectSlowdown(model.program, options.slow_node_ms, options.slow_from_step,
                   &current_step);
  }
  v1::GraphReport report;
  report.set_graph_hash(model.graph.StructuralHash());
  if (rank == 0) *report.mutable_graph() = ToProto(model.graph);
  agent.ReportGraph(report);

  auto stop_signal = [&]() -> absl::Status {
    const int signal = options.stop_signal ? options.stop_signal->load() : 0;
    if (signal == 0) return absl::OkStatus();
    return absl::AbortedError(StoppedBySignal(rank, signal));
  };
  // A collective (or the rendezvous) failed: most likely a peer died. The
  // coordinator names the lost rank (its session closed, or its heartbeats
  // stopped) and restarts or fails the job; wait for that verdict instead
  // of blaming this rank.
  auto peer_failed = [&](const std::string& what,
                         const absl::Status& failure) -> absl::Status {
    // A stopping peer breaks the collective: no verdict to wait for.
    RETURN_IF_ERROR(stop_signal());
    agent.ReportError(
        absl::StrCat(what, " (a peer is probably gone): ", failure.message()),
        /*fatal=*/false, /*peer_lost=*/true);
    if (std::optional<std::string> stop =
            agent.WaitForStop(kPeerLossVerdictWait)) {
      return absl::FailedPreconditionError(*stop);
    }
    return failure;
  };

  // No rendezvous before every rank registered: one that dies meanwhile
  // leaves no address for its peers to fail on.
  if (!registered.start_key().empty()) {
    RETURN_IF_ERROR(
        WaitForStart(client, agent, options.job_id, registered, stop_signal));
  }
  auto store = c10::make_intrusive<CoordinatorStore>(
      &client, registered.store_prefix(), std::chrono::minutes(5));
  absl::StatusOr<c10::intrusive_ptr<c10d::ProcessGroup>> group_or =
      CreateProcessGroupFromStore(store, rank, world, options.runtime.backend,
                                  std::chrono::minutes(5), options.bind_host);
  if (!group_or.ok()) {
    return peer_failed("the rendezvous failed", group_or.status());
  }
  c10::intrusive_ptr<c10d::ProcessGroup> group = *std::move(group_or);
  ASSIGN_OR_RETURN(Schedule baseline,
                   BaselineSchedule(model.graph, spec.parallel().zero_stage()));
  ASSIGN_OR_RETURN(TrainingJobOptions job_options,
                   TrainingJobOptionsFor(options.runtime, options.offload_dir));
  absl::StatusOr<std::unique_ptr<TrainingJob>> started =
      TrainingJob::Start(spec, &model, rank, world, group, std::move(baseline),
                         meter, job_options);
  // A peer that dies after the rendezvous, before the first step, fails one
  // of Start's collectives (the graph check, the link probe, a resume).
  if (!started.ok() && IsCollectiveFailure(started.status())) {
    return peer_failed("starting the job: a collective failed",
                       started.status());
  }
  ASSIGN_OR_RETURN(std::unique_ptr<TrainingJob> job, std::move(started));
  Executor& executor = job->executor();
  if (options.observer != nullptr) {
    options.observer->OnStart(options.job_id, rank, world);
    job->set_observer(options.observer);
  }
  // The last iteration's trace, for `tandem timeline`.
  auto report_timeline = [&] {
    const IterationTimeline::Iteration& last =
        executor.profiler().timeline().last();
    if (last.iteration < 0) return;
    v1::TimelineReport timeline;
    timeline.set_step(last.iteration);
    timeline.set_schedule_version(last.schedule_version);
    timeline.set_trace_json(ChromeTraceJson(last, rank, &model.graph));
    agent.ReportTimeline(timeline);
  };
  const int window =
      options.profile_window > 0
          ? options.profile_window
          : std::max(1, static_cast<int>(spec.optimize().warmup_steps()));
  int in_window = 0;
  int64_t applied_version = executor.active_schedule().version;
  int64_t reported_version = applied_version;
  // The process's first steps pay one-time costs (kUnprofiledProcessSteps),
  // and a schedule's first step its own (new buffers, the persistent
  // params' gathers): none is profiled, or the plan made from the window
  // would price them into every step (worker/README.md, "Profiling").
  int unprofiled = kUnprofiledProcessSteps;

  for (int64_t step = job->first_step(); step < spec.train().steps(); ++step) {
    RETURN_IF_ERROR(stop_signal());
    if (std::optional<std::string> stop = agent.StopReason()) {
      return absl::FailedPreconditionError(*stop);
    }
    RETURN_IF_ERROR(OfferPending(agent, executor));
    current_step.store(step);
    absl::StatusOr<StepStats> stats = job->Step(step);
    if (!stats.ok() && !job->comm().failure().ok()) {
      return peer_failed(absl::StrCat("step ", step, ": a collective failed"),
                         stats.status());
    }
    ASSIGN_OR_RETURN(StepStats s, std::move(stats));
    out << StepJson(s, rank) << "\n";
    out.flush();
    if (s.schedule_version != applied_version) {
      // A comparison alternates back to its older incumbent: only a newer
      // version is news to the coordinator.
      if (s.schedule_version != kLeastMemoryVersion &&
          s.schedule_version > reported_version) {
        reported_version = s.schedule_version;
        agent.ReportApplied(s.schedule_version, step);
      }
      applied_version = s.schedule_version;
      unprofiled = std::max(unprofiled, 1);
    }
    if (s.memory_guard) {
      // Every rank runs the least-memory schedule from the next step: the
      // coordinator re-plans from the profile measured under it.
      std::fprintf(stderr, "tandem-worker: %s\n", s.guard_reason.c_str());
      agent.ReportMemoryGuard(step + 1, s.schedule_version, s.guard_reason);
    }
    v1::IterationProgress progress;
    progress.set_step(step + 1);
    progress.set_loss(s.loss);
    progress.set_iteration_s(s.iteration_s);
    progress.set_exposed_comm_s(s.exposed_comm_s);
    progress.set_peak_bytes(s.peak_bytes);
    progress.set_schedule_version(s.schedule_version);
    progress.set_work(s.work);
    if (s.cpu_wait_share >= 0) progress.set_cpu_wait_share(s.cpu_wait_share);
    if (s.loss_scaling) {
      progress.set_loss_scale(s.loss_scale);
      progress.set_skipped(s.skipped);
    }
    // The last step's trace goes before its progress: once every rank's last
    // step arrived the job ends and the coordinator reads no further.
    const bool last_step = step + 1 == spec.train().steps();
    if (last_step) report_timeline();
    agent.ReportProgress(progress);
    RETURN_IF_ERROR(CheckFiniteLoss(spec, s));
    if (unprofiled > 0) {
      executor.profiler().Reset();
      in_window = 0;
      --unprofiled;
    } else if (++in_window >= window) {
      // The profile's one conversion on its way to the planner (README.md,
      // "The path of a profile").
      v1::WorkerMessage message;
      *message.mutable_profile() = ToProto(executor.profiler().Snapshot(
          executor.graph().StructuralHash(), rank));
      agent.Send(message);
      if (!last_step) report_timeline();
      executor.profiler().Reset();
      in_window = 0;
    }
  }
  ASSIGN_OR_RETURN(const std::string final_json, job->FinalJson());
  out << final_json << "\n";
  out.flush();
  // The coordinator ends the job once every rank's last step reached it
  // (re-sent after a reconnect); wait for that before hanging up.
  std::optional<std::string> stop = agent.WaitForStop(kCompletionWait);
  if (!stop.has_value()) {
    std::fprintf(stderr,
                 "tandem-worker: finished, but the coordinator did not confirm "
                 "the job's end within %lld s\n",
                 static_cast<long long>(kCompletionWait.count() / 1000));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status RunAgent(CoordinatorClient& client,
                      const AgentTrainerOptions& options, std::ostream& out) {
  SetComputeThreads(options.threads);
  // Before registering: a rank that cannot use its device takes no rank.
  ASSIGN_OR_RETURN(MemoryMeter* const meter, ActivateRuntime(options.runtime));
  WorkerAgent::Options agent_options;
  agent_options.job_id = options.job_id;
  agent_options.requested_rank = options.requested_rank;
  agent_options.hostname = options.hostname;
  agent_options.device = options.runtime.device.str();
  agent_options.device_memory_bytes = DeviceMemoryBytes(options.runtime);
  agent_options.heartbeat_interval = options.heartbeat_interval;
  WorkerAgent agent(&client, agent_options);

  // "agent-signal-watch": on a stop signal, tells the coordinator at once
  // (the job fails with that reason and every rank is told to stop), then
  // ends the process if training is still blocked after the grace time.
  std::mutex watch_mu;
  std::condition_variable watch_wake;
  bool done = false;
  std::atomic<int> registered_rank{-1};
  std::atomic<bool> signal_reported{false};
  std::thread watcher;
  if (options.stop_signal != nullptr) {
    watcher = std::thread([&] {
      std::unique_lock<std::mutex> lock(watch_mu);
      while (!done && options.stop_signal->load() == 0 &&
             !agent.RestartRequested()) {
        watch_wake.wait_for(lock, std::chrono::milliseconds(100));
      }
      if (done) return;
      if (options.stop_signal->load() == 0) {
        // The job restarts: a rank blocked in a rendezvous or a collective
        // with a dead peer would never see it between steps.
        if (!watch_wake.wait_for(lock, options.stop_grace,
                                 [&] { return done; })) {
          std::fprintf(stderr,
                       "tandem-worker: the job restarts; still blocked %lld "
                       "ms later (rendezvous or a collective), exiting with "
                       "status 75 for the launcher to start it again\n",
                       static_cast<long long>(options.stop_grace.count()));
          std::_Exit(75);
        }
        return;
      }
      const int signal = options.stop_signal->load();
      const int rank = registered_rank.load();
      if (rank < 0) {
        std::fprintf(stderr, "tandem-worker: %s before registering; exiting\n",
                     SignalName(signal).c_str());
        std::_Exit(128 + signal);
      }
      if (options.on_ready) options.on_ready(false);
      agent.ReportError(StoppedBySignal(rank, signal), /*fatal=*/true);
      signal_reported = true;
      if (!watch_wake.wait_for(lock, options.stop_grace,
                               [&] { return done; })) {
        std::fprintf(stderr,
                     "tandem-worker: %s; still blocked %lld ms later "
                     "(rendezvous or a collective), exiting\n",
                     StoppedBySignal(rank, signal).c_str(),
                     static_cast<long long>(options.stop_grace.count()));
        std::_Exit(128 + signal);
      }
    });
  }
  auto stop_watcher = [&] {
    {
      std::lock_guard<std::mutex> lock(watch_mu);
      done = true;
    }
    watch_wake.notify_all();
    if (watcher.joinable()) watcher.join();
  };

  absl::StatusOr<v1::RegisterResponse> registered_or = agent.Register();
  if (registered_or.ok() && !registered_or->not_needed().empty()) {
    // The job resumed at a smaller world without this worker: done.
    std::fprintf(stderr, "tandem-worker: %s\n",
                 registered_or->not_needed().c_str());
    stop_watcher();
    return absl::OkStatus();
  }
  absl::Status started =
      registered_or.ok() ? agent.Start() : registered_or.status();
  if (!started.ok()) {
    stop_watcher();
    return started;
  }
  const v1::RegisterResponse& registered = *registered_or;
  registered_rank = registered.rank();
  if (options.on_ready) options.on_ready(true);
  std::fprintf(
      stderr, "tandem-worker: job %s rank %d of %d on %s (incarnation %s)\n",
      options.job_id.c_str(), registered.rank(), registered.world_size(),
      DescribeRuntime(options.runtime).c_str(), agent.incarnation().c_str());

  absl::Status status;
  // A job that resumed at a smaller world (restart.min_world) runs with
  // fewer ranks than were launched.
  const int32_t min_world = registered.spec().restart().min_world();
  const bool resumed_smaller = options.expected_world > 0 && min_world > 0 &&
                               registered.world_size() >= min_world &&
                               registered.world_size() < options.expected_world;
  if (options.expected_world > 0 && !resumed_smaller &&
      options.expected_world != registered.world_size()) {
    status = absl::InvalidArgumentError(absl::StrCat(
        "rank ", registered.rank(), " was launched as one of ",
        options.expected_world, " ranks (--world), but job ", options.job_id,
        " has world_size ", registered.world_size(), ": launch ",
        registered.world_size(), " ranks, or submit the job with world_size ",
        options.expected_world));
  } else {
    try {
      status = Train(options, meter, agent, client, registered, out);
    } catch (const c10::Error& e) {
      status = absl::InternalError(e.what_without_backtrace());
    } catch (const std::exception& e) {
      status = absl::InternalError(e.what());
    }
  }
  if (options.on_ready) options.on_ready(false);
  if (agent.RestartRequested()) {
    // The job restarts from its newest checkpoint: whatever this rank was
    // doing is moot. Cancelled tells the caller to exit for a relaunch.
    status = absl::CancelledError(*agent.StopReason());
  }
  if (!status.ok() && status.code() != absl::StatusCode::kFailedPrecondition &&
      status.code() != absl::StatusCode::kCancelled) {
    if (!signal_reported.load()) {
      agent.ReportError(std::string(status.message()), /*fatal=*/true);
    }
    // Give the session a moment to carry the error before hanging up.
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  stop_watcher();
  agent.Shutdown();
  return status;
}

}  // namespace tandem
