// Decides when a running job has left what its active schedule predicted, so
// the coordinator re-plans (coordinator/README.md, "Drift and re-planning").
// Pure logic, one per job:
//   - "drift": the measured iteration time deviates from the prediction by
//     more than `threshold` (relative) for `window` iterations in a row;
//   - "memory": the measured peak comes within 5% of the budget.
// The score is the latest relative deviation, exported as a metric.
#ifndef TANDEM_COORDINATOR_SERVICE_DRIFT_DETECTOR_H_
#define TANDEM_COORDINATOR_SERVICE_DRIFT_DETECTOR_H_

#include <cstdint>
#include <optional>
#include <string>

namespace tandem {

class DriftDetector {
 public:
  DriftDetector(double threshold, int window, int64_t budget_bytes)
      : threshold_(threshold), window_(window), budget_bytes_(budget_bytes) {}

  // A new schedule became active: compare against its predictions from now
  // on, and forget earlier deviations.
  void SetPrediction(double iteration_s, int64_t peak_bytes);
  // The budget changed (e.g. lowered mid-run).
  void SetBudget(int64_t budget_bytes) { budget_bytes_ = budget_bytes; }

  // One iteration's measurement (the slowest rank's time, the largest peak).
  // Returns the re-plan reason when one fires; after firing it stays quiet
  // until the next SetPrediction.
  std::optional<std::string> Observe(double iteration_s, int64_t peak_bytes);

  // Latest |measured - predicted| / predicted (0 without a prediction).
  double score() const { return score_; }
  bool has_prediction() const { return predicted_s_ > 0; }

 private:
  double threshold_;
  int window_;
  int64_t budget_bytes_;
  double predicted_s_ = 0;
  int streak_ = 0;
  double score_ = 0;
  bool fired_ = false;
};

}  // namespace tandem

#endif  // TANDEM_COORDINATOR_SERVICE_DRIFT_DETECTOR_H_
