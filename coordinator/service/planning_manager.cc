#include "coordinator/service/planning_manager.h"

#include <algorithm>
#include <chrono>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/ir/proto_convert.h"
#include "common/ir/validate.h"
#include "common/sim/hardware_model.h"
#include "coordinator/analysis/schedule_invariants.h"
#include "coordinator/passes/offload_pass.h"
#include "coordinator/passes/pass_pipeline.h"
#include "coordinator/passes/planning_context.h"
#include "coordinator/passes/prefetch_pass.h"
#include "coordinator/passes/unshard_pass.h"
#include "coordinator/passes/zero1_pass.h"
#include "coordinator/passes/zero3_insert_pass.h"
#include "coordinator/planner/planner.h"

namespace tandem {
namespace {

// Per-pass wall time into the coordinator's histogram.
class MetricsSink : public PassRecordSink {
 public:
  explicit MetricsSink(CoordinatorMetrics* metrics) : metrics_(metrics) {}
  void Record(const PassRecord& record) override {
    if (metrics_ != nullptr) {
      metrics_->pass_seconds->WithLabels({record.pass}).Observe(record.wall_s);
    }
  }

 private:
  CoordinatorMetrics* metrics_;
};

// Time: the slowest rank; memory: the largest.
Profile Aggregate(const std::map<int32_t, Profile>& by_rank) {
  Profile out = by_rank.begin()->second;
  out.rank = Profile::kAggregateRank;
  for (const auto& [rank, p] : by_rank) {
    out.iteration_s = std::max(out.iteration_s, p.iteration_s);
    out.peak_bytes = std::max(out.peak_bytes, p.peak_bytes);
    std::map<int32_t, double> times;
    for (const NodeTiming& t : out.nodes) times[t.node_id] = t.time_s;
    for (const NodeTiming& t : p.nodes) {
      times[t.node_id] = std::max(times[t.node_id], t.time_s);
    }
    for (NodeTiming& t : out.nodes) t.time_s = times[t.node_id];
    if (p.collectives.size() == out.collectives.size()) {
      for (size_t i = 0; i < p.collectives.size(); ++i) {
        out.collectives[i].issue_to_done_s =
            std::max(out.collectives[i].issue_to_done_s,
                     p.collectives[i].issue_to_done_s);
        out.collectives[i].exposed_s =
            std::max(out.collectives[i].exposed_s, p.collectives[i].exposed_s);
      }
    }
    if (p.memory.size() == out.memory.size()) {
      for (size_t i = 0; i < p.memory.size(); ++i) {
        out.memory[i].before_bytes =
            std::max(out.memory[i].before_bytes, p.memory[i].before_bytes);
        out.memory[i].after_bytes =
            std::max(out.memory[i].after_bytes, p.memory[i].after_bytes);
      }
    }
  }
  return out;
}

}  // namespace

absl::StatusOr<std::unique_ptr<PassPipeline>> BuildPipelineFromNames(
    const std::vector<std::string>& names, PassRecordSink* sink) {
  auto pipeline = std::make_unique<PassPipeline>("job", sink);
  for (const std::string& name : names) {
    if (name == "zero3-insert") {
      pipeline->AddPass<Zero3InsertPass>();
    } else if (name == "prefetch") {
      pipeline->AddPass<PrefetchPass>();
    } else if (name == "unshard") {
      pipeline->AddPass<UnshardPass>();
    } else if (name == "offload") {
      pipeline->AddPass<OffloadPass>();
    } else if (name == "zero1") {
      pipeline->AddPass<Zero1Pass>();
    } else {
      return absl::InvalidArgumentError(absl::StrCat(
          "unknown pass '", name,
          "'; use zero3-insert, prefetch, unshard, offload or zero1"));
    }
  }
  pipeline->AddInvariantChecker<GatherBeforeUseChecker>();
  pipeline->AddInvariantChecker<NoUseAfterReleaseChecker>();
  pipeline->AddInvariantChecker<ReduceOnceChecker>();
  pipeline->AddInvariantChecker<MemoryBudgetChecker>();
  return pipeline;
}

PlanningManager::PlanningManager(JobManager* jobs, JobStore* store,
                                 CoordinatorMetrics* metrics)
    : jobs_(jobs), store_(store), metrics_(metrics) {
  planner_ = std::thread([this] { PlannerLoop(); });
}

PlanningManager::~PlanningManager() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  work_.notify_all();
  planner_.join();
}

void PlanningManager::SetPublisher(Publisher publisher) {
  std::lock_guard<std::mutex> lock(mu_);
  publisher_ = std::move(publisher);
}

