#include "worker/agent/worker_agent.h"

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/lowering/least_memory.h"

namespace tandem {

std::string NewIncarnation() {
  std::random_device rd;
  std::mt19937_64 rng((static_cast<uint64_t>(rd()) << 32) ^ rd() ^
                      static_cast<uint64_t>(getpid()));
  return absl::StrFormat("%016x", rng());
}

WorkerAgent::WorkerAgent(CoordinatorClient* client, Options options)
    : client_(client),
      options_(std::move(options)),
      incarnation_(NewIncarnation()) {}

WorkerAgent::~WorkerAgent() { Shutdown(); }

absl::StatusOr<v1::RegisterResponse> WorkerAgent::Register() {
  v1::RegisterRequest request;
  request.set_job_id(options_.job_id);
  request.set_incarnation(incarnation_);
  request.set_hostname(options_.hostname);
  request.set_requested_rank(options_.requested_rank);
  request.set_device(options_.device);
  request.set_device_memory_bytes(options_.device_memory_bytes);
  const auto start = std::chrono::steady_clock::now();
  const auto deadline = start + options_.register_timeout;
  auto backoff = std::chrono::milliseconds(200);
  for (;;) {
    absl::StatusOr<v1::RegisterResponse> response = client_->Register(request);
    if (response.ok()) {
      std::lock_guard<std::mutex> lock(mu_);
      rank_ = response->rank();
      state_ = State::kRegistered;
      return response;
    }
    if (response.status().code() != absl::StatusCode::kUnavailable &&
        response.status().code() != absl::StatusCode::kDeadlineExceeded) {
      return response.status();
    }
    const auto now = std::chrono::steady_clock::now();
    if (now + backoff > deadline) return response.status();
    // Said on every retry: a worker that waits on its coordinator says so
    // rather than sitting silent until register_timeout.
    std::fprintf(
        stderr, "tandem-worker: %s; retrying registration (%.1f s of %.0f s)\n",
        std::string(response.status().message()).c_str(),
        std::chrono::duration<double>(now - start).count(),
        std::chrono::duration<double>(options_.register_timeout).count());
    std::this_thread::sleep_for(backoff);
    backoff = std::min(backoff * 2, std::chrono::milliseconds(2000));
  }
}

absl::Status WorkerAgent::Start() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (state_ != State::kRegistered) {
      return absl::FailedPreconditionError("Start() needs Register() first");
    }
  }
  absl::Status s = Connect();
  if (!s.ok() && s.code() != absl::StatusCode::kUnavailable) return s;
  heartbeat_ = std::thread([this] { HeartbeatLoop(); });
  return absl::OkStatus();
}

void WorkerAgent::Shutdown() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (shutdown_) return;
    shutdown_ = true;
  }
  wake_.notify_all();
  if (heartbeat_.joinable()) heartbeat_.join();
  client_->CloseSession();
}

absl::Status WorkerAgent::Connect() {
  v1::WorkerMessage hello;
  {
    std::lock_guard<std::mutex> lock(mu_);
    hello.mutable_hello()->set_job_id(options_.job_id);
    hello.mutable_hello()->set_rank(rank_);
    hello.mutable_hello()->set_incarnation(incarnation_);
    hello.mutable_hello()->set_schedule_version(schedule_version_);
    hello.mutable_hello()->set_step(step_);
  }
  absl::Status s = client_->OpenSession(
      hello, [this](const v1::CoordinatorMessage& m) { OnMessage(m); },
      [this](const absl::Status& status) { OnClosed(status); });
  if (!s.ok()) return s;
  // What a coordinator that restarted (or this session's) would otherwise
  // miss: the graph, the newest progress and the newest schedule applied.
  // Copied once connected, under the lock: a report made while the session
  // was opening was kept but not sent, and is the one re-sent here; one
  // made from now on is sent by its caller (a duplicate at most).
  std::vector<v1::WorkerMessage> resend;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (state_ != State::kStopped) state_ = State::kConnected;
    for (const std::optional<v1::WorkerMessage>* kept :
         {&graph_, &progress_, &applied_}) {
      if (kept->has_value()) resend.push_back(**kept);
    }
  }
  for (const v1::WorkerMessage& m : resend) (void)client_->Send(m);
  return absl::OkStatus();
}

void WorkerAgent::OnMessage(const v1::CoordinatorMessage& message) {
  std::lock_guard<std::mutex> lock(mu_);
  switch (message.payload_case()) {
    case v1::CoordinatorMessage::kSchedule:
      if (!pending_schedule_.has_value() ||
          pending_schedule_->schedule().version() <
              message.schedule().schedule().version()) {
        pending_schedule_ = message.schedule();
      }
      break;
    case v1::CoordinatorMessage::kCommand:
      if (message.command().kind() == v1::Command::KIND_STOP ||
          message.command().kind() == v1::Command::KIND_RESTART) {
        stop_reason_ = message.command().reason();
        restart_requested_ =
            message.command().kind() == v1::Command::KIND_RESTART;
        state_ = State::kStopped;
        wake_.notify_all();
      }
      break;
    case v1::CoordinatorMessage::kRejected:
      ++rejected_;
      std::fprintf(stderr, "tandem-worker: coordinator refused a %s: %s\n",
                   message.rejected().payload().c_str(),
                   message.rejected().message().c_str());
      break;
    default:
      break;
  }
}

