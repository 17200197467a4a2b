// Turns what workers measure into schedules: hands each rank's graph and
// profile windows to the job's ProfileAggregator, plans from the aggregates
// on its own thread (never on an RPC thread), persists every schedule version
// and hands it to a publisher, which the server wires to the workers. It also
// watches each iteration for drift (DriftDetector) and re-plans on drift,
// memory pressure or a Reoptimize call, recording the reason.
//
// When a plan is made:
//   - "initial": the first complete window after the job's warm-up steps;
//   - "drift" / "memory": the first complete window after the detector
//     fired (measured under the schedule that drifted);
//   - "reoptimize": right away, from the latest aggregated window;
//   - "rollback": no plan: the active schedule measured slower than the
//     best one measured on the job (ScheduleMeasurements, steps measured
//     one after the other), whose plan is published again to be checked:
//     it alternates with the active version in blocks like a trial, and
//     runs on ("kept") only if DecideInterleaved measures it faster;
//     otherwise the active version's plan is published again ("rollback")
//     and what was measured one after the other is forgotten (it was the
//     machine, not the plan). A rollback that ends a trial or a check runs
//     on without a check;
//   - "cached": no plan: an identical earlier job's newest schedule, as soon
//     as the graph and every rank's device are known (plan_cache.h); it
//     carries what that job measured it to buy over the baseline (the
//     job's speedup, with its interval), and is not checked again;
//   - "trial": no plan: the runner-up of the plan that made the active
//     version, when the cost model predicted it within
//     optimize.trial_margin of that plan (TrialCandidate), once the active
//     version has been measured for drift_window steps and is not behind.
//     The ranks alternate it with that version (the incumbent) in blocks of
//     kComparisonBlockSteps steps, and the comparison is decided from the
//     interleaved blocks (DecideInterleaved: a bootstrap interval of the
//     ratio of medians, optimize.min_gain): measured faster, the trial's
//     plan is published again to run on ("kept"); slower, equivalent or
//     inconclusive, the incumbent's is ("rollback") and the trial is never
//     published again. After an inconclusive trial the next one (a later
//     plan's runner-up) waits TrialBackoffSteps(drift_window, inconclusive
//     trials in a row) steps; a decided trial ends the backoff;
//   - "kept": no plan: the trial's plan (or a checked rollback's), which
//     the comparison found faster;
//   - "baseline-check": no plan: the settled plan again (measured, not
//     behind, its trial decided), alternated with the baseline (v0) for
//     optimize.baseline_pairs block pairs, after which it runs on: what it
//     bought is measured interleaved, with an interval (DescribeSpeedup);
//   - "memory-guard": the first complete window measured under the
//     least-memory schedule, which every rank switched to because a rank's
//     peak came near the budget (OnMemoryGuard); the plan keeps, beyond
//     MemoryHeadroom, what the job's peaks exceeded the tripped plan's
//     prediction by plus the spread of its step peaks (GuardHeadroom).
// Plans leave MemoryHeadroom of the budget free (PlanFromMeasurements). A
// failed plan is an event; the job keeps its current schedule, except when
// no schedule fits the budget by the measurements: the job fails naming the
// smallest budget that fits. A plan identical to one measured slower is not
// published, nor a drift plan identical to the active one (KeepActive).
//
// A job's state is dropped once the job has ended: as its late messages
// arrive, when it is planned, and when another job starts. Nothing has to
// call in when a job ends, so the threads that end jobs (the worker
// manager's heartbeat watcher) never reach into this manager.
#ifndef TANDEM_COORDINATOR_SERVICE_PLANNING_MANAGER_H_
#define TANDEM_COORDINATOR_SERVICE_PLANNING_MANAGER_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <iterator>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/ir/graph.h"
#include "common/ir/profile.h"
#include "coordinator/planner/job_plan.h"
#include "coordinator/planner/planner.h"
#include "coordinator/service/coordinator_metrics.h"
#include "coordinator/service/drift_detector.h"
#include "coordinator/service/job_manager.h"
#include "coordinator/service/plan_cache.h"
#include "coordinator/service/plan_decision.h"
#include "coordinator/service/profile_aggregator.h"
#include "coordinator/service/schedule_measurements.h"
#include "coordinator/service/work_scale.h"
#include "coordinator/service/worker_manager.h"
#include "coordinator/store/job_store.h"
#include "tandem/v1/worker_service.pb.h"

