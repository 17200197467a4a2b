#include "coordinator/service/job_manager.h"

#include <algorithm>
#include <cmath>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/job/job_spec.h"
#include "common/json_string.h"
#include "common/status_macros.h"
#include "coordinator/planner/job_plan.h"

namespace tandem {
namespace {

double NowUnix() {
  return absl::ToDoubleSeconds(absl::Now() - absl::UnixEpoch());
}

// Sortable and unique enough for one coordinator: time then random bits.
std::string NewJobId(absl::string_view name) {
  static std::mt19937_64 rng{std::random_device{}()};
  const int64_t ms = absl::ToUnixMillis(absl::Now());
  return absl::StrFormat("%s-%x%04x", name, ms, rng() & 0xffff);
}

}  // namespace

std::string WaitingFor(const v1::Job& job,
                       const std::map<int32_t, std::string>& connected) {
  const int32_t world = job.spec().parallel().world_size();
  std::vector<std::string> here;
  std::vector<std::string> missing;
  for (int32_t r = 0; r < world; ++r) {
    auto it = connected.find(r);
    if (it == connected.end()) {
      missing.push_back(absl::StrCat(r));
    } else {
      here.push_back(absl::StrCat("rank ", r, " on ", it->second));
    }
  }
  const size_t n = missing.size();
  const std::string registered =
      here.empty()
          ? absl::StrCat("no rank of ", world, " registered yet")
          : absl::StrCat(here.size(), " of ", world, " ranks registered (",
                         absl::StrJoin(here, ", "), ")");
  if (n == 0) return registered;
  return absl::StrCat(registered, "; missing ", n == 1 ? "rank " : "ranks ",
                      absl::StrJoin(missing, ", "), ": start ",
                      n == 1 ? "it" : "them", " with `tandem launch --nproc ",
                      n, " --job ", job.id(),
                      "` (deploy/slurm, deploy/k8s on a cluster)");
}

bool IsTerminal(v1::JobState state) {
  return state == v1::JOB_STATE_SUCCEEDED || state == v1::JOB_STATE_FAILED ||
         state == v1::JOB_STATE_CANCELLED;
}

absl::string_view JobStateName(v1::JobState state) {
  switch (state) {
    case v1::JOB_STATE_PENDING:
      return "PENDING";
    case v1::JOB_STATE_RUNNING:
      return "RUNNING";
    case v1::JOB_STATE_SUCCEEDED:
      return "SUCCEEDED";
    case v1::JOB_STATE_FAILED:
      return "FAILED";
    case v1::JOB_STATE_CANCELLED:
      return "CANCELLED";
    default:
      return "UNSPECIFIED";
  }
}

JobManager::JobManager(JobStore* store, Limits limits)
    : store_(store), limits_(std::move(limits)) {}

void JobManager::SetStateListener(StateListener listener) {
  absl::MutexLock lock(&mu_);
  listener_ = std::move(listener);
}

void JobManager::SetChangeListener(ChangeListener listener) {
  absl::MutexLock lock(&mu_);
  change_listener_ = std::move(listener);
}

void JobManager::ChangedLocked(Record& record) {
  ++record.generation;
  changed_.SignalAll();
  if (change_listener_) change_listener_();
}

absl::Status JobManager::Recover() {
  absl::StatusOr<std::vector<v1::Job>> jobs = store_->LoadJobs();
  if (!jobs.ok()) return jobs.status();
  absl::MutexLock lock(&mu_);
  for (v1::Job& job : *jobs) {
    absl::StatusOr<std::vector<v1::JobEvent>> events =
        store_->LoadEvents(job.id());
    if (!events.ok()) return events.status();
    Record record;
    record.job = std::move(job);
    record.events = *std::move(events);
    if (absl::Status s = TrimEvents(record); !s.ok()) return s;
    const std::string id = record.job.id();
    Record& kept = jobs_[id] = std::move(record);
    if (IsTerminal(kept.job.state())) EndedLocked(kept);
  }
  return absl::OkStatus();
}

void JobManager::EndedLocked(const Record& record) {
  ended_.emplace(
      record.events.empty() ? NowUnix() : record.events.back().time_unix_s(),
      record.job.id());
  const size_t keep = static_cast<size_t>(std::max(1, limits_.max_ended_jobs));
  while (ended_.size() > keep) {
    const std::string id = ended_.begin()->second;
    ended_.erase(ended_.begin());
    jobs_.erase(id);
    // A failure leaves rows behind, not a wrong answer: the job is gone
    // from memory, and the next restart's recovery deletes it again.
    (void)store_->DeleteJob(id);
  }
}

JobManager::Record* JobManager::Find(absl::string_view job_id) {
  auto it = jobs_.find(job_id);
  return it == jobs_.end() ? nullptr : &it->second;
}

const JobManager::Record* JobManager::Find(absl::string_view job_id) const {
  auto it = jobs_.find(job_id);
  return it == jobs_.end() ? nullptr : &it->second;
}

std::string NoSuchJob(absl::string_view job_id) {
  return absl::StrCat(
      "no job '", job_id.substr(0, 128),
      "' on this coordinator; `tandem list` shows the jobs it knows");
}

absl::Status JobManager::NotFound(absl::string_view job_id) const {
  return absl::NotFoundError(NoSuchJob(job_id));
}

absl::Status JobManager::TrimEvents(Record& record) {
  const size_t keep =
      static_cast<size_t>(std::max(1, limits_.max_events_per_job));
  if (record.events.size() <= keep) return absl::OkStatus();
  const size_t drop = record.events.size() - keep;
  const int64_t first_kept = record.events[drop].seq();
  record.events.erase(record.events.begin(), record.events.begin() + drop);
  return store_->DeleteEventsBefore(record.job.id(), first_kept);
}

absl::Status JobManager::AppendLocked(Record& record, absl::string_view kind,
                                      absl::string_view message) {
  v1::JobEvent event;
  event.set_seq(record.events.empty() ? 1 : record.events.back().seq() + 1);
  event.set_time_unix_s(NowUnix());
  event.set_kind(std::string(kind));
  event.set_message(std::string(message));
  if (absl::Status s = store_->AppendEvent(record.job.id(), event); !s.ok()) {
    return s;
  }
  if (absl::Status s = store_->PutJob(record.job); !s.ok()) return s;
  record.last_persist_unix_s = event.time_unix_s();
  record.events.push_back(std::move(event));
  // Dropping old events from the store may fail without harm: a restart
  // trims again.
  TrimEvents(record).IgnoreError();
  ChangedLocked(record);
  return absl::OkStatus();
}

absl::StatusOr<v1::Job> JobManager::Submit(v1::JobSpec spec,
                                           std::string owner) {
  ApplyJobSpecDefaults(spec);
  // Paths first: validation opens the files a spec names (an archive's
  // manifest, a tensors file's header), and must never open one outside
  // the roots, relative or through "..".
  if (absl::Status s = CheckJobPathRoots(spec, limits_.roots); !s.ok()) {
    return s;
  }
  // The pipeline it names is checked against the planner's pass registry.
  if (absl::Status s = ValidateJobSpec(spec, CheckOptimizeSpec); !s.ok()) {
    return s;
  }
  // A budget no schedule fits is refused now, not at its first step.
  if (absl::Status s = CheckBudgetFits(spec); !s.ok()) return s;
  absl::ReleasableMutexLock lock(&mu_);
  int active = 0;
  int owned = 0;
  for (const auto& [id, r] : jobs_) {
    if (IsTerminal(r.job.state())) continue;
    ++active;
    if (r.job.owner() == owner) ++owned;
  }
  if (active >= limits_.max_active_jobs) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "this coordinator already holds ", active,
        " jobs that have not ended, its limit (--max-active-jobs ",
        limits_.max_active_jobs,
        "): wait for some to end or cancel those you no longer need"));
  }
  if (owned >= limits_.max_active_jobs_per_user) {
    return absl::ResourceExhaustedError(absl::StrCat(
        owner.empty() ? std::string("you") : absl::StrCat("user '", owner, "'"),
        " already ", owner.empty() ? "have " : "has ", owned,
        " jobs that have not ended, the limit per user "
        "(--max-active-jobs-per-user ",
        limits_.max_active_jobs_per_user,
        "): wait for some to end or cancel those you no longer need"));
  }
  Record record;
  record.job.set_id(NewJobId(spec.name()));
  record.job.set_state(v1::JOB_STATE_PENDING);
  record.job.set_submitted_unix_s(NowUnix());
  record.job.set_owner(std::move(owner));
  const JobModelDescription model = DescribeJobModel(spec);
  record.job.set_model_text(model.text);
  record.job.set_throughput_unit(model.unit);
  record.job.set_items_per_step(model.items_per_step);
  *record.job.mutable_spec() = std::move(spec);
  record.job.set_waiting(WaitingFor(record.job, {}));
  record.job.set_waiting_since_unix_s(record.job.submitted_unix_s());
  const std::string id = record.job.id();
  if (absl::Status s = AppendLocked(
          record, "state",
          absl::StrCat("PENDING: submitted, waiting for ",
                       record.job.spec().parallel().world_size(), " workers"));
      !s.ok()) {
    return s;
  }
  v1::Job out = record.job;
  jobs_[id] = std::move(record);
  if (StateListener listener = listener_; listener) {
    lock.Release();
    listener(id, v1::JOB_STATE_PENDING);
  }
  return out;
}

