// Jobs and their lifecycle: PENDING -> RUNNING -> SUCCEEDED | FAILED |
// CANCELLED. Every change is an event, persisted before the call returns, and
// watchers are woken. No gRPC in here: protos in, status out.
//
//   Submit ──> PENDING ──(all ranks registered)──> RUNNING ──> SUCCEEDED
//                 │                                   │ ├────> FAILED
//                 └──────────(Cancel)─────────────────┴─┴────> CANCELLED
//
// Terminal states are final: a transition out of one fails with
// FailedPrecondition.
#ifndef TANDEM_COORDINATOR_SERVICE_JOB_MANAGER_H_
#define TANDEM_COORDINATOR_SERVICE_JOB_MANAGER_H_

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "common/job/job_spec.h"
#include "coordinator/store/job_store.h"
#include "tandem/v1/job.pb.h"
#include "tandem/v1/worker_service.pb.h"

namespace tandem {

bool IsTerminal(v1::JobState state);
// "PENDING", "RUNNING", ...
absl::string_view JobStateName(v1::JobState state);

// The answer for a job id this coordinator does not know, and the same
// for one the caller may not see (so that a stranger cannot tell them
// apart): "no job 'ID' on this coordinator; `tandem list` shows the jobs it
// knows".
std::string NoSuchJob(absl::string_view job_id);

// What a PENDING job waits for, in words: which ranks are registered and
// connected (`connected`: rank -> host), which are missing, and the command
// that starts the missing ones ("1 of 2 ranks registered (rank 0 on host-a);
// missing rank 1: start it with `tandem launch --nproc 1 --job JOB` on its
// host").
std::string WaitingFor(const v1::Job& job,
                       const std::map<int32_t, std::string>& connected);

class JobManager {
 public:
  // Called (outside the manager's lock) after every state change, and
  // with PENDING after a submit.
  using StateListener =
      std::function<void(const std::string& job_id, v1::JobState state)>;

  // What one coordinator holds (coordinator/README.md, "Limits"); each
  // refusal names the figure and the flag.
  struct Limits {
    // Jobs not yet ended (PENDING or RUNNING), over all users and per user
    // (the authenticated owner; everyone is one user without tokens).
    // Past either, Submit gets ResourceExhausted.
    int max_active_jobs = 10000;
    int max_active_jobs_per_user = 1000;
    // Events kept per job, in memory and in the store: past it the oldest
    // are dropped (the newest `max_events_per_job` stay, with their seqs).
    int max_events_per_job = 10000;
    // Ended jobs kept, in memory and in the store: past it the one that
    // ended longest ago is deleted with everything stored for it (at least
    // 1: a job that just ended always stays).
    int max_ended_jobs = 100000;
    // Where jobs may read and write (common/job/job_spec.h).
    JobPathRoots roots;
  };

  // `store` must outlive the manager.
  explicit JobManager(JobStore* store, Limits limits);
  explicit JobManager(JobStore* store) : JobManager(store, Limits()) {}
  JobManager(const JobManager&) = delete;
  JobManager& operator=(const JobManager&) = delete;

  // Loads every job and its events from the store (after a restart).
  absl::Status Recover();
  void SetStateListener(StateListener listener);
  // Called whenever a job gets an event or a new step, under the manager's
  // lock: it may only take note (WatchHub wakes its thread), never call
  // back into the manager.
  using ChangeListener = std::function<void()>;
  void SetChangeListener(ChangeListener listener);

  // Applies defaults, validates (InvalidArgument with field-level messages),
  // assigns an id and stores the job as PENDING, owned by `owner` (the
  // authenticated user; empty when the coordinator does not authenticate).
  absl::StatusOr<v1::Job> Submit(v1::JobSpec spec, std::string owner = "");
  // NotFound names the id and suggests `tandem list`.
  absl::StatusOr<v1::Job> Get(absl::string_view job_id) const;
  // Newest first; `limit` is capped at 1000. With `owner`, only that
  // user's jobs.
  std::vector<v1::Job> List(const std::vector<v1::JobState>& states, int limit,
                            const std::optional<std::string>& owner = {}) const;
  // Every job not ended yet (PENDING or RUNNING), however many: what the
  // other managers recover after a restart.
  std::vector<v1::Job> Unfinished() const;
  // How many jobs are in each state (the jobs gauge).
  absl::flat_hash_map<v1::JobState, int64_t> CountByState() const;
  absl::StatusOr<std::vector<v1::JobEvent>> Events(absl::string_view job_id,
                                                   int64_t after_seq) const;

