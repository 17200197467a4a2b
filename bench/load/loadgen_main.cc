// tandem-loadgen: many fake workers against one real coordinator
// (bench/README.md, "load"). Each fake worker (bench/load/fake_worker.h)
// speaks WorkerService as tandem-worker's agent does (worker/agent/): it
// registers with its job's join secret, holds one session stream,
// heartbeats every second, reports its graph, its progress every step and a
// profile every profile window, switches to each schedule the coordinator
// publishes at its effective step, and reconnects with the same incarnation
// when the stream breaks. The graph is the job's real one and the profiles
// the simulator's replay of the schedule the ranks run, so the coordinator
// validates, aggregates and plans them as it would a real job's.
//
// What it measures, per load (workers across jobs):
//   - heartbeat round trip: a heartbeat, then an empty WorkerMessage, which
//     the coordinator refuses with a MessageRejected on the same stream once
//     it has handled the heartbeat before it; the time from queueing the
//     heartbeat to reading that refusal;
//   - profile to schedule: from the last rank's profile that completes the
//     window a plan was made from (the schedule's provenance names it) to
//     the schedule arriving on the session streams (first rank, all ranks);
//   - the coordinator's CPU and RSS (/proc/<pid>/stat and status);
//   - Submit latency with --fill-jobs jobs in the database, idle and under
//     the load;
//   - restart: SIGKILL the coordinator, start it again (--restart-cmd) on the
//     same database, time until it serves a JobService call and until every
//     fake worker's session is back.
// No libtorch: the proto/gRPC stubs and common/ only.
#include <grpcpp/grpcpp.h>
#include <signal.h>
#include <spawn.h>
#include <sys/types.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <deque>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <queue>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "bench/load/fake_worker.h"
#include "common/flags/command_line.h"
#include "common/flags/flag_checks.h"
#include "common/job/job_spec.h"
#include "common/json_string.h"
#include "tandem/v1/job_service.grpc.pb.h"
#include "tandem/v1/worker_service.grpc.pb.h"

extern char** environ;

ABSL_FLAG(std::string, coordinator, "127.0.0.1:50051",
          "the coordinator's gRPC address, HOST:PORT");
ABSL_FLAG(int, coordinator_pid, 0,
          "the coordinator's process id: its CPU and RSS are read from "
          "/proc (0: not measured; needed for --restart-at-load)");
ABSL_FLAG(std::string, loads, "100,250,500,1000,2000",
          "fake workers per load step, in order");
ABSL_FLAG(std::string, jobs, "",
          "jobs per load step (comma list, one per load); empty: the target's "
          "ratio, 64 jobs per 1000 workers (at least 1)");
ABSL_FLAG(double, settle_s, 10,
          "seconds after every session is open before measuring (the first "
          "plans land in it)");
ABSL_FLAG(double, duration_s, 60, "seconds measured per load step");
ABSL_FLAG(double, step_s, 1.0,
          "seconds per training step of the fake jobs (progress every step)");
ABSL_FLAG(double, heartbeat_s, 1.0, "seconds between heartbeats (the agent's)");
ABSL_FLAG(int, probe_every, 1,
          "follow every N-th heartbeat with the round-trip probe");
ABSL_FLAG(int, layers, 2, "the fake jobs' llama layers (d_model 64)");
ABSL_FLAG(bool, distinct_specs, true,
          "give each job its own memory.budget_bytes so that no job reuses "
          "another's plan (the plan cache): every job plans");
ABSL_FLAG(int, fill_jobs, 1000,
          "jobs submitted (and cancelled) before the loads, so that Submit "
          "is measured with that many in the database");
ABSL_FLAG(int, submit_samples, 200,
          "Submit calls timed after the fill (each job cancelled after)");
ABSL_FLAG(int, submit_under_load, 20,
          "Submit calls timed during each load's measured window");
ABSL_FLAG(int, restart_at_load, 1000,
          "SIGKILL and restart the coordinator during this load step (0: "
          "never); needs --coordinator-pid and --restart-cmd");
ABSL_FLAG(std::string, restart_cmd, "",
          "shell command that starts the coordinator again on the same "
          "database and address, run with /bin/sh -c (start it with `exec` "
          "so that the shell's pid is the coordinator's)");
ABSL_FLAG(std::string, pid_file, "",
          "write the restarted coordinator's pid here");
ABSL_FLAG(double, post_restart_s, 20,
          "seconds measured after every session is back from the restart");
ABSL_FLAG(double, p99_limit_s, 1.0,
          "a load passes when the steady heartbeat p99 is under this, every "
          "session stayed open and no job failed");
ABSL_FLAG(bool, stop_on_miss, true, "skip the loads after the first miss");
ABSL_FLAG(int, register_threads, 8, "threads registering fake workers");
ABSL_FLAG(std::string, out, "", "write the results here as JSON");
ABSL_FLAG(std::string, db, "",
          "the coordinator's database file: its size (with its WAL) is "
          "reported after each phase");
ABSL_FLAG(std::string, note, "",
          "free text for the results (e.g. the coordinator's commit)");

