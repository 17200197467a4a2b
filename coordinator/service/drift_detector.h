// Decides when a running job has left what its active schedule predicted, so
// the coordinator re-plans (coordinator/README.md, "Drift and re-planning").
// Pure logic, one per job, fed the slowest rank's time of every step. It
// fires "drift" when all three hold for the last `window` steps:
//   1. their median deviates from the prediction by more than `threshold`
//      (relative);
//   2. at least window - 1 of them (all of them for a window under 3)
//      deviate that far on the same side;
//   3. the median (in log space) lies more than kNoiseZ noise scales from
//      the schedule's measured level. Both come from the job's newest
//      kHistorySteps steps (the window itself left out), split by the
//      schedule they ran under (the baseline's steps count too). The noise
//      scale is how far the median of `window` steps moves from one window
//      to the next, disjoint one of the same schedule: 1.4826 x the median
//      of those moves / sqrt(2), once there are kMinNoiseMedians of them;
//      before, from consecutive steps the same way, times 1.2533 /
//      sqrt(window) (the median of `window` independent steps), once there
//      are kMinNoiseSteps. The level is the median of the active schedule's
//      rolling medians once it has kMinHistorySteps steps, the prediction
//      before. With no noise scale yet, only 1 and 2 apply.
// A schedule kept by a re-plan at a new level (Rearm) is also expected at
// the levels it was expected at before: a window within the threshold of
// any of them fires nothing, so a link that flaps between two rates re-plans
// once, not at every flap (the plan is the planner's choice at both).
// So one outlier, however large, never fires a window of 3 or more; a
// prediction that is off fires in the schedule's first windows when the
// job's noise allows telling, and later only a change from what the
// schedule measured fires; noise that moves the median of `window` steps by
// more than the threshold raises the bar instead of re-planning.
// It also fires:
//   - "memory": the measured peak comes within 5% of the budget and is over
//     the active schedule's predicted peak by more than the workers' guard
//     band (kMemoryGuardBand of the budget); without a predicted peak, the
//     first condition alone. Plans sit close to the budget by design: one
//     that peaks where it said fires nothing.
// The score is the latest window median's relative deviation, exported as a
// metric.
#ifndef TANDEM_COORDINATOR_SERVICE_DRIFT_DETECTOR_H_
#define TANDEM_COORDINATOR_SERVICE_DRIFT_DETECTOR_H_

#include <cmath>
#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <string>

namespace tandem {

class DriftDetector {
 public:
  // How many noise scales the window median must move (bench/README.md,
  // "drift": false re-plans per 1000 steps against detection delay).
  static constexpr double kNoiseZ = 5.0;
  // Steps of a schedule kept for its noise, and the fewest that measure it.
  static constexpr int kHistorySteps = 256;
  static constexpr int kMinHistorySteps = 20;
  static constexpr int kMinNoiseMedians = 10;
  static constexpr int kMinNoiseSteps = 4;
  // Levels a schedule is known to run at besides its expectation (Rearm).
  static constexpr int kKnownLevels = 4;

  DriftDetector(double threshold, int window, int64_t budget_bytes)
      : threshold_(threshold),
        window_(window < 1 ? 1 : window),
        budget_bytes_(budget_bytes) {}

  // A new schedule became active: compare against its predictions from now
  // on. Earlier steps count towards the noise only. `plan` names the plan
  // it runs (the first version of it, whatever versions rerun it since):
  // the levels a Rearm made known for that plan hold again; -1: none.
  void SetPrediction(double iteration_s, int64_t peak_bytes, int64_t plan = -1);
  // The same schedule, now expected at `iteration_s`: a re-plan from a
  // window at that level kept it. The level it was expected at until now
  // stays known (with up to kKnownLevels - 1 earlier ones): a window back at
  // any of them is no change of plan. They are the plan's: SetPrediction
  // forgets them, and brings them back for the same plan (a version that
  // reruns it, a comparison's verdict).
  void Rearm(double iteration_s, int64_t peak_bytes);
  // The budget changed (e.g. lowered mid-run).
  void SetBudget(int64_t budget_bytes) { budget_bytes_ = budget_bytes; }

  // A step run before any schedule was predicted (the baseline): it counts
  // towards the noise only.
  void ObserveUnpredicted(double iteration_s);
  // One iteration's measurement (the slowest rank's time, the largest peak).
  // Returns the re-plan reason when one fires; after firing it stays quiet
  // until the next SetPrediction.
  std::optional<std::string> Observe(double iteration_s, int64_t peak_bytes);

  // |median of the last `window` steps / predicted - 1| (0 without a
  // prediction or a full window).
  double score() const { return score_; }
  // The latest window median, in seconds (0 without a full window).
  double window_median_s() const { return window_median_s_; }
  // The relative deviation the window median had to exceed beyond the
  // threshold: exp(kNoiseZ x noise) - 1 (0 while no noise was measured).
  double noise_bound() const;
  bool has_prediction() const { return predicted_s_ > 0; }
  // What the active schedule is expected to take (SetPrediction's).
  double predicted_s() const { return predicted_s_; }
  // Other levels the active schedule is known to run at (Rearm's), oldest
  // first.
  const std::deque<double>& known_levels_s() const { return known_levels_s_; }

 private:
  struct Noise {
    double scale;
    // The active schedule's measured level; nullopt under kMinHistorySteps.
    std::optional<double> level;
  };
  // Noise and level (log space) from the first `end` recorded steps; nullopt
  // without enough steps for a noise scale.
  std::optional<Noise> MeasureNoise(size_t end) const;
  void Record(double iteration_s);
  // Within the threshold of each other (relative, either way).
  bool SameLevel(double a_s, double b_s) const {
    return std::fabs(std::log(a_s / b_s)) <= std::log1p(threshold_);
  }

  double threshold_;
  int window_;
  int64_t budget_bytes_;
  double predicted_s_ = 0;
  int64_t predicted_peak_bytes_ = 0;
  std::deque<double> known_levels_s_;
  // The plan watched (SetPrediction's), and each plan's known levels.
  int64_t plan_ = -1;
  std::map<int64_t, std::deque<double>> known_by_plan_;
  // The newest steps, oldest first: log(iteration_s) and the schedule they
  // ran under (a count of SetPrediction calls).
  struct Recorded {
    double log_s;
    int64_t schedule;
  };
  std::deque<Recorded> steps_;
  int64_t schedule_ = 0;
  std::optional<double> noise_;
  double score_ = 0;
  double window_median_s_ = 0;
  bool fired_ = false;
};

}  // namespace tandem

#endif  // TANDEM_COORDINATOR_SERVICE_DRIFT_DETECTOR_H_
