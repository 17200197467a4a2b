#include "bench/load/fake_worker.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/status/statusor.h"
#include "common/ir/profile.h"
#include "common/ir/proto_convert.h"
#include "common/ir/schedule.h"
#include "common/job/job_spec.h"
#include "common/lowering/lowering.h"
#include "common/models/graph_builder.h"
#include "common/sim/simulator.h"

namespace tandem {
namespace {

// The profile a rank of `job` measures under `schedule`: the simulator's
// replay of it on the job's hardware (node times, every collective, memory
// after every node). With a `prediction`, the ranks run at its times.
absl::StatusOr<VersionModel> ModelVersion(const FakeJob& job,
                                          const Schedule& schedule,
                                          const v1::Prediction* prediction) {
  absl::StatusOr<SimResult> sim = Simulate(job.graph, schedule, job.hw);
  if (!sim.ok()) return sim.status();
  Profile p;
  p.graph_hash = job.hash;
  p.schedule_version = schedule.version;
  p.iteration_s = sim->iteration_s;
  p.peak_bytes = sim->peak_bytes;
  p.peak_min_bytes = sim->peak_bytes;
  p.work = static_cast<double>(job.tokens);
  std::map<int32_t, int> group_index;
  for (size_t i = 0; i < schedule.groups.size(); ++i) {
    group_index[schedule.groups[i].id] = static_cast<int>(i);
  }
  int64_t before = 0;
  for (const NodeTimelineEntry& n : sim->nodes) {
    NodeTiming t;
    t.node_id = n.node_id;
    t.time_s = std::max(0.0, n.end_s - n.start_s);
    t.samples = job.window;
    p.nodes.push_back(t);
    p.memory.push_back({n.node_id, before, n.memory_after_bytes});
    before = n.memory_after_bytes;
  }
  for (const CollectiveTimelineEntry& c : sim->collectives) {
    if (c.action_index < 0 ||
        c.action_index >= static_cast<int>(schedule.actions.size())) {
      continue;  // the fused re-gather after the optimizer
    }
    const Action& a = schedule.actions[c.action_index];
    CollectiveTiming t;
    t.node_id = a.node_id;
    t.bytes = c.bytes;
    t.issue_to_done_s = std::max(0.0, c.end_s - c.issue_s);
    t.run_s = std::max(0.0, c.end_s - c.start_s);
    if (a.kind == ActionKind::kAllGather) {
      t.kind = CollectiveKind::kAllGather;
      t.group_id = a.group_id;
      auto g = group_index.find(a.group_id);
      if (g != group_index.end() &&
          g->second < static_cast<int>(sim->group_exposed_s.size())) {
        t.exposed_s =
            std::min(t.issue_to_done_s, sim->group_exposed_s[g->second]);
      }
    } else {
      t.kind = CollectiveKind::kReduceScatter;
      t.param_ids = a.param_ids;
    }
    p.collectives.push_back(std::move(t));
  }
  VersionModel m;
  m.profile = ToProto(p);
  m.iteration_s = prediction != nullptr && prediction->iteration_s() > 0
                      ? prediction->iteration_s()
                      : sim->iteration_s;
  m.exposed_comm_s = prediction != nullptr ? prediction->exposed_comm_s()
                                           : sim->exposed_comm_s;
  m.peak_bytes = prediction != nullptr && prediction->peak_bytes() > 0
                     ? prediction->peak_bytes()
                     : sim->peak_bytes;
  return m;
}

}  // namespace

absl::Status FakeJob::Prepare() {
  world = spec.parallel().world_size();
  window = std::max(1, static_cast<int>(spec.optimize().warmup_steps()));
  tokens = static_cast<int64_t>(spec.batch().micro_batch()) *
           spec.batch().seq_len() * std::max(1, spec.batch().grad_accum());
  absl::StatusOr<ModelConfig> config = ModelConfigFromJobSpec(spec);
  if (!config.ok()) return config.status();
  absl::StatusOr<Graph> built = BuildModelGraph(*config);
  if (!built.ok()) return built.status();
  graph = *std::move(built);
  hash = graph.StructuralHash();
  full_report.set_graph_hash(hash);
  *full_report.mutable_graph() = ToProto(graph);
  hash_report.set_graph_hash(hash);
  hw.world_size = world;
  hw.ranks_per_node = std::min(8, world);
  absl::StatusOr<Schedule> baseline = StartingSchedule(
      graph, spec.parallel().zero_stage() == 1 ? ShardingMode::kZero1
                                               : ShardingMode::kZero3);
  if (!baseline.ok()) return baseline.status();
  absl::StatusOr<VersionModel> v0 = ModelVersion(*this, *baseline, nullptr);
  if (!v0.ok()) return v0.status();
  versions_[0] = *std::move(v0);
  return absl::OkStatus();
}

const VersionModel& FakeJob::ModelOf(const v1::ScheduleUpdate& update,
                                     std::string* error) {
  const int64_t version = update.schedule().version();
  auto it = versions_.find(version);
  if (it != versions_.end()) return it->second;
  absl::StatusOr<Schedule> s = FromProto(update.schedule());
  absl::StatusOr<VersionModel> m =
      s.ok() ? ModelVersion(*this, *s, &update.schedule().prediction())
             : absl::StatusOr<VersionModel>(s.status());
  if (m.ok()) return versions_[version] = *std::move(m);
  if (error != nullptr) *error = std::string(m.status().message());
  VersionModel fallback = versions_.at(0);
  fallback.profile.set_schedule_version(version);
  return versions_[version] = std::move(fallback);
}

double Jitter(int rank, int64_t step) {
  uint64_t x = static_cast<uint64_t>(rank) * 0x9E3779B97F4A7C15ull ^
               static_cast<uint64_t>(step) * 0xBF58476D1CE4E5B9ull;
  x ^= x >> 31;
  x *= 0x94D049BB133111EBull;
  x ^= x >> 29;
  return 1.0 + 0.02 * static_cast<double>(x % 1000) / 1000.0;
}

FakeRank::FakeRank(FakeJob* job, int rank, std::string incarnation)
    : job_(job), rank_(rank), incarnation_(std::move(incarnation)) {}

std::vector<v1::WorkerMessage> FakeRank::ConnectMessages() const {
  std::vector<v1::WorkerMessage> first;
  v1::WorkerMessage hello;
  hello.mutable_hello()->set_job_id(job_->id);
  hello.mutable_hello()->set_rank(rank_);
  hello.mutable_hello()->set_incarnation(incarnation_);
  hello.mutable_hello()->set_schedule_version(applied_version_);
  hello.mutable_hello()->set_step(next_step_);
  first.push_back(std::move(hello));
  v1::WorkerMessage graph;
  *graph.mutable_graph() = rank_ == 0 ? job_->full_report : job_->hash_report;
  first.push_back(std::move(graph));
  if (last_progress_.has_value()) first.push_back(*last_progress_);
  return first;
}

void FakeRank::OfferSchedule(const v1::ScheduleUpdate& update) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!pending_.has_value() ||
      pending_->schedule().version() < update.schedule().version()) {
    pending_ = update;
  }
}