void WorkerAgent::OnClosed(const absl::Status& status) {
  std::lock_guard<std::mutex> lock(mu_);
  if (state_ == State::kStopped) return;
  // A refusal that no reconnect can fix ends the worker. The hello is
  // answered after OpenSession returned, so a job that ended before its
  // hello was read (FailedPrecondition) is refused here, not in Connect.
  if (status.code() == absl::StatusCode::kPermissionDenied ||
      status.code() == absl::StatusCode::kUnauthenticated ||
      status.code() == absl::StatusCode::kNotFound ||
      status.code() == absl::StatusCode::kFailedPrecondition) {
    stop_reason_ = std::string(status.message());
    state_ = State::kStopped;
  } else {
    state_ = State::kDisconnected;
  }
  wake_.notify_all();
}

void WorkerAgent::HeartbeatLoop() {
  // While disconnected, retry after 250 ms, then every 500 ms (the
  // channel's own reconnect backoff is capped at 500 ms too): a restarted
  // coordinator sees the rank again within about a second of serving, well
  // inside its heartbeat timeout.
  constexpr std::chrono::milliseconds kFirstRetry(250);
  constexpr std::chrono::milliseconds kMaxRetry(500);
  auto retry = kFirstRetry;
  auto backoff = options_.heartbeat_interval;
  std::unique_lock<std::mutex> lock(mu_);
  while (!shutdown_ && state_ != State::kStopped) {
    wake_.wait_for(lock, backoff, [&] { return shutdown_; });
    if (shutdown_ || state_ == State::kStopped) break;
    if (state_ == State::kDisconnected) {
      lock.unlock();
      client_->CloseSession();
      absl::Status s = Connect();
      lock.lock();
      if (!s.ok()) {
        // FailedPrecondition: the job ended while this worker was away.
        if (s.code() == absl::StatusCode::kPermissionDenied ||
            s.code() == absl::StatusCode::kUnauthenticated ||
            s.code() == absl::StatusCode::kNotFound ||
            s.code() == absl::StatusCode::kFailedPrecondition) {
          stop_reason_ = std::string(s.message());
          state_ = State::kStopped;
          wake_.notify_all();
        }
        backoff = retry;
        retry = std::min(retry * 2, kMaxRetry);
        continue;
      }
      backoff = options_.heartbeat_interval;
      retry = kFirstRetry;
    }
    lock.unlock();
    v1::WorkerMessage hb;
    hb.mutable_heartbeat()->set_time_unix_s(
        absl::ToDoubleSeconds(absl::Now() - absl::UnixEpoch()));
    if (!client_->Send(hb).ok()) {
      lock.lock();
      if (state_ == State::kConnected) state_ = State::kDisconnected;
      backoff = kFirstRetry;
      continue;
    }
    lock.lock();
  }
}

void WorkerAgent::Send(const v1::WorkerMessage& message,
                       bool keep_for_reconnect) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (keep_for_reconnect) graph_ = message;
    if (state_ != State::kConnected) return;
  }
  if (!client_->Send(message).ok()) {
    std::lock_guard<std::mutex> lock(mu_);
    if (state_ == State::kConnected) state_ = State::kDisconnected;
    wake_.notify_all();
  }
}

void WorkerAgent::ReportGraph(const v1::GraphReport& report) {
  v1::WorkerMessage m;
  *m.mutable_graph() = report;
  Send(m, /*keep_for_reconnect=*/true);
}

void WorkerAgent::ReportTimeline(const v1::TimelineReport& timeline) {
  v1::WorkerMessage m;
  *m.mutable_timeline() = timeline;
  Send(m, false);
}

void WorkerAgent::ReportProgress(const v1::IterationProgress& progress) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    step_ = std::max(step_, progress.step());
  }
  v1::WorkerMessage m;
  *m.mutable_progress() = progress;
  {
    std::lock_guard<std::mutex> lock(mu_);
    progress_ = m;
  }
  Send(m, false);
}

void WorkerAgent::ReportApplied(int64_t version, int64_t step,
                                const std::string& reason) {
  v1::WorkerMessage m;
  m.mutable_applied()->set_version(version);
  m.mutable_applied()->set_step(step);
  m.mutable_applied()->set_reason(reason);
  if (version >= 0) {
    // The newest published version held (the least-memory fallback is not
    // one): a reconnect gets only newer plans, and says it runs this one.
    std::lock_guard<std::mutex> lock(mu_);
    schedule_version_ = version;
    applied_ = m;
  }
  Send(m, false);
}

void WorkerAgent::ReportMemoryGuard(int64_t from_step, int64_t tripped_version,
                                    const std::string& reason) {
  v1::WorkerMessage m;
  m.mutable_applied()->set_version(kLeastMemoryVersion);
  m.mutable_applied()->set_step(from_step);
  m.mutable_applied()->set_reason(reason);
  m.mutable_applied()->set_tripped_version(tripped_version);
  Send(m, false);
}

void WorkerAgent::ReportError(const std::string& message, bool fatal,
                              bool peer_lost) {
  v1::WorkerMessage m;
  m.mutable_error()->set_message(message);
  m.mutable_error()->set_fatal(fatal);
  m.mutable_error()->set_peer_lost(peer_lost);
  Send(m, false);
}

std::optional<v1::ScheduleUpdate> WorkerAgent::TakeSchedule() {
  std::lock_guard<std::mutex> lock(mu_);
  std::optional<v1::ScheduleUpdate> out = std::move(pending_schedule_);
  pending_schedule_.reset();
  return out;
}

std::optional<std::string> WorkerAgent::WaitForStop(
    std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  wake_.wait_for(lock, timeout, [&] { return stop_reason_.has_value(); });
  return stop_reason_;
}

bool WorkerAgent::RestartRequested() const {
  std::lock_guard<std::mutex> lock(mu_);
  return restart_requested_;
}

std::optional<std::string> WorkerAgent::StopReason() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stop_reason_;
}

WorkerAgent::State WorkerAgent::state() const {
  std::lock_guard<std::mutex> lock(mu_);
  return state_;
}

}  // namespace tandem