namespace tandem {

// The worker manager's first listener (coordinator_server.cc): what workers
// report that planning needs.
class PlanningManager final : public WorkerEventListener {
 public:
  // Pushes a new schedule to every rank of a job. Called on the planner
  // thread, never after Stop() has returned.
  using Publisher = std::function<void(const std::string& job_id,
                                       const v1::ScheduleUpdate& update)>;

  // Steps between the newest step any rank reported and the step a new
  // schedule takes effect: time for it to reach every rank.
  static constexpr int64_t kSwitchLeadSteps = 2;
  // Steps per block of a comparison (a trial against its incumbent): the
  // first step of each pays for the switch and is left out.
  static constexpr int64_t kComparisonBlockSteps = 4;

  // `jobs`, `store` and `metrics` (nullable) must outlive the manager.
  PlanningManager(JobManager* jobs, JobStore* store,
                  CoordinatorMetrics* metrics);
  // Stop().
  ~PlanningManager();
  PlanningManager(const PlanningManager&) = delete;
  PlanningManager& operator=(const PlanningManager&) = delete;

  // Set before the first report; the publisher must stay callable until
  // Stop() returns.
  void SetPublisher(Publisher publisher);
  // Per-job quotas (coordinator/README.md, "Limits"): bytes of profiles
  // held awaiting the other ranks (ProfileAggregator), and bytes of window
  // aggregates kept in the store (the oldest go past it). Set before the
  // first report.
  void SetProfileQuotas(int64_t max_held_bytes, int64_t max_stored_bytes);
  // The least time a comparison block's counted steps must take to be
  // judged as run on a busy host (CompareOptions::min_judged_s; default
  // kMinJudgedBlockSeconds). Tests with short synthetic steps lower it.
  void SetMinJudgedBlockSeconds(double seconds);
  // No new plans from now on: queued ones are dropped, a running one finishes
  // and is persisted, or is abandoned when Stop() came first, and it is not
  // published. Returns once the planner thread has exited, so nothing is
  // published after it returns. Idempotent; not from the publisher.
  void Stop();
  // Reloads graphs and schedules of unfinished jobs after a restart.
  absl::Status Recover();

  // Rank 0 reports the graph; every rank its hash. Errors: NotFound (unknown
  // job), InvalidArgument for a malformed graph (the message says what is
  // wrong), FailedPrecondition for a hash that differs from rank 0's (the job
  // is failed: its ranks run different models) or a job that ended.
  absl::Status OnGraph(const std::string& job_id, int32_t rank,
                       const v1::GraphReport& report) override;
  // Errors: NotFound (unknown job); InvalidArgument for a profile that is too
  // large, not for this job's graph, or has negative/NaN values;
  // FailedPrecondition for a job that ended, or when a rank sends more than
  // ProfileAggregator::kMaxEarlyProfilesPerRank before the graph (they are
  // held until it comes, then checked). Nothing is recorded on error.
  absl::Status OnProfile(const std::string& job_id, int32_t rank,
                         const v1::Profile& profile) override;
  void OnProgress(const std::string& job_id, int32_t rank,
                  const v1::IterationProgress& progress) override;
  // All ranks switched to `version`.
  void OnScheduleActive(const std::string& job_id, int64_t version) override;
  // The memory guard switched every rank to the least-memory schedule from
  // `step` (each rank reports it; the first report of a step counts): an
  // event, and a "memory-guard" re-plan from the next window measured under
  // it. `tripped_version` is the version the step that came near the budget
  // ran: 0 (the baseline, or a baseline check's v0 blocks) marks the
  // baseline unfit to measure a speedup against; a plan's version (its own,
  // a rerun's, a baseline check's plan blocks) forgets that plan's
  // measurements, so that it is never rolled back to. Without it (a worker
  // that does not say) the newest version is taken to have tripped, and a
  // baseline check, whose blocks are either, forgets nothing. Unknown or
  // ended jobs are ignored.
  // The job resumes at another world size (restart.min_world): what was
  // measured and planned for the old graph is dropped, the stored graph
  // too (rank 0 sends the new one); the schedules stay, for the record and
  // their version numbers, but no new session is handed one of them.
  void OnWorldChanged(const std::string& job_id) override;
  void OnMemoryGuard(const std::string& job_id, int32_t rank, int64_t step,
                     std::optional<int64_t> tripped_version,
                     const std::string& reason) override;
  // A rank registered: its device counts in the job's hardware model
  // (HardwareForJob). Unknown or ended jobs are ignored.
  void OnRankRegistered(const std::string& job_id, int32_t rank,
                        RankDevice device);
  void OnRankRegistered(const std::string& job_id, int32_t rank,
                        const std::string& hostname, const std::string& device,
                        int64_t device_memory_bytes) override {
    OnRankRegistered(job_id, rank,
                     RankDevice{hostname, device, device_memory_bytes});
  }
  // Plans now (reason "reoptimize" unless given); returns the version that
  // will be planned. FailedPrecondition when the job has no profile yet or
  // ended; Unavailable after Stop().
  absl::StatusOr<int64_t> RequestReplan(const std::string& job_id,
                                        const std::string& reason);