namespace tandem {
namespace {

using Clock = std::chrono::steady_clock;
const Clock::time_point kStart = Clock::now();

double Now() {
  return std::chrono::duration<double>(Clock::now() - kStart).count();
}

// ---------------------------------------------------------------------------
// Statistics.

struct Summary {
  size_t n = 0;
  double p50 = 0, p90 = 0, p99 = 0, max = 0, mean = 0;
};

// Nearest-rank percentiles.
Summary Summarize(std::vector<double> v) {
  Summary s;
  s.n = v.size();
  if (v.empty()) return s;
  std::sort(v.begin(), v.end());
  auto at = [&](double p) {
    size_t k = static_cast<size_t>(std::ceil(p / 100.0 * v.size()));
    return v[std::min(v.size() - 1, k == 0 ? 0 : k - 1)];
  };
  s.p50 = at(50);
  s.p90 = at(90);
  s.p99 = at(99);
  s.max = v.back();
  double sum = 0;
  for (double x : v) sum += x;
  s.mean = sum / v.size();
  return s;
}

// Milliseconds, from seconds.
std::string JsonMs(const Summary& s) {
  return absl::StrFormat(
      "{\"n\": %d, \"p50\": %.3f, \"p90\": %.3f, \"p99\": %.3f, \"max\": "
      "%.3f, \"mean\": %.3f}",
      s.n, s.p50 * 1e3, s.p90 * 1e3, s.p99 * 1e3, s.max * 1e3, s.mean * 1e3);
}

std::string MsText(const Summary& s) {
  if (s.n == 0) return "n=0";
  return absl::StrFormat("p50 %.1f ms, p99 %.1f ms, max %.1f ms (n=%d)",
                         s.p50 * 1e3, s.p99 * 1e3, s.max * 1e3, s.n);
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// utime + stime of a process, seconds; -1 when it is gone.
double CpuSeconds(int pid) {
  const std::string stat = ReadFile(
      pid == 0 ? "/proc/self/stat" : absl::StrCat("/proc/", pid, "/stat"));
  const size_t paren = stat.rfind(')');
  if (paren == std::string::npos) return -1;
  std::vector<std::string> f =
      absl::StrSplit(stat.substr(paren + 2), ' ', absl::SkipEmpty());
  // After the name: state is field 3, utime 14 and stime 15 (1-based).
  if (f.size() < 13) return -1;
  int64_t utime = 0, stime = 0;
  if (!absl::SimpleAtoi(f[11], &utime) || !absl::SimpleAtoi(f[12], &stime)) {
    return -1;
  }
  return static_cast<double>(utime + stime) / sysconf(_SC_CLK_TCK);
}

// A field of /proc/<pid>/status in kB (VmRSS, VmHWM) or a count (Threads).
int64_t StatusField(int pid, const std::string& name) {
  const std::string status = ReadFile(absl::StrCat("/proc/", pid, "/status"));
  for (absl::string_view line : absl::StrSplit(status, '\n')) {
    if (absl::ConsumePrefix(&line, name) && absl::ConsumePrefix(&line, ":")) {
      std::vector<std::string> parts =
          absl::StrSplit(line, ' ', absl::SkipEmpty());
      int64_t v = 0;
      for (const std::string& p : parts) {
        std::string t(absl::StripAsciiWhitespace(p));
        if (absl::SimpleAtoi(t, &v)) return v;
      }
    }
  }
  return -1;
}

// The database with its WAL, MB; -1 without --db.
double DatabaseMb() {
  const std::string db = absl::GetFlag(FLAGS_db);
  if (db.empty()) return -1;
  int64_t bytes = 0;
  for (const std::string& f : {db, db + "-wal", db + "-shm"}) {
    std::ifstream in(f, std::ios::binary | std::ios::ate);
    if (in) bytes += static_cast<int64_t>(in.tellg());
  }
  return bytes / 1048576.0;
}

bool ProcessAlive(int pid) {
  if (pid <= 0 || kill(pid, 0) != 0) return false;
  const std::string stat = ReadFile(absl::StrCat("/proc/", pid, "/stat"));
  const size_t paren = stat.rfind(')');
  // A zombie has closed its sockets already.
  return paren != std::string::npos && paren + 2 < stat.size() &&
         stat[paren + 2] != 'Z' && stat[paren + 2] != 'X';
}

std::string LoadAverage() {
  std::vector<std::string> f =
      absl::StrSplit(ReadFile("/proc/loadavg"), ' ', absl::SkipEmpty());
  if (f.size() < 3) return "[]";
  return absl::StrCat("[", f[0], ", ", f[1], ", ", f[2], "]");
}

// ---------------------------------------------------------------------------
// Jobs and their models.

// A job its fake workers run (bench/load/fake_worker.h), and when its
// schedules reached them.
struct Job : FakeJob {
  int index = 0;
  double t0 = 0;  // step 0 starts

  std::mutex mu;
  // Profile window (last iteration) -> when its latest rank report was
  // queued, and how many ranks reported it.
  std::map<int64_t, std::pair<double, int>> window_sent;
  struct Arrival {
    std::string reason;
    int64_t window_last = -1;
    double window_sent = -1;
    int window_ranks = 0;
    double first = -1;
    double last = -1;
    std::set<int> ranks;
  };
  std::map<int64_t, Arrival> arrivals;  // by schedule version
};

v1::JobSpec LoadSpec(const std::string& name, int world, int64_t budget) {
  v1::JobSpec spec;
  spec.set_name(name);
  spec.mutable_model()->set_preset("llama");
  spec.mutable_model()->set_layers(absl::GetFlag(FLAGS_layers));
  spec.mutable_model()->set_d_model(64);
  spec.mutable_model()->set_heads(4);
  spec.mutable_model()->set_ffn(128);
  spec.mutable_model()->set_vocab(256);
  spec.mutable_batch()->set_micro_batch(2);
  spec.mutable_batch()->set_seq_len(32);
  spec.mutable_train()->set_steps(1000000000);
  spec.mutable_parallel()->set_world_size(world);
  spec.mutable_optimize()->set_warmup_steps(3);
  spec.mutable_memory()->set_budget_bytes(budget);
  return spec;
}

// ---------------------------------------------------------------------------
// Fake workers.

// A fake worker process: its rank (FakeRank), its connection and its
// session, with what the load measures of them.
struct Worker {
  Worker(Job* j, int rank, std::string incarnation)
      : job(j), fake(j, rank, std::move(incarnation)) {}
  int index = 0;
  Job* job;
  FakeRank fake;
  std::string hostname;
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<v1::WorkerService::Stub> stub;

  // The driver thread's.
  std::shared_ptr<SessionStream> session;
  bool stopped = false;
  int64_t heartbeats = 0;
  double retry_s = 0.25;

  // Shared with the stream's callbacks.
  std::mutex mu;
  // The newest session's probes in flight: when each was queued, and
  // whether it followed a heartbeat (each is an empty message, refused).
  struct Probe {
    double t;
    bool heartbeat;
  };
  std::deque<Probe> probes;
  bool confirmed = false;
  std::atomic<bool> stop_command{false};
  // When the newest session was confirmed (its first refusal came back);
  // -1 before any.
  std::atomic<double> confirmed_at{-1};
  std::atomic<bool> live{false};
};

// What every stream reports, for the current load step.
struct Recorder {
  // 0 ramp, 1 steady, 2 restart, 3 after the restart, 4 draining.
  std::atomic<int> phase{0};
  std::mutex mu;
  std::vector<double> rtt[5];
  std::map<std::string, int64_t> rejected;
  std::map<std::string, std::string> rejected_sample;
  std::map<std::string, int64_t> commands;
  std::map<std::string, int64_t> closed;  // by status code, not ours
  std::map<std::string, std::string> closed_sample;
  int64_t connects = 0;
  int64_t schedules = 0;

  void Reset() {
    std::lock_guard<std::mutex> lock(mu);
    for (auto& v : rtt) v.clear();
    rejected.clear();
    rejected_sample.clear();
    commands.clear();
    closed.clear();
    closed_sample.clear();
    connects = 0;
    schedules = 0;
  }
};

const char* CodeName(grpc::StatusCode code) {
  switch (code) {
    case grpc::StatusCode::OK:
      return "OK";
    case grpc::StatusCode::CANCELLED:
      return "CANCELLED";
    case grpc::StatusCode::UNKNOWN:
      return "UNKNOWN";
    case grpc::StatusCode::INVALID_ARGUMENT:
      return "INVALID_ARGUMENT";
    case grpc::StatusCode::DEADLINE_EXCEEDED:
      return "DEADLINE_EXCEEDED";
    case grpc::StatusCode::NOT_FOUND:
      return "NOT_FOUND";
    case grpc::StatusCode::ALREADY_EXISTS:
      return "ALREADY_EXISTS";
    case grpc::StatusCode::PERMISSION_DENIED:
      return "PERMISSION_DENIED";
    case grpc::StatusCode::RESOURCE_EXHAUSTED:
      return "RESOURCE_EXHAUSTED";
    case grpc::StatusCode::FAILED_PRECONDITION:
      return "FAILED_PRECONDITION";
    case grpc::StatusCode::ABORTED:
      return "ABORTED";
    case grpc::StatusCode::OUT_OF_RANGE:
      return "OUT_OF_RANGE";
    case grpc::StatusCode::UNIMPLEMENTED:
      return "UNIMPLEMENTED";
    case grpc::StatusCode::INTERNAL:
      return "INTERNAL";
    case grpc::StatusCode::UNAVAILABLE:
      return "UNAVAILABLE";
    case grpc::StatusCode::DATA_LOSS:
      return "DATA_LOSS";
    case grpc::StatusCode::UNAUTHENTICATED:
      return "UNAUTHENTICATED";
    default:
      return "?";
  }
}

// What the load records of a message on `w`'s session: a probe's refusal
// (the round trip, after a heartbeat; the first confirms the session), any
// other refusal, a schedule's arrival (when the first rank of its job got
// it, and the last), a command. A stop or restart command ends the
// session, as a real worker finishes its step and exits.
void Record(Worker& w, Recorder& recorder, SessionStream& stream,
            const v1::CoordinatorMessage& m) {
  const double now = Now();
  switch (m.payload_case()) {
    case v1::CoordinatorMessage::kRejected: {
      if (m.rejected().payload() == "empty") {
        std::optional<Worker::Probe> probe;
        {
          std::lock_guard<std::mutex> lock(w.mu);
          if (!w.probes.empty()) {
            probe = w.probes.front();
            w.probes.pop_front();
          }
          if (!w.confirmed) {
            w.confirmed = true;
            w.confirmed_at.store(now);
            w.live.store(true);
          }
        }
        if (probe.has_value() && probe->heartbeat) {
          std::lock_guard<std::mutex> lock(recorder.mu);
          recorder.rtt[recorder.phase.load()].push_back(now - probe->t);
        }
        return;
      }
      std::lock_guard<std::mutex> lock(recorder.mu);
      const std::string& key = m.rejected().payload();
      if (recorder.rejected[key]++ == 0) {
        recorder.rejected_sample[key] = m.rejected().message();
      }
      return;
    }
    case v1::CoordinatorMessage::kSchedule: {
      const v1::ScheduleUpdate& u = m.schedule();
      w.fake.OfferSchedule(u);
      Job& job = *w.job;
      bool first_time = false;
      {
        std::lock_guard<std::mutex> lock(job.mu);
        Job::Arrival& a = job.arrivals[u.schedule().version()];
        if (a.ranks.insert(w.fake.rank()).second) {
          if (a.first < 0) {
            first_time = true;
            a.first = now;
            a.reason = u.schedule().provenance().reason();
            a.window_last = u.schedule().provenance().window_last_iteration();
            auto sent = job.window_sent.find(a.window_last);
            if (sent != job.window_sent.end()) {
              a.window_sent = sent->second.first;
              a.window_ranks = sent->second.second;
            }
          }
          a.last = now;
        }
      }
      if (first_time) {
        std::lock_guard<std::mutex> lock(recorder.mu);
        ++recorder.schedules;
      }
      return;
    }
    case v1::CoordinatorMessage::kCommand: {
      {
        std::lock_guard<std::mutex> lock(recorder.mu);
        ++recorder.commands[v1::Command::Kind_Name(m.command().kind())];
      }
      if (m.command().kind() == v1::Command::KIND_STOP ||
          m.command().kind() == v1::Command::KIND_RESTART) {
        w.stop_command.store(true);
        stream.Cancel();
      }
      return;
    }
    default:
      return;
  }
}

// ---------------------------------------------------------------------------
// The coordinator's process, sampled once a second.

class ProcessSampler {
 public:
  struct Sample {
    double t;
    double cpu_s;  // coordinator utime + stime
    double self_cpu_s;
    int64_t rss_kb;
    int64_t threads;
  };

  explicit ProcessSampler(int pid) : pid_(pid) {
    if (pid_ > 0) thread_ = std::thread([this] { Run(); });
  }
  ~ProcessSampler() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    wake_.notify_all();
    if (thread_.joinable()) thread_.join();
  }
  void SetPid(int pid) { pid_.store(pid); }
  int pid() const { return pid_.load(); }

  // Samples in [from, to].
  std::vector<Sample> Between(double from, double to) const {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<Sample> out;
    for (const Sample& s : samples_) {
      if (s.t >= from && s.t <= to) out.push_back(s);
    }
    return out;
  }

 private:
  void Run() {
    std::unique_lock<std::mutex> lock(mu_);
    while (!stop_) {
      lock.unlock();
      const int pid = pid_.load();
      Sample s{Now(), CpuSeconds(pid), CpuSeconds(0), StatusField(pid, "VmRSS"),
               StatusField(pid, "Threads")};
      lock.lock();
      if (s.cpu_s >= 0) samples_.push_back(s);
      wake_.wait_for(lock, std::chrono::seconds(1), [&] { return stop_; });
    }
  }

  std::atomic<int> pid_;
  mutable std::mutex mu_;
  std::condition_variable wake_;
  bool stop_ = false;
  std::vector<Sample> samples_;
  std::thread thread_;
};

struct ProcessStats {
  double cpu_cores_avg = -1;
  double cpu_cores_max = -1;
  double self_cpu_cores_avg = -1;
  double rss_mb_max = -1;
  double rss_mb_end = -1;
  int64_t threads_max = -1;
};

ProcessStats StatsOf(const std::vector<ProcessSampler::Sample>& s) {
  ProcessStats out;
  if (s.size() < 2) return out;
  const double dt = s.back().t - s.front().t;
  // Across a restart the counter starts again: sum the positive steps.
  double cpu = 0, self = 0;
  out.cpu_cores_max = 0;
  for (size_t i = 1; i < s.size(); ++i) {
    const double d = s[i].cpu_s - s[i - 1].cpu_s;
    if (d > 0) cpu += d;
    const double step = s[i].t - s[i - 1].t;
    if (step > 0 && d > 0) {
      out.cpu_cores_max = std::max(out.cpu_cores_max, d / step);
    }
    self += std::max(0.0, s[i].self_cpu_s - s[i - 1].self_cpu_s);
  }
  out.cpu_cores_avg = dt > 0 ? cpu / dt : -1;
  out.self_cpu_cores_avg = dt > 0 ? self / dt : -1;
  out.rss_mb_max = 0;
  out.threads_max = 0;
  for (const auto& x : s) {
    out.rss_mb_max = std::max(out.rss_mb_max, x.rss_kb / 1024.0);
    out.threads_max = std::max(out.threads_max, x.threads);
  }
  out.rss_mb_end = s.back().rss_kb / 1024.0;
  return out;
}

std::string JsonProcess(const ProcessStats& p) {
  return absl::StrFormat(
      "{\"cpu_cores_avg\": %.3f, \"cpu_cores_max\": %.3f, \"rss_mb_max\": "
      "%.1f, \"rss_mb_end\": %.1f, \"threads_max\": %d, "
      "\"loadgen_cpu_cores_avg\": %.3f}",
      p.cpu_cores_avg, p.cpu_cores_max, p.rss_mb_max, p.rss_mb_end,
      p.threads_max, p.self_cpu_cores_avg);
}

// ---------------------------------------------------------------------------
// The load generator.

std::shared_ptr<grpc::Channel> WorkerChannel(const std::string& address) {
  grpc::ChannelArguments args;
  // The agent's (worker/agent/grpc_coordinator_client.cc).
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 500);
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetMaxReceiveMessageSize(64 << 20);
  // Each worker is its own process with its own connection: no subchannel
  // shared between these channels.
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  return grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(),
                                   args);
}

