#include "coordinator/service/planning_manager.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <iterator>
#include <limits>
#include <optional>

#include "absl/algorithm/container.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "common/bytes.h"
#include "common/ir/proto_convert.h"
#include "common/job/job_spec.h"
#include "common/lowering/least_memory.h"
#include "common/status_macros.h"
#include "coordinator/passes/pass_pipeline.h"
#include "coordinator/planner/planner.h"

namespace tandem {
namespace {

// A schedule's predicted iteration time at the job's reference work (the
// prediction is for the work of the window it was planned from).
double PredictedAtReference(const WorkScale& work, const v1::Prediction& p) {
  return work.ToReference(p.iteration_s(), p.work());
}

// The provenance pass of every version published after the baseline
// tripped the memory guard (JobPlanning::baseline_unfit), read back after a
// restart.
constexpr char kBaselineUnfitPass[] = "baseline-unfit";
// The provenance pass of a rollback that ends an inconclusive trial: the
// trial backoff is recovered from these after a restart.
constexpr char kInconclusivePass[] = "trial-inconclusive";

// The predicted peak of `version` among `schedules` (0 if none).
int64_t PredictedPeak(const std::vector<StoredSchedule>& schedules,
                      int64_t version) {
  for (const StoredSchedule& s : schedules) {
    if (s.schedule.version() == version) {
      return s.schedule.prediction().peak_bytes();
    }
  }
  return 0;
}

bool HasPass(const v1::Schedule& schedule, absl::string_view pass) {
  return absl::c_linear_search(schedule.provenance().passes(), pass);
}

// The job's optimize.min_gain (jobs stored before it existed: the default).
double MinGain(const v1::JobSpec& spec) {
  return spec.optimize().has_min_gain() ? spec.optimize().min_gain()
                                        : kDefaultMinGain;
}

// The job's optimize.baseline_pairs (jobs stored before it existed: the
// default).
int BaselinePairs(const v1::JobSpec& spec) {
  return spec.optimize().has_baseline_pairs() ? spec.optimize().baseline_pairs()
                                              : kDefaultBaselinePairs;
}

// The provenance pass of a "baseline-check" version: the block pairs it
// alternates for ("baseline-pairs:N", BaselineCheckPairs), read back after
// a restart.
constexpr char kBaselinePairsPass[] = "baseline-pairs:";
// The provenance pass of a baseline check that measures on for an earlier
// one whose interval was too wide ("baseline-continues-vK"): its pairs
// count with that check's.
constexpr char kBaselineContinuesPass[] = "baseline-continues-v";

// The block pairs a baseline check alternates for: the job's
// optimize.baseline_pairs, or more when the steps the job's versions
// measured (`measured`: each version's, the baseline's and the settled
// plan's among them; the machine's noise reaches every plan) are noisy
// enough that those would leave an interval wider than kMaxSpeedupWidth
// (NoisePairs), at most kMaxBaselinePairs, and no more than half the job's
// steps left from `from` hold: half of a check's steps run the slower
// baseline, and a short job keeps most of its steps for its plan
// (optimize.baseline_pairs always run, as they always did).
// The block pairs half the job's steps left from `from` hold, less a step
// to spare: what a baseline check or a promising comparison may take (half
// of its steps run the slower plan; a short job keeps most of its steps for
// the plan it settles on).
int64_t PairsInHalfTheStepsLeft(const v1::JobSpec& spec, int64_t from) {
  return (spec.train().steps() - from - 2) / 2 /
         (2 * PlanningManager::kComparisonBlockSteps);
}

int BaselineCheckPairs(const v1::JobSpec& spec,
                       const std::vector<std::vector<double>>& measured,
                       int64_t from) {
  const int least = BaselinePairs(spec);
  const int64_t block = PlanningManager::kComparisonBlockSteps;
  int pairs =
      NoisePairs(measured, static_cast<int>(block), least, kMaxBaselinePairs);
  // The plan's first step on its own after the pairs completes the figure
  // (MeasureBaselineLocked): it must fit too, with a step to spare.
  const int64_t fit = PairsInHalfTheStepsLeft(spec, from);
  if (pairs > least && fit < pairs) {
    pairs = static_cast<int>(std::max<int64_t>(least, fit));
  }
  return pairs;
}

// What the baseline (v0) does, the basis a speedup is stated against.
std::string BaselineBasis(const v1::JobSpec& spec) {
  return spec.parallel().zero_stage() == 1
             ? "ZeRO-1, gradients all-reduced in buckets"
             : "FSDP-style on-demand gathers";
}

// The job's optimize.trial_margin (jobs stored before it existed: the
// default).
double TrialMargin(const v1::JobSpec& spec) {
  return spec.optimize().has_trial_margin() ? spec.optimize().trial_margin()
                                            : kDefaultTrialMargin;
}

// The text after `prefix` in the newest of the schedule's provenance passes
// that starts with it.
std::optional<std::string> PassAfter(const v1::Schedule& schedule,
                                     absl::string_view prefix) {
  const auto& passes = schedule.provenance().passes();
  for (auto it = passes.rbegin(); it != passes.rend(); ++it) {
    absl::string_view rest = *it;
    if (absl::ConsumePrefix(&rest, prefix)) return std::string(rest);
  }
  return std::nullopt;
}

// The version a pass's text after "rollback-to-v" or "trial-of-v" names.
std::optional<int64_t> AsVersion(const std::optional<std::string>& rest) {
  int64_t version = 0;
  if (!rest.has_value() || !absl::SimpleAtoi(*rest, &version)) {
    return std::nullopt;
  }
  return version;
}

// The version a "rollback-to-vK" or "trial-of-vK" pass names.
std::optional<int64_t> VersionPass(const v1::Schedule& schedule,
                                   absl::string_view prefix) {
  return AsVersion(PassAfter(schedule, prefix));
}

// The text after `prefix` in the version's own pass that starts with it:
// one after the newest pass naming the version it reruns ("rollback-to-vK",
// "kept-vK", "baseline-check-of-vK", that pass included). A version that
// reruns an earlier one's schedule carries that one's passes before its
// own (a baseline check of a rollback that continued another check, say),
// which say nothing about it.
std::optional<std::string> OwnPassAfter(const v1::Schedule& schedule,
                                        absl::string_view prefix) {
  const auto& passes = schedule.provenance().passes();
  for (auto it = passes.rbegin(); it != passes.rend(); ++it) {
    absl::string_view rest = *it;
    if (absl::ConsumePrefix(&rest, prefix)) return std::string(rest);
    if (absl::StartsWith(*it, "rollback-to-v") ||
        absl::StartsWith(*it, "kept-v") ||
        absl::StartsWith(*it, "baseline-check-of-v")) {
      return std::nullopt;
    }
  }
  return std::nullopt;
}

// What a version is compared as, from its provenance: its reason and the
// pass that marks that kind (ComparisonPass). A rollback reruns an earlier
// version's schedule with its passes (a check's, say, when it reruns a kept
// check), so only the passes after its own "rollback-to-vK" count: a
// check's pass comes after it.
std::optional<ComparedVersion> ComparedOf(const v1::Schedule& schedule) {
  const std::optional<PlanReason> why =
      PlanReasonFromName(schedule.provenance().reason());
  const auto& passes = schedule.provenance().passes();
  for (const ComparisonKind kind : kComparisonKinds) {
    if (why != ComparisonReason(kind)) continue;
    for (auto it = passes.rbegin(); it != passes.rend(); ++it) {
      absl::string_view rest = *it;
      if (absl::StartsWith(rest, "rollback-to-v")) break;
      int64_t against = 0;
      if (absl::ConsumePrefix(&rest, ComparisonPass(kind)) &&
          absl::SimpleAtoi(rest, &against)) {
        return ComparedVersion{kind, against};
      }
    }
  }
  return std::nullopt;
}

// Where a trial's plan came from: its "trial:<source>" pass.
std::string TrialSource(const v1::Schedule& schedule) {
  return PassAfter(schedule, "trial:").value_or("the runner-up");
}

// What the job a cached plan comes from measured that plan to buy over
// the baseline: its outcome's figure, which is its active (newest) version's
// (ReportOutcomeLocked), the version the cache hands out. Nullopt when that
// job has no figure (not measured yet, too noisy, no check).
std::optional<Speedup> CarriedSpeedup(JobManager& jobs,
                                      const CachedPlan& cached) {
  absl::StatusOr<v1::Job> source = jobs.Get(cached.job_id);
  if (!source.ok() || source->measured_speedup() <= 0 ||
      source->speedup_low() <= 0 || source->speedup_text().empty()) {
    return std::nullopt;
  }
  Speedup s;
  s.factor = source->measured_speedup();
  s.low = source->speedup_low();
  s.high = source->speedup_high();
  s.steps = source->speedup_steps();
  s.text = absl::StrCat(source->speedup_text(), " on job ", cached.job_id,
                        ", whose plan this job runs");
  return s;
}

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

}  // namespace

PlanningManager::JobPlanning::JobPlanning(const v1::JobSpec& job_spec,
                                          int64_t max_held_profile_bytes)
    : spec(job_spec),
      profiles(job_spec.parallel().world_size(), max_held_profile_bytes),
      measured(job_spec.optimize().drift_window()) {
  const v1::OptimizeSpec& o = job_spec.optimize();
  drift = std::make_unique<DriftDetector>(o.drift_threshold(), o.drift_window(),
                                          job_spec.memory().budget_bytes());
}

PlanningManager::PlanningManager(JobManager* jobs, JobStore* store,
                                 CoordinatorMetrics* metrics)
    : jobs_(jobs), store_(store), metrics_(metrics) {
  planner_ = std::thread([this] { PlannerLoop(); });
}

PlanningManager::~PlanningManager() { Stop(); }

void PlanningManager::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
    queue_.clear();
    for (auto& [_, state] : state_) state.queued = false;
  }
  work_.SignalAll();
  // Concurrent callers all return after the join.
  std::call_once(joined_, [this] { planner_.join(); });
}

void PlanningManager::SetPublisher(Publisher publisher) {
  absl::MutexLock lock(&mu_);
  publisher_ = std::move(publisher);
}

void PlanningManager::SetProfileQuotas(int64_t max_held_bytes,
                                       int64_t max_stored_bytes) {
  absl::MutexLock lock(&mu_);
  max_held_profile_bytes_ = max_held_bytes;
  max_stored_profile_bytes_ = max_stored_bytes;
}

void PlanningManager::SetMinJudgedBlockSeconds(double seconds) {
  absl::MutexLock lock(&mu_);
  min_judged_block_s_ = seconds;
}

CompareOptions PlanningManager::BusyOptionsLocked(
    const JobPlanning& state) const {
  CompareOptions options;
  options.busy_wait_share = state.contention.Thresholds();
  options.min_judged_s = min_judged_block_s_;
  return options;
}

PlanningManager::JobPlanning& PlanningManager::State(const std::string& job_id,
                                                     const v1::Job& job) {
  auto it = state_.find(job_id);
  if (it != state_.end()) return it->second;
  ForgetEndedLocked();
  it = state_.try_emplace(job_id, job.spec(), max_held_profile_bytes_).first;
  if (metrics_ != nullptr) {
    // Series from 0, so increase() sees the first plan.
    for (const char* reason : CoordinatorMetrics::kReplanReasons) {
      metrics_->replans->WithLabels({job_id, reason});
    }
  }
  return it->second;
}

void PlanningManager::ForgetEndedLocked() {
  for (auto it = state_.begin(); it != state_.end();) {
    absl::StatusOr<v1::Job> job = jobs_->Get(it->first);
    if (!job.ok() || IsTerminal(job->state())) {
      it = state_.erase(it);
    } else {
      ++it;
    }
  }
}

