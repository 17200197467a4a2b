#include "coordinator/service/worker_manager.h"

#include <algorithm>
#include <cmath>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/job/job_spec.h"
#include "common/status_macros.h"

namespace tandem {
namespace {

using Clock = std::chrono::steady_clock;

std::string RankRef(int32_t rank, const std::string& hostname) {
  return hostname.empty() ? absl::StrCat("rank ", rank)
                          : absl::StrCat("rank ", rank, " (", hostname, ")");
}

}  // namespace

WorkerManager::WorkerManager(JobManager* jobs, JobStore* store, KvStore* kv,
                             CoordinatorMetrics* metrics,
                             TimelineStore* timelines, Options options)
    : jobs_(jobs),
      store_(store),
      kv_(kv),
      metrics_(metrics),
      timelines_(timelines),
      options_(options) {
  watcher_ = std::thread([this] { WatchLoop(); });
}

WorkerManager::~WorkerManager() { Stop(); }

void WorkerManager::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  stop_cv_.SignalAll();
  // Concurrent callers all return after the join.
  std::call_once(joined_, [this] { watcher_.join(); });
}

void WorkerEventFanOut::OnRankRegistered(const std::string& job_id,
                                         int32_t rank,
                                         const std::string& hostname,
                                         const std::string& device,
                                         int64_t device_memory_bytes) {
  for (WorkerEventListener* l : listeners_) {
    l->OnRankRegistered(job_id, rank, hostname, device, device_memory_bytes);
  }
}

absl::Status WorkerEventFanOut::OnGraph(const std::string& job_id, int32_t rank,
                                        const v1::GraphReport& report) {
  for (WorkerEventListener* l : listeners_) {
    RETURN_IF_ERROR(l->OnGraph(job_id, rank, report));
  }
  return absl::OkStatus();
}

absl::Status WorkerEventFanOut::OnProfile(const std::string& job_id,
                                          int32_t rank,
                                          const v1::Profile& profile) {
  for (WorkerEventListener* l : listeners_) {
    RETURN_IF_ERROR(l->OnProfile(job_id, rank, profile));
  }
  return absl::OkStatus();
}

void WorkerEventFanOut::OnProgress(const std::string& job_id, int32_t rank,
                                   const v1::IterationProgress& progress) {
  for (WorkerEventListener* l : listeners_) {
    l->OnProgress(job_id, rank, progress);
  }
}

void WorkerEventFanOut::OnScheduleActive(const std::string& job_id,
                                         int64_t version) {
  for (WorkerEventListener* l : listeners_)
    l->OnScheduleActive(job_id, version);
}

void WorkerEventFanOut::OnMemoryGuard(const std::string& job_id, int32_t rank,
                                      int64_t step,
                                      std::optional<int64_t> tripped_version,
                                      const std::string& reason) {
  for (WorkerEventListener* l : listeners_) {
    l->OnMemoryGuard(job_id, rank, step, tripped_version, reason);
  }
}

void WorkerEventFanOut::OnWorldChanged(const std::string& job_id) {
  for (WorkerEventListener* l : listeners_) l->OnWorldChanged(job_id);
}

void WorkerManager::AddListener(WorkerEventListener* listener) {
  absl::MutexLock lock(&mu_);
  if (listener != nullptr) listeners_.Add(listener);
}

void WorkerManager::SetListener(WorkerEventListener* listener) {
  absl::MutexLock lock(&mu_);
  listeners_.Clear();
  if (listener != nullptr) listeners_.Add(listener);
}

void WorkerManager::SetScheduleLookup(ScheduleLookup lookup) {
  absl::MutexLock lock(&mu_);
  schedule_lookup_ = std::move(lookup);
}

WorkerEventListener& WorkerManager::Listener() {
  absl::MutexLock lock(&mu_);
  return listeners_;
}

std::string WorkerManager::StorePrefix(const std::string& job_id, int restarts,
                                       int resumed_world) {
  if (restarts == 0) return absl::StrCat("jobs/", job_id, "/");
  if (resumed_world > 0) {
    return absl::StrCat("jobs/", job_id, "/r", restarts, "w", resumed_world,
                        "/");
  }
  return absl::StrCat("jobs/", job_id, "/r", restarts, "/");
}

std::string WorkerManager::StorePrefix(const v1::Job& job) {
  return StorePrefix(
      job.id(), job.restarts(),
      job.submitted_world_size() > 0 ? job.spec().parallel().world_size() : 0);
}