absl::StatusOr<v1::Job> JobManager::Get(absl::string_view job_id) const {
  absl::MutexLock lock(&mu_);
  const Record* r = Find(job_id);
  if (r == nullptr) return NotFound(job_id);
  return r->job;
}

std::vector<v1::Job> JobManager::List(
    const std::vector<v1::JobState>& states, int limit,
    const std::optional<std::string>& owner) const {
  limit = limit <= 0 ? 1000 : std::min(limit, 1000);
  absl::MutexLock lock(&mu_);
  // Only the `limit` newest are copied: a user with many ended jobs asking
  // for the newest few pays for those few (bench/README.md, "hostile": List
  // read every cancelled probe job and its p99 grew with them).
  std::vector<const v1::Job*> matched;
  for (const auto& [id, r] : jobs_) {
    if (!states.empty() && std::find(states.begin(), states.end(),
                                     r.job.state()) == states.end()) {
      continue;
    }
    if (owner.has_value() && r.job.owner() != *owner) continue;
    matched.push_back(&r.job);
  }
  const size_t n = std::min(matched.size(), static_cast<size_t>(limit));
  // Newest first; equal submit times by id, so the order is the same on
  // every call.
  std::partial_sort(matched.begin(), matched.begin() + n, matched.end(),
                    [](const v1::Job* a, const v1::Job* b) {
                      if (a->submitted_unix_s() != b->submitted_unix_s()) {
                        return a->submitted_unix_s() > b->submitted_unix_s();
                      }
                      return a->id() < b->id();
                    });
  std::vector<v1::Job> out;
  out.reserve(n);
  for (size_t i = 0; i < n; ++i) out.push_back(*matched[i]);
  return out;
}