FakeRank::StepReport FakeRank::Step() {
  StepReport out;
  const int64_t step = next_step_++;
  // Schedules switch at the start of their effective step.
  std::optional<v1::ScheduleUpdate> update;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (pending_.has_value() && step >= pending_->effective_step()) {
      update = std::move(pending_);
      pending_.reset();
    }
  }
  if (model_ == nullptr) model_ = &job_->Baseline();
  if (update.has_value() && update->schedule().version() != applied_version_) {
    model_ = &job_->ModelOf(*update, &out.model_error);
    applied_version_ = update->schedule().version();
    v1::WorkerMessage applied;
    applied.mutable_applied()->set_version(applied_version_);
    applied.mutable_applied()->set_step(step);
    out.messages.push_back(std::move(applied));
    unprofiled_ = true;
  }
  const VersionModel* model = model_;
  const double jitter = Jitter(rank_, step);
  v1::WorkerMessage progress;
  v1::IterationProgress* p = progress.mutable_progress();
  p->set_step(step + 1);
  p->set_loss(5.5 * std::exp(-static_cast<double>(step) / 2000.0) +
              0.01 * jitter);
  p->set_iteration_s(model->iteration_s * jitter);
  p->set_exposed_comm_s(model->exposed_comm_s);
  p->set_peak_bytes(model->peak_bytes);
  p->set_schedule_version(applied_version_);
  p->set_work(job_->tokens);
  last_progress_ = progress;
  out.messages.push_back(std::move(progress));
  if (unprofiled_) {
    unprofiled_ = false;
    in_window_ = 0;
    window_first_ = step + 1;
  } else if (++in_window_ >= job_->window) {
    v1::WorkerMessage m;
    v1::Profile* prof = m.mutable_profile();
    *prof = model->profile;
    prof->set_rank(rank_);
    prof->set_first_iteration(window_first_);
    prof->set_last_iteration(step);
    prof->set_iteration_s(model->iteration_s * jitter);
    for (v1::NodeTiming& n : *prof->mutable_nodes()) {
      n.set_time_s(n.time_s() * jitter);
    }
    out.messages.push_back(std::move(m));
    out.window_last = step;
    in_window_ = 0;
    window_first_ = step + 1;
  }
  return out;
}

