#include "coordinator/service/coordinator_metrics.h"

#include "common/status_macros.h"

namespace tandem {

absl::StatusOr<std::unique_ptr<CoordinatorMetrics>> CoordinatorMetrics::Create(
    metrics::Registry& registry) {
  auto m = std::make_unique<CoordinatorMetrics>();
  ASSIGN_OR_RETURN(
      m->jobs, registry.AddGauge("tandem_jobs", "Jobs by state.", {"state"}));
  ASSIGN_OR_RETURN(m->workers_connected,
                   registry.AddGauge("tandem_workers_connected",
                                     "Workers with an open session.", {"job"}));
  ASSIGN_OR_RETURN(m->workers_expected,
                   registry.AddGauge("tandem_workers_expected",
                                     "Workers a job runs with (its world "
                                     "size).",
                                     {"job"}));
  ASSIGN_OR_RETURN(
      m->replans,
      registry.AddCounter("tandem_replans_total",
                          "Schedules planned, by reason (initial, drift, "
                          "memory, reoptimize).",
                          {"job", "reason"}));
  ASSIGN_OR_RETURN(
      m->worker_restarts,
      registry.AddCounter("tandem_worker_restarts_total",
                          "Ranks that registered again as a new worker "
                          "process while their job ran.",
                          {"job"}));
  ASSIGN_OR_RETURN(
      m->job_restarts,
      registry.AddCounter("tandem_job_restarts_total",
                          "Times a job was restarted from its newest "
                          "checkpoint after losing a rank, by cause "
                          "(heartbeat, peer, relaunch).",
                          {"job", "cause"}));
  ASSIGN_OR_RETURN(m->drift_score,
                   registry.AddGauge("tandem_drift_score",
                                     "Relative deviation of the median of "
                                     "the last drift_window steps from the "
                                     "prediction.",
                                     {"job"}));
  ASSIGN_OR_RETURN(
      m->pass_seconds,
      registry.AddHistogram("tandem_planning_pass_seconds",
                            "Wall time of each planning pass.", {"pass"},
                            metrics::ExponentialBuckets(1e-5, 4, 10)));
  ASSIGN_OR_RETURN(m->predicted_iteration_seconds,
                   registry.AddGauge("tandem_predicted_iteration_seconds",
                                     "Iteration time the active schedule "
                                     "predicts.",
                                     {"job"}));
  ASSIGN_OR_RETURN(m->measured_iteration_seconds,
                   registry.AddGauge("tandem_measured_iteration_seconds",
                                     "Latest measured iteration time (slowest "
                                     "rank).",
                                     {"job"}));
  ASSIGN_OR_RETURN(m->schedule_version,
                   registry.AddGauge("tandem_schedule_version",
                                     "Active schedule version.", {"job"}));
  ASSIGN_OR_RETURN(
      m->speedup,
      registry.AddGauge("tandem_schedule_speedup_ratio",
                        "Measured median step time of the baseline (v0) over "
                        "the active schedule's; 1 on the baseline.",
                        {"job"}));
  ASSIGN_OR_RETURN(
      m->open_streams,
      registry.AddGauge("tandem_open_streams",
                        "Open gRPC streams by kind: worker sessions, those "
                        "still awaiting their hello, and watches.",
                        {"kind"}));
  ASSIGN_OR_RETURN(
      m->waiting_kv_gets,
      registry.AddGauge("tandem_waiting_kv_gets",
                        "Rendezvous gets waiting for their key.", {}));
  ASSIGN_OR_RETURN(
      m->http_connections,
      registry.AddGauge("tandem_http_connections",
                        "Connections the metrics port holds open.", {}));
  ASSIGN_OR_RETURN(m->http_refused,
                   registry.AddCounter("tandem_http_refused_total",
                                       "Metrics-port connections refused at "
                                       "a cap (per address, or in all).",
                                       {}));
  return m;
}

}  // namespace tandem