std::vector<v1::Job> JobManager::Unfinished() const {
  absl::MutexLock lock(&mu_);
  std::vector<v1::Job> out;
  for (const auto& [id, r] : jobs_) {
    if (!IsTerminal(r.job.state())) out.push_back(r.job);
  }
  return out;
}

absl::flat_hash_map<v1::JobState, int64_t> JobManager::CountByState() const {
  absl::MutexLock lock(&mu_);
  absl::flat_hash_map<v1::JobState, int64_t> out;
  for (const auto& [id, r] : jobs_) ++out[r.job.state()];
  return out;
}

absl::StatusOr<std::vector<v1::JobEvent>> JobManager::Events(
    absl::string_view job_id, int64_t after_seq) const {
  absl::MutexLock lock(&mu_);
  const Record* r = Find(job_id);
  if (r == nullptr) return NotFound(job_id);
  std::vector<v1::JobEvent> out;
  for (const v1::JobEvent& e : r->events) {
    if (e.seq() > after_seq) out.push_back(e);
  }
  return out;
}

absl::Status JobManager::Transition(absl::string_view job_id,
                                    v1::JobState state,
                                    absl::string_view message) {
  StateListener listener;
  {
    absl::MutexLock lock(&mu_);
    Record* r = Find(job_id);
    if (r == nullptr) return NotFound(job_id);
    if (IsTerminal(r->job.state())) {
      return absl::FailedPreconditionError(absl::StrCat(
          "job ", job_id, " already ended ", JobStateName(r->job.state()),
          (r->job.error().empty() ? "" : absl::StrCat(": ", r->job.error())),
          "; submit it again to rerun"));
    }
    if (r->job.state() == state) return absl::OkStatus();
    r->job.set_state(state);
    if (state != v1::JOB_STATE_PENDING) {
      r->job.clear_waiting();
      r->job.clear_waiting_since_unix_s();
    }
    if (state == v1::JOB_STATE_FAILED || state == v1::JOB_STATE_CANCELLED) {
      r->job.set_error(std::string(message));
    }
    if (absl::Status s = AppendLocked(
            *r, "state", absl::StrCat(JobStateName(state), ": ", message));
        !s.ok()) {
      return s;
    }
    if (IsTerminal(state)) EndedLocked(*r);
    listener = listener_;
  }
  if (listener) listener(std::string(job_id), state);
  return absl::OkStatus();
}