  // Moves the job to `state`, recording `message` as a "state" event; `error`
  // is kept on the job for FAILED and CANCELLED. NotFound, or
  // FailedPrecondition for a job already ended.
  absl::Status Transition(absl::string_view job_id, v1::JobState state,
                          absl::string_view message);
  // A rank of a RUNNING job is lost (`cause`): when its
  // restart.max_restarts allows another, counts it, records a "restart"
  // event and moves the job back to PENDING (waiting for every rank to
  // register again) and returns the restart's number (1, 2, ...);
  // otherwise fails the job with the cause and returns 0. Nothing for a job
  // not RUNNING (another rank's loss already handled): returns -1.
  // A restart that waited restart.rejoin_timeout_s for every rank resumes
  // at `world` ranks, those registered (restart.min_world <= world < the
  // job's world): the spec's parallel.world_size becomes `world` (the job's
  // submitted_world_size keeps what was submitted), with a "restart" event
  // naming `missing`. FailedPrecondition unless the job is PENDING after a
  // restart and `world` is within those bounds.
  absl::Status ResumeSmaller(absl::string_view job_id, int32_t world,
                             absl::string_view missing);
  absl::StatusOr<int> RestartOrFail(absl::string_view job_id,
                                    absl::string_view cause);
  // Fails every PENDING job that has waited for its ranks longer than its
  // parallel.start_timeout_s (0: kDefaultStartTimeoutS), saying what it
  // waited for and what to do. Returns how many.
  int FailOverdueStarts();
  static constexpr double kDefaultStartTimeoutS = 900;
  // A PENDING job's Job.waiting: what it waits for (WaitingFor), with a
  // "worker" event when it changed. Nothing for a job not PENDING.
  absl::Status SetWaiting(absl::string_view job_id, absl::string_view waiting);
  // Appends an event of `kind` (e.g. "schedule", "replan", "worker").
  absl::Status RecordEvent(absl::string_view job_id, absl::string_view kind,
                           absl::string_view message);
  // Records that every rank runs schedule `version` (Job.active_version,
  // and a "schedule" event with `message`); false when that version, or a
  // newer one, was recorded already.
  absl::StatusOr<bool> RecordScheduleActive(absl::string_view job_id,
                                            int64_t version,
                                            absl::string_view message);
  // Rank 0's progress. Not persisted on every call: the job row is written
  // at most once a second, and on every event. A step the loss scaler
  // skipped counts in skipped_steps and is a "skipped" event.
  absl::Status UpdateProgress(absl::string_view job_id,
                              const v1::IterationProgress& progress);

  // What the active schedule bought (v1::Job's measured_speedup and its
  // interval, steps and text, predicted_iteration_s, measured_iteration_s);
  // written with the next progress or event.
  struct Outcome {
    double speedup = 0;
    double speedup_low = 0;
    double speedup_high = 0;
    int32_t speedup_steps = 0;
    std::string speedup_text;
    double predicted_s = 0;
    double measured_s = 0;
  };
  absl::Status UpdateOutcome(absl::string_view job_id, const Outcome& outcome);

  // The job and its events after some seq, read under one lock: a job seen
  // terminal here comes with the event that ended it.
  struct JobChanges {
    v1::Job job;
    std::vector<v1::JobEvent> events;
  };
  // Blocks until the job has events after `after_seq`, its state or step
  // differs from `known`'s, or `timeout` passes; returns the job as it is
  // then and the new events.
  absl::StatusOr<JobChanges> WaitForEvents(absl::string_view job_id,
                                           int64_t after_seq,
                                           const v1::Job& known,
                                           std::chrono::milliseconds timeout);
  // Without waiting: nullopt when the job has not changed since
  // `*generation` (a count the manager keeps per job), else the job, its
  // events after `after_seq`, and `*generation` moved on. Start from 0.
  absl::StatusOr<std::optional<JobChanges>> ChangesSince(
      absl::string_view job_id, int64_t after_seq, int64_t* generation) const;

 private:
  struct Record {
    v1::Job job;
    std::vector<v1::JobEvent> events;
    double last_persist_unix_s = 0;
    // Bumped by every change a watcher sees (ChangedLocked).
    int64_t generation = 1;
  };
  Record* Find(absl::string_view job_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  const Record* Find(absl::string_view job_id) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status NotFound(absl::string_view job_id) const;
  // Retention (Limits::max_events_per_job): drops the oldest events past
  // it, from memory, then from the store (whose error it returns).
  absl::Status TrimEvents(Record& record) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Retention (Limits::max_ended_jobs): `record` just ended (or ended
  // before a restart); deletes the jobs that ended longest ago past the
  // limit, from memory and the store. Requires mu_.
  void EndedLocked(const Record& record) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Appends an event and persists it and the job row. Requires mu_.
  absl::Status AppendLocked(Record& record, absl::string_view kind,
                            absl::string_view message)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Wakes waiters and the change listener. Requires mu_.
  void ChangedLocked(Record& record) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  JobStore* store_;
  const Limits limits_;
  mutable absl::Mutex mu_;
  absl::CondVar changed_;
  std::map<std::string, Record, std::less<>> jobs_ ABSL_GUARDED_BY(mu_);
  // Ended jobs by the time of their last event, oldest first.
  std::set<std::pair<double, std::string>> ended_ ABSL_GUARDED_BY(mu_);
  StateListener listener_ ABSL_GUARDED_BY(mu_);
  ChangeListener change_listener_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tandem

#endif  // TANDEM_COORDINATOR_SERVICE_JOB_MANAGER_H_