void WorkerManager::StartIfReady(const std::string& job_id) {
  absl::StatusOr<v1::Job> job = jobs_->Get(job_id);
  if (!job.ok() || job->state() != v1::JOB_STATE_PENDING) return;
  const int32_t world = job->spec().parallel().world_size();
  std::map<int32_t, std::string> connected;
  {
    absl::MutexLock lock(&mu_);
    JobWorkers& w = jobs_workers_[job_id];
    // Connected, not merely registered: a rank that died between its
    // registration and its session never counts.
    for (const auto& [rank, r] : w.ranks) {
      if (r.connected() && rank < world) connected[rank] = r.hostname;
    }
    if (static_cast<int32_t>(connected.size()) == world) {
      w.waiting_since.reset();
    }
  }
  if (static_cast<int32_t>(connected.size()) != world) {
    // Still waiting: the job says for which ranks, and how to start them.
    (void)jobs_->SetWaiting(job_id, WaitingFor(*job, connected));
    return;
  }
  if (!jobs_
           ->Transition(job_id, v1::JOB_STATE_RUNNING,
                        absl::StrCat("all ", world, " workers registered"))
           .ok()) {
    return;
  }
  // The ranks wait for this before their rendezvous. Set after the state:
  // a coordinator that dies in between sets it on recovery.
  (void)kv_->Set(StorePrefix(*job) + kStartKey, "1");
}

std::vector<std::shared_ptr<SessionSink>> WorkerManager::DropRanksLocked(
    const std::string& job_id, JobWorkers& w) {
  std::vector<std::shared_ptr<SessionSink>> sinks;
  for (auto& [_, r] : w.ranks) {
    if (r.sink) sinks.push_back(r.sink);
    if (r.connected()) sessions_.erase(r.session);
  }
  w.ranks.clear();
  w.peer_lost_reporter = -1;
  UpdateConnectedMetric(job_id, w);
  return sinks;
}

void WorkerManager::ResumeSmallerWorld(const std::string& job_id, int32_t world,
                                       const std::string& missing) {
  if (!jobs_->ResumeSmaller(job_id, world, missing).ok()) return;
  std::vector<std::shared_ptr<SessionSink>> sinks;
  {
    absl::MutexLock lock(&mu_);
    JobWorkers& w = jobs_workers_[job_id];
    sinks = DropRanksLocked(job_id, w);
    w.world = world;
    // A fresh wait, for the smaller world.
    w.waiting_since = Clock::now();
  }
  (void)store_->DeleteWorkers(job_id);
  kv_->DeletePrefix(StorePrefix(job_id));
  Listener().OnWorldChanged(job_id);
  v1::CoordinatorMessage stop;
  stop.mutable_command()->set_kind(v1::Command::KIND_RESTART);
  stop.mutable_command()->set_reason(absl::StrCat(
      "job ", job_id, " resumes at world ", world, " (restart.min_world): ",
      missing, " did not register in time; register again"));
  for (auto& sink : sinks) sink->Send(stop);
}

bool WorkerManager::LoseRank(const std::string& job_id, absl::string_view cause,
                             absl::string_view kind) {
  absl::StatusOr<v1::Job> before = jobs_->Get(job_id);
  absl::StatusOr<int> restart = jobs_->RestartOrFail(job_id, cause);
  if (!restart.ok() || *restart <= 0) return false;
  // Every rank stops and registers again: a relaunched process, or a spare.
  std::vector<std::shared_ptr<SessionSink>> sinks;
  {
    absl::MutexLock lock(&mu_);
    JobWorkers& w = jobs_workers_[job_id];
    sinks = DropRanksLocked(job_id, w);
    w.step_at_restart = before.ok() ? before->step() : 0;
    w.waiting_since = Clock::now();
  }
  (void)store_->DeleteWorkers(job_id);
  kv_->DeletePrefix(StorePrefix(job_id));
  if (metrics_ != nullptr) {
    metrics_->job_restarts->WithLabels({job_id, std::string(kind)}).Increment();
  }
  v1::CoordinatorMessage stop;
  stop.mutable_command()->set_kind(v1::Command::KIND_RESTART);
  stop.mutable_command()->set_reason(
      absl::StrCat("job ", job_id, " restarts (", *restart, "): ", cause));
  for (auto& sink : sinks) sink->Send(stop);
  return true;
}

WorkerManager::JobWorkers& WorkerManager::Workers(const v1::Job& job) {
  // The job's restarts series exists (at 0) from its first registration.
  if (metrics_ != nullptr && jobs_workers_.count(job.id()) == 0) {
    metrics_->worker_restarts->WithLabels({job.id()});
  }
  JobWorkers& w = jobs_workers_[job.id()];
  w.world = job.spec().parallel().world_size();
  w.total_steps = job.spec().train().steps();
  const v1::RestartSpec& restart = job.spec().restart();
  w.min_world = restart.min_world() == 0 ? w.world : restart.min_world();
  w.rejoin_timeout = std::chrono::milliseconds(static_cast<int64_t>(
      (restart.rejoin_timeout_s() > 0 ? restart.rejoin_timeout_s() : 60) *
      1000));
  return w;
}