absl::StatusOr<int> JobManager::RestartOrFail(absl::string_view job_id,
                                              absl::string_view cause) {
  StateListener listener;
  v1::JobState state = v1::JOB_STATE_UNSPECIFIED;
  int restart = 0;
  {
    absl::MutexLock lock(&mu_);
    Record* r = Find(job_id);
    if (r == nullptr) return NotFound(job_id);
    if (r->job.state() != v1::JOB_STATE_RUNNING) return -1;
    const int max = r->job.spec().restart().max_restarts();
    if (r->job.restarts() < max) {
      restart = r->job.restarts() + 1;
      r->job.set_restarts(restart);
      r->job.set_state(v1::JOB_STATE_PENDING);
      r->job.set_waiting(WaitingFor(r->job, {}));
      r->job.set_waiting_since_unix_s(NowUnix());
      state = v1::JOB_STATE_PENDING;
      if (absl::Status s = AppendLocked(
              *r, "restart",
              absl::StrCat("restart ", restart, " of ", max, ": ", cause,
                           "; the other ranks are stopped, and the job "
                           "resumes from its newest complete checkpoint once "
                           "every rank has registered again"));
          !s.ok()) {
        return s;
      }
      if (absl::Status s = AppendLocked(
              *r, "state",
              absl::StrCat("PENDING: restart ", restart, ", waiting for ",
                           r->job.spec().parallel().world_size(), " workers"));
          !s.ok()) {
        return s;
      }
    } else {
      state = v1::JOB_STATE_FAILED;
      const std::string error =
          max == 0 ? std::string(cause)
                   : absl::StrCat(cause, " (no restarts left: ", max,
                                  " of restart.max_restarts used)");
      r->job.set_state(state);
      r->job.set_error(error);
      if (absl::Status s =
              AppendLocked(*r, "state", absl::StrCat("FAILED: ", error));
          !s.ok()) {
        return s;
      }
      EndedLocked(*r);
    }
    listener = listener_;
  }
  if (listener) listener(std::string(job_id), state);
  return restart;
}

