#include "coordinator/rpc/watch_hub.h"

#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "coordinator/rpc/queued_writer.h"
#include "coordinator/rpc/status_util.h"

namespace tandem {
namespace {

// Ends at once with its status; for calls refused before they start.
class RefusedWatch : public WatchHub::Reactor {
 public:
  explicit RefusedWatch(grpc::Status status) { Finish(std::move(status)); }
  void OnDone() override { delete this; }
};

}  // namespace

class WatchHub::Stream : public WatchHub::Reactor {
 public:
  Stream(WatchHub* hub, const v1::WatchJobRequest& request,
         std::optional<std::string> authorization, std::string user,
         v1::Job job)
      : hub_(hub),
        job_id_(request.job_id()),
        authorization_(std::move(authorization)),
        user_(std::move(user)),
        after_seq_(request.after_seq()),
        known_(std::move(job)),
        writer_(this) {}

  const std::string& user() const { return user_; }

  void SendFirst() {
    v1::WatchJobResponse first;
    *first.mutable_job() = known_;
    writer_.Push(std::move(first), kMaxQueued);
  }

  // Sends what changed since the last call, once what was sent before is
  // written. `recheck`: check the caller's token again. Runs on the hub's
  // thread with the hub's lock held, so the stream is not deleted meanwhile.
  void Pump(bool recheck) {
    if (!writer_.Idle()) return;  // OnWriteDone wakes the hub
    if (recheck) {
      Principal caller;
      grpc::Status still = hub_->auth_->Authenticate(
          authorization_.has_value()
              ? std::optional<absl::string_view>(*authorization_)
              : std::nullopt,
          &caller);
      if (still.ok()) still = hub_->auth_->MayAccess(caller, known_);
      if (!still.ok()) {
        writer_.Finish(still);
        return;
      }
    }
    absl::StatusOr<std::optional<JobManager::JobChanges>> changes =
        hub_->jobs_->ChangesSince(job_id_, after_seq_, &generation_);
    if (!changes.ok()) {
      writer_.Finish(ToGrpc(changes.status()));
      return;
    }
    if (!changes->has_value()) return;
    const v1::Job& now = (*changes)->job;
    const std::vector<v1::JobEvent>& events = (*changes)->events;
    if (events.empty() && now.step() != known_.step()) {
      v1::WatchJobResponse progress;
      *progress.mutable_job() = now;
      writer_.Push(std::move(progress), kMaxQueued);
    }
    for (const v1::JobEvent& e : events) {
      v1::WatchJobResponse update;
      *update.mutable_job() = now;
      *update.mutable_event() = e;
      writer_.Push(std::move(update), kMaxQueued);
      after_seq_ = e.seq();
    }
    known_ = now;
    // An ended job comes with the event that ended it: the stream ends
    // once that is written.
    if (IsTerminal(known_.state())) writer_.Finish(grpc::Status::OK);
  }

  void OnWriteDone(bool ok) override {
    writer_.OnWriteDone(ok);
    hub_->Wake();
  }
  // The client went away or the server is shutting down.
  void OnCancel() override {
    writer_.Finish(grpc::Status(grpc::StatusCode::CANCELLED, "cancelled"));
  }
  void OnDone() override {
    hub_->Remove(this);
    writer_.Detach();
    delete this;
  }

 private:
  // A job's events past the first snapshot are few (kept events are
  // bounded per job); this only bounds a replay of them all.
  static constexpr size_t kMaxQueued = 1 << 20;

  WatchHub* hub_;
  const std::string job_id_;
  const std::optional<std::string> authorization_;
  const std::string user_;
  int64_t after_seq_;
  int64_t generation_ = 0;
  v1::Job known_;
  QueuedWriter<WatchHub::Reactor, v1::WatchJobResponse> writer_;
};

WatchHub::WatchHub(JobManager* jobs, const RpcAuth* auth, Limits limits)
    : jobs_(jobs), auth_(auth), limits_(limits) {
  jobs_->SetChangeListener([this] { Wake(); });
  thread_ = std::thread([this] { Run(); });
}

WatchHub::~WatchHub() {
  jobs_->SetChangeListener(nullptr);
  {
    absl::MutexLock lock(&wake_mu_);
    stop_ = true;
  }
  wake_cv_.SignalAll();
  thread_.join();
}

WatchHub::Reactor* WatchHub::Open(grpc::CallbackServerContext* context,
                                  const v1::WatchJobRequest& request,
                                  const Principal& caller, v1::Job job) {
  Stream* stream;
  {
    absl::MutexLock lock(&mu_);
    int& held = per_user_[caller.user];
    if (held >= limits_.max_streams_per_user) {
      const int n = held;
      return Refuse(grpc::Status(
          grpc::StatusCode::RESOURCE_EXHAUSTED,
          absl::StrCat(
              caller.user.empty() ? std::string("this coordinator's users")
                                  : absl::StrCat("user ", caller.user),
              " hold ", n,
              " watches, the most one user may (--max-streams-per-user); "
              "close one first")));
    }
    ++held;
    stream = new Stream(this, request, RpcAuth::Authorization(*context),
                        caller.user, std::move(job));
    streams_.insert(stream);
    stream->SendFirst();
  }
  Wake();
  return stream;
}

WatchHub::Reactor* WatchHub::Refuse(grpc::Status status) {
  return new RefusedWatch(std::move(status));
}

int64_t WatchHub::streams() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int64_t>(streams_.size());
}

void WatchHub::Remove(Stream* stream) {
  absl::MutexLock lock(&mu_);
  streams_.erase(stream);
  auto it = per_user_.find(stream->user());
  if (it != per_user_.end() && --it->second == 0) per_user_.erase(it);
}

void WatchHub::Wake() {
  {
    absl::MutexLock lock(&wake_mu_);
    woken_ = true;
  }
  wake_cv_.Signal();
}

void WatchHub::Run() {
  using Clock = std::chrono::steady_clock;
  Clock::time_point next_recheck = Clock::now() + limits_.recheck;
  wake_mu_.Lock();
  while (!stop_) {
    const absl::Time until =
        absl::Now() + absl::FromChrono(next_recheck - Clock::now());
    while (!woken_ && !stop_ && !wake_cv_.WaitWithDeadline(&wake_mu_, until)) {
    }
    if (stop_) break;
    woken_ = false;
    wake_mu_.Unlock();
    const Clock::time_point now = Clock::now();
    const bool recheck = now >= next_recheck;
    if (recheck) next_recheck = now + limits_.recheck;
    {
      absl::MutexLock lock(&mu_);
      for (Stream* s : streams_) s->Pump(recheck);
    }
    wake_mu_.Lock();
  }
  wake_mu_.Unlock();
}

}  // namespace tandem