PlanningManager::JobPlanning& PlanningManager::State(const std::string& job_id,
                                                     const v1::Job& job) {
  auto [it, inserted] = state_.try_emplace(job_id);
  if (inserted) {
    it->second.spec = job.spec();
    const v1::OptimizeSpec& o = job.spec().optimize();
    it->second.drift =
        std::make_unique<DriftDetector>(o.drift_threshold(), o.drift_window(),
                                        job.spec().memory().budget_bytes());
    if (metrics_ != nullptr) {
      // Series from 0, so increase() sees the first plan.
      for (const char* reason : CoordinatorMetrics::kReplanReasons) {
        metrics_->replans->WithLabels({job_id, reason});
      }
    }
  }
  return it->second;
}

absl::Status PlanningManager::Recover() {
  for (const v1::Job& job : jobs_->List({}, 1000)) {
    if (IsTerminal(job.state())) continue;
    absl::StatusOr<std::optional<v1::Graph>> graph =
        store_->LoadGraph(job.id());
    if (!graph.ok()) return graph.status();
    absl::StatusOr<std::vector<StoredSchedule>> schedules =
        store_->LoadSchedules(job.id());
    if (!schedules.ok()) return schedules.status();
    std::lock_guard<std::mutex> lock(mu_);
    JobPlanning& state = State(job.id(), job);
    if (graph->has_value()) {
      absl::StatusOr<Graph> ir = FromProto(**graph);
      if (!ir.ok()) return ir.status();
      state.graph_hash = ir->StructuralHash();
      state.graph = *std::move(ir);
    }
    state.schedules = *std::move(schedules);
    if (!state.schedules.empty()) {
      const v1::Schedule& s = state.schedules.back().schedule;
      state.drift->SetPrediction(s.prediction().iteration_s(),
                                 s.prediction().peak_bytes());
    }
  }
  return absl::OkStatus();
}

void PlanningManager::Fail(const std::string& job_id,
                           const std::string& message) {
  (void)jobs_->Transition(job_id, v1::JOB_STATE_FAILED, message);
}

absl::Status PlanningManager::OnGraph(const std::string& job_id, int32_t rank,
                                      const v1::GraphReport& report) {
  absl::StatusOr<v1::Job> job = jobs_->Get(job_id);
  if (!job.ok()) return job.status();
  std::optional<Graph> graph;
  if (report.has_graph()) {
    absl::StatusOr<Graph> ir = FromProto(report.graph());
    if (!ir.ok()) return ir.status();
    if (absl::Status s = ValidateGraph(*ir); !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "rank ", rank, " sent a malformed graph: ", s.message()));
    }
    graph = *std::move(ir);
  }
  std::string mismatch;
  std::string early_errors;
  bool store_graph = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    JobPlanning& state = State(job_id, *job);
    const std::string hash =
        graph.has_value() ? graph->StructuralHash() : report.graph_hash();
    if (rank == 0 && graph.has_value()) {
      if (state.graph.has_value() && state.graph_hash != hash) {
        mismatch = absl::StrCat("rank 0 reported graph ", hash, " after graph ",
                                state.graph_hash);
      } else if (!state.graph.has_value()) {
        state.graph_hash = hash;
        state.graph = std::move(graph);
        store_graph = true;
        for (const auto& [r, h] : state.early_hashes) {
          if (h != hash && mismatch.empty()) {
            mismatch = absl::StrCat("rank ", r, " built graph ", h,
                                    " but rank 0 built ", hash);
          }
        }
        state.early_hashes.clear();
        for (auto& [r, early] : state.early_profiles) {
          absl::Status s =
              AcceptProfileLocked(job_id, state, r, std::move(early));
          if (!s.ok() && early_errors.empty()) {
            early_errors = std::string(s.message());
          }
        }
        state.early_profiles.clear();
      }
    } else if (state.graph.has_value()) {
      if (hash != state.graph_hash) {
        mismatch = absl::StrCat("rank ", rank, " built graph ", hash,
                                " but rank 0 built ", state.graph_hash);
      }
    } else {
      state.early_hashes[rank] = hash;
    }
  }
  if (!mismatch.empty()) {
    const std::string msg = absl::StrCat(
        "graph hash mismatch: ", mismatch,
        "; every rank must build the same model from the same spec");
    Fail(job_id, msg);
    return absl::FailedPreconditionError(msg);
  }
  if (store_graph) {
    v1::Graph proto;
    {
      std::lock_guard<std::mutex> lock(mu_);
      proto = ToProto(*state_[job_id].graph);
    }
    if (absl::Status s = store_->PutGraph(job_id, proto); !s.ok()) return s;
    (void)jobs_->RecordEvent(
        job_id, "graph",
        absl::StrCat("graph ", proto.hash(), ": ", proto.nodes_size(),
                     " nodes, ", proto.params_size(), " params"));
    if (!early_errors.empty()) {
      (void)jobs_->RecordEvent(
          job_id, "worker",
          absl::StrCat("a profile sent before the graph was dropped: ",
                       early_errors));
    }
  }
  return absl::OkStatus();
}

