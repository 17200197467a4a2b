// The coordinator's Prometheus series, created once on a Registry and handed
// to the managers (a null pointer disables metrics, as in unit tests).
#ifndef TANDEM_COORDINATOR_SERVICE_COORDINATOR_METRICS_H_
#define TANDEM_COORDINATOR_SERVICE_COORDINATOR_METRICS_H_

#include <memory>

#include "absl/status/statusor.h"
#include "common/metrics/metrics_registry.h"

namespace tandem {

struct CoordinatorMetrics {
  // {state}
  metrics::Family<metrics::Gauge>* jobs;
  // {job}
  metrics::Family<metrics::Gauge>* workers_connected;
  // {job}: the job's world size, for "a worker is missing" alerts.
  metrics::Family<metrics::Gauge>* workers_expected;
  // {job, reason}
  metrics::Family<metrics::Counter>* replans;
  // Ranks that registered again as a new process while their job ran (a
  // relaunched worker), by job; 0 from a job's first registration on.
  metrics::Family<metrics::Counter>* worker_restarts;
  // Elastic restarts of a job (restart.max_restarts), by what was lost.
  metrics::Family<metrics::Counter>* job_restarts;
  // The reasons a plan is made, whose series start at 0 with each job.
  // Every PlanReasonName (coordinator/service/plan_decision.h).
  static constexpr const char* kReplanReasons[] = {
      "initial", "drift",        "memory", "reoptimize", "rollback",
      "cached",  "memory-guard", "trial",  "kept",       "baseline-check"};
  // {job}
  metrics::Family<metrics::Gauge>* drift_score;
  // {pass}
  metrics::Family<metrics::Histogram>* pass_seconds;
  // {job}
  metrics::Family<metrics::Gauge>* predicted_iteration_seconds;
  metrics::Family<metrics::Gauge>* measured_iteration_seconds;
  metrics::Family<metrics::Gauge>* schedule_version;
  // {job}: the baseline's median step time over the active schedule's.
  metrics::Family<metrics::Gauge>* speedup;
  // Read at each scrape (CoordinatorServer's collect hook). {kind}:
  // "session", "pending_session", "watch".
  metrics::Family<metrics::Gauge>* open_streams;
  metrics::Family<metrics::Gauge>* waiting_kv_gets;
  metrics::Family<metrics::Gauge>* http_connections;
  metrics::Family<metrics::Counter>* http_refused;

  static absl::StatusOr<std::unique_ptr<CoordinatorMetrics>> Create(
      metrics::Registry& registry);
};

}  // namespace tandem

#endif  // TANDEM_COORDINATOR_SERVICE_COORDINATOR_METRICS_H_
