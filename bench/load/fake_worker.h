// A fake worker: one rank of a job speaking WorkerService to a real
// coordinator as tandem-worker's agent does (worker/agent/), with no
// libtorch. tandem-loadgen runs thousands of them (bench/README.md, "load");
// the coordinator's RPC tests run a few, step by step.
//
//   - FakeJob: the job as its fake ranks run it. The graph is the job's real
//     one (common/models' graph builder, as the worker's model estimates);
//     what the ranks measure under a schedule is the simulator's replay of
//     it (common/sim), so the coordinator validates, aggregates and plans
//     the profiles as it would a real job's.
//   - FakeRank: one rank's side of the protocol, a step at a time. It
//     reports its graph (rank 0 the whole graph, the others its hash), its
//     progress every step and a profile every profile window (the job's
//     warm-up steps), and switches to each schedule the coordinator
//     publishes at its effective step (ScheduleApplied). A switch leaves
//     its first step unprofiled, as the agent's profiler does.
//   - SessionStream: one session stream over gRPC's callback API (no thread
//     per stream), its writes queued and sent one at a time.
// What the agent does that no fake does: train, alternate a comparison's
// blocks (a fake runs the newest schedule alone), checkpoint.
#ifndef TANDEM_BENCH_LOAD_FAKE_WORKER_H_
#define TANDEM_BENCH_LOAD_FAKE_WORKER_H_

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/ir/graph.h"
#include "common/sim/hardware_model.h"
#include "tandem/v1/worker_service.grpc.pb.h"

namespace tandem {

// What the ranks of a job report while they run one schedule version.
struct VersionModel {
  v1::Profile profile;  // rank and window set per report
  double iteration_s = 0;
  double exposed_comm_s = 0;
  int64_t peak_bytes = 0;
};

struct FakeJob {
  std::string id;
  // The join secret Submit returned (empty: none sent).
  std::string secret;
  // As the coordinator stored it (with its defaults).
  v1::JobSpec spec;

  // Set by Prepare.
  int world = 0;
  // Steps per profile window (optimize.warmup_steps).
  int window = 3;
  // Work per step (Profile::work): micro_batch x seq_len x grad_accum.
  int64_t tokens = 0;
  Graph graph;
  std::string hash;
  v1::GraphReport full_report;  // rank 0's
  v1::GraphReport hash_report;  // the other ranks'
  // 8 GPUs of 80 GiB per host, the analytic links.
  HardwareModel hw;

  // The graph, its reports and the baseline's model (v0), from `spec`.
  absl::Status Prepare();
  // What the ranks measure under `update`'s schedule, made on first use
  // (one thread at a time: the ranks' driver). A published plan runs as
  // predicted: nothing drifts. A schedule the simulator cannot replay runs
  // at the baseline's times, and `error` (nullable) says why.
  const VersionModel& ModelOf(const v1::ScheduleUpdate& update,
                              std::string* error);
  const VersionModel& Baseline() const { return versions_.at(0); }

 private:
  std::map<int64_t, VersionModel> versions_;
};

// A rank's own small spread (+0..2%), fixed per rank and step.
double Jitter(int rank, int64_t step);

// One rank of a FakeJob. Step and ConnectMessages are called by one thread
// (its driver); OfferSchedule by the session's, at any time.
class FakeRank {
 public:
  FakeRank(FakeJob* job, int rank, std::string incarnation);

  // What a session starts with, as the agent sends on every connect: the
  // hello (the applied schedule version, the next step), the graph report
  // and the newest progress.
  std::vector<v1::WorkerMessage> ConnectMessages() const;

  // A schedule the coordinator sent: taken at the start of its effective
  // step (an older version than one already offered is ignored).
  void OfferSchedule(const v1::ScheduleUpdate& update);

  struct StepReport {
    // In order: ScheduleApplied when the step switched, the progress, and a
    // profile when the step ended a window.
    std::vector<v1::WorkerMessage> messages;
    // The window's last step, when a profile is among them.
    std::optional<int64_t> window_last;
    // Why the switched schedule runs at the baseline's times (empty: it
    // runs as simulated).
    std::string model_error;
  };
  // Runs the next step.
  StepReport Step();

  int rank() const { return rank_; }
  const std::string& incarnation() const { return incarnation_; }
  int64_t next_step() const { return next_step_; }
  int64_t applied_version() const { return applied_version_; }

 private:
  FakeJob* job_;
  int rank_;
  std::string incarnation_;
  int64_t next_step_ = 0;
  int64_t applied_version_ = 0;
  bool unprofiled_ = true;
  int in_window_ = 0;
  int64_t window_first_ = 0;
  std::optional<v1::WorkerMessage> last_progress_;
  // What the applied version runs at (the job's, which keeps it in place);
  // null before the first step: the baseline.
  const VersionModel* model_ = nullptr;
  std::mutex mu_;
  std::optional<v1::ScheduleUpdate> pending_;
};

// One session stream. Writes are queued and sent one at a time; the handler
// sees each message from the coordinator, then the end, on gRPC's threads.
// The stream keeps itself alive until it is done.
class SessionStream final
    : public grpc::ClientBidiReactor<v1::WorkerMessage,
                                     v1::CoordinatorMessage> {
 public:
  struct Handler {
    std::function<void(SessionStream&, const v1::CoordinatorMessage&)>
        on_message;
    // The stream's status; `cancelled`: Cancel() ended it.
    std::function<void(const grpc::Status&, bool cancelled)> on_done;
  };

  // Opens a session on `stub` (which must outlive it) and queues `first`;
  // a non-empty `secret` goes as the tandem-join-secret metadata.
  static std::shared_ptr<SessionStream> Open(
      v1::WorkerService::Stub* stub, const std::string& secret,
      std::vector<v1::WorkerMessage> first, Handler handler);

  // Queues a message; false once the stream is closing.
  bool Send(v1::WorkerMessage message);
  // Sends nothing more after what is queued (the server then ends the
  // stream once it has handled it).
  void HalfClose();
  void Cancel();
  bool done() const { return done_.load(); }
  // Once done.
  grpc::Status status() const;

  // Use Open.
  explicit SessionStream(Handler handler) : handler_(std::move(handler)) {}

 private:
  // Starts the next queued write, or the half-close once none is left.
  // Requires mu_; returns what to start outside it.
  enum class Next { kNothing, kWrite, kWritesDone };
  Next NextLocked();
  void Start(Next next);
  void OnWriteDone(bool ok) override;
  void OnWritesDoneDone(bool ok) override;
  void OnReadDone(bool ok) override;
  void OnDone(const grpc::Status& status) override;
  // Drops the hold once nothing more is written.
  void MaybeReleaseLocked(bool* release);

  Handler handler_;
  std::shared_ptr<SessionStream> self_;
  grpc::ClientContext ctx_;
  mutable std::mutex mu_;
  std::deque<v1::WorkerMessage> out_;
  bool writing_ = false;
  bool closing_ = false;
  bool half_close_ = false;
  bool half_closed_ = false;
  bool released_ = false;
  bool cancelled_ = false;
  grpc::Status status_;
  v1::CoordinatorMessage in_;
  std::atomic<bool> done_{false};
};

}  // namespace tandem

#endif  // TANDEM_BENCH_LOAD_FAKE_WORKER_H_