class Loadgen {
 public:
  explicit Loadgen(std::string address, int pid)
      : address_(std::move(address)), sampler_(pid) {
    grpc::ChannelArguments args;
    // Backoff only: the minimum "backoff" is gRPC's connect timeout, which
    // stays at its 20 s default (worker/agent/grpc_coordinator_client.cc).
    args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 50);
    args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 20);
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    args.SetMaxReceiveMessageSize(64 << 20);
    client_channel_ = grpc::CreateCustomChannel(
        address_, grpc::InsecureChannelCredentials(), args);
    jobs_stub_ = v1::JobService::NewStub(client_channel_);
  }

  int Run();

 private:
  // Submit with a deadline; latency in seconds.
  absl::StatusOr<v1::SubmitJobResponse> Submit(const v1::JobSpec& spec,
                                               double* latency) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() +
                     std::chrono::seconds(30));
    v1::SubmitJobRequest req;
    *req.mutable_spec() = spec;
    v1::SubmitJobResponse resp;
    const double t = Now();
    grpc::Status s = jobs_stub_->Submit(&ctx, req, &resp);
    if (latency != nullptr) *latency = Now() - t;
    if (!s.ok()) {
      return absl::Status(static_cast<absl::StatusCode>(s.error_code()),
                          s.error_message());
    }
    return resp;
  }
  grpc::Status Cancel(const std::string& id, const std::string& reason) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() +
                     std::chrono::seconds(30));
    v1::CancelJobRequest req;
    req.set_job_id(id);
    req.set_reason(reason);
    v1::CancelJobResponse resp;
    return jobs_stub_->Cancel(&ctx, req, &resp);
  }

  std::string SubmitPhase();
  std::string LoadStep(int workers, int njobs, bool restart, bool* pass,
                       bool* fatal);
  std::string RestartPhase(std::vector<std::unique_ptr<Worker>>& workers,
                           std::vector<std::unique_ptr<Job>>& jobs);

  // The driver: heartbeats, steps, reconnects.
  void StartDriver(std::vector<std::unique_ptr<Worker>>* workers);
  void StopDriver();
  void DriverLoop();
  void Connect(Worker& w);
  void Heartbeat(Worker& w);
  void Step(Worker& w);
  void SessionDone(Worker* w) {
    {
      std::lock_guard<std::mutex> lock(driver_mu_);
      done_queue_.push_back(w);
    }
    driver_wake_.notify_all();
  }
  bool Deliver(Worker& w, v1::WorkerMessage m) {
    if (w.session == nullptr || w.session->done()) return false;
    return w.session->Send(std::move(m));
  }

  const std::string address_;
  std::shared_ptr<grpc::Channel> client_channel_;
  std::unique_ptr<v1::JobService::Stub> jobs_stub_;
  ProcessSampler sampler_;
  Recorder recorder_;
  std::atomic<int> open_sessions_{0};
  int jobs_submitted_ = 0;
  int load_index_ = 0;

  // Driver state.
  struct Event {
    double t;
    int worker;
    int kind;  // 0 heartbeat, 1 step, 2 reconnect
    bool operator>(const Event& o) const { return t > o.t; }
  };
  std::vector<std::unique_ptr<Worker>>* workers_ = nullptr;
  std::mutex driver_mu_;
  std::condition_variable driver_wake_;
  std::vector<Worker*> done_queue_;
  std::atomic<bool> driver_stop_{false};
  std::atomic<bool> draining_{false};
  std::thread driver_;
  std::priority_queue<Event, std::vector<Event>, std::greater<Event>> events_;
  std::mutex lag_mu_;
  std::vector<double> lag_;  // how late the driver ran events, steady phase
};