absl::Status JobManager::ResumeSmaller(absl::string_view job_id, int32_t world,
                                       absl::string_view missing) {
  absl::MutexLock lock(&mu_);
  Record* r = Find(job_id);
  if (r == nullptr) return NotFound(job_id);
  v1::JobSpec& spec = *r->job.mutable_spec();
  const int32_t now = spec.parallel().world_size();
  const int32_t min_world =
      spec.restart().min_world() == 0 ? now : spec.restart().min_world();
  if (r->job.state() != v1::JOB_STATE_PENDING || r->job.restarts() == 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("job ", job_id,
                     " is not waiting for its ranks after a "
                     "restart; it cannot resume at a smaller world"));
  }
  if (world < min_world || world >= now) {
    return absl::FailedPreconditionError(
        absl::StrCat("job ", job_id, " may resume at ", min_world, "..",
                     now - 1, " ranks (restart.min_world), not ", world));
  }
  if (r->job.submitted_world_size() == 0) {
    r->job.set_submitted_world_size(now);
  }
  spec.mutable_parallel()->set_world_size(world);
  r->job.set_waiting(WaitingFor(r->job, {}));
  return AppendLocked(
      *r, "restart",
      absl::StrCat("restart ", r->job.restarts(), " resumes at world ", world,
                   " of ", r->job.submitted_world_size(), ": ", missing,
                   " did not register within restart.rejoin_timeout_s; the "
                   "newest checkpoint is resharded to ",
                   world, world == 1 ? " rank" : " ranks"));
}

int JobManager::FailOverdueStarts() {
  std::vector<std::pair<std::string, std::string>> overdue;
  {
    absl::MutexLock lock(&mu_);
    const double now = NowUnix();
    for (const auto& [id, r] : jobs_) {
      const v1::Job& job = r.job;
      if (job.state() != v1::JOB_STATE_PENDING ||
          job.waiting_since_unix_s() <= 0) {
        continue;
      }
      const double limit = job.spec().parallel().start_timeout_s() > 0
                               ? job.spec().parallel().start_timeout_s()
                               : kDefaultStartTimeoutS;
      const double waited = now - job.waiting_since_unix_s();
      if (waited < limit) continue;
      overdue.emplace_back(
          id, absl::StrFormat(
                  "its ranks did not all start within "
                  "parallel.start_timeout_s (%g s)%s: %s; submit it again "
                  "and start its workers, or raise parallel.start_timeout_s",
                  limit, job.restarts() > 0 ? " of its restart" : "",
                  job.waiting()));
    }
  }
  int failed = 0;
  for (const auto& [id, reason] : overdue) {
    failed += Transition(id, v1::JOB_STATE_FAILED, reason).ok();
  }
  return failed;
}

absl::Status JobManager::SetWaiting(absl::string_view job_id,
                                    absl::string_view waiting) {
  absl::MutexLock lock(&mu_);
  Record* r = Find(job_id);
  if (r == nullptr) return NotFound(job_id);
  if (r->job.state() != v1::JOB_STATE_PENDING || r->job.waiting() == waiting) {
    return absl::OkStatus();
  }
  r->job.set_waiting(std::string(waiting));
  return AppendLocked(*r, "worker", absl::StrCat("waiting: ", waiting));
}

absl::Status JobManager::RecordEvent(absl::string_view job_id,
                                     absl::string_view kind,
                                     absl::string_view message) {
  absl::MutexLock lock(&mu_);
  Record* r = Find(job_id);
  if (r == nullptr) return NotFound(job_id);
  return AppendLocked(*r, kind, message);
}

absl::StatusOr<bool> JobManager::RecordScheduleActive(
    absl::string_view job_id, int64_t version, absl::string_view message) {
  absl::MutexLock lock(&mu_);
  Record* r = Find(job_id);
  if (r == nullptr) return NotFound(job_id);
  const int64_t recorded = r->job.active_version();
  if (version <= recorded) return false;
  r->job.set_active_version(version);  // persisted with the event
  if (absl::Status s = AppendLocked(*r, "schedule", message); !s.ok()) {
    r->job.set_active_version(recorded);
    return s;
  }
  return true;
}

