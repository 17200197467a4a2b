#include "common/sim/hardware_model.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"

namespace tandem {

absl::StatusOr<PiecewiseLinear> PiecewiseLinear::Fit(
    std::vector<std::pair<int64_t, double>> points) {
  if (points.empty()) {
    return absl::InvalidArgumentError(
        "a piecewise-linear fit needs at least one (bytes, seconds) point");
  }
  for (const auto& [bytes, seconds] : points) {
    if (bytes < 0 || !std::isfinite(seconds) || seconds < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "point (", bytes, " bytes, ", seconds,
          " s): bytes and seconds must be finite and non-negative"));
    }
  }
  std::sort(points.begin(), points.end());
  PiecewiseLinear fit;
  for (size_t i = 0; i < points.size();) {
    size_t j = i;
    double sum = 0;
    for (; j < points.size() && points[j].first == points[i].first; ++j) {
      sum += points[j].second;
    }
    double seconds = sum / static_cast<double>(j - i);
    // Noise must not make a larger buffer cheaper than a smaller one.
    if (!fit.points_.empty()) {
      seconds = std::max(seconds, fit.points_.back().second);
    }
    fit.points_.emplace_back(points[i].first, seconds);
    i = j;
  }
  return fit;
}

double PiecewiseLinear::operator()(int64_t bytes) const {
  if (points_.empty()) return 0;
  const double x = static_cast<double>(bytes);
  if (points_.size() == 1) {
    const auto& [b, s] = points_.front();
    return b == 0 ? s : std::max(0.0, s * x / static_cast<double>(b));
  }
  // The segment holding `bytes`, or the first / last one to extrapolate.
  auto it =
      std::upper_bound(points_.begin(), points_.end(), bytes,
                       [](int64_t v, const std::pair<int64_t, double>& p) {
                         return v < p.first;
                       });
  size_t hi = static_cast<size_t>(it - points_.begin());
  hi = std::clamp<size_t>(hi, 1, points_.size() - 1);
  const auto& [x0, y0] = points_[hi - 1];
  const auto& [x1, y1] = points_[hi];
  const double slope = (y1 - y0) / static_cast<double>(x1 - x0);
  if (bytes > x1) {
    const auto& [xf, yf] = points_.front();
    const double far =
        std::max(slope, (y1 - yf) / static_cast<double>(x1 - xf));
    return y1 + far * (x - static_cast<double>(x1));
  }
  return std::max(0.0, y0 + slope * (x - static_cast<double>(x0)));
}

HardwareModel HardwareModel::H100(int32_t world_size) {
  HardwareModel hw;
  hw.world_size = world_size;
  return hw;
}

double HardwareModel::RingSeconds(int64_t full_bytes) const {
  const double n = world_size;
  const double bandwidth = world_size <= ranks_per_node
                               ? intra_node_bytes_per_s
                               : inter_node_bytes_per_s;
  return collective_latency_s +
         static_cast<double>(full_bytes) * (n - 1) / (n * bandwidth);
}

double HardwareModel::AllGatherSeconds(int64_t full_bytes) const {
  if (world_size <= 1 || full_bytes <= 0) return 0;
  return allgather_fit.empty() ? RingSeconds(full_bytes)
                               : allgather_fit(full_bytes);
}

double HardwareModel::ReduceScatterSeconds(int64_t full_bytes) const {
  if (world_size <= 1 || full_bytes <= 0) return 0;
  return reduce_scatter_fit.empty() ? RingSeconds(full_bytes)
                                    : reduce_scatter_fit(full_bytes);
}

double HardwareModel::HostCopySeconds(int64_t bytes) const {
  if (bytes <= 0) return 0;
  return static_cast<double>(bytes) / host_bytes_per_s;
}

namespace {

constexpr absl::string_view kHardwareKeys =
    "world, ranks_per_node, intra_gbps, inter_gbps, latency_us, host_gbps, "
    "ag_cpu_s_per_gb, rs_cpu_s_per_gb, copy_cpu_s_per_gb, ag_stretch, "
    "rs_stretch, copy_stretch, memory, budget, unmodeled";

absl::Status FieldError(absl::string_view key, absl::string_view value,
                        absl::string_view expected) {
  return absl::InvalidArgumentError(absl::StrCat(
      "hardware model: ", key, "='", value, "': expected ", expected));
}

absl::StatusOr<int32_t> ParseCount(absl::string_view key,
                                   absl::string_view value) {
  int32_t n = 0;
  if (!absl::SimpleAtoi(value, &n) || n < 1) {
    return FieldError(key, value, "an integer >= 1");
  }
  return n;
}

// A finite number > 0 (or >= 0 with allow_zero), scaled by `unit`.
absl::StatusOr<double> ParseRate(absl::string_view key, absl::string_view value,
                                 double unit, bool allow_zero) {
  double v = 0;
  if (!absl::SimpleAtod(value, &v) || !std::isfinite(v) || v < 0 ||
      (v == 0 && !allow_zero)) {
    return FieldError(
        key, value,
        allow_zero ? "a finite number >= 0" : "a finite number > 0");
  }
  return v * unit;
}

// Bytes, optionally with a B, KiB, MiB, GiB or TiB suffix; "1.5GiB" is fine
// as long as the result is a whole number of bytes.
absl::StatusOr<int64_t> ParseBytes(absl::string_view key,
                                   absl::string_view value) {
  static constexpr std::pair<absl::string_view, double> kSuffixes[] = {
      {"TiB", 1099511627776.0},
      {"GiB", 1073741824.0},
      {"MiB", 1048576.0},
      {"KiB", 1024.0},
      {"B", 1.0}};
  absl::string_view number = value;
  double unit = 1;
  for (const auto& [suffix, scale] : kSuffixes) {
    if (absl::EndsWith(number, suffix)) {
      number.remove_suffix(suffix.size());
      unit = scale;
      break;
    }
  }
  double v = 0;
  constexpr absl::string_view kExpected =
      "a byte count >= 0 below 2^62, optionally with a suffix B, KiB, MiB, "
      "GiB or TiB (e.g. 80GiB)";
  if (number.empty() || !absl::SimpleAtod(number, &v) || !std::isfinite(v) ||
      v < 0) {
    return FieldError(key, value, kExpected);
  }
  const double bytes = v * unit;
  if (bytes >= 4611686018427387904.0 || bytes != std::floor(bytes)) {
    return FieldError(key, value, kExpected);
  }
  return static_cast<int64_t>(bytes);
}

}  // namespace