void Loadgen::StartDriver(std::vector<std::unique_ptr<Worker>>* workers) {
  workers_ = workers;
  driver_stop_ = false;
  draining_ = false;
  events_ = {};
  done_queue_.clear();
  driver_ = std::thread([this] { DriverLoop(); });
}

void Loadgen::StopDriver() {
  driver_stop_ = true;
  driver_wake_.notify_all();
  if (driver_.joinable()) driver_.join();
}

void Loadgen::Connect(Worker& w) {
  std::vector<v1::WorkerMessage> first = w.fake.ConnectMessages();
  first.emplace_back();  // the confirming probe
  {
    std::lock_guard<std::mutex> lock(w.mu);
    w.probes.clear();
    w.probes.push_back({Now(), false});
    w.confirmed = false;
  }
  open_sessions_.fetch_add(1);
  SessionStream::Handler handler;
  handler.on_message = [this, &w](SessionStream& stream,
                                  const v1::CoordinatorMessage& m) {
    Record(w, recorder_, stream, m);
  };
  handler.on_done = [this, &w](const grpc::Status& status, bool cancelled) {
    if (!cancelled) {
      std::lock_guard<std::mutex> lock(recorder_.mu);
      const std::string code = CodeName(status.error_code());
      if (recorder_.closed[code]++ == 0) {
        recorder_.closed_sample[code] = status.error_message();
      }
    }
    w.live.store(false);
    SessionDone(&w);
    open_sessions_.fetch_sub(1);
  };
  w.session = SessionStream::Open(w.stub.get(), w.job->secret, std::move(first),
                                  std::move(handler));
}

void Loadgen::Heartbeat(Worker& w) {
  if (w.session == nullptr || w.session->done()) return;
  v1::WorkerMessage hb;
  hb.mutable_heartbeat()->set_time_unix_s(
      absl::ToDoubleSeconds(absl::Now() - absl::UnixEpoch()));
  const int every = std::max(1, absl::GetFlag(FLAGS_probe_every));
  const bool probe = w.heartbeats++ % every == 0;
  if (probe) {
    std::lock_guard<std::mutex> lock(w.mu);
    w.probes.push_back({Now(), true});
  }
  // The probe, an empty message, right after the heartbeat: its refusal
  // comes back once the coordinator has handled the heartbeat.
  if (w.session->Send(std::move(hb)) && probe) {
    w.session->Send(v1::WorkerMessage());
  }
}

void Loadgen::Step(Worker& w) {
  Job& job = *w.job;
  FakeRank::StepReport report = w.fake.Step();
  if (!report.model_error.empty()) {
    std::fprintf(stderr, "tandem-loadgen: job %s v%lld: %s\n", job.id.c_str(),
                 static_cast<long long>(w.fake.applied_version()),
                 report.model_error.c_str());
  }
  for (v1::WorkerMessage& m : report.messages) {
    const bool profile = m.has_profile();
    if (Deliver(w, std::move(m)) && profile) {
      std::lock_guard<std::mutex> lock(job.mu);
      auto& [t, ranks] = job.window_sent[*report.window_last];
      t = std::max(t, Now());
      ++ranks;
    }
  }
}

void Loadgen::DriverLoop() {
  std::vector<std::unique_ptr<Worker>>& workers = *workers_;
  for (;;) {
    std::vector<Worker*> done;
    {
      std::unique_lock<std::mutex> lock(driver_mu_);
      const double now = Now();
      double wait = 0.05;
      if (!events_.empty()) wait = std::min(wait, events_.top().t - now);
      if (wait > 0 && done_queue_.empty() && !driver_stop_) {
        driver_wake_.wait_for(
            lock, std::chrono::microseconds(static_cast<int64_t>(wait * 1e6)));
      }
      if (driver_stop_) return;
      done.swap(done_queue_);
    }
    const double now = Now();
    for (Worker* w : done) {
      if (w->stopped || draining_) continue;
      if (w->stop_command.load()) {
        w->stopped = true;
        continue;
      }
      const grpc::StatusCode code = w->session != nullptr
                                        ? w->session->status().error_code()
                                        : grpc::StatusCode::OK;
      // What no reconnect can fix ends the worker (the agent's rule).
      if (code == grpc::StatusCode::PERMISSION_DENIED ||
          code == grpc::StatusCode::UNAUTHENTICATED ||
          code == grpc::StatusCode::NOT_FOUND) {
        w->stopped = true;
        continue;
      }
      // The agent's: 250 ms after a session that worked, then 500 ms.
      bool confirmed;
      {
        std::lock_guard<std::mutex> lock(w->mu);
        confirmed = w->confirmed;
      }
      if (w->session != nullptr && confirmed) w->retry_s = 0.25;
      events_.push({now + w->retry_s, w->index, 2});
      w->retry_s = 0.5;
    }
    const bool steady = recorder_.phase.load() == 1;
    while (!events_.empty() && events_.top().t <= Now()) {
      const Event e = events_.top();
      events_.pop();
      Worker& w = *workers[e.worker];
      if (steady) {
        std::lock_guard<std::mutex> lock(lag_mu_);
        lag_.push_back(Now() - e.t);
      }
      if (e.kind == 0) {
        if (w.stopped || draining_) continue;
        Heartbeat(w);
        double next = e.t + absl::GetFlag(FLAGS_heartbeat_s);
        if (next < Now()) next = Now() + absl::GetFlag(FLAGS_heartbeat_s);
        events_.push({next, e.worker, 0});
      } else if (e.kind == 1) {
        if (w.stopped || draining_) continue;
        Step(w);
        // The job's clock, not the driver's: the ranks stay in step.
        events_.push(
            {w.job->t0 + w.fake.next_step() * absl::GetFlag(FLAGS_step_s),
             e.worker, 1});
      } else {
        if (w.stopped || draining_) continue;
        if (w.session != nullptr && !w.session->done()) continue;
        {
          std::lock_guard<std::mutex> lock(recorder_.mu);
          ++recorder_.connects;
        }
        Connect(w);
      }
    }
  }
}