absl::Status PlanningManager::Recover() {
  for (const v1::Job& job : jobs_->Unfinished()) {
    absl::StatusOr<std::optional<v1::Graph>> graph =
        store_->LoadGraph(job.id());
    if (!graph.ok()) return graph.status();
    absl::StatusOr<std::vector<StoredSchedule>> schedules =
        store_->LoadSchedules(job.id());
    if (!schedules.ok()) return schedules.status();
    // The ranks' devices, as they registered: the hardware of later plans.
    absl::StatusOr<std::vector<StoredWorker>> workers =
        store_->LoadWorkers(job.id());
    if (!workers.ok()) return workers.status();
    // Its step history: the evidence rollbacks are decided on.
    absl::StatusOr<std::vector<StoredStep>> steps = store_->LoadSteps(job.id());
    if (!steps.ok()) return steps.status();
    absl::StatusOr<Graph> ir;
    if (graph->has_value()) {
      ir = FromProto(**graph);
      if (!ir.ok()) return ir.status();
    }
    absl::MutexLock lock(&mu_);
    JobPlanning& state = State(job.id(), job);
    if (graph->has_value()) {
      absl::StatusOr<ProfileAggregator::GraphAccepted> accepted =
          state.profiles.SetGraph(*std::move(ir));
      if (!accepted.ok()) return accepted.status();
    }
    state.schedules = *std::move(schedules);
    for (const StoredWorker& w : *workers) {
      if (w.rank < 0 || w.rank >= job.spec().parallel().world_size()) continue;
      if (state.devices.size() <= static_cast<size_t>(w.rank)) {
        state.devices.resize(w.rank + 1);
      }
      state.devices[w.rank] = {w.hostname, w.device, w.device_memory_bytes};
    }
    if (!state.schedules.empty()) {
      // The reference work is the first plan's window's.
      state.work.SetReference(
          state.schedules.front().schedule.prediction().work());
    }
    RecoverEvidenceLocked(state, *steps);
    if (!state.schedules.empty()) {
      const auto [seconds, peak, plan] =
          DriftExpectation(state, state.schedules.back().schedule);
      state.drift->SetPrediction(seconds, peak, plan);
    }
  }
  return absl::OkStatus();
}

int64_t PlanningManager::PlanOrigin(const JobPlanning& state, int64_t version) {
  // Each rerun names an earlier version; bounded all the same.
  for (size_t hops = 0; hops <= state.rollbacks.size(); ++hops) {
    auto rerun = state.rollbacks.find(version);
    if (rerun == state.rollbacks.end() || rerun->second >= version) break;
    version = rerun->second;
  }
  return version;
}

std::tuple<double, int64_t, int64_t> PlanningManager::DriftExpectation(
    const JobPlanning& state, const v1::Schedule& schedule) {
  auto compared = state.compared.find(schedule.version());
  if (compared != state.compared.end() &&
      compared->second.kind != ComparisonKind::kDriftCheck &&
      !state.judged.count(schedule.version())) {
    for (const StoredSchedule& s : state.schedules) {
      if (s.schedule.version() != compared->second.against) continue;
      const std::optional<ScheduleMeasurements::Summary> m =
          state.measured.Summarize(s.schedule.version());
      return {
          m.has_value() ? m->median_s : ExpectedAtReference(state, s.schedule),
          s.schedule.prediction().peak_bytes(),
          PlanOrigin(state, s.schedule.version())};
    }
  }
  return {ExpectedAtReference(state, schedule),
          schedule.prediction().peak_bytes(),
          PlanOrigin(state, schedule.version())};
}

double PlanningManager::ExpectedAtReference(const JobPlanning& state,
                                            const v1::Schedule& schedule) {
  auto rerun = state.rollbacks.find(schedule.version());
  if (rerun != state.rollbacks.end()) {
    for (const int64_t version : {rerun->second, schedule.version()}) {
      if (std::optional<ScheduleMeasurements::Summary> m =
              state.measured.Summarize(version)) {
        return m->median_s;
      }
    }
  }
  return PredictedAtReference(state.work, schedule.prediction());
}

void PlanningManager::RecoverEvidenceLocked(
    JobPlanning& state, const std::vector<StoredStep>& steps) {
  // Rollbacks: each rollback version runs an earlier version's plan again
  // ("rollback-to-vK", its newest such pass) and rejected the version
  // before it, which is never published again.
  // Trials ("trial-of-vK"): judged unless still the newest version.
  for (size_t i = 0; i < state.schedules.size(); ++i) {
    const v1::Schedule& s = state.schedules[i].schedule;
    // The baseline tripped the memory guard before this version: no check
    // runs it again.
    if (HasPass(s, kBaselineUnfitPass)) state.baseline_unfit = true;
    // (A rollback to a trial keeps the trial's passes: the reason decides.)
    const std::optional<PlanReason> why =
        PlanReasonFromName(s.provenance().reason());
    // The trial backoff: inconclusive trials in a row, from the rollbacks
    // that ended them; a decided trial (kept, or rolled back without the
    // pass) ends the run.
    const bool after_trial =
        i > 0 && PlanReasonFromName(
                     state.schedules[i - 1].schedule.provenance().reason()) ==
                     PlanReason::kTrial;
    if (why == PlanReason::kRollback && after_trial &&
        HasPass(s, kInconclusivePass)) {
      ++state.inconclusive_trials;
      state.trial_not_before =
          state.schedules[i].effective_step +
          TrialBackoffSteps(state.spec.optimize().drift_window(),
                            state.inconclusive_trials);
    } else if ((why == PlanReason::kKept || why == PlanReason::kRollback) &&
               after_trial) {
      // (A verdict on a check, of a rollback or a drift, leaves the run as
      // it was, as CompareLocked does.)
      state.inconclusive_trials = 0;
      state.trial_not_before = -1;
    }
    // A trial or a check, compared against the version it alternated
    // with: judged unless still the newest version.
    if (std::optional<ComparedVersion> compared = ComparedOf(s)) {
      state.compared[s.version()] = *compared;
      if (i + 1 < state.schedules.size()) state.judged.insert(s.version());
    }
    // A kept trial and a baseline check rerun a plan; a kept trial (or
    // check) rejects the version it was compared against.
    if (why == PlanReason::kKept || why == PlanReason::kBaselineCheck) {
      if (std::optional<int64_t> to = VersionPass(
              s, why == PlanReason::kKept ? "kept-v" : "baseline-check-of-v")) {
        state.rollbacks[s.version()] = *to;
        auto against = state.compared.find(*to);
        if (why == PlanReason::kKept && against != state.compared.end()) {
          for (size_t j = 0; j < i; ++j) {
            const v1::Schedule& earlier = state.schedules[j].schedule;
            if (earlier.version() == against->second.against) {
              state.rejected[earlier.version()] = earlier;
            }
          }
        }
      }
      continue;
    }
    if (why != PlanReason::kRollback) continue;
    if (std::optional<int64_t> to = VersionPass(s, "rollback-to-v")) {
      state.rollbacks[s.version()] = *to;
    }
    // A checked rollback rejects nothing until its comparison is decided.
    if (i > 0 &&
        !state.IsCompared(s.version(), ComparisonKind::kRollbackCheck)) {
      state.rejected[state.schedules[i - 1].schedule.version()] =
          state.schedules[i - 1].schedule;
    }
  }
  // The blocks of the check the newest baseline check continues, measured
  // again from the steps it ran between `carried_from` and `carried_to`.
  std::optional<JobPlanning::Comparison> carried;
  int64_t carried_from = 0;
  int64_t carried_to = 0;
  // A trial still undecided: its comparison goes on (the ranks alternate
  // on their own), from the blocks its steps so far ran in.
  if (!state.schedules.empty()) {
    const v1::Schedule& newest = state.schedules.back().schedule;
    auto of = state.compared.find(newest.version());
    if (of != state.compared.end() && !state.judged.count(of->first)) {
      state.comparison = JobPlanning::Comparison{of->first, of->second.against};
    }
    // A baseline check: measured again from its stored steps (its first step
    // after them completes it when every pair is in).
    if (PlanReasonFromName(newest.provenance().reason()) ==
            PlanReason::kBaselineCheck &&
        BaselinePairs(state.spec) > 0) {
      int pairs = BaselinePairs(state.spec);
      std::optional<std::string> stored =
          OwnPassAfter(newest, kBaselinePairsPass);
      if (stored.has_value() && !absl::SimpleAtoi(*stored, &pairs)) {
        pairs = BaselinePairs(state.spec);
      }
      state.comparison = JobPlanning::Comparison{newest.version(), 0, pairs};
      // A check that continues an earlier one: that check's steps, between
      // its start and this one's, are measured again as its blocks.
      if (std::optional<int64_t> of =
              AsVersion(OwnPassAfter(newest, kBaselineContinuesPass))) {
        for (const StoredSchedule& s : state.schedules) {
          if (s.schedule.version() != *of) continue;
          carried.emplace(JobPlanning::Comparison{*of, 0});
          carried_from = s.effective_step;
          carried_to = state.schedules.back().effective_step;
        }
      }
    }
  }
  // A drift check forgot what was measured before it (Plan): steps before
  // the newest check's first are not measured again.
  int64_t measured_from = -1;
  for (const StoredSchedule& s : state.schedules) {
    if (state.IsCompared(s.schedule.version(), ComparisonKind::kDriftCheck)) {
      measured_from = std::max(measured_from, s.effective_step);
    }
  }
  // Step times per version, as OnProgress recorded them (at the reference
  // work), from the steps the job history stored.
  for (const StoredStep& step : steps) {
    state.work.Record(step.schedule_version, step.iteration_s,
                      static_cast<double>(step.work));
    state.contention.Record(step.schedule_version, step.cpu_wait_share,
                            step.iteration_s);
    state.max_step = std::max(state.max_step, step.step);
    if (step.schedule_version == kLeastMemoryVersion) continue;
    const double at_reference = state.work.ToReference(
        step.iteration_s, static_cast<double>(step.work));
    if (step.step >= measured_from) {
      state.measured.Record(step.schedule_version, step.step, at_reference);
    }
    if (state.comparison.has_value() &&
        step.step >= state.schedules.back().effective_step) {
      state.comparison->Add(step.schedule_version, step.step, at_reference,
                            step.cpu_wait_share);
    }
    if (carried.has_value() && step.step >= carried_from &&
        step.step < carried_to) {
      carried->Add(step.schedule_version, step.step, at_reference,
                   step.cpu_wait_share);
    }
  }
  if (carried.has_value()) {
    const CompareOptions options = BusyOptionsLocked(state);
    std::optional<RatioInterval> r =
        InterleavedRatio(carried->blocks, 0, carried->candidate, options);
    state.comparison->Continue(carried->candidate, std::move(carried->blocks),
                               r.has_value() ? r->pairs : 0);
  }
  // A rollback check that did not measure faster forgot everything
  // measured before its verdict (CompareLocked): forget it again, for the
  // newest such check (what the versions since measured stays).
  for (size_t i = state.schedules.size(); i-- > 1;) {
    const v1::Schedule& back = state.schedules[i].schedule;
    const int64_t check = state.schedules[i - 1].schedule.version();
    if (PlanReasonFromName(back.provenance().reason()) !=
            PlanReason::kRollback ||
        !state.IsCompared(check, ComparisonKind::kRollbackCheck)) {
      continue;
    }
    state.measured.Forget(0);
    for (size_t j = 0; j < i; ++j) {
      state.measured.Forget(state.schedules[j].schedule.version());
    }
    break;
  }
  // A rollback that measured as slow as what it replaced had its evidence
  // forgotten (the machine changed): forget it again.
  if (!state.schedules.empty()) {
    const int64_t active = state.schedules.back().schedule.version();
    if (state.rollbacks.count(active) &&
        state.measured.BehindBest(active).has_value()) {
      state.measured.KeepOnly(active);
    }
  }
}

void PlanningManager::Fail(const std::string& job_id,
                           const std::string& message) {
  (void)jobs_->Transition(job_id, v1::JOB_STATE_FAILED, message);
}