absl::Status WorkerManager::Recover() {
  const auto now = Clock::now();
  for (const v1::Job& job : jobs_->Unfinished()) {
    absl::StatusOr<std::vector<StoredWorker>> workers =
        store_->LoadWorkers(job.id());
    if (!workers.ok()) return workers.status();
    absl::MutexLock lock(&mu_);
    JobWorkers& w = Workers(job);
    // The newest version recorded active: a push this coordinator's death
    // interrupted is recorded once every rank re-sends what it applied.
    w.announced_version = job.active_version();
    if (job.state() == v1::JOB_STATE_PENDING && job.restarts() > 0) {
      w.waiting_since = now;
    }
    if (job.state() == v1::JOB_STATE_RUNNING) {
      const std::string start = StorePrefix(job) + kStartKey;
      if (!kv_->Check({start})) (void)kv_->Set(start, "1");
    }
    for (const StoredWorker& sw : *workers) {
      Rank& r = w.ranks[sw.rank];
      r.incarnation = sw.incarnation;
      r.hostname = sw.hostname;
      r.device = sw.device;
      r.last_seen = now;
      r.step = job.step();
    }
  }
  return absl::OkStatus();
}

std::vector<v1::WorkerStatus> WorkerManager::DescribeLocked(
    const JobWorkers& w) const {
  std::vector<v1::WorkerStatus> out;
  for (const auto& [rank, r] : w.ranks) {
    v1::WorkerStatus& status = out.emplace_back();
    status.set_rank(rank);
    status.set_hostname(r.hostname);
    status.set_incarnation(r.incarnation);
    status.set_device(r.device);
    status.set_connected(r.connected());
    if (r.last_heard.time_since_epoch().count() != 0) {
      status.set_last_heartbeat_unix_s(
          std::chrono::duration<double>(r.last_heard.time_since_epoch())
              .count());
    }
    status.set_step(r.step);
  }
  return out;
}

absl::StatusOr<std::vector<v1::WorkerStatus>> WorkerManager::Describe(
    const std::string& job_id) {
  {
    absl::MutexLock lock(&mu_);
    auto it = jobs_workers_.find(job_id);
    if (it != jobs_workers_.end() && !it->second.ranks.empty()) {
      return DescribeLocked(it->second);
    }
    auto ended = ended_workers_.find(job_id);
    if (ended != ended_workers_.end()) return ended->second;
  }
  std::vector<v1::WorkerStatus> out;
  // An ended job's (or one this coordinator has not seen a worker of since
  // it started): what the store kept of its registrations, by rank.
  absl::StatusOr<std::vector<StoredWorker>> stored =
      store_->LoadWorkers(job_id);
  if (!stored.ok()) return stored.status();
  for (const StoredWorker& sw : *stored) {
    v1::WorkerStatus& w = out.emplace_back();
    w.set_rank(sw.rank);
    w.set_hostname(sw.hostname);
    w.set_incarnation(sw.incarnation);
    w.set_device(sw.device);
  }
  return out;  // LoadWorkers is by rank
}