std::string Loadgen::SubmitPhase() {
  const int fill = absl::GetFlag(FLAGS_fill_jobs);
  const int samples = absl::GetFlag(FLAGS_submit_samples);
  std::vector<double> fill_lat, lat, cancel_lat;
  std::vector<std::string> ids;
  int failures = 0;
  std::string first_error;
  std::fprintf(stderr,
               "tandem-loadgen: submitting %d jobs to fill the database\n",
               fill);
  const int pid = sampler_.pid();
  const int64_t rss_before = pid > 0 ? StatusField(pid, "VmRSS") : -1;
  const double db_before = DatabaseMb();
  const v1::JobSpec spec = LoadSpec("load-fill", 2, 0);
  for (int i = 0; i < fill + samples; ++i) {
    v1::JobSpec s = spec;
    s.set_name(absl::StrCat(i < fill ? "load-fill-" : "load-sample-", i));
    double latency = 0;
    absl::StatusOr<v1::SubmitJobResponse> r = Submit(s, &latency);
    if (!r.ok()) {
      if (failures++ == 0) first_error = std::string(r.status().message());
      continue;
    }
    ++jobs_submitted_;
    (i < fill ? fill_lat : lat).push_back(latency);
    ids.push_back(r->job().id());
    // Ended jobs in the database, as a coordinator's history would hold
    // (and under any limit on jobs not yet ended).
    const double t = Now();
    grpc::Status c = Cancel(r->job().id(), "tandem-loadgen: database fill");
    cancel_lat.push_back(Now() - t);
    if (!c.ok() && failures++ == 0) first_error = c.error_message();
  }
  auto slice = [](const std::vector<double>& v, size_t from, size_t to) {
    return std::vector<double>(v.begin() + std::min(from, v.size()),
                               v.begin() + std::min(to, v.size()));
  };
  const Summary first100 = Summarize(slice(fill_lat, 0, 100));
  const Summary last100 = Summarize(
      slice(fill_lat, fill_lat.size() > 100 ? fill_lat.size() - 100 : 0,
            fill_lat.size()));
  const Summary measured = Summarize(lat);
  std::fprintf(stderr,
               "tandem-loadgen: Submit with %d jobs in the database: %s "
               "(the fill's first 100: %s)\n",
               fill, MsText(measured).c_str(), MsText(first100).c_str());
  const int64_t rss_after = pid > 0 ? StatusField(pid, "VmRSS") : -1;
  return absl::StrFormat(
      "{\"coordinator_rss_mb_before\": %.1f, \"coordinator_rss_mb_after\": "
      "%.1f, \"db_mb_before\": %.2f, \"db_mb_after\": %.2f, "
      "\"fill_jobs\": %d, \"jobs_in_db_before_samples\": %d, "
      "\"fill_first100_ms\": %s, \"fill_last100_ms\": %s, \"latency_ms\": %s, "
      "\"cancel_ms\": %s, \"failures\": %d, \"first_error\": %s}",
      rss_before / 1024.0, rss_after / 1024.0, db_before, DatabaseMb(), fill,
      static_cast<int>(fill_lat.size()), JsonMs(first100), JsonMs(last100),
      JsonMs(measured), JsonMs(Summarize(cancel_lat)), failures,
      JsonString(first_error));
}

std::string Loadgen::RestartPhase(std::vector<std::unique_ptr<Worker>>& workers,
                                  std::vector<std::unique_ptr<Job>>& jobs) {
  const int old_pid = sampler_.pid();
  const std::string cmd = absl::GetFlag(FLAGS_restart_cmd);
  recorder_.phase = 2;
  int64_t connects_before;
  {
    std::lock_guard<std::mutex> lock(recorder_.mu);
    connects_before = recorder_.connects;
  }
  std::fprintf(stderr, "tandem-loadgen: SIGKILL coordinator %d\n", old_pid);
  const double t_kill = Now();
  kill(old_pid, SIGKILL);
  while (ProcessAlive(old_pid) && Now() - t_kill < 10) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  const double t_dead = Now();
  pid_t pid = 0;
  const char* argv[] = {"/bin/sh", "-c", cmd.c_str(), nullptr};
  const double t_start = Now();
  if (posix_spawn(&pid, "/bin/sh", nullptr, nullptr,
                  const_cast<char* const*>(argv), environ) != 0) {
    return absl::StrFormat("{\"error\": %s}",
                           JsonString("posix_spawn of --restart-cmd failed"));
  }
  sampler_.SetPid(pid);
  if (!absl::GetFlag(FLAGS_pid_file).empty()) {
    std::ofstream(absl::GetFlag(FLAGS_pid_file)) << pid << "\n";
  }
  // Serving: a JobService call answers.
  double t_serve = -1;
  std::string last_error;
  while (Now() - t_start < 120) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() +
                     std::chrono::milliseconds(250));
    ctx.set_wait_for_ready(true);
    v1::ListJobsRequest req;
    req.set_limit(1);
    v1::ListJobsResponse resp;
    grpc::Status s = jobs_stub_->List(&ctx, req, &resp);
    if (s.ok()) {
      t_serve = Now();
      break;
    }
    last_error = s.error_message();
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  // Every fake worker's session back (confirmed after the kill), except
  // those stopped (their job ended).
  double t_back = -1;
  int back = 0, expected = 0;
  while (Now() - t_start < 120) {
    back = 0;
    expected = 0;
    for (auto& w : workers) {
      if (w->stop_command.load()) continue;
      ++expected;
      if (w->confirmed_at.load() > t_kill) ++back;
    }
    if (back == expected) {
      t_back = Now();
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  int64_t attempts;
  {
    std::lock_guard<std::mutex> lock(recorder_.mu);
    attempts = recorder_.connects - connects_before;
  }
  std::fprintf(stderr,
               "tandem-loadgen: restarted as %d: serving after %.3f s, "
               "%d/%d sessions back after %.3f s\n",
               pid, t_serve - t_start, back, expected,
               t_back > 0 ? t_back - t_start : -1.0);
  // The load after the restart.
  recorder_.phase = 3;
  const double t_post = Now();
  std::this_thread::sleep_for(
      std::chrono::duration<double>(absl::GetFlag(FLAGS_post_restart_s)));
  std::vector<double> rtt;
  {
    std::lock_guard<std::mutex> lock(recorder_.mu);
    rtt = recorder_.rtt[3];
  }
  const ProcessStats after = StatsOf(sampler_.Between(t_post, Now()));
  int failed = 0;
  for (auto& j : jobs) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() +
                     std::chrono::seconds(10));
    v1::GetJobRequest req;
    req.set_job_id(j->id);
    v1::GetJobResponse resp;
    if (jobs_stub_->Get(&ctx, req, &resp).ok() &&
        resp.job().state() != v1::JOB_STATE_RUNNING) {
      ++failed;
    }
  }
  recorder_.phase = 1;
  return absl::StrFormat(
      "{\"old_pid\": %d, \"new_pid\": %d, \"kill_to_exit_s\": %.3f, "
      "\"start_to_serving_s\": %.3f, \"start_to_all_sessions_s\": %.3f, "
      "\"kill_to_all_sessions_s\": %.3f, \"sessions_back\": %d, "
      "\"sessions_expected\": %d, \"session_attempts\": %d, "
      "\"jobs_not_running_after\": %d, "
      "\"heartbeat_rtt_after_ms\": %s, \"coordinator_after\": %s, "
      "\"last_error_before_serving\": %s}",
      old_pid, pid, t_dead - t_kill, t_serve > 0 ? t_serve - t_start : -1.0,
      t_back > 0 ? t_back - t_start : -1.0, t_back > 0 ? t_back - t_kill : -1.0,
      back, expected, attempts, failed, JsonMs(Summarize(rtt)),
      JsonProcess(after), JsonString(last_error));
}