absl::Status PlanningManager::OnGraph(const std::string& job_id, int32_t rank,
                                      const v1::GraphReport& report) {
  absl::StatusOr<v1::Job> job = jobs_->Get(job_id);
  if (!job.ok()) return job.status();
  if (IsTerminal(job->state())) return Ended(*job);
  std::optional<Graph> graph;
  if (report.has_graph()) {
    absl::StatusOr<Graph> ir = FromProto(report.graph());
    if (!ir.ok()) return ir.status();
    graph = *std::move(ir);
  }
  // Rank 0's graph is the reference; every other report is checked by hash.
  const bool reference = rank == 0 && graph.has_value();
  const std::string hash = reference           ? std::string()
                           : graph.has_value() ? graph->StructuralHash()
                                               : report.graph_hash();
  absl::Status agreement;
  std::optional<v1::Graph> new_graph;
  std::vector<std::string> dropped;
  {
    absl::MutexLock lock(&mu_);
    JobPlanning& state = State(job_id, *job);
    if (reference) {
      absl::StatusOr<ProfileAggregator::GraphAccepted> accepted =
          state.profiles.SetGraph(*std::move(graph));
      if (accepted.ok()) {
        if (accepted->is_new) new_graph = ToProto(*state.profiles.graph());
        for (Profile& aggregate : accepted->completed) {
          OnWindowLocked(job_id, state, std::move(aggregate));
        }
        dropped = std::move(accepted->dropped);
      } else {
        agreement = accepted.status();
      }
    } else {
      agreement = state.profiles.CheckHash(rank, hash);
    }
  }
  if (agreement.code() == absl::StatusCode::kFailedPrecondition) {
    Fail(job_id, std::string(agreement.message()));
  }
  if (!agreement.ok()) return agreement;
  if (new_graph.has_value()) {
    if (absl::Status s = store_->PutGraph(job_id, *new_graph); !s.ok()) {
      return s;
    }
    (void)jobs_->RecordEvent(
        job_id, "graph",
        absl::StrCat("graph ", new_graph->hash(), ": ", new_graph->nodes_size(),
                     " nodes, ", new_graph->params_size(), " params"));
    MaybeStartCached(*job);
  }
  if (!dropped.empty()) {
    (void)jobs_->RecordEvent(
        job_id, "worker",
        absl::StrCat(dropped.size(),
                     " profile(s) sent before the graph were dropped; the "
                     "first: ",
                     dropped.front()));
  }
  return absl::OkStatus();
}

absl::Status PlanningManager::OnProfile(const std::string& job_id, int32_t rank,
                                        const v1::Profile& proto) {
  // Bounded and converted (outside the lock), then validated, once each, by
  // the aggregator.
  absl::StatusOr<Profile> profile = ProfileAggregator::Decode(rank, proto);
  if (!profile.ok()) return profile.status();
  absl::StatusOr<v1::Job> job = jobs_->Get(job_id);
  if (!job.ok()) return job.status();
  if (IsTerminal(job->state())) return Ended(*job);
  absl::MutexLock lock(&mu_);
  JobPlanning& state = State(job_id, *job);
  absl::StatusOr<std::optional<Profile>> aggregate =
      state.profiles.AddProfile(rank, *std::move(profile));
  if (!aggregate.ok()) return aggregate.status();
  if (aggregate->has_value()) {
    OnWindowLocked(job_id, state, **std::move(aggregate));
  }
  return absl::OkStatus();
}

void PlanningManager::OnWindowLocked(const std::string& job_id,
                                     JobPlanning& state, Profile aggregate) {
  (void)store_->PutProfile(job_id, ToProto(aggregate),
                           max_stored_profile_bytes_);
  state.latest = std::move(aggregate);
  const Profile& latest = *state.latest;
  // Times are scaled to the work of the window the first plan is made from.
  state.work.SetReference(latest.work);

  // Under the memory guard, the ranks run the least-memory schedule.
  const int64_t active_version =
      state.guard_active        ? kLeastMemoryVersion
      : state.schedules.empty() ? 0
                                : state.schedules.back().schedule.version();
  if (state.schedules.empty() &&
      latest.last_iteration + 1 >= state.spec.optimize().warmup_steps()) {
    QueueLocked(job_id, state, PlanReason::kInitial);
  } else if (state.pending_reason.has_value() && !state.queued &&
             latest.schedule_version == active_version) {
    // (Not while a plan is queued: the version it publishes is the one to
    // re-plan from.)
    QueueLocked(job_id, state, *state.pending_reason);
    state.pending_reason.reset();
  }
}

void PlanningManager::OnProgress(const std::string& job_id, int32_t rank,
                                 const v1::IterationProgress& progress) {
  absl::StatusOr<v1::Job> job = jobs_->Get(job_id);
  if (!job.ok()) return;
  if (IsTerminal(job->state())) {
    Forget(job_id);
    return;
  }
  absl::MutexLock lock(&mu_);
  JobPlanning& state = State(job_id, *job);
  state.max_step = std::max(state.max_step, progress.step());
  auto& [slowest, peak, ranks, work, wait] = state.steps[progress.step()];
  slowest = std::max(slowest, progress.iteration_s());
  peak = std::max(peak, progress.peak_bytes());
  work = std::max(work, progress.work());
  if (progress.has_cpu_wait_share()) {
    wait = std::max(wait, progress.cpu_wait_share());
  }
  if (++ranks < state.spec.parallel().world_size()) return;
  // With variable-length batches, what the step would have taken at the
  // reference work: every comparison below is at that one work.
  state.work.Record(progress.schedule_version(), slowest,
                    static_cast<double>(work));
  const double measured =
      state.work.ToReference(slowest, static_cast<double>(work));
  const double measured_s = slowest;  // as measured, for the metric
  const int64_t measured_peak = peak;
  const double cpu_wait_share = wait;
  state.contention.Record(progress.schedule_version(), cpu_wait_share,
                          measured_s);
  state.steps.erase(state.steps.begin(),
                    std::next(state.steps.find(progress.step())));
  if (metrics_ != nullptr) {
    metrics_->measured_iteration_seconds->WithLabels({job_id}).Set(measured_s);
  }
  auto [range, first_step] = state.peak_by_version.try_emplace(
      progress.schedule_version(), measured_peak, measured_peak);
  if (!first_step) {
    range->second.first = std::min(range->second.first, measured_peak);
    range->second.second = std::max(range->second.second, measured_peak);
  }
  // The least-memory fallback is no plan to roll back to.
  if (progress.schedule_version() == kLeastMemoryVersion) return;
  state.measured.Record(progress.schedule_version(), progress.step(), measured);
  ReportOutcomeLocked(job_id, state, progress.schedule_version());
  // A comparison's steps say nothing about rollbacks until it is decided;
  // the machine can change meanwhile, which the drift detector watches
  // (WatchComparisonLocked) while the comparison goes on.
  if (state.comparison.has_value()) {
    const int64_t compared = state.comparison->candidate;
    if (CompareLocked(job_id, state, progress.schedule_version(),
                      progress.step(), measured, cpu_wait_share)) {
      if (state.comparison.has_value() &&
          state.comparison->candidate == compared) {
        WatchComparisonLocked(job_id, state, progress.schedule_version(),
                              progress.step(), measured, measured_peak);
      }
      return;
    }
  }
  // Only iterations run under the newest schedule say anything about it.
  const int64_t active_version =
      state.schedules.empty() ? 0 : state.schedules.back().schedule.version();
  if (active_version == 0 || progress.schedule_version() != active_version) {
    // The baseline's steps measure the job's noise for the first plan,
    // those run while that plan is on its way to the ranks included (with a
    // short warm-up they are most of what the first windows are judged
    // against).
    if (progress.schedule_version() == 0 && !state.drift->has_prediction()) {
      state.drift->ObserveUnpredicted(measured);
    }
    return;
  }
  // Behind the best schedule measured on this job (the baseline counts):
  // back to that one, whatever the prediction said. A trial not yet judged
  // is judged below instead, against the version it was tried against.
  const bool unjudged_trial = state.compared.count(active_version) &&
                              !state.judged.count(active_version);
  if (!state.queued && !state.rejected.count(active_version) &&
      !unjudged_trial) {
    std::optional<ScheduleMeasurements::Behind> behind =
        state.measured.BehindBest(active_version);
    auto rerun = state.rollbacks.find(active_version);
    // The fastest version ran the very plan the active one runs (a
    // re-plan that gave the same plan): nothing to roll back to or check.
    bool same_plan = false;
    if (behind.has_value() && rerun == state.rollbacks.end()) {
      for (const StoredSchedule& s : state.schedules) {
        if (s.schedule.version() != behind->best_version) continue;
        absl::StatusOr<Schedule> best = FromProto(s.schedule);
        absl::StatusOr<Schedule> active =
            FromProto(state.schedules.back().schedule);
        same_plan = best.ok() && active.ok() && SamePlan(*best, *active);
      }
    }
    if (behind.has_value() && (rerun != state.rollbacks.end() || same_plan)) {
      // The plan that measured fastest measures slower now: the machine
      // changed, and what earlier versions measured no longer holds.
      state.measured.KeepOnly(active_version);
      (void)jobs_->RecordEvent(
          job_id, "rollback",
          absl::StrFormat(
              "v%d runs v%d's plan again but measured %.4f s/iter against "
              "v%d's %.4f: the machine changed; earlier measurements are "
              "forgotten and drift detection decides from here",
              active_version, same_plan ? behind->best_version : rerun->second,
              behind->active.median_s, behind->best_version,
              behind->best.median_s));
      behind.reset();
    }
    if (behind.has_value()) {
      // Measured one after the other, so a change in the machine between
      // the two looks the same: v<best>'s plan is published again and
      // checked against the active one, interleaved (CompareLocked), before
      // it runs on.
      state.rollback_to = behind->best_version;
      state.rollback_check_of = active_version;
      state.pending_reason.reset();
      (void)jobs_->RecordEvent(
          job_id, "rollback",
          absl::StrFormat(
              "v%d measured %.4f s/iter (median of %d steps) against "
              "v%d's %.4f s/iter (%d steps): %.1f%% slower, beyond the "
              "measured noise of %.1f%%, in steps measured one after the "
              "other; at step %d v%d's schedule is published again and "
              "alternated with v%d's: it runs on only if the interleaved "
              "blocks measure it faster",
              active_version, behind->active.median_s, behind->active.samples,
              behind->best_version, behind->best.median_s, behind->best.samples,
              100 * (behind->active.median_s / behind->best.median_s - 1),
              100 * behind->noise, progress.step(), behind->best_version,
              active_version));
      QueueLocked(job_id, state, PlanReason::kRollback);
      return;
    }
  }
  // A trial is judged by its comparison; drift waits for the verdict.
  if (unjudged_trial) return;
  // The active plan is judged and not behind: its runner-up's turn.
  if (state.trial.has_value() && state.trial_after == active_version &&
      !state.queued && !state.pending_reason.has_value() &&
      !state.guard_active) {
    // After inconclusive trials the next one waits (backs off): on this
    // machine the comparisons did not tell plans apart, and each costs the
    // steps it alternates.
    if (progress.step() < state.trial_not_before) return;
    if (std::optional<ScheduleMeasurements::Summary> m =
            state.measured.Summarize(active_version)) {
      const double predicted = PredictedAtReference(
          state.work, state.schedules.back().schedule.prediction());
      const double theirs =
          state.work.ToReference(state.trial->schedule.prediction.iteration_s,
                                 state.trial->schedule.prediction.work);
      (void)jobs_->RecordEvent(
          job_id, "trial",
          absl::StrFormat(
              "v%d measured %.4f s/iter (median of %d steps); measuring %s's "
              "plan next, predicted %.4f s/iter against v%d's %.4f (%+.1f%%, "
              "within optimize.trial_margin %.0f%%: the cost model cannot "
              "tell them apart); the faster by measurement is kept",
              active_version, m->median_s, m->samples, state.trial->source,
              theirs, active_version, predicted,
              predicted > 0 ? 100 * (theirs / predicted - 1) : 0.0,
              100 * TrialMargin(state.spec)));
      QueueLocked(job_id, state, PlanReason::kTrial);
      return;
    }
  }
  // The active plan has settled (measured, not behind, no trial to come):
  // what it bought is measured against the baseline, interleaved, once per
  // plan: not again for a version that reruns a plan already checked (a
  // rollback to it after a drift check or a trial), nor for one that reruns
  // the baseline's.
  const int64_t active_plan = PlanOrigin(state, active_version);
  const bool reruns_baseline = active_plan == 0;
  if (BaselinePairs(state.spec) > 0 && !state.baseline_unfit && !state.queued &&
      !state.pending_reason.has_value() && !state.guard_active &&
      !state.comparison.has_value() &&
      PlanOrigin(state, state.speedup_version) != active_plan &&
      !reruns_baseline &&
      !(state.trial.has_value() && state.trial_after == active_version) &&
      state.measured.Summarize(active_version).has_value()) {
    state.rollback_to = active_version;
    QueueLocked(job_id, state, PlanReason::kBaselineCheck);
    return;
  }
  std::optional<std::string> reason =
      state.drift->Observe(measured, measured_peak);
  if (metrics_ != nullptr) {
    metrics_->drift_score->WithLabels({job_id}).Set(state.drift->score());
  }
  // The detector says "drift" or "memory" (drift_detector.h).
  const std::optional<PlanReason> why =
      reason.has_value() ? PlanReasonFromName(*reason) : std::nullopt;
  if (why.has_value() && !state.pending_reason.has_value() && !state.queued) {
    state.pending_reason = why;
    const double predicted = PredictedAtReference(
        state.work, state.schedules.back().schedule.prediction());
    (void)jobs_->RecordEvent(
        job_id, "drift",
        *why == PlanReason::kDrift
            ? absl::StrFormat(
                  "drift at step %d: the last %d steps measured %.4f s/iter "
                  "(median) against %.4f expected (score %.2f; threshold "
                  "%.2f, noise bound %.2f); re-planning from the next "
                  "profile window",
                  progress.step(), state.spec.optimize().drift_window(),
                  state.drift->window_median_s(), state.drift->predicted_s(),
                  state.drift->score(), state.spec.optimize().drift_threshold(),
                  state.drift->noise_bound())
            : absl::StrFormat(
                  "%s at step %d: measured %.4f s/iter against %.4f "
                  "predicted (score %.2f); re-planning from the next "
                  "profile window",
                  *reason, progress.step(), measured, predicted,
                  state.drift->score()));
  }
}

