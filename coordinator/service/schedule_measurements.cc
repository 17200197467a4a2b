#include "coordinator/service/schedule_measurements.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace tandem {
namespace {

double Median(std::vector<double> v) {
  const size_t mid = v.size() / 2;
  std::nth_element(v.begin(), v.begin() + mid, v.end());
  if (v.size() % 2 == 1) return v[mid];
  const double upper = v[mid];
  return (*std::max_element(v.begin(), v.begin() + mid) + upper) / 2;
}

}  // namespace

void ScheduleMeasurements::Record(int64_t version, int64_t step,
                                  double iteration_s) {
  if (!(iteration_s > 0) || !std::isfinite(iteration_s)) return;
  Samples& s = versions_[version];
  if (s.first_step < 0 || step < s.first_step) {
    // The step that switched to this version pays for the switch.
    s.first_step = step;
    return;
  }
  if (step == s.first_step) return;
  s.seconds.push_back(iteration_s);
  if (s.seconds.size() > static_cast<size_t>(kMaxSamples)) {
    s.seconds.pop_front();
  }
}

std::vector<std::vector<double>> ScheduleMeasurements::AllSteps() const {
  std::vector<std::vector<double>> out;
  for (const auto& [version, samples] : versions_) {
    out.emplace_back(samples.seconds.begin(), samples.seconds.end());
  }
  return out;
}

std::optional<ScheduleMeasurements::Summary> ScheduleMeasurements::Summarize(
    int64_t version) const {
  auto it = versions_.find(version);
  if (it == versions_.end() ||
      it->second.seconds.size() < static_cast<size_t>(std::max(window_, 1))) {
    return std::nullopt;
  }
  std::vector<double> v(it->second.seconds.begin(), it->second.seconds.end());
  Summary out;
  out.samples = static_cast<int>(v.size());
  out.median_s = Median(v);
  for (double& x : v) x = std::abs(x - out.median_s);
  out.relative_mad = out.median_s > 0 ? Median(v) / out.median_s : 0;
  return out;
}

std::optional<ScheduleMeasurements::Behind> ScheduleMeasurements::BehindBest(
    int64_t active) const {
  const std::optional<Summary> now = Summarize(active);
  if (!now.has_value()) return std::nullopt;
  std::optional<Behind> best;
  for (const auto& [version, samples] : versions_) {
    if (version == active) continue;
    const std::optional<Summary> other = Summarize(version);
    if (!other.has_value()) continue;
    if (best.has_value() && other->median_s >= best->best.median_s) continue;
    best = Behind{version, *other, *now, 0};
  }
  if (!best.has_value()) return std::nullopt;
  best->noise = std::max(
      kMinNoise,
      kNoiseMads * std::max(best->best.relative_mad, now->relative_mad));
  if (now->median_s <= best->best.median_s * (1 + best->noise)) {
    return std::nullopt;
  }
  return best;
}

void ScheduleMeasurements::Forget(int64_t version) { versions_.erase(version); }

void ScheduleMeasurements::KeepOnly(int64_t version) {
  for (auto it = versions_.begin(); it != versions_.end();) {
    it = it->first == version ? std::next(it) : versions_.erase(it);
  }
}

}  // namespace tandem
