// What each schedule version measured on a job, and whether the active one
// is behind the best measured so far: the evidence the coordinator rolls a
// schedule back on (coordinator/README.md, "Drift and re-planning"). The
// baseline (v0) counts as measured like any plan, so a job never stays on a
// plan slower than its own baseline, whatever the cost model got wrong.
//
// A step's time is the slowest rank's. The first step after a switch is left
// out (it pays for the switch); each version keeps its newest kMaxSamples
// steps. Two versions are compared by their medians, and "slower" must clear
// the measured noise: the larger relative median absolute deviation of the
// two, times kNoiseMads, and never less than kMinNoise. Pure logic, one per
// job, no locking (the planning manager holds its lock).
#ifndef TANDEM_COORDINATOR_SERVICE_SCHEDULE_MEASUREMENTS_H_
#define TANDEM_COORDINATOR_SERVICE_SCHEDULE_MEASUREMENTS_H_

#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <vector>

namespace tandem {

class ScheduleMeasurements {
 public:
  static constexpr int kMaxSamples = 64;
  static constexpr double kNoiseMads = 3.0;
  static constexpr double kMinNoise = 0.05;

  // `window`: steps a version needs before it is judged (the job's
  // optimize.drift_window).
  explicit ScheduleMeasurements(int window) : window_(window) {}

  void Record(int64_t version, int64_t step, double iteration_s);

  struct Summary {
    double median_s = 0;
    // Median absolute deviation over the median.
    double relative_mad = 0;
    int samples = 0;
  };
  // Nullopt until the version has `window` steps.
  std::optional<Summary> Summarize(int64_t version) const;
  // Each version's kept steps, oldest first (its switch step left out), by
  // version.
  std::vector<std::vector<double>> AllSteps() const;

  struct Behind {
    int64_t best_version = 0;
    Summary best;
    Summary active;
    // The relative margin `active` had to exceed.
    double noise = 0;
  };
  // When `active` has been measured for `window` steps and its median is
  // slower than another judged version's by more than the noise: that
  // fastest version and the figures. Nullopt otherwise.
  std::optional<Behind> BehindBest(int64_t active) const;

  // Forgets every version but `version`: what they measured no longer
  // describes the machine (a schedule rolled back to measured slower than it
  // did before).
  void KeepOnly(int64_t version);
  // Forgets every version: a rollback checked interleaved measured no
  // faster than the active plan, so the gap measured one after the other
  // was the machine changing, and nothing measured so far describes it.
  void Clear() { versions_.clear(); }
  // Forgets one version: it cannot run again (the memory guard tripped
  // under it), so it is never the best to roll back to.
  void Forget(int64_t version);

 private:
  struct Samples {
    int64_t first_step = -1;
    std::deque<double> seconds;
  };
  int window_;
  std::map<int64_t, Samples> versions_;
};

}  // namespace tandem

#endif  // TANDEM_COORDINATOR_SERVICE_SCHEDULE_MEASUREMENTS_H_