bool PlanningManager::CompareLocked(const std::string& job_id,
                                    JobPlanning& state, int64_t version,
                                    int64_t step, double seconds,
                                    double cpu_wait_share) {
  JobPlanning::Comparison& c = *state.comparison;
  if (!c.Add(version, step, seconds, cpu_wait_share)) return false;
  if (c.baseline_pairs > 0) {
    MeasureBaselineLocked(job_id, state, version, step);
    return true;
  }
  if (state.queued || !c.closed_block) return true;
  const CompareOptions options = CompareOptionsLocked(state);
  const ComparisonDecision decision =
      DecideInterleaved(c.blocks, c.incumbent, c.candidate, options);
  // A verdict without an interval is a steady hog's inconclusive one.
  if (!decision.done()) return true;
  ApplyVerdictLocked(job_id, state, step, decision, options);
  return true;
}

CompareOptions PlanningManager::CompareOptionsLocked(
    const JobPlanning& state) const {
  const JobPlanning::Comparison& c = *state.comparison;
  CompareOptions options = BusyOptionsLocked(state);
  options.min_gain = MinGain(state.spec);
  // A promising comparison measures on past max_pairs in at most half the
  // steps the job had left when it began, as a baseline check does: a
  // short job keeps most of its steps for the plan it settles on.
  for (const StoredSchedule& s : state.schedules) {
    if (s.schedule.version() != c.candidate) continue;
    const int64_t fit = PairsInHalfTheStepsLeft(state.spec, s.effective_step);
    options.promising_max_pairs = static_cast<int>(
        std::max<int64_t>(options.max_pairs,
                          std::min<int64_t>(options.promising_max_pairs, fit)));
  }
  return options;
}

void PlanningManager::ApplyVerdictLocked(const std::string& job_id,
                                         JobPlanning& state, int64_t step,
                                         const ComparisonDecision& decision,
                                         const CompareOptions& options) {
  const JobPlanning::Comparison& c = *state.comparison;
  // No interval only when every pair was left out as busy (a steady hog:
  // inconclusive, DecideInterleaved).
  const RatioInterval r = decision.interval.value_or(RatioInterval{});
  // The pairs left out, said with the verdict.
  const std::string busy =
      decision.busy.pairs > 0
          ? absl::StrFormat(
                "; %d block %s (%d steps) left out: the host's CPUs were "
                "busy with other work",
                decision.busy.pairs,
                decision.busy.pairs == 1 ? "pair" : "pairs",
                decision.busy.steps)
          : std::string();
  const int64_t candidate = c.candidate;
  const int64_t incumbent = c.incumbent;
  std::optional<v1::Schedule> candidate_schedule;
  std::optional<v1::Schedule> incumbent_schedule;
  for (const StoredSchedule& s : state.schedules) {
    if (s.schedule.version() == candidate) candidate_schedule = s.schedule;
    if (s.schedule.version() == incumbent) incumbent_schedule = s.schedule;
  }
  // A trial; a rollback check (the candidate reruns the best version
  // measured one after the other, the incumbent is the active version found
  // behind it); or a drift check (the candidate is the re-plan of a drift,
  // the incumbent the version that drifted).
  auto compared = state.compared.find(candidate);
  const ComparisonKind kind = compared != state.compared.end()
                                  ? compared->second.kind
                                  : ComparisonKind::kTrial;
  const bool trial = kind == ComparisonKind::kTrial;
  auto rerun = state.rollbacks.find(candidate);
  const int64_t reran = rerun != state.rollbacks.end() ? rerun->second : -1;
  std::string source;
  switch (kind) {
    case ComparisonKind::kTrial:
      source = absl::StrCat(candidate_schedule.has_value()
                                ? TrialSource(*candidate_schedule)
                                : std::string("the runner-up"),
                            "'s plan");
      break;
    case ComparisonKind::kRollbackCheck:
      source = absl::StrCat("v", reran, "'s plan again");
      break;
    case ComparisonKind::kDriftCheck:
      source = "the plan re-fitted to the drift";
      break;
  }
  std::string verdict;
  switch (decision.verdict) {
    case Verdict::kCandidateFaster:
      verdict = absl::StrFormat(
          "%.1f%% faster, beyond optimize.min_gain %.0f%%; %s",
          100 * (1 - r.ratio), 100 * options.min_gain,
          kind == ComparisonKind::kRollbackCheck
              ? absl::StrCat("rolled back: v", reran, "'s plan runs on")
              : std::string("kept: its plan runs on"));
      break;
    case Verdict::kCandidateSlower:
      verdict = absl::StrFormat("%.1f%% slower; back to v%d's schedule",
                                100 * (r.ratio - 1), incumbent);
      break;
    case Verdict::kEquivalent:
      verdict = absl::StrFormat(
          "within optimize.min_gain %.0f%% of v%d: not worth a switch; back "
          "to v%d's schedule",
          100 * options.min_gain, incumbent, incumbent);
      break;
    default: {
      verdict =
          decision.interval.has_value()
              ? absl::StrFormat(
                    "inconclusive after %d block pairs (the interval spans "
                    "both sides of optimize.min_gain %.0f%%); back to v%d's "
                    "schedule",
                    r.pairs, 100 * options.min_gain, incumbent)
              : absl::StrFormat(
                    "inconclusive: no block pair measured on a quiet host; "
                    "back to v%d's schedule",
                    incumbent);
      // Trials back off; a check is not a trial (the next one comes only
      // from another plan found behind, or another drift).
      if (trial) {
        ++state.inconclusive_trials;
        const int64_t wait = TrialBackoffSteps(
            state.spec.optimize().drift_window(), state.inconclusive_trials);
        state.trial_not_before = step + wait;
        absl::StrAppendFormat(
            &verdict,
            "; the next trial waits until step %d (%d steps: %d inconclusive "
            "in a row)",
            state.trial_not_before, wait, state.inconclusive_trials);
      }
      break;
    }
  }
  if (kind == ComparisonKind::kRollbackCheck && !decision.keep_candidate()) {
    // Interleaved, the active plan is not behind: the gap measured one
    // after the other was the machine changing between the two, and what
    // was measured describes neither plan now. Drift detection takes over,
    // against the plan's own prediction (ExpectedAtReference with nothing
    // measured): a machine that stays slower re-plans from a window
    // measured under it, where the re-fitted model decides whether another
    // plan is now the faster.
    absl::StrAppend(&verdict,
                    "; the machine changed, not the plan: what was measured "
                    "is forgotten and drift detection decides from here");
  }
  if (kind == ComparisonKind::kDriftCheck && !decision.keep_candidate()) {
    // Measured side by side, the active plan is not behind the re-plan:
    // every plan slowed alike. It runs on, expected at what it measured in
    // the blocks (ExpectedAtReference), so the same slowdown does not
    // re-plan again.
    absl::StrAppendFormat(&verdict,
                          "; the machine changed for every plan, not v%d's "
                          "plan alone: v%d runs on, expected at what it "
                          "measured in the blocks",
                          incumbent, incumbent);
  }
  if (decision.verdict != Verdict::kInconclusive && trial) {
    state.inconclusive_trials = 0;
    state.trial_not_before = -1;
  }
  (void)jobs_->RecordEvent(
      job_id, PlanReasonName(ComparisonReason(kind)),
      decision.interval.has_value()
          ? absl::StrFormat(
                "%s v%d (%s) against v%d, interleaved in blocks of %d steps "
                "(%d block pairs; %d steps of v%d, %d of v%d counted, each "
                "block's first left out%s): v%d/v%d = %.3f (%.3f-%.3f, %.0f%% "
                "interval) at step %d: %s",
                ComparisonName(kind), candidate, source, incumbent,
                kComparisonBlockSteps, r.pairs, r.candidate_steps, candidate,
                r.incumbent_steps, incumbent, busy, candidate, incumbent,
                r.ratio, r.low, r.high, 100 * options.confidence, step, verdict)
          : absl::StrFormat(
                "%s v%d (%s) against v%d, interleaved in blocks of %d steps "
                "(no block pair counted%s) at step %d: %s",
                ComparisonName(kind), candidate, source, incumbent,
                kComparisonBlockSteps, busy, step, verdict));
  state.judged.insert(candidate);
  state.comparison.reset();
  state.pending_reason.reset();
  // A drift seen while the two alternated: the plan that runs on is
  // expected at its level before the change (the watched plan's, times the
  // ratio the blocks measured when the candidate runs on), so that the
  // detector fires again if the change lasts (WatchComparisonLocked).
  if (state.drift_seen_level_s > 0) {
    state.rearm_level_s = decision.keep_candidate()
                              ? state.drift_seen_level_s * r.ratio
                              : state.drift_seen_level_s;
    state.drift_seen_level_s = 0;
  }
  if (decision.keep_candidate()) {
    if (incumbent_schedule.has_value()) {
      state.rejected[incumbent] = *incumbent_schedule;
    }
    state.rollback_to = candidate;
    QueueLocked(job_id, state, PlanReason::kKept);
  } else {
    if (candidate_schedule.has_value()) {
      state.rejected[candidate] = *candidate_schedule;
    }
    if (kind == ComparisonKind::kRollbackCheck) state.measured.Clear();
    state.rollback_to = incumbent;
    state.rollback_inconclusive =
        trial && decision.verdict == Verdict::kInconclusive;
    QueueLocked(job_id, state, PlanReason::kRollback);
  }
}

