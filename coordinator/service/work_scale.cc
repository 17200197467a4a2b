#include "coordinator/service/work_scale.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <vector>

namespace tandem {

void WorkScale::Record(int64_t version, double iteration_s, double work) {
  if (!(work > 0) || !std::isfinite(work) || !(iteration_s > 0) ||
      !std::isfinite(iteration_s)) {
    return;
  }
  if (!steps_.empty() && steps_.front().work != work) varies_ = true;
  steps_.push_back({version, iteration_s, work});
  if (steps_.size() > static_cast<size_t>(kHistorySteps)) steps_.pop_front();
  slope_.reset();
}

void WorkScale::SetReference(double work) {
  if (reference_ > 0 || !(work > 0) || !std::isfinite(work)) return;
  reference_ = work;
}

double WorkScale::slope() const {
  if (slope_.has_value()) return *slope_;
  std::vector<double> slopes;
  if (varies_) {
    for (size_t i = 0; i < steps_.size(); ++i) {
      for (size_t j = i + 1; j < steps_.size(); ++j) {
        const Step& a = steps_[i];
        const Step& b = steps_[j];
        if (a.version != b.version) continue;
        const double dw = b.work - a.work;
        if (std::abs(dw) < kMinWorkSpread * std::max(a.work, b.work)) continue;
        slopes.push_back((b.seconds - a.seconds) / dw);
      }
    }
  }
  double slope = 0;
  if (slopes.size() >= static_cast<size_t>(kMinPairs)) {
    auto mid = slopes.begin() + static_cast<std::ptrdiff_t>(slopes.size() / 2);
    std::nth_element(slopes.begin(), mid, slopes.end());
    double median = *mid;
    if (slopes.size() % 2 == 0) {
      median = (median + *std::max_element(slopes.begin(), mid)) / 2;
    }
    slope = std::max(0.0, median);
  }
  slope_ = slope;
  return slope;
}

double WorkScale::Scale(double iteration_s, double work, double to_work) const {
  if (!(work > 0) || !(to_work > 0) || work == to_work) return iteration_s;
  const double s = slope();
  if (s <= 0) return iteration_s;
  const double scaled = iteration_s + s * (to_work - work);
  const double proportional = iteration_s * to_work / work;
  return std::clamp(scaled, std::min(iteration_s, proportional),
                    std::max(iteration_s, proportional));
}

}  // namespace tandem
