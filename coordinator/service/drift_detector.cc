#include "coordinator/service/drift_detector.h"

#include <cmath>

namespace tandem {

void DriftDetector::SetPrediction(double iteration_s, int64_t peak_bytes) {
  (void)peak_bytes;
  predicted_s_ = iteration_s;
  streak_ = 0;
  score_ = 0;
  fired_ = false;
}

std::optional<std::string> DriftDetector::Observe(double iteration_s,
                                                  int64_t peak_bytes) {
  if (fired_) return std::nullopt;
  if (budget_bytes_ > 0 && peak_bytes >= 0.95 * budget_bytes_) {
    fired_ = true;
    return std::string("memory");
  }
  if (predicted_s_ <= 0 || !std::isfinite(iteration_s)) return std::nullopt;
  score_ = std::fabs(iteration_s - predicted_s_) / predicted_s_;
  streak_ = score_ > threshold_ ? streak_ + 1 : 0;
  if (streak_ >= window_) {
    fired_ = true;
    return std::string("drift");
  }
  return std::nullopt;
}

}  // namespace tandem