void PlanningManager::MeasureBaselineLocked(const std::string& job_id,
                                            JobPlanning& state, int64_t version,
                                            int64_t step) {
  const JobPlanning::Comparison& c = *state.comparison;
  // When a block was cut short (a step missing), the plan may run alone for
  // longer than a pair: measured from what is in.
  const bool alone_long = !c.blocks.empty() &&
                          c.blocks.back().version == c.candidate &&
                          c.blocks.back().step_s.size() >
                              static_cast<size_t>(2 * kComparisonBlockSteps);
  std::optional<RatioInterval> r;
  BusyCount busy;
  if (c.closed_block || alone_long) {
    const CompareOptions options = BusyOptionsLocked(state);
    r = InterleavedRatio(c.blocks, c.incumbent, c.candidate, options);
    busy = BusyPairs(r, c.blocks, c.incumbent, c.candidate, options);
  }
  // Every pair in (those left out as busy too: the ranks alternate for the
  // pairs the update asked) and the plan running on by itself.
  const bool all_in = (c.closed_block || alone_long) &&
                      (r.has_value() ? r->pairs : 0) + busy.pairs >=
                          c.baseline_pairs + c.carried_pairs &&
                      version == c.candidate;
  if (!all_in && !alone_long) {
    // How far the check is, in the job's outcome.
    ReportOutcomeLocked(job_id, state, c.candidate);
    return;
  }
  const int64_t checked = c.candidate;
  JobPlanning::Comparison ended = std::move(*state.comparison);
  state.comparison.reset();
  state.speedup_version = checked;
  state.speedup =
      DescribeSpeedup(r, BaselineBasis(state.spec), kMaxSpeedupWidth, busy);
  // Too wide for a figure: measured on once, for as many more pairs as the
  // width asks (MorePairsForWidth), when they fit in half the steps the job
  // has left (a check's blocks alternate with the slower baseline) and are
  // at least two; pooled with these pairs. Never a continuation's
  // continuation: at most one version more per check. Nor after a drift
  // seen during the check: the plan runs alone, and the detector tells
  // whether the change lasts. Pairs left out because the host was busy
  // are measured again the same way (at least two).
  int more = 0;
  const auto rerun = state.rollbacks.find(checked);
  const bool two_counted = r.has_value() && r->pairs >= 2;
  if (!state.speedup.measured() && (two_counted || busy.pairs > 0) &&
      ended.continues < 0 && rerun != state.rollbacks.end() && !state.queued &&
      !state.pending_reason.has_value() && state.drift_seen_level_s <= 0) {
    const int64_t fit =
        PairsInHalfTheStepsLeft(state.spec, step + kSwitchLeadSteps);
    int want = busy.pairs > 0 ? std::max(2, busy.pairs) : 0;
    if (two_counted) {
      want = std::max(want, MorePairsForWidth(*r, kMaxBaselinePairs));
    }
    more = static_cast<int>(
        std::min<int64_t>({static_cast<int64_t>(want), fit,
                           static_cast<int64_t>(kMaxBaselinePairs)}));
  }
  if (more >= 2) {
    state.speedup.text += absl::StrFormat(
        "; measuring on for %d more block pairs, pooled with these", more);
  }
  (void)jobs_->RecordEvent(
      job_id, "baseline",
      absl::StrFormat("v%d against the baseline (v0), alternated in %d block "
                      "pairs of %d steps, at step %d: %s",
                      checked, r.has_value() ? r->pairs : 0,
                      kComparisonBlockSteps, step, state.speedup.text));
  ReportOutcomeLocked(job_id, state, checked);
  if (state.drift_seen_level_s > 0) {
    // A drift seen during the check (WatchComparisonLocked): the plan, which
    // runs on alone, is expected at its level before the change, so the
    // detector fires again only if the change lasts.
    state.drift->SetPrediction(state.drift_seen_level_s,
                               PredictedPeak(state.schedules, checked),
                               PlanOrigin(state, checked));
    state.drift_seen_level_s = 0;
  }
  if (more >= 2) {
    // The carried pairs: those counted and those left out, which the
    // pooled check's blocks hold too.
    state.baseline_continuation = JobPlanning::BaselineContinuation{
        checked, (r.has_value() ? r->pairs : 0) + busy.pairs, more,
        std::move(ended.blocks), busy.pairs};
    state.rollback_to = rerun->second;
    QueueLocked(job_id, state, PlanReason::kBaselineCheck);
  }
}

void PlanningManager::WatchComparisonLocked(const std::string& job_id,
                                            JobPlanning& state, int64_t version,
                                            int64_t step, double seconds,
                                            int64_t peak_bytes) {
  const JobPlanning::Comparison& c = *state.comparison;
  const bool baseline_check = c.baseline_pairs > 0;
  if (!baseline_check &&
      state.IsCompared(c.candidate, ComparisonKind::kDriftCheck)) {
    return;
  }
  // A verdict or a re-plan on its way; the fallback's steps are not these.
  if (state.queued || state.pending_reason.has_value() || state.guard_active ||
      !state.drift->has_prediction()) {
    return;
  }
  // Only the watched plan's steps: the other plan's vary by its own
  // blocks (a trial's pairs can disagree by more than the threshold on a
  // steady machine), which is the comparison's to judge, not a drift.
  const int64_t watched = baseline_check ? c.candidate : c.incumbent;
  if (version != watched) return;
  const std::optional<std::string> reason =
      state.drift->Observe(seconds, peak_bytes);
  if (metrics_ != nullptr) {
    metrics_->drift_score->WithLabels({job_id}).Set(state.drift->score());
  }
  if (!reason.has_value()) return;
  // Not acted on now: interleaved, the blocks see the change alike on both
  // plans and still compare them, and a change that passes (a link that
  // flaps) would otherwise cut every comparison short. The comparison goes
  // on; when it ends, the plan that runs on is expected at the watched
  // plan's level before the change (ApplyVerdictLocked,
  // MeasureBaselineLocked), and the detector fires again if the change
  // lasts. The level is the one before the first change the comparison
  // saw: a link that flaps back to it re-plans nothing.
  if (state.drift_seen_level_s <= 0) {
    state.drift_seen_level_s = state.drift->predicted_s();
  }
  const double expected = state.drift->predicted_s();
  const double window_median = state.drift->window_median_s();
  const double score = state.drift->score();
  const double noise_bound = state.drift->noise_bound();
  // Watched on from the changed level, so that a later change during the
  // comparison shows too (a first plan that missed its prediction, then a
  // throttled link).
  state.drift->SetPrediction(window_median > 0 ? window_median : expected,
                             PredictedPeak(state.schedules, watched),
                             PlanOrigin(state, watched));
  std::string what;
  if (baseline_check) {
    auto rerun = state.rollbacks.find(c.candidate);
    what = absl::StrFormat(
        "the baseline check of v%d (v%d's plan alternating with the "
        "baseline, v0)",
        c.candidate,
        rerun != state.rollbacks.end() ? rerun->second : c.candidate);
  } else {
    what = absl::StrFormat("the %s of v%d against v%d",
                           ComparisonName(state.compared[c.candidate].kind),
                           c.candidate, c.incumbent);
  }
  (void)jobs_->RecordEvent(
      job_id, *reason,
      *reason == PlanReasonName(PlanReason::kDrift)
          ? absl::StrFormat(
                "drift at step %d during %s: the last %d steps of v%d "
                "measured %.4f s/iter (median) against %.4f expected (score "
                "%.2f; threshold %.2f, noise bound %.2f); the comparison "
                "goes on (interleaved, its blocks see the change alike on "
                "both plans); once it ends, the plan that runs on is "
                "expected at its level before the change and re-plans if "
                "the change lasts",
                step, what, state.spec.optimize().drift_window(), watched,
                window_median, expected, score,
                state.spec.optimize().drift_threshold(), noise_bound)
          : absl::StrFormat(
                "%s at step %d during %s: the measured peak came near the "
                "budget beyond v%d's prediction; the comparison goes on "
                "(the workers' memory guard holds the budget), and the plan "
                "that runs on once it ends re-plans if it lasts",
                *reason, step, what, watched));
}

void PlanningManager::MaybeStartCached(const v1::Job& job) {
  std::string hash;
  std::vector<RankDevice> devices;
  {
    absl::MutexLock lock(&mu_);
    JobPlanning& state = State(job.id(), job);
    const int world = job.spec().parallel().world_size();
    int reported = 0;
    for (const RankDevice& d : state.devices) reported += !d.device.empty();
    if (state.cache_checked || state.profiles.graph() == nullptr ||
        reported < world || !state.schedules.empty() || state.queued) {
      return;
    }
    state.cache_checked = true;
    hash = state.profiles.graph()->StructuralHash();
    devices = state.devices;
  }
  std::optional<CachedPlan> cached =
      FindCachedPlan(*jobs_, *store_, job, hash, devices);
  if (!cached.has_value()) return;
  std::optional<Speedup> carried = CarriedSpeedup(*jobs_, *cached);
  absl::MutexLock lock(&mu_);
  JobPlanning& state = State(job.id(), job);
  if (!state.schedules.empty() || state.queued) return;
  state.cached_from = cached->job_id;
  state.cached = std::move(cached->schedule);
  state.cached_speedup = std::move(carried);
  QueueLocked(job.id(), state, PlanReason::kCached);
}

void PlanningManager::ReportOutcomeLocked(const std::string& job_id,
                                          const JobPlanning& state,
                                          int64_t version) {
  const int64_t active =
      state.schedules.empty() ? 0 : state.schedules.back().schedule.version();
  if (version != active) return;
  JobManager::Outcome o;
  if (!state.schedules.empty()) {
    o.predicted_s = PredictedAtReference(
        state.work, state.schedules.back().schedule.prediction());
  }
  // Too few steps of the active version yet: its prediction alone, never
  // the figures of the version it replaced (nor the gauge's: NaN, "not
  // measured", which no alert or panel reads as a value).
  const std::optional<ScheduleMeasurements::Summary> now =
      state.measured.Summarize(active);
  if (now.has_value()) o.measured_s = now->median_s;
  double gauge = std::numeric_limits<double>::quiet_NaN();
  const int64_t plan = PlanOrigin(state, active);
  if (plan == 0) {
    if (now.has_value()) {
      o.speedup = 1;
      gauge = 1;
    }
    o.speedup_text =
        active == 0
            ? std::string("on the baseline (v0)")
            : absl::StrFormat("on the baseline's plan (v%d runs v0's again)",
                              active);
  } else if (state.comparison.has_value() &&
             state.comparison->candidate == active &&
             state.comparison->baseline_pairs > 0) {
    // Its check (or a continuation of its plan's) under way.
    const JobPlanning::Comparison& c = *state.comparison;
    const int64_t baseline_blocks = std::count_if(
        c.blocks.begin(), c.blocks.end(),
        [&c](const StepBlock& b) { return b.version == c.incumbent; });
    o.speedup_text = absl::StrFormat(
        "not measured yet (v%d alternates with the baseline: %d of %d block "
        "pairs)",
        active, baseline_blocks, c.baseline_pairs + c.carried_pairs);
  } else if (state.speedup_version >= 0 &&
             PlanOrigin(state, state.speedup_version) == plan) {
    // Measured interleaved (its plan's baseline check, under this version
    // or one that ran the same plan): the figure with its interval, or why
    // it is not one.
    const Speedup& s = state.speedup;
    o.speedup = s.factor;
    o.speedup_low = s.low;
    o.speedup_high = s.high;
    o.speedup_steps = s.steps;
    o.speedup_text = s.text;
    if (s.measured()) gauge = s.factor;
  } else if (BaselinePairs(state.spec) == 0) {
    o.speedup_text =
        "not measured (optimize.baseline_pairs is 0: no interleaved "
        "measurement against the baseline)";
  } else if (state.baseline_unfit) {
    o.speedup_text =
        "not measured: the baseline (v0) does not fit memory.budget_bytes "
        "(the memory guard tripped under it), so it is not run to compare";
  } else {
    o.speedup_text = absl::StrFormat(
        "not measured yet (v%d is measured against the baseline, "
        "interleaved, once it has settled)",
        active);
  }
  (void)jobs_->UpdateOutcome(job_id, o);
  if (metrics_ != nullptr) {
    metrics_->speedup->WithLabels({job_id}).Set(gauge);
  }
}

void PlanningManager::OnRankRegistered(const std::string& job_id, int32_t rank,
                                       RankDevice device) {
  absl::StatusOr<v1::Job> job = jobs_->Get(job_id);
  if (!job.ok() || IsTerminal(job->state()) || rank < 0 ||
      rank >= job->spec().parallel().world_size()) {
    return;
  }
  {
    absl::MutexLock lock(&mu_);
    JobPlanning& state = State(job_id, *job);
    if (state.devices.size() <= static_cast<size_t>(rank)) {
      state.devices.resize(rank + 1);
    }
    state.devices[rank] = std::move(device);
  }
  // Once the graph and every rank's device are known.
  MaybeStartCached(*job);
}