absl::StatusOr<v1::RegisterResponse> WorkerManager::Register(
    const v1::RegisterRequest& request) {
  absl::StatusOr<v1::Job> job = jobs_->Get(request.job_id());
  if (!job.ok()) return job.status();
  if (IsTerminal(job->state())) {
    return absl::FailedPreconditionError(absl::StrCat(
        "job ", job->id(), " already ended ", JobStateName(job->state()),
        job->error().empty() ? "" : absl::StrCat(" (", job->error(), ")"),
        "; this worker should exit"));
  }
  if (request.incarnation().empty() || request.incarnation().size() > 128) {
    return absl::InvalidArgumentError(
        "incarnation must be 1..128 characters: a random id per worker "
        "process");
  }
  // A rank that cannot run the job (f16 on a CPU, a device other than the
  // declared hardware.device) fails it now, saying why, rather than at its
  // first step.
  if (absl::Status device = CheckRankDevice(
          job->spec(), request.device(),
          absl::StrCat("the worker on ", request.hostname().substr(0, 255)));
      !device.ok()) {
    (void)jobs_->Transition(job->id(), v1::JOB_STATE_FAILED, device.message());
    return device;
  }
  const int32_t world = job->spec().parallel().world_size();
  // Resumed at a smaller world (restart.min_world): the ranks launched for
  // the submitted one still come, and take whichever ranks are free.
  const int32_t launched = std::max(world, job->submitted_world_size());
  if (request.requested_rank() < -1 || request.requested_rank() >= launched) {
    return absl::InvalidArgumentError(
        absl::StrCat("requested rank ", request.requested_rank(),
                     " is outside [0, ", launched, ") for job ", job->id(),
                     "; use -1 to let the coordinator assign one"));
  }
  const int32_t requested =
      request.requested_rank() >= world ? -1 : request.requested_rank();
  int32_t rank = -1;
  bool restarted = false;
  std::string replaced;
  std::string restart_msg;
  {
    absl::MutexLock lock(&mu_);
    JobWorkers& w = Workers(*job);
    for (const auto& [r, info] : w.ranks) {
      if (info.incarnation == request.incarnation()) rank = r;
    }
    int32_t wanted = requested;
    if (rank < 0 && job->submitted_world_size() > 0 && wanted >= 0) {
      // Resumed at a smaller world: ranks went by arrival, so the one asked
      // for may be another worker's. A relaunch of a rank whose process is
      // gone (its session closed) while RUNNING restarts the job as usual;
      // otherwise the worker takes a free rank, or is not needed.
      auto it = w.ranks.find(wanted);
      if (it != w.ranks.end() &&
          (job->state() != v1::JOB_STATE_RUNNING || it->second.connected())) {
        wanted = -1;
      }
    }
    if (rank < 0) {
      if (wanted >= 0) {
        rank = wanted;
        auto it = w.ranks.find(rank);
        if (it != w.ranks.end()) {
          if (job->state() == v1::JOB_STATE_RUNNING) {
            restarted = true;
            if (metrics_ != nullptr) {
              metrics_->worker_restarts->WithLabels({job->id()}).Increment();
            }
            restart_msg = absl::StrCat(
                RankRef(rank, it->second.hostname), " restarted (incarnation ",
                it->second.incarnation, " -> ", request.incarnation(),
                "): its shards are lost");
          } else if (it->second.connected()) {
            return absl::AlreadyExistsError(absl::StrCat(
                "rank ", rank, " of job ", job->id(),
                " belongs to a connected worker on ", it->second.hostname,
                "; give each worker its own rank"));
          }
        }
      } else {
        for (int32_t r = 0; r < world && rank < 0; ++r) {
          auto it = w.ranks.find(r);
          if (it == w.ranks.end() ||
              (job->state() == v1::JOB_STATE_PENDING && !it->second.live())) {
            rank = r;
          }
        }
        if (rank < 0 && job->submitted_world_size() > 0) {
          // Resumed without it: not an error, the worker just ends.
          v1::RegisterResponse response;
          response.set_not_needed(absl::StrCat(
              "job ", job->id(), " resumed at world ", world, " of ",
              job->submitted_world_size(),
              " (restart.min_world) and all its ranks are taken; this "
              "worker is not needed"));
          return response;
        }
        if (rank < 0) {
          return absl::ResourceExhaustedError(
              absl::StrCat("job ", job->id(), " has all ", world,
                           " ranks registered; this worker is one too many"));
        }
      }
    }
    if (!restarted) {
      Rank& r = w.ranks[rank];
      if (!r.incarnation.empty() && r.incarnation != request.incarnation()) {
        replaced = absl::StrCat(
            RankRef(rank, r.hostname), " left before the job started (",
            r.live() ? "no session yet" : "its session closed",
            "); incarnation ", request.incarnation().substr(0, 64),
            " takes its rank");
      }
      if (r.incarnation != request.incarnation()) r = Rank{};
      r.incarnation = request.incarnation();
      r.hostname = request.hostname();
      r.device = request.device();
      r.last_seen = Clock::now();
      r.last_heard = std::chrono::system_clock::now();
    }
  }
  if (!replaced.empty()) {
    (void)jobs_->RecordEvent(job->id(), "worker", replaced);
  }
  if (restarted) {
    // A relaunched process: the job restarts (restart.max_restarts) and this
    // worker is the first of the new round, or the job fails.
    if (!LoseRank(job->id(), restart_msg, "relaunch")) {
      return absl::FailedPreconditionError(absl::StrCat(
          restart_msg, job->spec().restart().max_restarts() == 0
                           ? "; resubmit the job to resume from its last "
                             "checkpoint, or set restart.max_restarts"
                           : "; no restarts left"));
    }
    return Register(request);
  }
  if (absl::Status s = store_->PutWorker(
          job->id(), {rank, request.incarnation(), request.hostname(),
                      request.device(), request.device_memory_bytes()});
      !s.ok()) {
    return s;
  }
  Listener().OnRankRegistered(job->id(), rank, request.hostname(),
                              request.device(), request.device_memory_bytes());
  StartIfReady(job->id());
  v1::RegisterResponse response;
  response.set_rank(rank);
  response.set_world_size(world);
  response.set_incarnation(request.incarnation());
  *response.mutable_spec() = job->spec();
  response.set_store_prefix(StorePrefix(*job));
  response.set_start_key(response.store_prefix() + kStartKey);
  return response;
}