absl::Status PlanningManager::OnProfile(const std::string& job_id, int32_t rank,
                                        const v1::Profile& proto) {
  if (proto.nodes_size() + proto.collectives_size() + proto.memory_size() >
      kMaxProfileEntries) {
    return absl::InvalidArgumentError(absl::StrCat(
        "profile from rank ", rank, " has ",
        proto.nodes_size() + proto.collectives_size() + proto.memory_size(),
        " entries; at most ", kMaxProfileEntries,
        " are accepted: send shorter windows"));
  }
  absl::StatusOr<v1::Job> job = jobs_->Get(job_id);
  if (!job.ok()) return job.status();
  absl::StatusOr<Profile> profile = FromProto(proto);
  if (!profile.ok()) return profile.status();
  std::lock_guard<std::mutex> lock(mu_);
  JobPlanning& state = State(job_id, *job);
  if (!state.graph.has_value()) {
    // Rank 0's graph may still be on its way: hold a few profiles until it
    // arrives (they are checked then).
    if (static_cast<int>(state.early_profiles.size()) >=
        kMaxEarlyProfilesPerRank * state.spec.parallel().world_size()) {
      return absl::FailedPreconditionError(
          "profiles before the graph: rank 0 must report the graph first");
    }
    state.early_profiles.emplace_back(rank, *std::move(profile));
    return absl::OkStatus();
  }
  return AcceptProfileLocked(job_id, state, rank, *std::move(profile));
}

absl::Status PlanningManager::AcceptProfileLocked(const std::string& job_id,
                                                  JobPlanning& state,
                                                  int32_t rank,
                                                  Profile profile) {
  if (absl::Status s = ValidateProfile(profile, *state.graph); !s.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("profile from rank ", rank, ": ", s.message()));
  }
  const auto key =
      std::make_pair(profile.first_iteration, profile.last_iteration);
  auto& window = state.windows[key];
  window[rank] = std::move(profile);
  if (static_cast<int>(window.size()) < state.spec.parallel().world_size()) {
    return absl::OkStatus();
  }
  Profile aggregate = Aggregate(window);
  state.windows.erase(state.windows.begin(),
                      std::next(state.windows.find(key)));
  state.latest = aggregate;
  (void)store_->PutProfile(job_id, ToProto(aggregate));

  const int64_t active_version =
      state.schedules.empty() ? 0 : state.schedules.back().schedule.version();
  if (state.schedules.empty() &&
      aggregate.last_iteration + 1 >= state.spec.optimize().warmup_steps()) {
    QueueLocked(job_id, state, "initial");
  } else if (!state.pending_reason.empty() &&
             aggregate.schedule_version == active_version) {
    QueueLocked(job_id, state, state.pending_reason);
    state.pending_reason.clear();
  }
  return absl::OkStatus();
}

void PlanningManager::OnProgress(const std::string& job_id, int32_t rank,
                                 const v1::IterationProgress& progress) {
  absl::StatusOr<v1::Job> job = jobs_->Get(job_id);
  if (!job.ok()) return;
  std::lock_guard<std::mutex> lock(mu_);
  JobPlanning& state = State(job_id, *job);
  state.max_step = std::max(state.max_step, progress.step());
  auto& [slowest, peak, ranks] = state.steps[progress.step()];
  slowest = std::max(slowest, progress.iteration_s());
  peak = std::max(peak, progress.peak_bytes());
  if (++ranks < state.spec.parallel().world_size()) return;
  const double measured = slowest;
  const int64_t measured_peak = peak;
  state.steps.erase(state.steps.begin(),
                    std::next(state.steps.find(progress.step())));
  if (metrics_ != nullptr) {
    metrics_->measured_iteration_seconds->WithLabels({job_id}).Set(measured);
  }
  // Only iterations run under the newest schedule say anything about it.
  const int64_t active_version =
      state.schedules.empty() ? 0 : state.schedules.back().schedule.version();
  if (active_version == 0 || progress.schedule_version() != active_version) {
    return;
  }
  std::optional<std::string> reason =
      state.drift->Observe(measured, measured_peak);
  if (metrics_ != nullptr) {
    metrics_->drift_score->WithLabels({job_id}).Set(state.drift->score());
  }
  if (reason.has_value() && state.pending_reason.empty() && !state.queued) {
    state.pending_reason = *reason;
    (void)jobs_->RecordEvent(
        job_id, "drift",
        absl::StrFormat(
            "%s at step %d: measured %.4f s/iter against %.4f "
            "predicted (score %.2f); re-planning from the next "
            "profile window",
            *reason, progress.step(), measured,
            state.schedules.back().schedule.prediction().iteration_s(),
            state.drift->score()));
  }
}