void PlanningManager::OnMemoryGuard(const std::string& job_id, int32_t rank,
                                    int64_t step,
                                    std::optional<int64_t> tripped_version,
                                    const std::string& reason) {
  absl::StatusOr<v1::Job> job = jobs_->Get(job_id);
  if (!job.ok() || IsTerminal(job->state())) return;
  std::string message;
  {
    absl::MutexLock lock(&mu_);
    JobPlanning& state = State(job_id, *job);
    // Every rank reports the same switch.
    if (state.guard_step == step) return;
    state.guard_step = step;
    state.guard_active = true;
    state.guard_over_version =
        state.schedules.empty() ? 0 : state.schedules.back().schedule.version();
    // The version that tripped it: as the worker says, or else the newest.
    // While a baseline check alternates, its blocks run v0 or the plan:
    // without the worker's word, which of them tripped is unknown.
    const bool known =
        tripped_version.has_value() ||
        !(state.comparison.has_value() && state.comparison->baseline_pairs > 0);
    const int64_t tripped = tripped_version.value_or(state.guard_over_version);
    // Under the baseline (before any plan, or in its blocks): it does not
    // fit the budget, and is not run again to measure a speedup. Unknown in
    // a baseline check: taken as the baseline's, and no plan is forgotten.
    const bool under_baseline =
        state.schedules.empty() || tripped == 0 || !known;
    if (under_baseline) state.baseline_unfit = true;
    // The plan it tripped under does not fit: however fast it measured, it
    // is never rolled back to, nor is any version that reruns it (a rollback
    // to it, a kept trial, a baseline check of it: each would trip the guard
    // again).
    if (!under_baseline && tripped > 0) {
      auto rerun = state.rollbacks.find(tripped);
      const int64_t plan =
          rerun == state.rollbacks.end() ? tripped : rerun->second;
      state.measured.Forget(tripped);
      state.measured.Forget(plan);
      for (const auto& [version, reruns] : state.rollbacks) {
        if (reruns == plan) state.measured.Forget(version);
      }
    }
    // The ranks stopped alternating: a comparison running ends undecided,
    // and its trial is not tried again.
    if (state.comparison.has_value()) {
      state.judged.insert(state.comparison->candidate);
      state.comparison.reset();
    }
    state.drift_seen_level_s = 0;
    state.rearm_level_s = 0;
    // Before the first plan, the initial plan is measured under it anyway.
    if (!state.schedules.empty()) {
      state.pending_reason = PlanReason::kMemoryGuard;
    }
    message = absl::StrCat(
        "rank ", rank, ": ", reason,
        state.schedules.empty()
            ? "; the initial plan is made from the profile measured under it"
            : "; re-planning from the next profile window measured under it");
  }
  (void)jobs_->RecordEvent(job_id, "memory-guard", message);
}

void PlanningManager::OnScheduleActive(const std::string& job_id,
                                       int64_t version) {
  absl::MutexLock lock(&mu_);
  auto it = state_.find(job_id);
  if (it == state_.end()) return;
  // A plan published after the guard tripped replaced the least-memory
  // fallback. The version the guard tripped under, reported active late
  // (the ranks left it within a step or two), did not.
  if (version > it->second.guard_over_version) {
    it->second.guard_active = false;
  }
  for (const StoredSchedule& s : it->second.schedules) {
    if (s.schedule.version() == version) {
      auto [seconds, peak, plan] = DriftExpectation(it->second, s.schedule);
      // The version a comparison that saw a drift ended in: expected at the
      // level before the change (ApplyVerdictLocked), so that the detector
      // fires again only if the change lasts.
      if (it->second.rearm_level_s > 0 &&
          version == it->second.schedules.back().schedule.version()) {
        seconds = it->second.rearm_level_s;
        it->second.rearm_level_s = 0;
      }
      it->second.drift->SetPrediction(seconds, peak, plan);
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
  if (IsTerminal(job->state())) return Ended(*job);
  absl::MutexLock lock(&mu_);
  if (stop_) {
    return absl::UnavailableError(
        "the coordinator is shutting down; re-optimize once it is back");
  }
  JobPlanning& state = State(job_id, *job);
  if (!state.latest.has_value()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "job ", job_id,
        " has no profile yet; re-optimize after its warm-up steps"));
  }
  const std::optional<PlanReason> why =
      reason.empty() ? PlanReason::kReoptimize : PlanReasonFromName(reason);
  if (!why.has_value()) {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown re-plan reason '", reason,
                     "'; use 'reoptimize' (or leave it empty)"));
  }
  QueueLocked(job_id, state, *why);
  return static_cast<int64_t>(state.schedules.size()) + 1;
}

void PlanningManager::QueueLocked(const std::string& job_id, JobPlanning& state,
                                  PlanReason reason) {
  if (state.queued || stop_) return;
  state.queued = true;
  queue_.emplace_back(job_id, reason);
  work_.Signal();
}

void PlanningManager::PlannerLoop() {
  mu_.Lock();
  for (;;) {
    while (!stop_ && queue_.empty()) work_.Wait(&mu_);
    if (stop_) break;
    auto [job_id, reason] = queue_.front();
    queue_.pop_front();
    busy_ = true;
    mu_.Unlock();
    PlanOne(job_id, reason);
    mu_.Lock();
    busy_ = false;
    auto it = state_.find(job_id);
    if (it != state_.end()) it->second.queued = false;
    if (queue_.empty()) idle_.SignalAll();
  }
  mu_.Unlock();
  // Stop() emptied the queue: wake Drain().
  idle_.SignalAll();
}