  // The newest schedule of a job as the update that published it, with
  // its incumbent while a comparison runs: what a worker that reconnects
  // behind it is sent. NotFound when none.
  absl::StatusOr<v1::ScheduleUpdate> LatestUpdate(
      const std::string& job_id) const;
  // The schedule `version` of a job (0: the newest). NotFound when none.
  absl::StatusOr<StoredSchedule> GetSchedule(const std::string& job_id,
                                             int64_t version) const;
  // Exactly version `version`: 0 is the baseline every rank started on
  // (StartingSchedule of the job's graph; NotFound before rank 0 sent the
  // graph). NotFound for another version the job does not have, naming the
  // versions it has.
  absl::StatusOr<StoredSchedule> GetScheduleVersion(const std::string& job_id,
                                                    int64_t version) const;
  // The graph rank 0 reported for the job (the one it runs now), from
  // memory while the job is planned, else from the store. NotFound before
  // rank 0 sent it.
  absl::StatusOr<Graph> JobGraph(const std::string& job_id) const;
  // Blocks until no plan is queued or running (tests).
  void Drain();

 private:
  // Every schedule version of a job, in order: the planner's copy while it
  // plans the job, else the store's.
  absl::StatusOr<std::vector<StoredSchedule>> SchedulesOf(
      const std::string& job_id) const;

  struct JobPlanning {
    JobPlanning(const v1::JobSpec& job_spec, int64_t max_held_profile_bytes);