absl::StatusOr<int64_t> WorkerManager::OpenSession(
    const v1::SessionHello& hello, std::shared_ptr<SessionSink> sink) {
  absl::StatusOr<v1::Job> job = jobs_->Get(hello.job_id());
  if (!job.ok()) return job.status();
  if (IsTerminal(job->state())) {
    // Its ranks may be forgotten already: say why, not "unknown worker".
    return absl::FailedPreconditionError(absl::StrCat(
        "job ", job->id(), " already ended ", JobStateName(job->state()),
        job->error().empty() ? "" : absl::StrCat(" (", job->error(), ")"),
        "; this worker should exit"));
  }
  int64_t id = 0;
  ScheduleLookup lookup;
  bool ended = false;
  {
    absl::MutexLock lock(&mu_);
    lookup = schedule_lookup_;
    JobWorkers& w = Workers(*job);
    // Read under the lock OnJobEnded marks it under: a job that ended after
    // the read above either finds this sink registered or is seen here.
    ended = w.ended;
    auto it = w.ranks.find(hello.rank());
    if (it == w.ranks.end() || it->second.incarnation != hello.incarnation()) {
      return absl::PermissionDeniedError(
          absl::StrCat("unknown worker: rank ", hello.rank(),
                       " with incarnation '", hello.incarnation().substr(0, 64),
                       "' is not registered for job ", job->id(),
                       "; call Register first (a restarted worker registers "
                       "anew)"));
    }
    if (it->second.connected()) sessions_.erase(it->second.session);
    id = next_session_++;
    sessions_[id] = {job->id(), hello.rank()};
    it->second.session = id;
    it->second.sink = sink;
    it->second.last_seen = Clock::now();
    it->second.last_heard = std::chrono::system_clock::now();
    it->second.step = std::max(it->second.step, hello.step());
    it->second.link = Link::kConnected;
    UpdateConnectedMetric(job->id(), w);
  }
  // The job may start: this was the last rank to connect, or one counted
  // gone came back.
  StartIfReady(job->id());
  if (ended && !IsTerminal(job->state())) {
    absl::StatusOr<v1::Job> now = jobs_->Get(hello.job_id());
    if (now.ok()) job = *std::move(now);
  }
  if (ended || IsTerminal(job->state())) {
    v1::CoordinatorMessage stop;
    stop.mutable_command()->set_kind(v1::Command::KIND_STOP);
    stop.mutable_command()->set_reason(absl::StrCat(
        "job ended ", JobStateName(job->state()), ": ", job->error()));
    sink->Send(stop);
    return id;
  }
  // A worker that missed schedules while away gets the newest one.
  if (!lookup) return id;
  absl::StatusOr<v1::ScheduleUpdate> latest = lookup(job->id());
  if (latest.ok() && latest->schedule().version() > hello.schedule_version()) {
    v1::CoordinatorMessage update;
    *update.mutable_schedule() = *std::move(latest);
    sink->Send(update);
  }
  return id;
}

void WorkerManager::CloseSession(int64_t session) {
  std::string job_id;
  std::string lost_cause;
  {
    absl::MutexLock lock(&mu_);
    auto it = sessions_.find(session);
    if (it == sessions_.end()) return;
    job_id = it->second.job_id;
    auto jw = jobs_workers_.find(job_id);
    if (jw != jobs_workers_.end()) {
      JobWorkers& w = jw->second;
      auto r = w.ranks.find(it->second.rank);
      if (r != w.ranks.end() && r->second.session == session) {
        r->second.session = 0;
        r->second.sink.reset();
        r->second.link = Link::kGone;
        // A peer's collective already failed on this one (the peer_lost
        // error came before this stream closed): it is the lost rank.
        auto reporter = w.ranks.find(w.peer_lost_reporter);
        if (reporter != w.ranks.end() && reporter != r && !r->second.done) {
          lost_cause =
              absl::StrCat(RankRef(r->first, r->second.hostname),
                           " is gone: its session closed and ",
                           RankRef(reporter->first, reporter->second.hostname),
                           "'s collective failed");
          w.peer_lost_reporter = -1;
        }
      }
      UpdateConnectedMetric(job_id, w);
    }
    sessions_.erase(it);
  }
  if (!lost_cause.empty()) LoseRank(job_id, lost_cause, "peer");
  // A PENDING job's wait names the ranks connected: this one no more.
  StartIfReady(job_id);
}