std::string Loadgen::LoadStep(int nworkers, int njobs, bool restart, bool* pass,
                              bool* fatal) {
  ++load_index_;
  recorder_.Reset();
  recorder_.phase = 0;
  {
    std::lock_guard<std::mutex> lock(lag_mu_);
    lag_.clear();
  }
  const std::string loadavg_start = LoadAverage();
  std::fprintf(stderr, "tandem-loadgen: load %d: %d workers across %d jobs\n",
               load_index_, nworkers, njobs);
  // Jobs: world sizes differ by at most one.
  std::vector<std::unique_ptr<Job>> jobs;
  std::string error;
  for (int j = 0; j < njobs; ++j) {
    const int world = nworkers / njobs + (j < nworkers % njobs ? 1 : 0);
    const int64_t budget = absl::GetFlag(FLAGS_distinct_specs)
                               ? (int64_t{40} << 30) +
                                     (int64_t{load_index_} << 30) +
                                     (int64_t{j} << 20)
                               : 0;
    v1::JobSpec spec =
        LoadSpec(absl::StrCat("load-w", nworkers, "-j", j), world, budget);
    double latency = 0;
    absl::StatusOr<v1::SubmitJobResponse> r = Submit(spec, &latency);
    if (!r.ok()) {
      error =
          absl::StrCat("submit of job ", j, " failed: ", r.status().message());
      break;
    }
    ++jobs_submitted_;
    auto job = std::make_unique<Job>();
    job->index = j;
    job->id = r->job().id();
    job->secret = r->join_secret();
    job->spec = r->job().spec();
    if (absl::Status s = job->Prepare(); !s.ok()) {
      error = absl::StrCat("job ", j, ": ", s.message());
      break;
    }
    jobs.push_back(std::move(job));
  }
  if (!error.empty()) {
    *pass = false;
    *fatal = true;
    std::fprintf(stderr, "tandem-loadgen: %s\n", error.c_str());
    return absl::StrFormat("{\"workers\": %d, \"jobs\": %d, \"error\": %s}",
                           nworkers, njobs, JsonString(error));
  }
  std::vector<std::unique_ptr<Worker>> workers;
  std::mt19937_64 rng(1234 + load_index_);
  for (auto& job : jobs) {
    for (int r = 0; r < job->world; ++r) {
      auto w = std::make_unique<Worker>(job.get(), r,
                                        absl::StrFormat("%016x", rng()));
      w->index = static_cast<int>(workers.size());
      w->hostname =
          absl::StrCat("lg", load_index_, "-j", job->index, "-n", r / 8);
      w->channel = WorkerChannel(address_);
      w->stub = v1::WorkerService::NewStub(w->channel);
      workers.push_back(std::move(w));
    }
  }
  // Register, from a few threads (each worker process registers on its
  // own; these calls are unary).
  const double t_ramp = Now();
  std::atomic<size_t> next{0};
  std::mutex reg_mu;
  std::vector<double> reg_lat;
  std::map<std::string, int> reg_errors;
  std::string reg_error_sample;
  std::vector<std::thread> pool;
  for (int t = 0; t < std::max(1, absl::GetFlag(FLAGS_register_threads)); ++t) {
    pool.emplace_back([&] {
      for (size_t i = next++; i < workers.size(); i = next++) {
        Worker& w = *workers[i];
        v1::RegisterRequest req;
        req.set_job_id(w.job->id);
        req.set_incarnation(w.fake.incarnation());
        req.set_hostname(w.hostname);
        req.set_requested_rank(w.fake.rank());
        req.set_device(absl::StrCat("cuda:", w.fake.rank() % 8));
        req.set_device_memory_bytes(int64_t{80} << 30);
        grpc::Status s;
        double latency = 0;
        for (int attempt = 0; attempt < 20; ++attempt) {
          grpc::ClientContext ctx;
          ctx.set_deadline(std::chrono::system_clock::now() +
                           std::chrono::seconds(30));
          ctx.AddMetadata("tandem-join-secret", w.job->secret);
          v1::RegisterResponse resp;
          const double t = Now();
          s = w.stub->Register(&ctx, req, &resp);
          latency = Now() - t;
          if (s.error_code() != grpc::StatusCode::UNAVAILABLE) break;
          std::this_thread::sleep_for(std::chrono::milliseconds(200));
        }
        std::lock_guard<std::mutex> lock(reg_mu);
        if (s.ok()) {
          reg_lat.push_back(latency);
        } else {
          if (reg_errors[CodeName(s.error_code())]++ == 0) {
            reg_error_sample = s.error_message();
          }
          w.stopped = true;
        }
      }
    });
  }
  for (auto& t : pool) t.join();
  const double t_registered = Now();
  // Sessions, heartbeats and the jobs' clocks.
  std::uniform_real_distribution<double> phase(0, 1);
  for (auto& job : jobs) {
    job->t0 = Now() + 1.0 + absl::GetFlag(FLAGS_step_s) * phase(rng);
  }
  StartDriver(&workers);
  {
    std::lock_guard<std::mutex> lock(driver_mu_);
    // Connect everyone now (the driver has not run an event yet).
    for (auto& w : workers) {
      if (w->stopped) continue;
      events_.push({Now(), w->index, 2});
      events_.push({Now() + 0.5 + absl::GetFlag(FLAGS_heartbeat_s) * phase(rng),
                    w->index, 0});
      events_.push({w->job->t0, w->index, 1});
    }
  }
  driver_wake_.notify_all();
  // Every session confirmed.
  double t_all = -1;
  int confirmed = 0, expected = 0;
  while (Now() - t_registered < 120) {
    confirmed = 0;
    expected = 0;
    for (auto& w : workers) {
      if (w->stopped) continue;
      ++expected;
      confirmed += w->confirmed_at.load() > 0;
    }
    if (confirmed == expected) {
      t_all = Now();
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  std::fprintf(stderr,
               "tandem-loadgen: %d workers registered in %.2f s, %d/%d "
               "sessions open after %.2f s\n",
               static_cast<int>(reg_lat.size()), t_registered - t_ramp,
               confirmed, expected, Now() - t_ramp);
  std::this_thread::sleep_for(
      std::chrono::duration<double>(absl::GetFlag(FLAGS_settle_s)));
  // The measured window.
  recorder_.phase = 1;
  const double t_measure = Now();
  const double duration = absl::GetFlag(FLAGS_duration_s);
  const int under_load = absl::GetFlag(FLAGS_submit_under_load);
  std::vector<double> submit_lat;
  for (int i = 0; i < under_load; ++i) {
    const double at = t_measure + duration * (i + 0.5) / under_load;
    while (Now() < at)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    double latency = 0;
    absl::StatusOr<v1::SubmitJobResponse> r = Submit(
        LoadSpec(absl::StrCat("load-submit-", load_index_, "-", i), 2, 0),
        &latency);
    if (r.ok()) {
      ++jobs_submitted_;
      submit_lat.push_back(latency);
      (void)Cancel(r->job().id(), "tandem-loadgen: submit under load");
    }
  }
  while (Now() < t_measure + duration) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  const double t_end = Now();
  recorder_.phase = 4;
  const ProcessStats proc = StatsOf(sampler_.Between(t_measure, t_end));
  std::vector<double> rtt_steady, rtt_ramp;
  std::map<std::string, int64_t> rejected, commands, closed;
  std::map<std::string, std::string> rejected_sample, closed_sample;
  int64_t reconnects;
  {
    std::lock_guard<std::mutex> lock(recorder_.mu);
    rtt_steady = recorder_.rtt[1];
    rtt_ramp = recorder_.rtt[0];
    reconnects = recorder_.connects - static_cast<int64_t>(reg_lat.size());
  }
  int live_end = 0, expected_end = 0;
  for (auto& w : workers) {
    if (w->stopped || w->stop_command.load()) continue;
    ++expected_end;
    live_end += w->live.load();
  }
  std::vector<double> lag;
  {
    std::lock_guard<std::mutex> lock(lag_mu_);
    lag.swap(lag_);
  }
  std::string restart_json = "null";
  if (restart) restart_json = RestartPhase(workers, jobs);
  recorder_.phase = 4;
  // The jobs as the coordinator sees them.
  std::map<std::string, int> states;
  std::vector<std::string> job_errors;
  int workers_connected = 0;
  std::map<int64_t, int> versions;
  for (auto& j : jobs) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() +
                     std::chrono::seconds(10));
    v1::GetJobRequest req;
    req.set_job_id(j->id);
    v1::GetJobResponse resp;
    grpc::Status s = jobs_stub_->Get(&ctx, req, &resp);
    if (!s.ok()) {
      ++states[absl::StrCat("get:", CodeName(s.error_code()))];
      continue;
    }
    ++states[v1::JobState_Name(resp.job().state())];
    ++versions[resp.job().schedule_version()];
    if (!resp.job().error().empty() && job_errors.size() < 5) {
      job_errors.push_back(absl::StrCat(j->id, ": ", resp.job().error()));
    }
    for (const v1::WorkerStatus& ws : resp.workers()) {
      workers_connected += ws.connected();
    }
  }
  // Schedules: profile window -> arrival.
  std::vector<double> to_first, to_all;
  std::map<std::string, int> reasons;
  int jobs_planned = 0;
  for (auto& j : jobs) {
    std::lock_guard<std::mutex> lock(j->mu);
    if (!j->arrivals.empty()) ++jobs_planned;
    for (const auto& [version, a] : j->arrivals) {
      ++reasons[a.reason];
      if (a.window_sent > 0 && a.window_ranks >= j->world) {
        to_first.push_back(a.first - a.window_sent);
        if (static_cast<int>(a.ranks.size()) == j->world) {
          to_all.push_back(a.last - a.window_sent);
        }
      }
    }
  }
  // Done: cancel the jobs; their workers are told to stop.
  draining_ = true;
  for (auto& j : jobs) (void)Cancel(j->id, "tandem-loadgen: load step over");
  const double t_cancel = Now();
  while (open_sessions_.load() > 0 && Now() - t_cancel < 15) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  const int left_open = open_sessions_.load();
  StopDriver();
  for (auto& w : workers) {
    if (w->session != nullptr) w->session->Cancel();
  }
  while (open_sessions_.load() > 0 && Now() - t_cancel < 45) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  {
    std::lock_guard<std::mutex> lock(recorder_.mu);
    rejected = recorder_.rejected;
    rejected_sample = recorder_.rejected_sample;
    commands = recorder_.commands;
    closed = recorder_.closed;
    closed_sample = recorder_.closed_sample;
  }
  if (open_sessions_.load() > 0) {
    // Never free a Worker a stream still points at.
    std::fprintf(stderr,
                 "tandem-loadgen: %d sessions did not end; keeping them\n",
                 open_sessions_.load());
    for (auto& w : workers) w.release();
  }
  workers.clear();

  const Summary steady = Summarize(rtt_steady);
  const Summary ramp = Summarize(rtt_ramp);
  const Summary first = Summarize(to_first);
  const Summary all = Summarize(to_all);
  const int failed =
      states.count("JOB_STATE_FAILED") ? states["JOB_STATE_FAILED"] : 0;
  *pass = steady.n > 0 && steady.p99 < absl::GetFlag(FLAGS_p99_limit_s) &&
          live_end == expected_end && expected_end == nworkers && failed == 0 &&
          t_all > 0;
  *fatal = sampler_.pid() > 0 && !ProcessAlive(sampler_.pid());
  std::fprintf(
      stderr,
      "tandem-loadgen: load %d workers / %d jobs: heartbeat round trip %s; "
      "profile->schedule %s; coordinator %.2f cores, %.0f MB RSS; %s\n",
      nworkers, njobs, MsText(steady).c_str(), MsText(first).c_str(),
      proc.cpu_cores_avg, proc.rss_mb_max, *pass ? "PASS" : "MISS");
  // A JSON object of counts, or of sample messages.
  auto json_object = [](const auto& m) {
    std::vector<std::string> parts;
    for (const auto& [k, v] : m) {
      if constexpr (std::is_same_v<std::decay_t<decltype(v)>, std::string>) {
        parts.push_back(absl::StrCat(JsonString(k), ": ", JsonString(v)));
      } else {
        parts.push_back(absl::StrCat(JsonString(k), ": ", v));
      }
    }
    return absl::StrCat("{", absl::StrJoin(parts, ", "), "}");
  };
  std::map<std::string, int64_t> states64(states.begin(), states.end());
  std::map<std::string, int64_t> reasons64(reasons.begin(), reasons.end());
  std::map<std::string, int64_t> versions64;
  for (const auto& [v, n] : versions) versions64[absl::StrCat("v", v)] = n;
  std::map<std::string, int64_t> reg_errors64(reg_errors.begin(),
                                              reg_errors.end());
  std::vector<std::string> errs;
  for (const std::string& e : job_errors) errs.push_back(JsonString(e));
  return absl::StrFormat(
      "{\"workers\": %d, \"jobs\": %d, \"world_sizes\": [%d, %d], "
      "\"pass\": %s, \"registered\": %d, \"register_errors\": %s, "
      "\"register_error_sample\": %s, \"register_ms\": %s, "
      "\"register_all_s\": %.3f, \"all_sessions_open_s\": %.3f, "
      "\"measured_s\": %.1f, \"heartbeat_rtt_ms\": %s, "
      "\"heartbeat_rtt_ramp_ms\": %s, \"driver_lag_ms\": %s, "
      "\"profile_to_schedule_first_rank_ms\": %s, "
      "\"profile_to_schedule_all_ranks_ms\": %s, \"jobs_planned\": %d, "
      "\"schedule_reasons\": %s, \"submit_under_load_ms\": %s, "
      "\"coordinator\": %s, \"sessions_live_at_end\": %d, "
      "\"sessions_expected\": %d, \"reconnects\": %d, "
      "\"sessions_closed_by_coordinator\": %s, \"closed_samples\": %s, "
      "\"rejected\": %s, \"rejected_samples\": %s, \"commands\": %s, "
      "\"job_states\": %s, \"job_versions\": %s, \"job_errors\": [%s], "
      "\"workers_connected_per_coordinator\": %d, \"sessions_left_open\": %d, "
      "\"loadavg_start\": %s, \"loadavg_end\": %s, \"db_mb_end\": %.2f, "
      "\"jobs_submitted_so_far\": %d, \"restart\": %s}",
      nworkers, njobs, nworkers / njobs, (nworkers + njobs - 1) / njobs,
      *pass ? "true" : "false", static_cast<int>(reg_lat.size()),
      json_object(reg_errors64), JsonString(reg_error_sample),
      JsonMs(Summarize(reg_lat)), t_registered - t_ramp,
      t_all > 0 ? t_all - t_ramp : -1.0, t_end - t_measure, JsonMs(steady),
      JsonMs(ramp), JsonMs(Summarize(lag)), JsonMs(first), JsonMs(all),
      jobs_planned, json_object(reasons64), JsonMs(Summarize(submit_lat)),
      JsonProcess(proc), live_end, expected_end, static_cast<int>(reconnects),
      json_object(closed), json_object(closed_sample), json_object(rejected),
      json_object(rejected_sample), json_object(commands),
      json_object(states64), json_object(versions64), absl::StrJoin(errs, ", "),
      workers_connected, left_open, loadavg_start, LoadAverage(), DatabaseMb(),
      jobs_submitted_, restart_json);
}