std::shared_ptr<SessionStream> SessionStream::Open(
    v1::WorkerService::Stub* stub, const std::string& secret,
    std::vector<v1::WorkerMessage> first, Handler handler) {
  auto s = std::make_shared<SessionStream>(std::move(handler));
  s->self_ = s;
  if (!secret.empty()) s->ctx_.AddMetadata("tandem-join-secret", secret);
  stub->async()->Session(&s->ctx_, s.get());
  Next next;
  {
    std::lock_guard<std::mutex> lock(s->mu_);
    for (v1::WorkerMessage& m : first) s->out_.push_back(std::move(m));
    next = s->NextLocked();
  }
  s->Start(next);
  s->StartRead(&s->in_);
  // Held while writes may still come: released once the stream is closing
  // (or half-closed) with no write in flight.
  s->AddHold();
  s->StartCall();
  return s;
}

SessionStream::Next SessionStream::NextLocked() {
  if (writing_ || closing_ || half_closed_) return Next::kNothing;
  if (!out_.empty()) {
    writing_ = true;
    return Next::kWrite;
  }
  if (half_close_) {
    writing_ = true;
    return Next::kWritesDone;
  }
  return Next::kNothing;
}

void SessionStream::Start(Next next) {
  if (next == Next::kWrite) {
    // Queued messages stay where they are until their write is done
    // (a deque keeps its elements in place as others are appended).
    const v1::WorkerMessage* front;
    {
      std::lock_guard<std::mutex> lock(mu_);
      front = &out_.front();
    }
    StartWrite(front);
  } else if (next == Next::kWritesDone) {
    StartWritesDone();
  }
}

void SessionStream::MaybeReleaseLocked(bool* release) {
  if (!writing_ && !released_ && (closing_ || half_closed_)) {
    released_ = true;
    *release = true;
  }
}

bool SessionStream::Send(v1::WorkerMessage message) {
  Next next;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (closing_ || half_close_) return false;
    out_.push_back(std::move(message));
    next = NextLocked();
  }
  Start(next);
  return true;
}

void SessionStream::HalfClose() {
  Next next;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (half_close_) return;
    half_close_ = true;
    next = NextLocked();
  }
  Start(next);
}

void SessionStream::Cancel() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    cancelled_ = true;
  }
  ctx_.TryCancel();
}

grpc::Status SessionStream::status() const {
  std::lock_guard<std::mutex> lock(mu_);
  return status_;
}

void SessionStream::OnWriteDone(bool ok) {
  Next next;
  bool release = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    out_.pop_front();
    writing_ = false;
    if (!ok) closing_ = true;
    next = NextLocked();
    if (next == Next::kNothing) MaybeReleaseLocked(&release);
  }
  Start(next);
  if (release) RemoveHold();
}

void SessionStream::OnWritesDoneDone(bool ok) {
  bool release = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    writing_ = false;
    half_closed_ = true;
    if (!ok) closing_ = true;
    MaybeReleaseLocked(&release);
  }
  if (release) RemoveHold();
}

void SessionStream::OnReadDone(bool ok) {
  if (!ok) {
    bool release = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      closing_ = true;
      MaybeReleaseLocked(&release);
    }
    if (release) RemoveHold();
    return;
  }
  if (handler_.on_message) handler_.on_message(*this, in_);
  StartRead(&in_);
}

void SessionStream::OnDone(const grpc::Status& status) {
  bool cancelled;
  {
    std::lock_guard<std::mutex> lock(mu_);
    status_ = status;
    cancelled = cancelled_;
  }
  done_.store(true);
  if (handler_.on_done) handler_.on_done(status, cancelled);
  // Last: may destroy this.
  std::shared_ptr<SessionStream> keep = std::move(self_);
}

}  // namespace tandem
