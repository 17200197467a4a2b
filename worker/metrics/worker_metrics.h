// The worker's Prometheus series (dashboards/README.md, "Series"), fed by the
// IterationObserver interface the runtime reports through: the runtime never
// sees the registry, and the worker's main wires the two together. Labels are
// job and rank; one worker process runs one rank of one job, so each family
// holds a handful of series.
#ifndef TANDEM_WORKER_METRICS_WORKER_METRICS_H_
#define TANDEM_WORKER_METRICS_WORKER_METRICS_H_

#include <memory>
#include <mutex>
#include <string>

#include "absl/status/statusor.h"
#include "common/metrics/metrics_registry.h"
#include "worker/runtime/iteration_report.h"

namespace tandem {

class WorkerMetrics final : public IterationObserver {
 public:
  // Registers every worker family on `registry`, which must outlive this.
  // Errors: those of Registry::Add* (a name registered twice).
  static absl::StatusOr<std::unique_ptr<WorkerMetrics>> Create(
      metrics::Registry& registry);
  WorkerMetrics(const WorkerMetrics&) = delete;
  WorkerMetrics& operator=(const WorkerMetrics&) = delete;

  // Sets the job and rank labels; iterations reported before are dropped.
  void OnStart(const std::string& job, int rank, int world_size) override;
  void OnIteration(const IterationReport& report) override;

 private:
  WorkerMetrics() = default;

  using Gauge = metrics::Family<metrics::Gauge>;
  using Counter = metrics::Family<metrics::Counter>;
  using Histogram = metrics::Family<metrics::Histogram>;
  Histogram* iteration_seconds_ = nullptr;
  Histogram* compute_seconds_ = nullptr;
  Histogram* communication_seconds_ = nullptr;
  Histogram* exposed_communication_seconds_ = nullptr;
  Gauge* overlap_ratio_ = nullptr;
  Gauge* tokens_per_second_ = nullptr;
  Counter* tokens_ = nullptr;
  Counter* iterations_ = nullptr;
  Gauge* loss_ = nullptr;
  Gauge* step_ = nullptr;
  Gauge* memory_bytes_ = nullptr;  // {job, rank, kind}
  Gauge* param_bytes_ = nullptr;   // {job, rank, kind}
  Gauge* schedule_version_ = nullptr;
  Counter* collective_bytes_ = nullptr;  // {job, rank, op}
  Gauge* world_size_ = nullptr;
  Gauge* loss_scale_ = nullptr;       // only for jobs that scale the loss
  Counter* skipped_steps_ = nullptr;  // likewise

  std::mutex mu_;
  std::string job_;
  std::string rank_;
  bool started_ = false;
};

}  // namespace tandem

#endif  // TANDEM_WORKER_METRICS_WORKER_METRICS_H_