absl::Status WorkerManager::OnMessage(int64_t session,
                                      const v1::WorkerMessage& message) {
  std::string job_id;
  int32_t rank = 0;
  std::string hostname;
  int32_t world = 0;
  {
    absl::MutexLock lock(&mu_);
    auto it = sessions_.find(session);
    if (it == sessions_.end()) {
      return absl::FailedPreconditionError(
          "session is closed; open a new one with a hello");
    }
    job_id = it->second.job_id;
    rank = it->second.rank;
    Rank& r = jobs_workers_[job_id].ranks[rank];
    r.last_seen = Clock::now();
    r.last_heard = std::chrono::system_clock::now();
    hostname = r.hostname;
    world = jobs_workers_[job_id].world;
  }
  switch (message.payload_case()) {
    case v1::WorkerMessage::kHeartbeat: {
      // Its delay: clocks of other hosts may differ a little, a queue on
      // an overloaded coordinator by seconds.
      const double delay =
          std::chrono::duration<double>(
              std::chrono::system_clock::now().time_since_epoch())
              .count() -
          message.heartbeat().time_unix_s();
      const auto now = Clock::now();
      absl::MutexLock lock(&mu_);
      if (std::isfinite(delay) && message.heartbeat().time_unix_s() > 0 &&
          (delay > heartbeat_delay_s_ ||
           now - heartbeat_delay_at_ > 2 * options_.heartbeat_timeout)) {
        heartbeat_delay_s_ = std::max(0.0, delay);
        heartbeat_delay_at_ = now;
      }
      return absl::OkStatus();
    }
    case v1::WorkerMessage::kGraph:
      return Listener().OnGraph(job_id, rank, message.graph());
    case v1::WorkerMessage::kProfile:
      return Listener().OnProfile(job_id, rank, message.profile());
    case v1::WorkerMessage::kProgress: {
      const v1::IterationProgress& p = message.progress();
      // The loss may be NaN (a diverged run is the user's to see); what
      // the planner and the reports compute with may not.
      if (!std::isfinite(p.iteration_s()) || p.iteration_s() < 0 ||
          !std::isfinite(p.exposed_comm_s()) || p.exposed_comm_s() < 0 ||
          p.step() < 0 || p.peak_bytes() < 0 || p.work() < 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("progress from rank ", rank,
                         " has a negative or non-finite step, time, exposed "
                         "communication, peak or work"));
      }
      if (p.has_cpu_wait_share() &&
          !(p.cpu_wait_share() >= 0 && p.cpu_wait_share() <= 1)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "progress from rank ", rank, " has cpu_wait_share ",
            p.cpu_wait_share(),
            ": a share of the step's wall time is in [0, 1] (leave it unset "
            "when not measured)"));
      }
      bool all_done = false;
      int64_t total = 0;
      {
        absl::MutexLock lock(&mu_);
        JobWorkers& w = jobs_workers_[job_id];
        Rank& r = w.ranks[rank];
        r.step = std::max(r.step, p.step());
        total = w.total_steps;
        if (p.step() >= w.total_steps) r.done = true;
        all_done = static_cast<int32_t>(w.ranks.size()) == w.world;
        for (const auto& [_, other] : w.ranks)
          all_done = all_done && other.done;
      }
      if (rank == 0) {
        int64_t step_at_restart = -1;
        {
          absl::MutexLock lock(&mu_);
          std::swap(step_at_restart, jobs_workers_[job_id].step_at_restart);
        }
        if (step_at_restart >= 0) {
          const int64_t resumed_at = p.step() - 1;
          const int64_t recomputed =
              std::max<int64_t>(0, step_at_restart - resumed_at);
          (void)jobs_->RecordEvent(
              job_id, "restart",
              absl::StrCat("resumed at step ", resumed_at, " (",
                           resumed_at == 0 ? "from the start: no checkpoint"
                                           : "the newest checkpoint",
                           "); ", recomputed,
                           recomputed == 1 ? " step" : " steps",
                           " recomputed"));
        }
        (void)jobs_->UpdateProgress(job_id, p);
      }
      Listener().OnProgress(job_id, rank, p);
      if (all_done) {
        (void)jobs_->Transition(
            job_id, v1::JOB_STATE_SUCCEEDED,
            absl::StrCat("all ", world, " ranks finished ", total, " steps"));
      }
      return absl::OkStatus();
    }
    case v1::WorkerMessage::kApplied: {
      const v1::ScheduleApplied& a = message.applied();
      if (a.version() < 0) {
        // The least-memory fallback: not a published version.
        Listener().OnMemoryGuard(
            job_id, rank, a.step(),
            a.has_tripped_version()
                ? std::optional<int64_t>(a.tripped_version())
                : std::nullopt,
            a.reason().substr(0, 4096));
        return absl::OkStatus();
      }
      bool all = false;
      {
        absl::MutexLock lock(&mu_);
        JobWorkers& w = jobs_workers_[job_id];
        // Re-sent after a reconnect: never a step back.
        int64_t& applied = w.ranks[rank].applied_version;
        applied = std::max(applied, a.version());
        all = a.version() > w.announced_version &&
              static_cast<int32_t>(w.ranks.size()) == w.world;
        for (const auto& [_, other] : w.ranks) {
          all = all && other.applied_version >= a.version();
        }
        if (all) w.announced_version = a.version();
      }
      // Once per version, across coordinator restarts (Job.active_version).
      if (all && jobs_
                     ->RecordScheduleActive(
                         job_id, a.version(),
                         absl::StrCat("v", a.version(), " active on all ",
                                      world, " ranks from step ", a.step()))
                     .value_or(false)) {
        Listener().OnScheduleActive(job_id, a.version());
      }
      return absl::OkStatus();
    }
    case v1::WorkerMessage::kError: {
      const v1::WorkerError& e = message.error();
      const std::string text = absl::StrCat(RankRef(rank, hostname), ": ",
                                            e.message().substr(0, 4096));
      if (e.fatal()) {
        (void)jobs_->Transition(job_id, v1::JOB_STATE_FAILED, text);
        return absl::OkStatus();
      }
      (void)jobs_->RecordEvent(job_id, "worker", text);
      if (e.peer_lost()) {
        // A peer whose session closed is the one lost (a process that
        // died): act now rather than after its heartbeat timeout.
        std::string lost;
        {
          absl::MutexLock lock(&mu_);
          JobWorkers& w = jobs_workers_[job_id];
          for (const auto& [r, info] : w.ranks) {
            if (r != rank && !info.connected() && !info.done) {
              lost = RankRef(r, info.hostname);
              break;
            }
          }
          if (lost.empty()) {
            // The lost rank's stream has not closed yet: CloseSession acts
            // when it does.
            w.peer_lost_reporter = rank;
          }
        }
        if (!lost.empty()) {
          LoseRank(
              job_id,
              absl::StrCat(lost, " is gone: its session closed and ",
                           RankRef(rank, hostname), "'s collective failed"),
              "peer");
        }
      }
      return absl::OkStatus();
    }
    case v1::WorkerMessage::kTimeline:
      if (timelines_ == nullptr) {
        return absl::FailedPreconditionError(
            "this coordinator keeps no timelines");
      }
      return timelines_->Put(job_id, rank, message.timeline());
    case v1::WorkerMessage::kHello:
      return absl::InvalidArgumentError(
          "hello is only the first message of a session");
    default:
      return absl::InvalidArgumentError(
          "empty worker message: set one payload");
  }
}