void PlanningManager::OnScheduleActive(const std::string& job_id,
                                       int64_t version) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = state_.find(job_id);
  if (it == state_.end()) return;
  for (const StoredSchedule& s : it->second.schedules) {
    if (s.schedule.version() == version) {
      it->second.drift->SetPrediction(s.schedule.prediction().iteration_s(),
                                      s.schedule.prediction().peak_bytes());
      if (metrics_ != nullptr) {
        metrics_->schedule_version->WithLabels({job_id}).Set(version);
        metrics_->predicted_iteration_seconds->WithLabels({job_id}).Set(
            s.schedule.prediction().iteration_s());
      }
    }
  }
}

absl::StatusOr<int64_t> PlanningManager::RequestReplan(
    const std::string& job_id, const std::string& reason) {
  absl::StatusOr<v1::Job> job = jobs_->Get(job_id);
  if (!job.ok()) return job.status();
  if (IsTerminal(job->state())) {
    return absl::FailedPreconditionError(absl::StrCat(
        "job ", job_id, " already ended ", JobStateName(job->state())));
  }
  std::lock_guard<std::mutex> lock(mu_);
  JobPlanning& state = State(job_id, *job);
  if (!state.latest.has_value()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "job ", job_id,
        " has no profile yet; re-optimize after its warm-up steps"));
  }
  QueueLocked(job_id, state, reason.empty() ? "reoptimize" : reason);
  return static_cast<int64_t>(state.schedules.size()) + 1;
}

void PlanningManager::QueueLocked(const std::string& job_id, JobPlanning& state,
                                  const std::string& reason) {
  if (state.queued) return;
  state.queued = true;
  queue_.emplace_back(job_id, reason);
  work_.notify_one();
}

void PlanningManager::PlannerLoop() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    work_.wait(lock, [&] { return stop_ || !queue_.empty(); });
    if (stop_) return;
    auto [job_id, reason] = queue_.front();
    queue_.pop_front();
    busy_ = true;
    lock.unlock();
    PlanOne(job_id, reason);
    lock.lock();
    busy_ = false;
    auto it = state_.find(job_id);
    if (it != state_.end()) it->second.queued = false;
    if (queue_.empty()) idle_.notify_all();
  }
}