void PlanningManager::PlanOne(const std::string& job_id, PlanReason why) {
  const std::string reason(PlanReasonName(why));
  // Snapshot what the plan needs, then plan without the lock.
  Graph graph;
  Profile profile;
  v1::JobSpec spec;
  std::vector<RankDevice> devices;
  int64_t version = 0;
  // A rollback: the version it returns to (its schedule when it is not the
  // baseline) and what that version measured.
  int64_t rollback_to = -1;
  // The rollback ends an inconclusive trial (kInconclusivePass).
  bool rollback_inconclusive = false;
  std::optional<v1::Schedule> rollback_schedule;
  // A rollback to the baseline: the plan whose explanation simulated it.
  std::optional<v1::Schedule> baseline_simulated;
  // Schedules measured slower than the best: never published again.
  std::map<int64_t, v1::Schedule> rejected;
  // A "cached" plan: the earlier job's schedule.
  std::string cached_from;
  std::optional<v1::Schedule> cached;
  // A version compared before it runs on: a trial, a rollback that is
  // checked first, or a drift plan that differs from the active one; and
  // the version it alternates with (the incumbent).
  std::optional<ComparisonKind> compare;
  std::optional<v1::Schedule> incumbent;
  // A "trial": the runner-up.
  std::optional<PlanAlternative> trial;
  // A "baseline-check": the block pairs it alternates for, and the check it
  // continues, if any.
  int check_pairs = 0;
  std::optional<JobPlanning::BaselineContinuation> continuation;
  // The plan's own runner-up, when worth a trial (TrialCandidate).
  std::optional<PlanAlternative> next_trial;
  // The schedule the profile was measured under (none for version 0: the
  // starting schedule), or the least-memory fallback.
  std::optional<v1::Schedule> profiled;
  bool profiled_least_memory = false;
  // Headroom beyond MemoryHeadroom, from the memory guard's trips.
  int64_t extra_headroom = 0;
  // What the re-fitted model prices the schedule the profile ran under at
  // (PlanResult::profiled_sim; 0: not priced).
  double profiled_price_s = 0;
  // The baseline tripped the memory guard: said in the provenance
  // (kBaselineUnfitPass) so that a restarted coordinator still knows.
  bool baseline_unfit = false;
  // Versions measured on this job (0: the baseline) and their medians,
  // scaled to the work of the profile planned from: the evidence the
  // interference model is re-fitted to.
  std::vector<std::pair<int64_t, double>> measured_versions;
  std::map<int64_t, v1::Schedule> measured_schedules;
  // The work measured times are scaled to (WorkScale).
  double reference_work = 0;
  {
    absl::MutexLock lock(&mu_);
    auto it = state_.find(job_id);
    // Plans that are not made from a profile: a cached plan, a rollback
    // and a trial (after a restart, before the next window).
    const bool cached_plan = why == PlanReason::kCached;
    const bool needs_profile = !cached_plan && why != PlanReason::kRollback &&
                               why != PlanReason::kKept &&
                               why != PlanReason::kTrial &&
                               why != PlanReason::kBaselineCheck;
    if (stop_ || it == state_.end() || it->second.profiles.graph() == nullptr ||
        (!it->second.latest && needs_profile)) {
      return;
    }
    graph = *it->second.profiles.graph();
    if (it->second.latest) profile = *it->second.latest;
    const WorkScale& work = it->second.work;
    reference_work = work.reference();
    auto at_profile = [&](double seconds) {
      return work.Scale(seconds, reference_work, profile.work);
    };
    if (cached_plan) {
      cached_from = it->second.cached_from;
      cached = it->second.cached;
    }
    if (why == PlanReason::kTrial) {
      if (!it->second.trial.has_value()) return;
      trial = std::move(it->second.trial);
      const int64_t trial_of = it->second.trial_after;
      it->second.trial.reset();
      it->second.trial_after = -1;
      for (const StoredSchedule& s : it->second.schedules) {
        if (s.schedule.version() == trial_of) incumbent = s.schedule;
      }
      // Alternated with the incumbent: without it there is nothing to
      // compare against.
      if (!incumbent.has_value()) return;
      compare = ComparisonKind::kTrial;
    }
    spec = it->second.spec;
    devices = it->second.devices;
    version = static_cast<int64_t>(it->second.schedules.size()) + 1;
    rejected = it->second.rejected;
    if (why == PlanReason::kBaselineCheck) {
      continuation = std::move(it->second.baseline_continuation);
      check_pairs =
          continuation.has_value()
              ? continuation->more_pairs
              : BaselineCheckPairs(spec, it->second.measured.AllSteps(),
                                   it->second.max_step + kSwitchLeadSteps);
    }
    it->second.baseline_continuation.reset();
    if (why == PlanReason::kRollback || why == PlanReason::kKept ||
        why == PlanReason::kBaselineCheck) {
      rollback_to = it->second.rollback_to;
      rollback_inconclusive =
          why == PlanReason::kRollback && it->second.rollback_inconclusive;
      it->second.rollback_inconclusive = false;
      int64_t check_of = -1;
      if (why == PlanReason::kRollback) {
        check_of = it->second.rollback_check_of;
        it->second.rollback_check_of = -1;
      }
      for (const StoredSchedule& s : it->second.schedules) {
        if (s.schedule.version() == rollback_to) rollback_schedule = s.schedule;
        if (check_of >= 0 && s.schedule.version() == check_of) {
          compare = ComparisonKind::kRollbackCheck;
          incumbent = s.schedule;
        }
        // The baseline's own prediction: the newest plan's simulation of
        // it (its explanation's baseline).
        if (s.schedule.explanation().baseline_iteration_s() > 0) {
          baseline_simulated = s.schedule;
        }
      }
    }
    for (const StoredSchedule& s : it->second.schedules) {
      if (s.schedule.version() == profile.schedule_version) {
        profiled = s.schedule;
      }
    }
    profiled_least_memory = profile.schedule_version == kLeastMemoryVersion;
    if (std::optional<ScheduleMeasurements::Summary> m =
            it->second.measured.Summarize(0)) {
      measured_versions.emplace_back(0, at_profile(m->median_s));
    }
    for (const StoredSchedule& s : it->second.schedules) {
      if (std::optional<ScheduleMeasurements::Summary> m =
              it->second.measured.Summarize(s.schedule.version())) {
        measured_versions.emplace_back(s.schedule.version(),
                                       at_profile(m->median_s));
        measured_schedules[s.schedule.version()] = s.schedule;
      }
    }
    JobPlanning& state = it->second;
    if (why == PlanReason::kMemoryGuard && !state.schedules.empty()) {
      const v1::Schedule& tripped = state.schedules.back().schedule;
      auto seen = state.peak_by_version.find(tripped.version());
      if (seen != state.peak_by_version.end()) {
        state.extra_headroom =
            std::max(state.extra_headroom,
                     GuardHeadroom(tripped.prediction().peak_bytes(),
                                   seen->second.first, seen->second.second));
      }
    }
    extra_headroom = state.extra_headroom;
    baseline_unfit = state.baseline_unfit;
  }
  absl::StatusOr<v1::Job> job = jobs_->Get(job_id);
  if (!job.ok() || IsTerminal(job->state())) {
    Forget(job_id);
    return;
  }

  const auto start = std::chrono::steady_clock::now();
  std::string assumed;
  std::string planned_on;
  int64_t headroom = 0;
  // No schedule fits the budget, by the measurements: the job fails.
  bool nothing_fits = false;
  absl::StatusOr<Schedule> planned = [&]() -> absl::StatusOr<Schedule> {
    if (cached.has_value()) {
      // Planned for an identical job: its plan from step 1, still
      // profiled, re-planned on drift.
      absl::StatusOr<Schedule> reused = FromProto(*cached);
      if (!reused.ok()) return reused.status();
      reused->provenance.passes.push_back(
          absl::StrCat("cached-from:", cached_from, "/v", cached->version()));
      planned_on = absl::StrCat("job ", cached_from, "'s plan");
      return reused;
    }
    if (trial.has_value()) {
      Schedule s = trial->schedule;
      s.provenance.passes.push_back(absl::StrCat("trial:", trial->source));
      s.provenance.passes.push_back(
          absl::StrCat(kTrialPass, incumbent->version()));
      Decision chosen;
      chosen.kind = DecisionKind::kPolicy;
      chosen.pass = "planner";
      chosen.what = absl::StrFormat(
          "%s's plan (predicted %.6f s) measured as a trial against v%d's "
          "(%.6f s): within optimize.trial_margin of it, where the cost model "
          "cannot tell the two apart; the two alternate in blocks of %d "
          "steps, and the faster by measurement is kept",
          trial->source, s.prediction.iteration_s, incumbent->version(),
          incumbent->prediction().iteration_s(), kComparisonBlockSteps);
      s.explanation.decisions.push_back(std::move(chosen));
      planned_on = absl::StrCat("v", incumbent->version(), "'s runner-up");
      return s;
    }
    if (rollback_to >= 0) {
      // The schedule measured fastest, predicted at what it measured: the
      // evidence, not the model that chose the slower one.
      absl::StatusOr<Schedule> back =
          rollback_schedule.has_value()
              ? FromProto(*rollback_schedule)
              : StartingSchedule(graph, spec.parallel().zero_stage() == 1
                                            ? ShardingMode::kZero1
                                            : ShardingMode::kZero3);
      if (!back.ok()) return back.status();
      if (!rollback_schedule.has_value() && baseline_simulated.has_value()) {
        const v1::Explanation& e = baseline_simulated->explanation();
        back->prediction.iteration_s = e.baseline_iteration_s();
        back->prediction.exposed_comm_s = e.baseline_exposed_comm_s();
        back->prediction.peak_bytes = e.baseline_peak_bytes();
        back->prediction.work = baseline_simulated->prediction().work();
      }
      back->provenance.passes.push_back(absl::StrCat(
          why == PlanReason::kKept            ? "kept-v"
          : why == PlanReason::kBaselineCheck ? "baseline-check-of-v"
                                              : "rollback-to-v",
          rollback_to));
      if (rollback_inconclusive) {
        back->provenance.passes.push_back(kInconclusivePass);
      }
      if (compare == ComparisonKind::kRollbackCheck) {
        back->provenance.passes.push_back(
            absl::StrCat(kRollbackCheckPass, incumbent->version()));
      }
      if (why == PlanReason::kBaselineCheck) {
        back->provenance.passes.push_back(
            absl::StrCat(kBaselinePairsPass, check_pairs));
        if (continuation.has_value()) {
          back->provenance.passes.push_back(
              absl::StrCat(kBaselineContinuesPass, continuation->of));
        }
      }
      planned_on = why == PlanReason::kKept            ? "the comparison"
                   : why == PlanReason::kBaselineCheck ? "the plan that settled"
                                                       : "the measurements";
      return back;
    }
    PlanOptions options = PlanOptionsFromSpec(spec);
    std::optional<Schedule> ran;
    if (profiled_least_memory) {
      absl::StatusOr<Schedule> s = LeastMemorySchedule(graph, options.mode);
      if (!s.ok()) return s.status();
      ran = *std::move(s);
    } else if (profiled.has_value()) {
      absl::StatusOr<Schedule> s = FromProto(*profiled);
      if (!s.ok()) return s.status();
      ran = *std::move(s);
    }
    const JobHardware hardware = HardwareForJob(spec, devices);
    assumed = absl::StrJoin(hardware.assumptions, "; ");
    MetricsSink sink(metrics_);
    options.sink = &sink;
    options.extra_headroom_bytes = extra_headroom;
    for (const auto& [measured_version, seconds] : measured_versions) {
      absl::StatusOr<Schedule> s =
          measured_version == 0
              ? StartingSchedule(graph, options.mode)
              : FromProto(measured_schedules[measured_version]);
      if (s.ok()) options.measured.emplace_back(*std::move(s), seconds);
    }
    absl::StatusOr<PlanResult> result =
        PlanFromMeasurements(graph, hardware.hw, &profile,
                             ran.has_value() ? &*ran : nullptr, options);
    if (!result.ok()) {
      nothing_fits =
          result.status().code() == absl::StatusCode::kResourceExhausted;
      return result.status();
    }
    // A share of an unlimited budget says nothing.
    headroom = result->hw.budget_bytes <= 0 &&
                       result->hw.device_memory_bytes >= kUnlimitedMemoryBytes
                   ? 0
                   : result->headroom_bytes;
    planned_on = DescribeHardware(result->hw);
    if (result->profiled_sim.has_value() && !profiled_least_memory) {
      profiled_price_s = result->profiled_sim->iteration_s;
    }
    if (why != PlanReason::kMemoryGuard) {
      next_trial = TrialCandidate(*result, TrialMargin(spec));
    }
    if (!result->feasible) {
      // A reference policy's plan that would run out of memory, as the real
      // framework would: not published.
      return absl::ResourceExhaustedError(absl::StrCat(
          "policy ", spec.optimize().policy(), "'s plan peaks at ",
          FormatBytes(result->sim.peak_bytes), ", over the budget of ",
          FormatBytes(result->hw.budget()),
          "; raise memory.budget_bytes or use the tandem policy, which "
          "offloads to fit"));
    }
    return result->schedule;
  }();
  const double wall =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
          .count();
  if (!planned.ok() && nothing_fits) {
    // Running on would only end in a step over the budget.
    Fail(job_id,
         absl::StrCat("memory.budget_bytes is too small for any schedule, "
                      "by the profile of steps ",
                      profile.first_iteration, "..", profile.last_iteration,
                      ": ", planned.status().message()));
    return;
  }
  if (!planned.ok()) {
    (void)jobs_->RecordEvent(
        job_id, "replan",
        absl::StrCat("planning v", version, " (", reason,
                     ") failed: ", planned.status().message(),
                     "; the job keeps its current schedule",
                     KeepActive(job_id, why, profile)));
    return;
  }
  for (const auto& [slower, schedule] : rejected) {
    absl::StatusOr<Schedule> seen = FromProto(schedule);
    if (rollback_to < 0 && seen.ok() && SamePlan(*seen, *planned)) {
      (void)jobs_->RecordEvent(
          job_id, "replan",
          absl::StrCat("planning v", version, " (", reason, ") gave v", slower,
                       "'s schedule again, which measured slower than the "
                       "best schedule on this job; the job keeps its "
                       "current schedule",
                       KeepActive(job_id, why, profile)));
      return;
    }
  }
  if (why == PlanReason::kDrift) {
    // A drift re-plan that changes nothing is no re-plan.
    std::optional<v1::Schedule> active;
    {
      absl::MutexLock lock(&mu_);
      auto it = state_.find(job_id);
      if (it != state_.end() && !it->second.schedules.empty() &&
          !it->second.guard_active) {
        active = it->second.schedules.back().schedule;
      }
    }
    absl::StatusOr<Schedule> current =
        active.has_value() ? FromProto(*active)
                           : absl::StatusOr<Schedule>(absl::NotFoundError(""));
    if (current.ok() && SamePlan(*current, *planned)) {
      (void)jobs_->RecordEvent(
          job_id, "replan",
          absl::StrCat("planning v", version, " (drift) gave the active v",
                       active->version(), "'s schedule again; the job keeps it",
                       KeepActive(job_id, why, profile)));
      return;
    }
    // Another plan, but the re-fitted model does not price it faster than
    // the active one by optimize.min_gain: what drifted is the machine, for
    // every plan alike (a CPU hog, a slower link), not the choice. A
    // switch would buy less than a comparison can tell apart.
    const double gain = MinGain(spec);
    if (current.ok() && profiled.has_value() &&
        profiled->version() == active->version() && profiled_price_s > 0 &&
        planned->prediction.iteration_s > profiled_price_s * (1 - gain)) {
      (void)jobs_->RecordEvent(
          job_id, "replan",
          absl::StrFormat(
              "planning v%d (drift): the model re-fitted to steps %d..%d "
              "prices the active v%d's plan at %.4f s/iter and the best "
              "other at %.4f (%+.1f%%, not faster by optimize.min_gain "
              "%.0f%%): the machine changed for every plan, not the "
              "choice; the job keeps v%d%s",
              version, profile.first_iteration, profile.last_iteration,
              active->version(), profiled_price_s,
              planned->prediction.iteration_s,
              100 * (planned->prediction.iteration_s / profiled_price_s - 1),
              100 * gain, active->version(), KeepActive(job_id, why, profile)));
      return;
    }
    // Priced faster by more than min_gain: the re-fitted model says the
    // choice moved. The model can misread a machine that slowed for every
    // plan, so the measurements decide: the drift plan alternates with the
    // active one, interleaved, and runs on only if measured faster
    // (CompareLocked).
    if (current.ok()) {
      compare = ComparisonKind::kDriftCheck;
      incumbent = *active;
      next_trial.reset();
    }
  }
  planned->version = version;
  planned->provenance.reason = reason;
  if (compare == ComparisonKind::kDriftCheck) {
    planned->provenance.passes.push_back(
        absl::StrCat(kDriftCheckPass, incumbent->version()));
  }
  if (baseline_unfit &&
      !absl::c_linear_search(planned->provenance.passes,
                             absl::string_view(kBaselineUnfitPass))) {
    planned->provenance.passes.push_back(kBaselineUnfitPass);
  }
  planned->provenance.window_first_iteration = profile.first_iteration;
  planned->provenance.window_last_iteration = profile.last_iteration;
  planned->provenance.plan_wall_s = wall;

  v1::ScheduleUpdate update;
  *update.mutable_schedule() = ToProto(*planned);
  {
    absl::MutexLock lock(&mu_);
    auto it = state_.find(job_id);
    // Abandoned: Stop() came while planning, or the job ended.
    if (stop_ || it == state_.end()) return;
    // A cached plan is sent as the ranks start: from the first boundary.
    update.set_effective_step(cached.has_value()
                                  ? it->second.max_step + 1
                                  : it->second.max_step + kSwitchLeadSteps);
  }
  if (compare.has_value()) {
    *update.mutable_incumbent() = *incumbent;
    update.set_block_steps(kComparisonBlockSteps);
  }
  if (why == PlanReason::kBaselineCheck) {
    absl::StatusOr<Schedule> baseline = StartingSchedule(
        graph, spec.parallel().zero_stage() == 1 ? ShardingMode::kZero1
                                                 : ShardingMode::kZero3);
    if (!baseline.ok()) {
      (void)jobs_->RecordEvent(
          job_id, "replan",
          absl::StrCat("the baseline check of v", rollback_to,
                       " has no baseline to alternate with: ",
                       baseline.status().message()));
      return;
    }
    *update.mutable_incumbent() = ToProto(*baseline);
    update.set_block_steps(kComparisonBlockSteps);
    update.set_block_pairs(check_pairs);
  }
  // Stored before any rank sees it, so that a restarted coordinator knows
  // every version a worker may be running.
  if (absl::Status s = store_->PutSchedule(job_id, update.schedule(),
                                           update.effective_step());
      !s.ok()) {
    Fail(job_id,
         absl::StrCat("cannot persist schedule v", version, ": ", s.message()));
    return;
  }
  Publisher publisher;
  std::string carried_text;
  {
    absl::MutexLock lock(&mu_);
    auto it = state_.find(job_id);
    if (it != state_.end()) {
      it->second.schedules.push_back(
          {update.schedule(), update.effective_step()});
      if (rollback_to >= 0) it->second.rollbacks[version] = rollback_to;
      if (compare.has_value()) {
        it->second.compared[version] = {*compare, incumbent->version()};
        it->second.comparison =
            JobPlanning::Comparison{version, incumbent->version()};
      }
      if (compare == ComparisonKind::kDriftCheck) {
        // The drift says the machine or the plan changed: what was measured
        // before describes neither. The check's blocks measure both plans
        // anew, and whichever runs on is expected at what it measured there
        // (ExpectedAtReference).
        it->second.measured.Clear();
      }
      if (why == PlanReason::kBaselineCheck) {
        it->second.comparison =
            JobPlanning::Comparison{version, 0, check_pairs};
        if (continuation.has_value()) {
          it->second.comparison->Continue(continuation->of,
                                          std::move(continuation->blocks),
                                          continuation->pairs);
        }
      }
      if (cached.has_value() && it->second.cached_speedup.has_value()) {
        // The source job measured this plan against the baseline on the
        // same graph, hardware and budget: its figure holds here, and no
        // check spends baseline steps to measure it again.
        it->second.speedup_version = version;
        it->second.speedup = *it->second.cached_speedup;
        carried_text = it->second.speedup.text;
      }
      it->second.trial_after = next_trial.has_value() ? version : -1;
      it->second.trial = next_trial;
    }
    // After Stop() the workers hear of it from the next coordinator, which
    // sends the newest stored schedule when they reconnect.
    if (!stop_) publisher = publisher_;
  }
  if (metrics_ != nullptr) {
    metrics_->replans->WithLabels({job_id, reason}).Increment();
  }
  if (!carried_text.empty()) {
    (void)jobs_->RecordEvent(
        job_id, "baseline",
        absl::StrFormat("v%d carries job %s's measurement of this plan: %s",
                        version, cached_from, carried_text));
  }
  std::string alternated;
  if (compare == ComparisonKind::kDriftCheck) {
    alternated = absl::StrFormat(
        "; alternated with v%d in blocks of %d steps, it runs on only if "
        "measured faster (a machine that slowed for every plan can read as "
        "a reason to switch)",
        incumbent->version(), kComparisonBlockSteps);
  }
  if (why == PlanReason::kBaselineCheck && continuation.has_value()) {
    const std::string why_more =
        continuation->busy_pairs > 0
            ? absl::StrFormat("%d of them left out while the host was busy",
                              continuation->busy_pairs)
            : absl::StrFormat("their interval was wider than %.0f%%",
                              100 * kMaxSpeedupWidth);
    alternated = absl::StrFormat(
        "; alternated with the baseline (v0) for %d more block pairs of %d "
        "steps, pooled with v%d's %d (%s), then it runs on",
        check_pairs, kComparisonBlockSteps, continuation->of,
        continuation->pairs, why_more);
  } else if (why == PlanReason::kBaselineCheck) {
    const int least = BaselinePairs(spec);
    alternated = absl::StrFormat(
        "; alternated with the baseline (v0) for %d block pairs of %d steps, "
        "then it runs on%s",
        check_pairs, kComparisonBlockSteps,
        check_pairs > least
            ? absl::StrFormat(
                  " (optimize.baseline_pairs is %d: steps spread too much "
                  "on this machine for %d pairs to measure the speedup "
                  "within %.0f%%)",
                  least, least, 100 * kMaxSpeedupWidth)
            : std::string());
  }
  (void)jobs_->RecordEvent(
      job_id, "schedule",
      absl::StrFormat(
          "v%d (%s) from step %d: predicted %.4f s/iter%s, exposed comm "
          "%.4f s, peak %s%s; passes %s; planned in %.1f ms on %s%s%s%s",
          version, reason, update.effective_step(),
          planned->prediction.iteration_s,
          profile.iteration_s > 0
              ? absl::StrFormat(" (measured %.4f)", profile.iteration_s)
              : std::string(),
          planned->prediction.exposed_comm_s,
          FormatBytes(planned->prediction.peak_bytes),
          headroom > 0 ? absl::StrCat(" (headroom ", FormatBytes(headroom),
                                      " of the budget kept free)")
                       : std::string(),
          absl::StrJoin(planned->provenance.passes, ","), wall * 1e3,
          planned_on,
          assumed.empty() ? "" : absl::StrCat("; assumed: ", assumed),
          next_trial.has_value()
              ? absl::StrFormat(
                    "; runner-up %s's plan predicted %.4f s/iter, measured "
                    "as a trial once this one has run %d steps",
                    next_trial->source, next_trial->sim.iteration_s,
                    spec.optimize().drift_window())
              : std::string(),
          alternated));
  if (publisher) publisher(job_id, update);
}