int Loadgen::Run() {
  // A comma-separated list of counts >= 1; false (said) when it is not.
  auto counts = [](const char* flag, const std::string& text,
                   std::vector<int>* out) {
    for (absl::string_view s : absl::StrSplit(text, ',', absl::SkipEmpty())) {
      int v = 0;
      if (!absl::SimpleAtoi(s, &v) || v < 1) {
        std::fprintf(stderr, "tandem-loadgen: %s: '%s' is not a count\n", flag,
                     std::string(s).c_str());
        return false;
      }
      out->push_back(v);
    }
    return true;
  };
  std::vector<int> loads;
  std::vector<int> jobs;
  if (!counts("--loads", absl::GetFlag(FLAGS_loads), &loads) ||
      !counts("--jobs", absl::GetFlag(FLAGS_jobs), &jobs)) {
    return 2;
  }
  if (!jobs.empty() && jobs.size() != loads.size()) {
    std::fprintf(stderr, "tandem-loadgen: --jobs needs one count per load\n");
    return 2;
  }
  // The coordinator answers at all.
  {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() +
                     std::chrono::seconds(20));
    ctx.set_wait_for_ready(true);
    v1::ListJobsRequest req;
    req.set_limit(1);
    v1::ListJobsResponse resp;
    grpc::Status s = jobs_stub_->List(&ctx, req, &resp);
    if (!s.ok()) {
      std::fprintf(stderr, "tandem-loadgen: coordinator at %s: %s\n",
                   address_.c_str(), s.error_message().c_str());
      return 1;
    }
  }
  const std::string started =
      absl::FormatTime("%Y-%m-%dT%H:%M:%SZ", absl::Now(), absl::UTCTimeZone());
  const std::string loadavg_start = LoadAverage();
  const std::string submit =
      absl::GetFlag(FLAGS_fill_jobs) + absl::GetFlag(FLAGS_submit_samples) > 0
          ? SubmitPhase()
          : "null";
  std::vector<std::string> results;
  // The largest load passing with every lower one passing too, and the
  // largest passing at all.
  int best = 0, best_any = 0;
  bool missed = false;
  for (size_t i = 0; i < loads.size(); ++i) {
    const int w = loads[i];
    const int j =
        jobs.empty()
            ? std::max(1, static_cast<int>(std::lround(w * 64 / 1000.0)))
            : jobs[i];
    const bool restart = w == absl::GetFlag(FLAGS_restart_at_load) &&
                         sampler_.pid() > 0 &&
                         !absl::GetFlag(FLAGS_restart_cmd).empty();
    if (missed && absl::GetFlag(FLAGS_stop_on_miss)) {
      results.push_back(absl::StrFormat(
          "{\"workers\": %d, \"jobs\": %d, \"skipped\": %s}", w, j,
          JsonString("a lower load missed (--stop-on-miss)")));
      continue;
    }
    bool pass = false, fatal = false;
    results.push_back(LoadStep(w, std::min(j, w), restart, &pass, &fatal));
    if (pass && !missed) best = std::max(best, w);
    if (pass) best_any = std::max(best_any, w);
    if (!pass) missed = true;
    if (fatal) {
      std::fprintf(stderr,
                   "tandem-loadgen: the coordinator is gone; stopping\n");
      break;
    }
  }
  const std::string cpu_model = [] {
    for (absl::string_view line :
         absl::StrSplit(ReadFile("/proc/cpuinfo"), '\n')) {
      if (absl::ConsumePrefix(&line, "model name")) {
        return std::string(
            absl::StripAsciiWhitespace(line.substr(line.find(':') + 1)));
      }
    }
    return std::string();
  }();
  const std::string json = absl::StrFormat(
      "{\"tool\": \"tandem-loadgen\", \"started\": %s, \"note\": %s, "
      "\"coordinator\": %s, "
      "\"machine\": {\"cpus\": %d, \"cpu_model\": %s, \"loadavg_start\": %s, "
      "\"loadavg_end\": %s}, \"config\": {\"loads\": %s, \"jobs\": %s, "
      "\"settle_s\": %.1f, \"duration_s\": %.1f, \"step_s\": %.2f, "
      "\"heartbeat_s\": %.2f, \"probe_every\": %d, \"layers\": %d, "
      "\"distinct_specs\": %s, \"p99_limit_s\": %.3f}, \"jobs_submitted\": %d, "
      "\"submit\": %s, \"loads\": [%s], \"max_passing_workers\": %d, "
      "\"max_passing_workers_any\": %d}\n",
      JsonString(started), JsonString(absl::GetFlag(FLAGS_note)),
      JsonString(address_),
      static_cast<int>(std::thread::hardware_concurrency()),
      JsonString(cpu_model), loadavg_start, LoadAverage(),
      JsonString(absl::GetFlag(FLAGS_loads)),
      JsonString(absl::GetFlag(FLAGS_jobs)), absl::GetFlag(FLAGS_settle_s),
      absl::GetFlag(FLAGS_duration_s), absl::GetFlag(FLAGS_step_s),
      absl::GetFlag(FLAGS_heartbeat_s), absl::GetFlag(FLAGS_probe_every),
      absl::GetFlag(FLAGS_layers),
      absl::GetFlag(FLAGS_distinct_specs) ? "true" : "false",
      absl::GetFlag(FLAGS_p99_limit_s), jobs_submitted_, submit,
      absl::StrJoin(results, ",\n  "), best, best_any);
  if (!absl::GetFlag(FLAGS_out).empty()) {
    std::ofstream(absl::GetFlag(FLAGS_out)) << json;
  } else {
    std::fputs(json.c_str(), stdout);
  }
  std::fprintf(stderr,
               "tandem-loadgen: largest passing load: %d workers (p99 "
               "heartbeat under %.2f s)\n",
               best, absl::GetFlag(FLAGS_p99_limit_s));
  return 0;
}