void WorkerManager::Broadcast(const std::string& job_id,
                              const v1::CoordinatorMessage& message) {
  std::vector<std::shared_ptr<SessionSink>> sinks;
  {
    absl::MutexLock lock(&mu_);
    auto it = jobs_workers_.find(job_id);
    if (it == jobs_workers_.end()) return;
    for (auto& [_, r] : it->second.ranks) {
      if (r.sink) sinks.push_back(r.sink);
    }
  }
  for (auto& sink : sinks) sink->Send(message);
}

void WorkerManager::OnJobEnded(const std::string& job_id, v1::JobState state) {
  absl::StatusOr<v1::Job> job = jobs_->Get(job_id);
  v1::CoordinatorMessage stop;
  stop.mutable_command()->set_kind(v1::Command::KIND_STOP);
  stop.mutable_command()->set_reason(absl::StrCat(
      "job ", job_id, " ended ", JobStateName(state),
      job.ok() && !job->error().empty() ? absl::StrCat(": ", job->error())
                                        : ""));
  // Marked ended in the same critical section that collects the sinks: a
  // session opening concurrently is either collected here or sees `ended`.
  std::vector<std::shared_ptr<SessionSink>> sinks;
  {
    absl::MutexLock lock(&mu_);
    auto it = jobs_workers_.find(job_id);
    if (it != jobs_workers_.end()) {
      it->second.ended = true;
      for (auto& [_, r] : it->second.ranks) {
        if (r.sink) sinks.push_back(r.sink);
      }
    }
  }
  for (auto& sink : sinks) sink->Send(stop);
  kv_->DeletePrefix(StorePrefix(job_id));
  absl::MutexLock lock(&mu_);
  if (metrics_ != nullptr) {
    // An ended job has no workers to miss (alerts compare the two).
    metrics_->workers_connected->Remove({job_id});
    metrics_->workers_expected->Remove({job_id});
  }
}