std::string PlanningManager::KeepActive(const std::string& job_id,
                                        PlanReason reason,
                                        const Profile& window) {
  if (reason != PlanReason::kDrift) return "";
  absl::MutexLock lock(&mu_);
  auto it = state_.find(job_id);
  if (it == state_.end() || it->second.schedules.empty() ||
      it->second.guard_active) {
    return "";
  }
  JobPlanning& state = it->second;
  const v1::Schedule& active = state.schedules.back().schedule;
  // The window that drifted, else its median, else the profile window
  // planned from when the version ran it (a version newly active, a
  // comparison's verdict say: the detector has no window of it yet), else
  // (unmeasured) the prediction.
  // Not the median first: the version's steps straddle the jump that
  // fired, and expecting their median would fire the same jump again.
  double expected = PredictedAtReference(state.work, active.prediction());
  if (state.drift->window_median_s() > 0) {
    expected = state.drift->window_median_s();
  } else if (std::optional<ScheduleMeasurements::Summary> m =
                 state.measured.Summarize(active.version())) {
    expected = m->median_s;
  } else if (window.schedule_version == active.version() &&
             window.iteration_s > 0) {
    expected = state.work.ToReference(window.iteration_s, window.work);
  }
  // Kept at the new level, so the planner's choice at both: a return to
  // the level it was expected at before is no drift (drift_detector.h).
  state.drift->Rearm(expected, active.prediction().peak_bytes());
  std::string also;
  for (double level : state.drift->known_levels_s()) {
    absl::StrAppend(&also, also.empty() ? "" : ", ",
                    absl::StrFormat("%.4f", level));
  }
  return absl::StrFormat(
      ", expected from now on at the %.4f s/iter it measured (drift is "
      "watched against that%s)",
      expected,
      also.empty() ? ""
                   : absl::StrCat("; a window back at ", also,
                                  " s/iter, where it was expected before, "
                                  "fires none"));
}

void PlanningManager::OnWorldChanged(const std::string& job_id) {
  absl::StatusOr<v1::Job> job = jobs_->Get(job_id);
  if (!job.ok() || IsTerminal(job->state())) return;
  std::vector<StoredSchedule> kept;
  std::set<std::string> stale;
  {
    absl::MutexLock lock(&mu_);
    auto it = state_.find(job_id);
    if (it != state_.end()) {
      kept = std::move(it->second.schedules);
      stale = std::move(it->second.stale_graphs);
      if (!it->second.profiles.graph_hash().empty()) {
        stale.insert(it->second.profiles.graph_hash());
      }
      state_.erase(it);
    }
  }
  if (kept.empty()) {
    absl::StatusOr<std::vector<StoredSchedule>> stored =
        store_->LoadSchedules(job_id);
    if (stored.ok()) kept = *std::move(stored);
  }
  for (const StoredSchedule& s : kept) stale.insert(s.schedule.graph_hash());
  (void)store_->DeleteGraph(job_id);
  absl::MutexLock lock(&mu_);
  JobPlanning& state = State(job_id, *job);
  state.schedules = std::move(kept);
  state.stale_graphs = std::move(stale);
}

void PlanningManager::Forget(const std::string& job_id) {
  absl::MutexLock lock(&mu_);
  state_.erase(job_id);
}

absl::Status PlanningManager::Ended(const v1::Job& job) {
  Forget(job.id());
  return absl::FailedPreconditionError(
      absl::StrCat("job ", job.id(), " already ended ",
                   JobStateName(job.state()), "; its workers should exit"));
}

void PlanningManager::Drain() {
  absl::MutexLock lock(&mu_);
  while (!queue_.empty() || busy_) idle_.Wait(&mu_);
}

absl::StatusOr<std::vector<StoredSchedule>> PlanningManager::SchedulesOf(
    const std::string& job_id) const {
  {
    absl::MutexLock lock(&mu_);
    auto it = state_.find(job_id);
    if (it != state_.end() && !it->second.schedules.empty()) {
      return it->second.schedules;
    }
  }
  // A finished job's, or before Recover.
  return store_->LoadSchedules(job_id);
}

absl::StatusOr<v1::ScheduleUpdate> PlanningManager::LatestUpdate(
    const std::string& job_id) const {
  ASSIGN_OR_RETURN(StoredSchedule newest, GetSchedule(job_id, 0));
  v1::ScheduleUpdate update;
  update.set_effective_step(newest.effective_step);
  int64_t incumbent = -1;
  int pairs = 0;
  {
    absl::MutexLock lock(&mu_);
    auto it = state_.find(job_id);
    if (it != state_.end() && it->second.comparison.has_value() &&
        it->second.comparison->candidate == newest.schedule.version()) {
      incumbent = it->second.comparison->incumbent;
      pairs = it->second.comparison->baseline_pairs;
    }
  }
  if (incumbent >= 0) {
    // The trial's incumbent, or the baseline (v0: the starting schedule).
    ASSIGN_OR_RETURN(StoredSchedule theirs,
                     GetScheduleVersion(job_id, incumbent));
    *update.mutable_incumbent() = std::move(theirs.schedule);
    update.set_block_steps(kComparisonBlockSteps);
    update.set_block_pairs(pairs);
  }
  *update.mutable_schedule() = std::move(newest.schedule);
  return update;
}

absl::StatusOr<StoredSchedule> PlanningManager::GetSchedule(
    const std::string& job_id, int64_t version) const {
  ASSIGN_OR_RETURN(std::vector<StoredSchedule> schedules, SchedulesOf(job_id));
  if (!schedules.empty()) {
    if (version == 0) {
      // The newest for the graph the job runs now: none of a graph it ran
      // before another world size, nor (once known) of another graph.
      std::set<std::string> stale;
      std::string now;
      {
        absl::MutexLock lock(&mu_);
        auto it = state_.find(job_id);
        if (it != state_.end()) {
          stale = it->second.stale_graphs;
          now = it->second.profiles.graph_hash();
        }
      }
      for (auto s = schedules.rbegin(); s != schedules.rend(); ++s) {
        const std::string& hash = s->schedule.graph_hash();
        if (stale.count(hash) == 0 && (now.empty() || hash == now)) return *s;
      }
      return absl::NotFoundError(
          absl::StrCat("job ", job_id,
                       " has no schedule for the world it "
                       "runs at now yet"));
    }
    for (const StoredSchedule& s : schedules) {
      if (s.schedule.version() == version) return s;
    }
  }
  return absl::NotFoundError(
      absl::StrCat("job ", job_id, " has no schedule",
                   version == 0 ? "" : absl::StrCat(" v", version),
                   " yet; schedules appear after the warm-up steps"));
}

absl::StatusOr<Graph> PlanningManager::JobGraph(
    const std::string& job_id) const {
  {
    absl::MutexLock lock(&mu_);
    auto it = state_.find(job_id);
    if (it != state_.end() && it->second.profiles.graph() != nullptr) {
      return *it->second.profiles.graph();
    }
  }
  absl::StatusOr<std::optional<v1::Graph>> stored = store_->LoadGraph(job_id);
  if (!stored.ok()) return stored.status();
  if (!stored->has_value()) {
    return absl::NotFoundError(
        absl::StrCat("job ", job_id,
                     " has no graph yet: rank 0 sends it once "
                     "it built the model"));
  }
  return FromProto(**stored);
}

absl::StatusOr<StoredSchedule> PlanningManager::GetScheduleVersion(
    const std::string& job_id, int64_t version) const {
  absl::StatusOr<v1::Job> job = jobs_->Get(job_id);
  if (!job.ok()) return job.status();
  if (version == 0) {
    absl::StatusOr<Graph> graph = JobGraph(job_id);
    if (absl::IsNotFound(graph.status())) {
      return absl::NotFoundError(absl::StrCat(
          "job ", job_id,
          " has no graph yet, so no baseline (v0): rank 0 sends it once it "
          "built the model"));
    }
    if (!graph.ok()) return graph.status();
    absl::StatusOr<Schedule> baseline =
        StartingSchedule(*graph, job->spec().parallel().zero_stage() == 1
                                     ? ShardingMode::kZero1
                                     : ShardingMode::kZero3);
    if (!baseline.ok()) return baseline.status();
    return StoredSchedule{ToProto(*baseline), 0};
  }
  ASSIGN_OR_RETURN(std::vector<StoredSchedule> schedules, SchedulesOf(job_id));
  std::vector<std::string> versions = {"v0 (the baseline)"};
  for (const StoredSchedule& s : schedules) {
    if (s.schedule.version() == version) return s;
    versions.push_back(absl::StrCat("v", s.schedule.version()));
  }
  return absl::NotFoundError(absl::StrCat("job ", job_id, " has no schedule v",
                                          version, "; it has ",
                                          absl::StrJoin(versions, ", ")));
}

}  // namespace tandem
