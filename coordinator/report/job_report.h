// A job's report (coordinator/README.md, "Job report"): one self-contained
// HTML page with inline SVG charts and no script, served at /jobs/<id> on
// the coordinator's metrics port and written by `tandem report JOB -o
// FILE` (JobService.GetReport). It shows
//   - loss and iteration time by step, schedule switches marked;
//   - each schedule version's predicted against measured iteration time;
//   - communication, exposed communication and overlap by rank;
//   - memory over one iteration: the simulator's curve of the active
//     schedule, the ranks' measured curves and peaks, the budget;
//   - one iteration's compute, communication and copy streams, as the
//     simulator predicts them and as each rank measured them;
//   - the planner's decisions (the explanation stored with each plan);
//   - the job's events.
// JobReport is what is shown, gathered by JobReportBuilder
// (job_report_builder.h); RenderJobReport is a pure function of it. A
// section without data says why in text instead of drawing an empty chart.
#ifndef TANDEM_COORDINATOR_REPORT_JOB_REPORT_H_
#define TANDEM_COORDINATOR_REPORT_JOB_REPORT_H_

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/ir/schedule.h"
#include "coordinator/report/svg_chart.h"
#include "coordinator/store/job_store.h"
#include "tandem/v1/job.pb.h"

namespace tandem {

// One schedule version as the job ran it.
struct ReportVersion {
  // 0: the baseline (the starting schedule); -1: the least-memory schedule
  // the memory guard switched to.
  int64_t version = 0;
  // Why it exists: "baseline", "least-memory", or the plan's reason
  // ("initial", "drift", "memory", "reoptimize", "rollback", "cached", ...).
  std::string reason;
  // Its plan's passes, comma-separated ("" for the baseline).
  std::string passes;
  // The step it was published to take effect at (0 for the baseline).
  int64_t effective_step = 0;
  // The first and last step it ran (-1: it never ran).
  int64_t first_step = -1;
  int64_t last_step = -1;
  // The simulator's prediction (0: none; the baseline's is the first
  // plan's simulation of the starting schedule).
  double predicted_s = 0;
  double predicted_exposed_comm_s = 0;
  int64_t predicted_peak_bytes = 0;
  // What it measured: the median step time (the slowest rank's; the first
  // step after each switch and the job's first step left out), the median
  // absolute deviation over it, the steps counted, and the largest peak.
  double measured_s = 0;
  double measured_relative_mad = 0;
  int measured_steps = 0;
  int64_t measured_peak_bytes = 0;
};

// A rank's profile windows under one schedule version, averaged.
struct ReportRankVersion {
  int32_t rank = 0;
  int64_t version = 0;
  int windows = 0;
  double iteration_s = 0;
  double comm_s = 0;
  double exposed_comm_s = 0;
  int64_t peak_bytes = 0;
  // 1 - exposed / communication (1 when nothing was communicated).
  double overlap() const {
    return comm_s > 0 ? std::max(0.0, 1 - exposed_comm_s / comm_s) : 1.0;
  }
};

// Memory over one iteration of one schedule version.
struct ReportMemory {
  int64_t version = 0;
  // The simulator's device memory after each node, (seconds into the
  // iteration, bytes), and its peak; empty with `simulated_note` saying why.
  std::vector<std::pair<double, double>> simulated;
  int64_t simulated_peak_bytes = 0;
  double simulated_peak_s = 0;
  // How the simulation was calibrated, or why there is none.
  std::string simulated_note;
  // The plan's stored prediction (0: none).
  int64_t predicted_peak_bytes = 0;
  // Each rank's measured peak (the largest of its profile windows under
  // `peaks_version`).
  int64_t peaks_version = 0;
  std::vector<std::pair<int32_t, int64_t>> measured_peaks;
  // Each rank's allocated bytes over its latest traced iteration.
  struct Curve {
    int32_t rank = 0;
    int64_t step = 0;
    int64_t version = 0;
    std::vector<std::pair<double, double>> points;
  };
  std::vector<Curve> measured;
  // Per rank (0: none).
  int64_t budget_bytes = 0;
};

struct ReportTimeline {
  // Lanes of the prediction first, then each rank's compute, communication
  // and copy streams.
  std::vector<report::Lane> lanes;
  // What each group of lanes is (version, step, iteration time).
  std::vector<std::string> captions;
};

struct JobReport {
  v1::Job job;
  std::vector<v1::JobEvent> events;
  std::vector<StoredStep> steps;
  // The baseline, then every stored version, then -1 if it ran.
  std::vector<ReportVersion> versions;
  // By rank, then version.
  std::vector<ReportRankVersion> ranks;
  std::optional<ReportMemory> memory;
  // Why there is no memory section (no graph yet, ...).
  std::string memory_missing;
  ReportTimeline timeline;
  std::string timeline_missing;
  // The planned schedules, oldest first (the explain tables).
  std::vector<Schedule> plans;
  // Stamped in the footer.
  double generated_unix_s = 0;
};

// The whole page: HTML5, inline CSS and SVG, every text escaped, no script
// and nothing fetched.
std::string RenderJobReport(const JobReport& report);

}  // namespace tandem

#endif  // TANDEM_COORDINATOR_REPORT_JOB_REPORT_H_