absl::Status JobManager::UpdateProgress(absl::string_view job_id,
                                        const v1::IterationProgress& progress) {
  const int64_t step = progress.step();
  const double loss = progress.loss();
  absl::MutexLock lock(&mu_);
  Record* r = Find(job_id);
  if (r == nullptr) return NotFound(job_id);
  if (step < r->job.step()) return absl::OkStatus();  // stale report
  // A repeat of the step (a restarted rank 0 reporting it again) counts once.
  const bool newly_skipped = progress.skipped() && step > r->job.step();
  r->job.set_loss_scale(progress.loss_scale());
  if (newly_skipped) {
    r->job.set_skipped_steps(r->job.skipped_steps() + 1);
    RETURN_IF_ERROR(AppendLocked(
        *r, "skipped",
        absl::StrFormat("step %d skipped: a gradient held an infinity or a "
                        "NaN at loss scale %g, so no param changed and the "
                        "scale backs off (train.loss_scale); %d skipped so far",
                        step, progress.loss_scale(), r->job.skipped_steps())));
  }
  // Training diverged: kept on record once, when the loss turns
  // non-finite (the step itself is in the history, its loss stored as such).
  const bool diverged = !std::isfinite(loss) && std::isfinite(r->job.loss());
  r->job.set_step(step);
  r->job.set_loss(loss);
  r->job.set_schedule_version(progress.schedule_version());
  if (diverged) {
    return AppendLocked(
        *r, "diverged",
        absl::StrCat("loss became ", NonFiniteName(loss), " at step ", step,
                     r->job.spec().train().on_nonfinite() == "continue"
                         ? " (train.on_nonfinite: continue: training on)"
                         : ""));
  }
  ChangedLocked(*r);
  const double now = NowUnix();
  if (now - r->last_persist_unix_s >= 1.0) {
    r->last_persist_unix_s = now;
    return store_->PutJob(r->job);
  }
  return absl::OkStatus();
}

absl::Status JobManager::UpdateOutcome(absl::string_view job_id,
                                       const Outcome& outcome) {
  absl::MutexLock lock(&mu_);
  Record* r = Find(job_id);
  if (r == nullptr) return NotFound(job_id);
  r->job.set_measured_speedup(outcome.speedup);
  r->job.set_speedup_low(outcome.speedup_low);
  r->job.set_speedup_high(outcome.speedup_high);
  r->job.set_speedup_steps(outcome.speedup_steps);
  r->job.set_speedup_text(outcome.speedup_text);
  r->job.set_predicted_iteration_s(outcome.predicted_s);
  r->job.set_measured_iteration_s(outcome.measured_s);
  return absl::OkStatus();
}

absl::StatusOr<JobManager::JobChanges> JobManager::WaitForEvents(
    absl::string_view job_id, int64_t after_seq, const v1::Job& known,
    std::chrono::milliseconds timeout) {
  absl::MutexLock lock(&mu_);
  const absl::Time deadline = absl::Now() + absl::FromChrono(timeout);
  for (;;) {
    Record* r = Find(job_id);
    if (r == nullptr) return NotFound(job_id);
    JobChanges out;
    for (const v1::JobEvent& e : r->events) {
      if (e.seq() > after_seq) out.events.push_back(e);
    }
    const bool timed_out = absl::Now() >= deadline;
    if (timed_out || !out.events.empty() || r->job.state() != known.state() ||
        r->job.step() != known.step()) {
      out.job = r->job;
      return out;
    }
    changed_.WaitWithDeadline(&mu_, deadline);
  }
}

absl::StatusOr<std::optional<JobManager::JobChanges>> JobManager::ChangesSince(
    absl::string_view job_id, int64_t after_seq, int64_t* generation) const {
  absl::MutexLock lock(&mu_);
  const Record* r = Find(job_id);
  if (r == nullptr) return NotFound(job_id);
  if (r->generation == *generation) return std::nullopt;
  *generation = r->generation;
  JobChanges out;
  out.job = r->job;
  // Events are in seq order: start past `after_seq`.
  auto first = std::upper_bound(
      r->events.begin(), r->events.end(), after_seq,
      [](int64_t seq, const v1::JobEvent& e) { return seq < e.seq(); });
  out.events.assign(first, r->events.end());
  return out;
}

}  // namespace tandem