std::string WorkerManager::OverloadHintLocked(Clock::time_point now) const {
  const double timeout_s =
      std::chrono::duration<double>(options_.heartbeat_timeout).count();
  if (now - heartbeat_delay_at_ <= 2 * options_.heartbeat_timeout &&
      heartbeat_delay_s_ > std::max(1.0, timeout_s / 4)) {
    return absl::StrFormat(
        "; heartbeats reach this coordinator up to %.1f s late: it is "
        "overloaded, and the worker may be alive (bench/README.md, \"load\")",
        heartbeat_delay_s_);
  }
  return "";
}

void WorkerManager::UpdateConnectedMetric(const std::string& job_id,
                                          const JobWorkers& w) {
  if (metrics_ == nullptr || w.ended) return;
  int connected = 0;
  for (const auto& [_, r] : w.ranks) connected += r.connected();
  metrics_->workers_connected->WithLabels({job_id}).Set(connected);
  metrics_->workers_expected->WithLabels({job_id}).Set(w.world);
}

void WorkerManager::WatchLoop() {
  mu_.Lock();
  for (;;) {
    // Every watch interval, until Stop().
    const absl::Time until =
        absl::Now() + absl::FromChrono(options_.watch_interval);
    while (!stop_ && !stop_cv_.WaitWithDeadline(&mu_, until)) {
    }
    if (stop_) break;
    const auto now = Clock::now();
    std::vector<std::pair<std::string, std::string>> failures;
    // Jobs that waited long enough after a restart: (job, world, missing).
    std::vector<std::tuple<std::string, int32_t, std::string>> smaller;
    for (auto& [job_id, w] : jobs_workers_) {
      for (auto& [_, r] : w.ranks) {
        if (r.link == Link::kRegistered &&
            now - r.last_seen > options_.session_grace) {
          r.link = Link::kGone;
        }
      }
      if (w.waiting_since.has_value() && w.min_world < w.world &&
          now - *w.waiting_since >= w.rejoin_timeout) {
        int32_t have = 0;
        std::vector<std::string> absent;
        for (int32_t r = 0; r < w.world; ++r) {
          auto it = w.ranks.find(r);
          if (it != w.ranks.end() && it->second.live()) {
            ++have;
          } else {
            absent.push_back(absl::StrCat(r));
          }
        }
        if (have >= w.min_world && have < w.world) {
          smaller.emplace_back(
              job_id, have,
              absl::StrCat(absent.size() == 1 ? "rank " : "ranks ",
                           absl::StrJoin(absent, ", ")));
        }
      }
    }
    for (auto& [job_id, w] : jobs_workers_) {
      for (auto& [rank, r] : w.ranks) {
        if (r.done) continue;
        const auto silent = now - r.last_seen;
        if (silent > options_.heartbeat_timeout) {
          failures.emplace_back(
              job_id,
              absl::StrFormat(
                  "%s missed heartbeats for %.1f s (timeout %.1f "
                  "s): the worker died or lost its connection%s",
                  RankRef(rank, r.hostname),
                  std::chrono::duration<double>(silent).count(),
                  std::chrono::duration<double>(options_.heartbeat_timeout)
                      .count(),
                  OverloadHintLocked(now)));
          break;
        }
      }
    }
    mu_.Unlock();
    for (const auto& [job_id, message] : failures) {
      // Restarts the job (restart.max_restarts) or fails it; nothing for a
      // job that is not RUNNING.
      LoseRank(job_id, message, "heartbeat");
    }
    for (const auto& [job_id, world, missing] : smaller) {
      ResumeSmallerWorld(job_id, world, missing);
    }
    // Jobs whose ranks never all came (parallel.start_timeout_s), once a
    // second: they fail saying which ranks were missing.
    if (now - last_start_check_ >= std::chrono::seconds(1)) {
      last_start_check_ = now;
      jobs_->FailOverdueStarts();
    }
    mu_.Lock();
    // Finished jobs need no watching.
    for (auto it = jobs_workers_.begin(); it != jobs_workers_.end();) {
      absl::StatusOr<v1::Job> job = jobs_->Get(it->first);
      if (!job.ok() || IsTerminal(job->state())) {
        bool connected = false;
        for (const auto& [_, r] : it->second.ranks) {
          connected = connected || r.connected();
        }
        if (!connected) {
          // What `tandem status` shows of it from now on.
          ended_workers_[it->first] = DescribeLocked(it->second);
          ended_order_.push_back(it->first);
          while (ended_order_.size() > kMaxEndedJobs) {
            ended_workers_.erase(ended_order_.front());
            ended_order_.pop_front();
          }
          it = jobs_workers_.erase(it);
          continue;
        }
        for (auto& [_, r] : it->second.ranks) r.done = true;
      }
      ++it;
    }
  }
  mu_.Unlock();
}

}  // namespace tandem
