// Gathers a job's report (job_report.h) from where the coordinator keeps
// it: the job and its events (JobManager), its schedules, graph, workers and
// aggregated profiles (JobStore), its steps and ranks' profile windows
// (JobHistory), the ranks' latest iteration traces (TimelineStore); and
// simulates the schedules it shows, with the hardware model calibrated to
// the job's newest profile as the planner does (CalibrateToMeasurements).
// The one renderer behind both JobService.GetReport (`tandem report`) and
// GET /jobs/<id> on the metrics port. Thread-safe (it only reads); no gRPC.
#ifndef TANDEM_COORDINATOR_REPORT_JOB_REPORT_BUILDER_H_
#define TANDEM_COORDINATOR_REPORT_JOB_REPORT_BUILDER_H_

#include <functional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/metrics/http_exporter.h"
#include "coordinator/report/job_history.h"
#include "coordinator/report/job_report.h"
#include "coordinator/service/job_manager.h"
#include "coordinator/service/timeline_store.h"
#include "coordinator/store/job_store.h"

namespace tandem {

class JobReportBuilder {
 public:
  // Everything must outlive the builder. `now_unix_s` stamps the report
  // (tests pass a fake clock).
  JobReportBuilder(const JobManager* jobs, JobStore* store, JobHistory* history,
                   const TimelineStore* timelines,
                   std::function<double()> now_unix_s = nullptr);
  JobReportBuilder(const JobReportBuilder&) = delete;
  JobReportBuilder& operator=(const JobReportBuilder&) = delete;

  // NotFound for an unknown job (naming it, suggesting `tandem list`);
  // the store's errors. What cannot be shown (no graph yet, a simulation
  // that failed) is said in the report, not returned.
  absl::StatusOr<JobReport> Build(const std::string& job_id) const;
  // Build, rendered (RenderJobReport).
  absl::StatusOr<std::string> RenderHtml(const std::string& job_id) const;

  // GET /jobs<path> on the metrics port (`path` is "/<job id>"): the
  // report; 404 with a page saying so for a missing or unknown job id, 400
  // for an id over 256 characters, 500 with the error otherwise.
  metrics::HttpExporter::Page ServePage(absl::string_view path) const;
  // The page ServePage answers an error with: `message` as HTML.
  static metrics::HttpExporter::Page ErrorPage(int status,
                                               absl::string_view message);

 private:
  const JobManager* jobs_;
  JobStore* store_;
  JobHistory* history_;
  const TimelineStore* timelines_;
  const std::function<double()> now_unix_s_;
};

}  // namespace tandem

#endif  // TANDEM_COORDINATOR_REPORT_JOB_REPORT_BUILDER_H_