absl::StatusOr<HardwareModel> ParseHardwareModel(absl::string_view text) {
  HardwareModel hw = HardwareModel::H100(1);
  std::vector<std::string> seen;
  for (absl::string_view token :
       absl::StrSplit(text, absl::ByAnyChar(" ,\t\n\r"), absl::SkipEmpty())) {
    const size_t eq = token.find('=');
    if (eq == absl::string_view::npos || eq == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("hardware model: '", token,
                       "' is not key=value (keys: ", kHardwareKeys, ")"));
    }
    const absl::string_view key = token.substr(0, eq);
    const absl::string_view value = token.substr(eq + 1);
    if (std::find(seen.begin(), seen.end(), key) != seen.end()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "hardware model: key '", key, "' given twice; give each key once"));
    }
    seen.emplace_back(key);
    if (key == "world") {
      auto n = ParseCount(key, value);
      if (!n.ok()) return n.status();
      hw.world_size = *n;
    } else if (key == "ranks_per_node") {
      auto n = ParseCount(key, value);
      if (!n.ok()) return n.status();
      hw.ranks_per_node = *n;
    } else if (key == "intra_gbps" || key == "inter_gbps" ||
               key == "host_gbps") {
      auto rate = ParseRate(key, value, 1e9, /*allow_zero=*/false);
      if (!rate.ok()) return rate.status();
      (key == "intra_gbps"   ? hw.intra_node_bytes_per_s
       : key == "inter_gbps" ? hw.inter_node_bytes_per_s
                             : hw.host_bytes_per_s) = *rate;
    } else if (key == "latency_us") {
      auto latency = ParseRate(key, value, 1e-6, /*allow_zero=*/true);
      if (!latency.ok()) return latency.status();
      hw.collective_latency_s = *latency;
    } else if (key == "ag_cpu_s_per_gb" || key == "rs_cpu_s_per_gb" ||
               key == "copy_cpu_s_per_gb") {
      auto per_byte = ParseRate(key, value, 1e-9, /*allow_zero=*/true);
      if (!per_byte.ok()) return per_byte.status();
      (key == "ag_cpu_s_per_gb"   ? hw.compute_s_per_allgather_byte
       : key == "rs_cpu_s_per_gb" ? hw.compute_s_per_reduce_scatter_byte
                                  : hw.compute_s_per_copy_byte) = *per_byte;
    } else if (key == "ag_stretch" || key == "rs_stretch" ||
               key == "copy_stretch") {
      double v = 0;
      if (!absl::SimpleAtod(value, &v) || !std::isfinite(v) || v < 1 ||
          v > HardwareModel::kMaxStretch) {
        return FieldError(key, value, "a number from 1 to 4");
      }
      (key == "ag_stretch"   ? hw.allgather_stretch
       : key == "rs_stretch" ? hw.reduce_scatter_stretch
                             : hw.copy_stretch) = v;
    } else if (key == "memory" || key == "budget") {
      auto bytes = ParseBytes(key, value);
      if (!bytes.ok()) return bytes.status();
      if (key == "memory" && *bytes == 0) {
        return FieldError(key, value, "a byte count > 0");
      }
      (key == "memory" ? hw.device_memory_bytes : hw.budget_bytes) = *bytes;
    } else if (key == "unmodeled") {
      auto bytes = ParseBytes(key, value);
      if (!bytes.ok()) return bytes.status();
      hw.unmodeled_bytes = *bytes;
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("hardware model: unknown key '", key,
                       "' (expected one of ", kHardwareKeys, ")"));
    }
  }
  if (hw.budget_bytes > hw.device_memory_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("hardware model: budget (", hw.budget_bytes,
                     " bytes) exceeds device memory (", hw.device_memory_bytes,
                     " bytes); lower budget or raise memory"));
  }
  return hw;
}

}  // namespace tandem
