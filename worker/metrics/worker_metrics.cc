#include "worker/metrics/worker_metrics.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/ir/profile.h"
#include "common/status_macros.h"

namespace tandem {
namespace {

// 1 ms .. ~65 s: CPU test models run in milliseconds, real ones in seconds.
std::vector<double> SecondsBuckets() {
  return metrics::ExponentialBuckets(0.001, 2, 17);
}

}  // namespace

absl::StatusOr<std::unique_ptr<WorkerMetrics>> WorkerMetrics::Create(
    metrics::Registry& registry) {
  std::unique_ptr<WorkerMetrics> m(new WorkerMetrics());
  const std::vector<std::string> labels = {"job", "rank"};
  ASSIGN_OR_RETURN(m->iteration_seconds_,
                   registry.AddHistogram("tandem_worker_iteration_seconds",
                                         "Wall time of each training "
                                         "iteration.",
                                         labels, SecondsBuckets()));
  ASSIGN_OR_RETURN(
      m->compute_seconds_,
      registry.AddHistogram("tandem_worker_compute_seconds",
                            "Compute time of each iteration (forward, "
                            "backward and optimizer nodes, less the "
                            "communication waited for inside them).",
                            labels, SecondsBuckets()));
  ASSIGN_OR_RETURN(
      m->communication_seconds_,
      registry.AddHistogram("tandem_worker_communication_seconds",
                            "Time collectives ran on the communication "
                            "stream in each iteration.",
                            labels, SecondsBuckets()));
  ASSIGN_OR_RETURN(
      m->exposed_communication_seconds_,
      registry.AddHistogram("tandem_worker_exposed_communication_seconds",
                            "Time compute was blocked on communication in "
                            "each iteration.",
                            labels, SecondsBuckets()));
  ASSIGN_OR_RETURN(m->overlap_ratio_,
                   registry.AddGauge("tandem_worker_overlap_ratio",
                                     "Fraction of the last iteration's "
                                     "communication hidden behind compute "
                                     "(1 - exposed / communication).",
                                     labels));
  ASSIGN_OR_RETURN(m->tokens_per_second_,
                   registry.AddGauge("tandem_worker_tokens_per_second",
                                     "Tokens this rank trained on per second "
                                     "in the last iteration.",
                                     labels));
  ASSIGN_OR_RETURN(m->tokens_,
                   registry.AddCounter("tandem_worker_tokens_total",
                                       "Tokens this rank trained on.", labels));
  ASSIGN_OR_RETURN(
      m->iterations_,
      registry.AddCounter("tandem_worker_iterations_total",
                          "Training iterations completed.", labels));
  ASSIGN_OR_RETURN(m->loss_,
                   registry.AddGauge("tandem_worker_loss",
                                     "Global-batch mean loss of the last "
                                     "iteration.",
                                     labels));
  ASSIGN_OR_RETURN(m->step_, registry.AddGauge("tandem_worker_step",
                                               "Last completed step.", labels));
  ASSIGN_OR_RETURN(
      m->memory_bytes_,
      registry.AddGauge("tandem_worker_memory_bytes",
                        "Memory by kind: allocated (at the end of the last "
                        "iteration), peak (of the last iteration), budget "
                        "(the job's; 0: none), offloaded (most optimizer-state "
                        "bytes on the host tier in the last iteration).",
                        {"job", "rank", "kind"}));
  ASSIGN_OR_RETURN(
      m->param_bytes_,
      registry.AddGauge("tandem_worker_param_bytes",
                        "Param bytes by kind: gathered (most full params "
                        "gathered at once under the schedule, persistent "
                        "included), persistent (kept gathered across "
                        "iterations), sharded (this rank's shards).",
                        {"job", "rank", "kind"}));
  ASSIGN_OR_RETURN(m->schedule_version_,
                   registry.AddGauge("tandem_worker_schedule_version",
                                     "Schedule version the last iteration ran "
                                     "under (0: the baseline).",
                                     labels));
  ASSIGN_OR_RETURN(
      m->collective_bytes_,
      registry.AddCounter("tandem_worker_collective_bytes_total",
                          "Full (unsharded) bytes moved by collectives, by "
                          "operation.",
                          {"job", "rank", "op"}));
  ASSIGN_OR_RETURN(m->world_size_,
                   registry.AddGauge("tandem_worker_world_size",
                                     "Ranks in this worker's job.", labels));
  ASSIGN_OR_RETURN(
      m->loss_scale_,
      registry.AddGauge("tandem_worker_loss_scale",
                        "Loss scale of the last iteration (dynamic loss "
                        "scaling; absent when the job does not scale).",
                        labels));
  ASSIGN_OR_RETURN(
      m->skipped_steps_,
      registry.AddCounter("tandem_worker_skipped_steps_total",
                          "Steps skipped because the gradients held an "
                          "infinity or a NaN on some rank (dynamic loss "
                          "scaling).",
                          labels));
  return m;
}

void WorkerMetrics::OnStart(const std::string& job, int rank, int world_size) {
  std::lock_guard<std::mutex> lock(mu_);
  job_ = job;
  rank_ = absl::StrCat(rank);
  started_ = true;
  const metrics::LabelValues l = {job_, rank_};
  world_size_->WithLabels(l).Set(world_size);
  // Series exist from the start, so rates see the first iteration.
  for (Counter* family : {tokens_, iterations_}) family->WithLabels(l);
  for (CollectiveKind kind :
       {CollectiveKind::kAllGather, CollectiveKind::kReduceScatter,
        CollectiveKind::kAllReduce}) {
    collective_bytes_->WithLabels(
        {job_, rank_, std::string(CollectiveKindName(kind))});
  }
}

void WorkerMetrics::OnIteration(const IterationReport& r) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!started_) return;
  const metrics::LabelValues l = {job_, rank_};
  iteration_seconds_->WithLabels(l).Observe(r.iteration_s);
  compute_seconds_->WithLabels(l).Observe(r.compute_s);
  communication_seconds_->WithLabels(l).Observe(r.communication_s);
  exposed_communication_seconds_->WithLabels(l).Observe(
      r.exposed_communication_s);
  overlap_ratio_->WithLabels(l).Set(r.overlap_ratio());
  if (r.iteration_s > 0) {
    tokens_per_second_->WithLabels(l).Set(r.tokens / r.iteration_s);
  }
  tokens_->WithLabels(l).Increment(static_cast<double>(r.tokens));
  iterations_->WithLabels(l).Increment();
  loss_->WithLabels(l).Set(r.loss);
  step_->WithLabels(l).Set(static_cast<double>(r.step));
  schedule_version_->WithLabels(l).Set(static_cast<double>(r.schedule_version));
  if (r.loss_scale > 0) {
    loss_scale_->WithLabels(l).Set(r.loss_scale);
    // The series exists from the first scaled step, at 0.
    metrics::Counter& skipped = skipped_steps_->WithLabels(l);
    if (r.skipped) skipped.Increment();
  }
  for (const auto& [kind, bytes] :
       {std::pair<const char*, int64_t>{"allocated", r.allocated_bytes},
        {"peak", r.peak_bytes},
        {"budget", r.budget_bytes},
        {"offloaded", r.offloaded_bytes}}) {
    memory_bytes_->WithLabels({job_, rank_, kind})
        .Set(static_cast<double>(bytes));
  }
  for (const auto& [kind, bytes] :
       {std::pair<const char*, int64_t>{"gathered", r.gathered_param_bytes},
        {"persistent", r.persistent_param_bytes},
        {"sharded", r.sharded_param_bytes}}) {
    param_bytes_->WithLabels({job_, rank_, kind})
        .Set(static_cast<double>(bytes));
  }
  for (CollectiveKind kind :
       {CollectiveKind::kAllGather, CollectiveKind::kReduceScatter,
        CollectiveKind::kAllReduce}) {
    collective_bytes_
        ->WithLabels({job_, rank_, std::string(CollectiveKindName(kind))})
        .Increment(
            static_cast<double>(r.collective_bytes[static_cast<int>(kind)]));
  }
}

}  // namespace tandem