void PlanningManager::PlanOne(const std::string& job_id,
                              const std::string& reason) {
  // Snapshot what the plan needs, then plan without the lock.
  Graph graph;
  Profile profile;
  v1::JobSpec spec;
  int64_t version = 0;
  // The schedule the profile was measured under (none for version 0: the
  // starting schedule).
  std::optional<v1::Schedule> profiled;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = state_.find(job_id);
    if (it == state_.end() || !it->second.graph || !it->second.latest) return;
    graph = *it->second.graph;
    profile = *it->second.latest;
    spec = it->second.spec;
    version = static_cast<int64_t>(it->second.schedules.size()) + 1;
    for (const StoredSchedule& s : it->second.schedules) {
      if (s.schedule.version() == profile.schedule_version) {
        profiled = s.schedule;
      }
    }
  }
  absl::StatusOr<v1::Job> job = jobs_->Get(job_id);
  if (!job.ok() || IsTerminal(job->state())) return;

  const auto start = std::chrono::steady_clock::now();
  absl::StatusOr<Schedule> planned = [&]() -> absl::StatusOr<Schedule> {
    absl::StatusOr<Graph> timed = ApplyProfile(graph, profile);
    if (!timed.ok()) return timed.status();
    HardwareModel hw = HardwareModel::H100(spec.parallel().world_size());
    hw.ranks_per_node = spec.parallel().world_size();
    if (spec.memory().budget_bytes() > 0) {
      hw.budget_bytes = spec.memory().budget_bytes();
      hw.device_memory_bytes =
          std::max(hw.device_memory_bytes, spec.memory().budget_bytes());
    }
    if (absl::Status s = FitCollectives(profile, hw); !s.ok()) return s;
    // Count what the runtime held beyond the simulator's model under the
    // measured schedule, so the plan fits the budget for real.
    absl::StatusOr<Schedule> ran =
        profiled.has_value()
            ? FromProto(*profiled)
            : StartingSchedule(*timed, spec.parallel().zero_stage() == 1
                                           ? ShardingMode::kZero1
                                           : ShardingMode::kZero3);
    if (!ran.ok()) return ran.status();
    if (absl::Status s = CalibrateMemory(*timed, *ran, profile, hw); !s.ok()) {
      return s;
    }
    MetricsSink sink(metrics_);
    absl::StatusOr<std::unique_ptr<PassPipeline>> pipeline =
        BuildPipelineFromNames(
            {spec.optimize().passes().begin(), spec.optimize().passes().end()},
            &sink);
    if (!pipeline.ok()) return pipeline.status();
    PlanningContext context(*timed, hw);
    if (absl::Status s = (*pipeline)->Run(context).status(); !s.ok()) return s;
    if (context.sim().peak_bytes > context.budget()) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "the plan peaks at ", FormatBytes(context.sim().peak_bytes),
          ", over the budget of ", FormatBytes(context.budget()),
          "; add the offload pass to optimize.passes or raise "
          "memory.budget_bytes"));
    }
    return context.schedule();
  }();
  const double wall =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
          .count();
  if (!planned.ok()) {
    (void)jobs_->RecordEvent(
        job_id, "replan",
        absl::StrCat("planning v", version, " (", reason,
                     ") failed: ", planned.status().message(),
                     "; the job keeps its current schedule"));
    return;
  }
  planned->version = version;
  planned->provenance.reason = reason;
  planned->provenance.window_first_iteration = profile.first_iteration;
  planned->provenance.window_last_iteration = profile.last_iteration;
  planned->provenance.plan_wall_s = wall;

  v1::ScheduleUpdate update;
  *update.mutable_schedule() = ToProto(*planned);
  Publisher publisher;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = state_.find(job_id);
    if (it == state_.end()) return;
    update.set_effective_step(it->second.max_step + kSwitchLeadSteps);
    it->second.schedules.push_back(
        {update.schedule(), update.effective_step()});
    publisher = publisher_;
  }
  if (absl::Status s = store_->PutSchedule(job_id, update.schedule(),
                                           update.effective_step());
      !s.ok()) {
    Fail(job_id,
         absl::StrCat("cannot persist schedule v", version, ": ", s.message()));
    return;
  }
  if (metrics_ != nullptr) {
    metrics_->replans->WithLabels({job_id, reason}).Increment();
  }
  (void)jobs_->RecordEvent(
      job_id, "schedule",
      absl::StrFormat("v%d (%s) from step %d: predicted %.4f s/iter "
                      "(measured %.4f), exposed comm %.4f s, peak %s; "
                      "passes %s; planned in %.1f ms",
                      version, reason, update.effective_step(),
                      planned->prediction.iteration_s, profile.iteration_s,
                      planned->prediction.exposed_comm_s,
                      FormatBytes(planned->prediction.peak_bytes),
                      absl::StrJoin(planned->provenance.passes, ","),
                      wall * 1e3));
  if (publisher) publisher(job_id, update);
}

void PlanningManager::Forget(const std::string& job_id) {
  std::lock_guard<std::mutex> lock(mu_);
  state_.erase(job_id);
}

void PlanningManager::Drain() {
  std::unique_lock<std::mutex> lock(mu_);
  idle_.wait(lock, [&] { return queue_.empty() && !busy_; });
}

absl::StatusOr<StoredSchedule> PlanningManager::GetSchedule(
    const std::string& job_id, int64_t version) const {
  std::vector<StoredSchedule> schedules;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = state_.find(job_id);
    if (it != state_.end()) schedules = it->second.schedules;
  }
  if (schedules.empty()) {  // a finished job's, or before Recover
    absl::StatusOr<std::vector<StoredSchedule>> stored =
        store_->LoadSchedules(job_id);
    if (!stored.ok()) return stored.status();
    schedules = *std::move(stored);
  }
  if (!schedules.empty()) {
    if (version == 0) return schedules.back();
    for (const StoredSchedule& s : schedules) {
      if (s.schedule.version() == version) return s;
    }
  }
  return absl::NotFoundError(
      absl::StrCat("job ", job_id, " has no schedule",
                   version == 0 ? "" : absl::StrCat(" v", version),
                   " yet; schedules appear after the warm-up steps"));
}

}  // namespace tandem
