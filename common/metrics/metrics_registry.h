// A small Prometheus metrics library: counters, gauges and histograms with
// labels, thread-safe, exposed in the text format 0.0.4. prometheus-cpp is not
// packaged for Debian 12, so Tandem has its own.
//
// A Registry is an ordinary object handed to whoever records metrics (no
// global state), so tests build their own. Families are created once, at
// start-up; series are looked up by label values and live as long as the
// registry. Names follow Prometheus' rules: base units (_seconds, _bytes),
// counters end in _total.
//
// Cardinality is bounded: a family holds at most `max_series` series; values
// for label sets beyond that go to a detached series that is not exported,
// and tandem_metrics_dropped_series_total counts them.
#ifndef TANDEM_COMMON_METRICS_METRICS_REGISTRY_H_
#define TANDEM_COMMON_METRICS_METRICS_REGISTRY_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tandem::metrics {

// Label values, in the order of the family's label names.
using LabelValues = std::vector<std::string>;

class Counter {
 public:
  // `delta` must be >= 0; negative deltas are ignored (counters only rise).
  void Increment(double delta = 1);
  double value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0};
};

class Gauge {
 public:
  void Set(double value) { value_.store(value, std::memory_order_relaxed); }
  void Add(double delta);
  double value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0};
};

class Histogram {
 public:
  // `bounds`: strictly increasing upper bounds, without +Inf.
  explicit Histogram(std::vector<double> bounds);
  void Observe(double value);

  struct Snapshot {
    std::vector<double> bounds;
    // Cumulative counts per bound, then the +Inf count.
    std::vector<uint64_t> cumulative;
    double sum = 0;
    uint64_t count = 0;
  };
  Snapshot snapshot() const;

 private:
  const std::vector<double> bounds_;
  mutable std::mutex mu_;
  std::vector<uint64_t> counts_;  // per bucket, non-cumulative, + overflow
  double sum_ = 0;
  uint64_t count_ = 0;
};

// Bucket bounds start, start*factor, ... (count of them).
std::vector<double> ExponentialBuckets(double start, double factor, int count);

enum class MetricType { kCounter, kGauge, kHistogram };

class Registry;

// The series of one metric name, one per label-value set.
template <typename T>
class Family {
 public:
  // The series for `values` (one per label name), created on first use.
  // A wrong number of values is a programmer error (CHECK).
  T& WithLabels(const LabelValues& values);
  // Drops a series (e.g. a finished job's); no-op when absent.
  void Remove(const LabelValues& values);

 private:
  friend class Registry;
  Family(Registry* registry, std::string name, std::string help,
         std::vector<std::string> label_names, MetricType type,
         std::vector<double> bounds, size_t max_series);
  std::unique_ptr<T> Make() const;

  Registry* registry_;
  const std::string name_;
  const std::string help_;
  const std::vector<std::string> label_names_;
  const MetricType type_;
  const std::vector<double> bounds_;
  const size_t max_series_;
  mutable std::mutex mu_;
  std::map<LabelValues, std::unique_ptr<T>> series_;
  std::unique_ptr<T> overflow_;
};

class Registry {
 public:
  explicit Registry(size_t max_series_per_family = 1000);
  Registry(const Registry&) = delete;
  Registry& operator=(const Registry&) = delete;

  // Errors (InvalidArgument): a malformed metric or label name, a counter not
  // ending in _total, a name registered twice, histogram bounds not strictly
  // increasing.
  absl::StatusOr<Family<Counter>*> AddCounter(
      absl::string_view name, absl::string_view help,
      std::vector<std::string> label_names = {});
  absl::StatusOr<Family<Gauge>*> AddGauge(
      absl::string_view name, absl::string_view help,
      std::vector<std::string> label_names = {});
  absl::StatusOr<Family<Histogram>*> AddHistogram(
      absl::string_view name, absl::string_view help,
      std::vector<std::string> label_names, std::vector<double> bounds);

  // Which series a reader may see: called with a family's label names and
  // one series' values; false leaves the series out (its family's HELP and
  // TYPE stay).
  using SeriesFilter = std::function<bool(
      const std::vector<std::string>& label_names, const LabelValues& values)>;

  // Every family, in registration order, in the text exposition format
  // 0.0.4; with `filter`, only the series it keeps. The collect hooks run
  // first.
  std::string Expose(const SeriesFilter& filter = nullptr) const;

  // Runs before every Expose, to set gauges that are read, not pushed
  // (open streams, waiting calls). Add before serving; each must stay
  // callable for the registry's life.
  void AddCollectHook(std::function<void()> hook);

 private:
  template <typename T>
  friend class Family;
  void CountDropped() { dropped_->Increment(); }
  absl::Status CheckNew(absl::string_view name,
                        const std::vector<std::string>& label_names);

  struct Entry {
    MetricType type;
    std::unique_ptr<Family<Counter>> counters;
    std::unique_ptr<Family<Gauge>> gauges;
    std::unique_ptr<Family<Histogram>> histograms;
  };
  const size_t max_series_;
  mutable std::mutex mu_;
  std::vector<Entry> families_;
  std::vector<std::function<void()>> hooks_;
  Counter* dropped_ = nullptr;
};

// Validation helpers, exposed for tests.
bool IsValidMetricName(absl::string_view name);
bool IsValidLabelName(absl::string_view name);
// Escapes a label value (backslash, double quote, newline).
std::string EscapeLabelValue(absl::string_view value);
// Formats a sample value as Prometheus expects (+Inf, -Inf, NaN, shortest
// round-trip decimal otherwise).
std::string FormatValue(double value);

}  // namespace tandem::metrics

#endif  // TANDEM_COMMON_METRICS_METRICS_REGISTRY_H_
