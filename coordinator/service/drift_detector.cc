#include "coordinator/service/drift_detector.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "common/lowering/least_memory.h"

namespace tandem {
namespace {

// Median of `v` (reordered); the mean of the middle two for an even size.
double Median(std::vector<double>& v) {
  const size_t mid = v.size() / 2;
  std::nth_element(v.begin(), v.begin() + mid, v.end());
  const double upper = v[mid];
  if (v.size() % 2 == 1) return upper;
  return 0.5 * (upper + *std::max_element(v.begin(), v.begin() + mid));
}

// 1.4826 x MAD is the standard deviation for normal data.
constexpr double kMadToSigma = 1.4826;

}  // namespace

void DriftDetector::SetPrediction(double iteration_s, int64_t peak_bytes,
                                  int64_t plan) {
  plan_ = plan;
  known_levels_s_.clear();
  if (auto known = known_by_plan_.find(plan); known != known_by_plan_.end()) {
    // Those not at the new expectation.
    for (double level : known->second) {
      if (!SameLevel(level, iteration_s)) known_levels_s_.push_back(level);
    }
  }
  predicted_s_ = iteration_s;
  predicted_peak_bytes_ = peak_bytes;
  ++schedule_;
  noise_.reset();
  if (std::optional<Noise> noise = MeasureNoise(steps_.size())) {
    noise_ = noise->scale;
  }
  score_ = 0;
  window_median_s_ = 0;
  fired_ = false;
}

void DriftDetector::Rearm(double iteration_s, int64_t peak_bytes) {
  std::deque<double> known = std::move(known_levels_s_);
  if (predicted_s_ > 0) known.push_back(predicted_s_);
  SetPrediction(iteration_s, peak_bytes, plan_);
  known_levels_s_.clear();
  // One entry per level: none at the new expectation or at a newer entry.
  for (auto it = known.rbegin(); it != known.rend(); ++it) {
    const auto same = [&](double level) { return SameLevel(*it, level); };
    if (same(predicted_s_) ||
        std::any_of(known_levels_s_.begin(), known_levels_s_.end(), same)) {
      continue;
    }
    known_levels_s_.push_front(*it);
    if (known_levels_s_.size() + 1 > static_cast<size_t>(kKnownLevels)) break;
  }
  if (plan_ >= 0) known_by_plan_[plan_] = known_levels_s_;
}

void DriftDetector::Record(double iteration_s) {
  steps_.push_back({std::log(iteration_s), schedule_});
  while (steps_.size() > static_cast<size_t>(kHistorySteps + window_)) {
    steps_.pop_front();
  }
}

void DriftDetector::ObserveUnpredicted(double iteration_s) {
  if (predicted_s_ > 0 || !std::isfinite(iteration_s) || iteration_s <= 0) {
    return;
  }
  Record(iteration_s);
}

std::optional<DriftDetector::Noise> DriftDetector::MeasureNoise(
    size_t end) const {
  const size_t n = static_cast<size_t>(window_);
  std::vector<double> moves;  // |median of one window - the next's|
  std::vector<double> steps;  // |one step - the next|, in log space
  std::optional<double> level;
  // One run of steps per schedule: the rolling medians of its windows.
  for (size_t first = 0; first < end;) {
    size_t last = first;
    while (last < end && steps_[last].schedule == steps_[first].schedule) {
      ++last;
    }
    for (size_t i = first; i + 1 < last; ++i) {
      steps.push_back(std::fabs(steps_[i + 1].log_s - steps_[i].log_s));
    }
    std::vector<double> medians;
    std::vector<double> w(n);
    for (size_t i = first; i + n <= last; ++i) {
      for (size_t k = 0; k < n; ++k) w[k] = steps_[i + k].log_s;
      medians.push_back(Median(w));
    }
    // Adjacent, disjoint windows: how far the median moves from one to the
    // next, whatever the run's level.
    for (size_t i = 0; i + n < medians.size(); ++i) {
      moves.push_back(std::fabs(medians[i + n] - medians[i]));
    }
    if (steps_[first].schedule == schedule_ &&
        last - first >= static_cast<size_t>(kMinHistorySteps)) {
      level = Median(medians);
    }
    first = last;
  }
  // The difference of two independent values has sqrt(2) times their
  // spread; 1.4826 x its median absolute value is that spread for normal
  // data.
  if (moves.size() >= static_cast<size_t>(kMinNoiseMedians)) {
    return Noise{kMadToSigma * Median(moves) / std::sqrt(2.0), level};
  }
  // Too few windows yet: one step's spread, and the median of `window`
  // independent steps (1.2533 sigma / sqrt(window) for normal data).
  if (steps.size() >= static_cast<size_t>(kMinNoiseSteps)) {
    return Noise{kMadToSigma * Median(steps) / std::sqrt(2.0) * 1.2533 /
                     std::sqrt(static_cast<double>(n)),
                 level};
  }
  return std::nullopt;
}

double DriftDetector::noise_bound() const {
  return noise_.has_value() ? std::expm1(kNoiseZ * *noise_) : 0.0;
}

std::optional<std::string> DriftDetector::Observe(double iteration_s,
                                                  int64_t peak_bytes) {
  if (fired_) return std::nullopt;
  // Near the budget and beyond what the plan said it would hold (by more
  // than the workers' guard band): a plan that peaks where it was predicted,
  // close to the budget by design, is not re-planned again and again.
  if (budget_bytes_ > 0 && peak_bytes >= 0.95 * budget_bytes_ &&
      (predicted_peak_bytes_ <= 0 ||
       peak_bytes >
           predicted_peak_bytes_ +
               kMemoryGuardBand * static_cast<double>(budget_bytes_))) {
    fired_ = true;
    return std::string("memory");
  }
  if (predicted_s_ <= 0 || !std::isfinite(iteration_s) || iteration_s <= 0) {
    return std::nullopt;
  }
  Record(iteration_s);
  const size_t n = static_cast<size_t>(window_);
  size_t current = 0;
  for (auto it = steps_.rbegin();
       it != steps_.rend() && it->schedule == schedule_; ++it) {
    ++current;
  }
  if (current < n) return std::nullopt;

  // Deviations of the window's steps from the prediction, in log space.
  const double log_predicted = std::log(predicted_s_);
  std::vector<double> dev;
  for (auto it = steps_.end() - n; it != steps_.end(); ++it) {
    dev.push_back(it->log_s - log_predicted);
  }
  std::vector<double> sorted = dev;
  const double median = Median(sorted);
  window_median_s_ = predicted_s_ * std::exp(median);
  score_ = std::fabs(std::expm1(median));
  // Against the schedule's measured level once it has one, else against the
  // prediction.
  double reference = log_predicted;
  if (std::optional<Noise> noise = MeasureNoise(steps_.size() - n)) {
    noise_ = noise->scale;
    if (noise->level.has_value()) reference = *noise->level;
  }

  // 1. Beyond the threshold.
  if (score_ <= threshold_) return std::nullopt;
  // 2. Consistently: all but one step of the window beyond it, on the same
  // side (a slower step can hide a faster drift and vice versa).
  const double bound = median > 0 ? std::log1p(threshold_)
                                  : std::log1p(-std::min(threshold_, 0.999));
  const int beyond =
      static_cast<int>(std::count_if(dev.begin(), dev.end(), [&](double d) {
        return median > 0 ? d > bound : d < bound;
      }));
  const int needed = window_ < 3 ? window_ : window_ - 1;
  if (beyond < needed) return std::nullopt;
  // Not back at a level the schedule is known to run at (Rearm).
  if (std::any_of(
          known_levels_s_.begin(), known_levels_s_.end(),
          [&](double level) { return SameLevel(window_median_s_, level); })) {
    return std::nullopt;
  }
  // 3. Beyond what the window median moves by on this job.
  if (noise_.has_value() &&
      std::fabs(median + log_predicted - reference) <= kNoiseZ * *noise_) {
    return std::nullopt;
  }
  fired_ = true;
  return std::string("drift");
}

}  // namespace tandem