    v1::JobSpec spec;
    // What each rank reported about its device, by rank.
    std::vector<RankDevice> devices;
    ProfileAggregator profiles;
    // The newest complete window's aggregate: what the next plan reads.
    std::optional<Profile> latest;
    // Graphs the job ran before it resumed at another world size: their
    // schedules are never handed to a new session.
    std::set<std::string> stale_graphs;
    std::vector<StoredSchedule> schedules;
    std::unique_ptr<DriftDetector> drift;
    // Step times per schedule version: the evidence for rollbacks.
    ScheduleMeasurements measured;
    // Versions found slower than the best measured one (each rolled back
    // once; a re-plan that would repeat one is not published), and the
    // version a queued rollback returns to.
    std::map<int64_t, v1::Schedule> rejected;
    int64_t rollback_to = -1;
    // A queued rollback checks first: it alternates with this version (the
    // active one, found behind in steps measured one after the other) and
    // runs on only if the interleaved blocks measure it faster (-1: none).
    int64_t rollback_check_of = -1;
    // Rollback versions and the version whose plan each runs again.
    std::map<int64_t, int64_t> rollbacks;
    // The runner-up to measure once version `trial_after` is judged.
    std::optional<PlanAlternative> trial;
    int64_t trial_after = -1;
    // Versions published to be compared before they run on (trials, and
    // rollback and drift checks: each marked so in its provenance), with
    // what each is and the version it alternates with; and those judged (a
    // verdict was reached).
    std::map<int64_t, ComparedVersion> compared;
    std::set<int64_t> judged;
    bool IsCompared(int64_t version, ComparisonKind kind) const {
      auto it = compared.find(version);
      return it != compared.end() && it->second.kind == kind;
    }
    // Trials in a row that ended inconclusive, and the step before which
    // the next trial does not start (TrialBackoffSteps of drift_window from
    // the last inconclusive verdict; -1: no wait). A decided trial resets
    // both: the comparisons are telling plans apart again.
    int inconclusive_trials = 0;
    int64_t trial_not_before = -1;
    // The queued rollback ends an inconclusive trial: its provenance says
    // so (kInconclusivePass), so that a restarted coordinator keeps the
    // backoff.
    bool rollback_inconclusive = false;
    // A drift seen during the comparison running (WatchComparisonLocked):
    // the watched plan's expected level before it (0: none). When the
    // comparison ends, the plan that runs on is expected at that level
    // (rearm_level_s: for the version published next, DriftExpectation),
    // so the detector fires again only if the change lasts.
    double drift_seen_level_s = 0;
    double rearm_level_s = 0;
    // The comparison running: a trial version alternating with the version
    // it is tried against, or a baseline check alternating with v0, and the
    // blocks of steps each ran, in order.
    struct Comparison {
      int64_t candidate = 0;
      int64_t incumbent = 0;
      // A baseline check of this many block pairs (a measurement, not a
      // decision); 0: a trial.
      int baseline_pairs = 0;
      // A baseline check that measures on for an earlier one whose interval
      // was too wide: that check's version (-1: none) and the pairs it
      // measured. Its blocks lead `blocks`, under this check's version; the
      // check is complete at baseline_pairs + carried_pairs.
      int64_t continues = -1;
      int carried_pairs = 0;
      std::vector<StepBlock> blocks;
      int64_t last_step = -1;
      // The step Add took last closed a block: it was a block's last
      // (kComparisonBlockSteps), or it opened a new block (the one before
      // is over, full or cut short). A verdict is reached only then, so the
      // interval is recomputed only then (a bootstrap of 2000 resamples,
      // under the manager's lock), not on every step.
      bool closed_block = false;
      // Adds a step to the block it ran in (a new block when the version
      // changed or a step is missing), from the candidate's first step on;
      // false, adding nothing, for a step of another version.
      bool Add(int64_t version, int64_t step, double seconds,
               double cpu_wait_share = -1) {
        closed_block = false;
        if (version != candidate && version != incumbent) return false;
        // The incumbent's steps before the switch: no block of the
        // comparison yet (the candidate runs first; blocks carried from the
        // check this one continues are not this comparison's steps).
        if (last_step < 0 && version != candidate) return true;
        if (blocks.empty() || blocks.back().version != version ||
            step != last_step + 1) {
          closed_block = !blocks.empty();
          blocks.push_back({version, {}});
        }
        blocks.back().step_s.push_back(seconds);
        blocks.back().cpu_wait_share.push_back(cpu_wait_share);
        closed_block =
            closed_block || blocks.back().step_s.size() ==
                                static_cast<size_t>(kComparisonBlockSteps);
        last_step = step;
        return true;
      }
      // Counts the blocks of `from`, an ended baseline check, as this
      // check's, which continues it (the same plan against the same
      // baseline): they lead `blocks`, under this version. Their last
      // block, the first step `from` ran on by itself, is too short to
      // count (InterleavedRatio). `pairs`: the pairs they hold.
      void Continue(int64_t from, std::vector<StepBlock> carried, int pairs) {
        for (StepBlock& b : carried) {
          if (b.version == from) b.version = candidate;
        }
        blocks.insert(blocks.begin(), std::make_move_iterator(carried.begin()),
                      std::make_move_iterator(carried.end()));
        continues = from;
        carried_pairs = pairs;
      }
    };
    std::optional<Comparison> comparison;
    // A baseline check ended with an interval too wide for a figure and the
    // job has the steps to measure on (MeasureBaselineLocked): the next
    // baseline check alternates for `more_pairs` more, pooled with the
    // ended check's blocks (`of`'s version, `pairs` pairs).
    struct BaselineContinuation {
      int64_t of = -1;
      int pairs = 0;
      int more_pairs = 0;
      std::vector<StepBlock> blocks;
      // Of `pairs`, those left out because the host was busy (what the
      // check measures on for, when its interval was not too wide).
      int busy_pairs = 0;
    };
    std::optional<BaselineContinuation> baseline_continuation;
    // The speedup over the baseline measured by the newest baseline check,
    // and the version it measured (-1: none yet).
    int64_t speedup_version = -1;
    Speedup speedup;
    // The memory guard tripped under the baseline (before the first plan, or
    // during a baseline check): it does not fit the budget, and no check
    // runs it again.
    bool baseline_unfit = false;
    // A queued "cached" plan: the earlier job it comes from and its schedule,
    // and what that job measured the plan to buy over the baseline (when
    // it measured it: carried as this job's figure, with no check of its
    // own, until a later version of this job needs one).
    std::string cached_from;
    std::optional<v1::Schedule> cached;
    std::optional<Speedup> cached_speedup;
    // The cache was looked up (once the graph and every device are known).
    bool cache_checked = false;
    // A step while its ranks report: the slowest iteration_s, the largest
    // peak, the ranks reported, the largest work and the largest
    // cpu_wait_share (-1: no rank measured it).
    struct StepSoFar {
      double slowest = 0;
      int64_t peak = 0;
      int ranks = 0;
      int64_t work = 0;
      double cpu_wait_share = -1;
    };
    std::map<int64_t, StepSoFar> steps;
    // Each version's quiet level of cpu_wait_share, from its steps: what
    // tells the comparisons' blocks measured on a busy host
    // (HostContention; coordinator/README.md, "A busy host").
    HostContention contention;
    // Step times scaled to one work (variable-length batches): what the
    // drift detector, the rollback evidence and the outcome compare.
    WorkScale work;
    int64_t max_step = 0;
    // Smallest and largest step peak (each the largest over the ranks) per
    // schedule version.
    std::map<int64_t, std::pair<int64_t, int64_t>> peak_by_version;
    // The memory guard: the step the ranks switched to the least-memory
    // schedule (-1: never), whether they still run it, and the headroom the
    // next plans keep beyond MemoryHeadroom.
    int64_t guard_step = -1;
    bool guard_active = false;
    // The newest version published when the guard tripped: only a newer one
    // replaces the fallback. The ranks report a version active once all of
    // them run it, which can come after they left it for the fallback.
    int64_t guard_over_version = 0;
    int64_t extra_headroom = 0;
    std::optional<PlanReason> pending_reason;
    bool queued = false;
  };