constexpr char kUsage[] =
    "usage: tandem-loadgen --coordinator HOST:PORT [--coordinator-pid PID]\n"
    "         [--loads 100,250,500,1000,2000] [--jobs J,...] [--duration-s S]\n"
    "         [--fill-jobs N] [--restart-at-load W --restart-cmd CMD "
    "[--pid-file F]] [--out FILE]\n"
    "Fake workers against a real coordinator: heartbeat round trip, profile "
    "to schedule, Submit latency, the coordinator's CPU, RSS and restart "
    "time (bench/README.md, \"load\"). bench/load/run.sh starts a "
    "coordinator and runs it.\n";

}  // namespace
}  // namespace tandem

int main(int argc, char** argv) {
  const tandem::CommandLineSpec spec{"tandem-loadgen", tandem::kUsage};
  tandem::ParseCommandLineOrExit(spec, argc, argv);
  tandem::ExitIfInvalid(
      spec,
      {tandem::CheckHostPort("--coordinator", absl::GetFlag(FLAGS_coordinator),
                             tandem::PortZero::kRejected),
       tandem::CheckPositive("--duration-s", absl::GetFlag(FLAGS_duration_s)),
       tandem::CheckPositive("--step-s", absl::GetFlag(FLAGS_step_s)),
       tandem::CheckPositive("--heartbeat-s", absl::GetFlag(FLAGS_heartbeat_s)),
       tandem::CheckAtLeast("--layers", absl::GetFlag(FLAGS_layers), 1),
       tandem::CheckAtLeast("--fill-jobs", absl::GetFlag(FLAGS_fill_jobs), 0),
       tandem::CheckAtLeast("--coordinator-pid",
                            absl::GetFlag(FLAGS_coordinator_pid), 0)});
  // A refused write must not kill the process.
  signal(SIGPIPE, SIG_IGN);
  tandem::Loadgen loadgen(absl::GetFlag(FLAGS_coordinator),
                          absl::GetFlag(FLAGS_coordinator_pid));
  return loadgen.Run();
}