  // A step of the comparison's candidate or incumbent (`version`): added to
  // its blocks; once DecideInterleaved decides, the winner's plan is queued
  // ("kept" or "rollback") and the comparison ends. Returns whether the step
  // belonged to the comparison (nothing else judges it). `cpu_wait_share`:
  // the step's (-1: not measured). Requires mu_.
  bool CompareLocked(const std::string& job_id, JobPlanning& state,
                     int64_t version, int64_t step, double seconds,
                     double cpu_wait_share) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A baseline check's step (CompareLocked): once its block pairs are in
  // and the plan runs on by itself, what it bought becomes the job's
  // speedup (an event, the job's outcome, the gauge). Requires mu_.
  void MeasureBaselineLocked(const std::string& job_id, JobPlanning& state,
                             int64_t version, int64_t step)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A comparison's step (CompareLocked took it; the comparison goes on): the
  // drift detector watches the plan the job runs on when the comparison
  // ends undecided, the incumbent (a baseline check's plan), against what it
  // measured, from its steps alone: the other plan's vary by its blocks,
  // which is the comparison's to judge. So a change shows within
  // drift_window steps of the watched plan (about twice as many steps of
  // the job). A drift check (the answer to a drift) is not watched. A drift
  // is an event but ends nothing: interleaved, the blocks see the change
  // alike on both plans, and a change that passes (a flapping link) would
  // otherwise cut every comparison short. When the comparison ends, the
  // plan that runs on is expected at the watched plan's level before the
  // change (drift_seen_level_s), so the detector fires again, and the job
  // re-plans, only if the change lasts. Requires mu_.
  void WatchComparisonLocked(const std::string& job_id, JobPlanning& state,
                             int64_t version, int64_t step, double seconds,
                             int64_t peak_bytes)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The options a trial or a check is decided with (its min_gain, and
  // promising_max_pairs within half the steps the job had left). Requires
  // mu_.
  CompareOptions CompareOptionsLocked(const JobPlanning& state) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The options that judge a busy host's blocks (each version's quiet
  // level, the least judged time), for a comparison or a check's figure.
  // Requires mu_.
  CompareOptions BusyOptionsLocked(const JobPlanning& state) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Ends the comparison with `decision` (done, with an interval): the
  // verdict event, and the winner's plan queued ("kept" or "rollback").
  // Requires mu_.
  void ApplyVerdictLocked(const std::string& job_id, JobPlanning& state,
                          int64_t step, const ComparisonDecision& decision,
                          const CompareOptions& options)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // What the drift detector expects while `schedule` is the active version
  // (seconds at the reference work, and peak): ExpectedAtReference, except
  // for a trial or a rollback check still alternating, whose detector
  // watches the incumbent (WatchComparisonLocked): that version's measured
  // median, else its own expectation. Requires mu_.
  // The third is the plan the detector watches (PlanOrigin), whose known
  // levels hold again (drift_detector.h, Rearm).
  static std::tuple<double, int64_t, int64_t> DriftExpectation(
      const JobPlanning& state, const v1::Schedule& schedule);
  // The version that first ran `version`'s plan: rollbacks, checks and
  // continuations that rerun a plan are followed back to it. Requires mu_.
  static int64_t PlanOrigin(const JobPlanning& state, int64_t version);
  // What the drift detector expects of `schedule`, at the reference work:
  // its prediction, except for a rollback, which is expected at what the
  // plan it runs again measured (else at what it measured itself): its
  // prediction stays the plan's own, so that its error is honest, but the
  // evidence decided it. Requires mu_.
  static double ExpectedAtReference(const JobPlanning& state,
                                    const v1::Schedule& schedule);
  // After a restart: the rollbacks, trials and rejected versions (from the
  // stored schedules' provenance) and each version's measured steps (from the
  // stored step history), so that a job is still never left on, or handed
  // again, a plan measured slower than another. Requires mu_.
  void RecoverEvidenceLocked(JobPlanning& state,
                             const std::vector<StoredStep>& steps)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The job's state, created on first use (when ended jobs are dropped).
  // Requires mu_.
  JobPlanning& State(const std::string& job_id, const v1::Job& job)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Drops the state of every job that has ended. Requires mu_.
  void ForgetEndedLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A window completed: keeps its aggregate and queues the plan it calls
  // for. Requires mu_.
  void OnWindowLocked(const std::string& job_id, JobPlanning& state,
                      Profile aggregate) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Looks the job up in the plan cache (plan_cache.h) once its graph and
  // every rank's device are known, and queues the cached plan when there is
  // one.
  void MaybeStartCached(const v1::Job& job);
  // Tells the job what the active schedule bought, once `version` (the one
  // a step just ran under) is the active one and measured. Requires mu_.
  void ReportOutcomeLocked(const std::string& job_id, const JobPlanning& state,
                           int64_t version) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Queues a plan for the job. Requires mu_.
  void QueueLocked(const std::string& job_id, JobPlanning& state,
                   PlanReason reason) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A drift re-plan that publishes nothing (it failed, gave a plan measured
  // slower before, or gave the active plan again) leaves the active
  // schedule running: from now on the detector expects it at what it
  // measured (the window that drifted, else its median, else `window`, the
  // profile window planned from, when the active version ran it), so the
  // same deviation does not fire again and a later change still does.
  // Returns the clause for the event ("" for other reasons, or under the
  // memory guard).
  std::string KeepActive(const std::string& job_id, PlanReason reason,
                         const Profile& window);
  void PlannerLoop() ABSL_LOCKS_EXCLUDED(mu_);
  void PlanOne(const std::string& job_id, PlanReason reason);
  void Fail(const std::string& job_id, const std::string& message);
  // Drops the job's state.
  void Forget(const std::string& job_id);
  // Drops the state of `job`, which ended, and says so (FailedPrecondition).
  absl::Status Ended(const v1::Job& job);

  JobManager* jobs_;
  JobStore* store_;
  CoordinatorMetrics* metrics_;
  Publisher publisher_;

  int64_t max_held_profile_bytes_ = ProfileAggregator::kDefaultMaxHeldBytes;
  int64_t max_stored_profile_bytes_ = JobStore::kDefaultMaxStoredProfileBytes;
  double min_judged_block_s_ = kMinJudgedBlockSeconds;
  mutable absl::Mutex mu_;
  absl::CondVar work_;
  absl::CondVar idle_;
  std::map<std::string, JobPlanning> state_ ABSL_GUARDED_BY(mu_);
  // job, reason
  std::deque<std::pair<std::string, PlanReason>> queue_ ABSL_GUARDED_BY(mu_);
  bool busy_ ABSL_GUARDED_BY(mu_) = false;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::once_flag joined_;
  // "planner": runs the pass pipelines so RPC threads never wait on them;
  // from the constructor until Stop().
  std::thread planner_;
};

}  // namespace tandem

#endif  // TANDEM_COORDINATOR_SERVICE_PLANNING_MANAGER_H_
