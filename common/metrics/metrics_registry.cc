#include "common/metrics/metrics_registry.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <iostream>

#include "absl/strings/str_cat.h"

namespace tandem::metrics {
namespace {

void AtomicAdd(std::atomic<double>& target, double delta) {
  double current = target.load(std::memory_order_relaxed);
  while (!target.compare_exchange_weak(current, current + delta,
                                       std::memory_order_relaxed)) {
  }
}

std::string EscapeHelp(absl::string_view help) {
  std::string out;
  for (char c : help) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

absl::string_view TypeName(MetricType type) {
  switch (type) {
    case MetricType::kCounter:
      return "counter";
    case MetricType::kGauge:
      return "gauge";
    case MetricType::kHistogram:
      return "histogram";
  }
  return "untyped";
}

// `{a="x",b="y"}` for the given names and values, plus an optional extra
// label (a histogram's `le`); empty when there are no labels at all.
std::string LabelText(const std::vector<std::string>& names,
                      const LabelValues& values, absl::string_view extra_name,
                      absl::string_view extra_value) {
  if (names.empty() && extra_name.empty()) return "";
  std::string out = "{";
  for (size_t i = 0; i < names.size(); ++i) {
    if (i > 0) out += ",";
    absl::StrAppend(&out, names[i], "=\"", EscapeLabelValue(values[i]), "\"");
  }
  if (!extra_name.empty()) {
    if (!names.empty()) out += ",";
    absl::StrAppend(&out, extra_name, "=\"", extra_value, "\"");
  }
  out += "}";
  return out;
}

}  // namespace

void Counter::Increment(double delta) {
  if (!(delta >= 0)) return;
  AtomicAdd(value_, delta);
}

void Gauge::Add(double delta) { AtomicAdd(value_, delta); }

Histogram::Histogram(std::vector<double> bounds)
    : bounds_(std::move(bounds)), counts_(bounds_.size() + 1, 0) {}

void Histogram::Observe(double value) {
  const size_t bucket =
      std::lower_bound(bounds_.begin(), bounds_.end(), value) - bounds_.begin();
  std::lock_guard<std::mutex> lock(mu_);
  ++counts_[bucket];
  sum_ += value;
  ++count_;
}

Histogram::Snapshot Histogram::snapshot() const {
  Snapshot s;
  s.bounds = bounds_;
  std::lock_guard<std::mutex> lock(mu_);
  uint64_t running = 0;
  for (uint64_t c : counts_) {
    running += c;
    s.cumulative.push_back(running);
  }
  s.sum = sum_;
  s.count = count_;
  return s;
}

std::vector<double> ExponentialBuckets(double start, double factor, int count) {
  std::vector<double> out;
  double v = start;
  for (int i = 0; i < count; ++i, v *= factor) out.push_back(v);
  return out;
}

template <typename T>
Family<T>::Family(Registry* registry, std::string name, std::string help,
                  std::vector<std::string> label_names, MetricType type,
                  std::vector<double> bounds, size_t max_series)
    : registry_(registry),
      name_(std::move(name)),
      help_(std::move(help)),
      label_names_(std::move(label_names)),
      type_(type),
      bounds_(std::move(bounds)),
      max_series_(max_series) {}

template <typename T>
std::unique_ptr<T> Family<T>::Make() const {
  if constexpr (std::is_same_v<T, Histogram>) {
    return std::make_unique<Histogram>(bounds_);
  } else {
    return std::make_unique<T>();
  }
}

template <typename T>
T& Family<T>::WithLabels(const LabelValues& values) {
  if (values.size() != label_names_.size()) {
    std::cerr << "metric " << name_ << " takes " << label_names_.size()
              << " label values, got " << values.size() << "\n";
    std::abort();
  }
  std::lock_guard<std::mutex> lock(mu_);
  auto it = series_.find(values);
  if (it != series_.end()) return *it->second;
  if (series_.size() >= max_series_) {
    if (registry_ != nullptr) registry_->CountDropped();
    if (overflow_ == nullptr) overflow_ = Make();
    return *overflow_;
  }
  return *series_.emplace(values, Make()).first->second;
}

template <typename T>
void Family<T>::Remove(const LabelValues& values) {
  std::lock_guard<std::mutex> lock(mu_);
  series_.erase(values);
}

template class Family<Counter>;
template class Family<Gauge>;
template class Family<Histogram>;

Registry::Registry(size_t max_series_per_family)
    : max_series_(max_series_per_family) {
  auto dropped = AddCounter(
      "tandem_metrics_dropped_series_total",
      "Samples recorded for label sets beyond a family's series limit.");
  dropped_ = &(*dropped)->WithLabels({});
}

absl::Status Registry::CheckNew(absl::string_view name,
                                const std::vector<std::string>& label_names) {
  if (!IsValidMetricName(name)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "metric name '", name, "' is malformed: use [a-zA-Z_:][a-zA-Z0-9_:]*"));
  }
  for (const std::string& label : label_names) {
    if (!IsValidLabelName(label) || label == "le" || label == "quantile") {
      return absl::InvalidArgumentError(absl::StrCat(
          "metric ", name, ": label name '", label,
          "' is malformed or reserved: use [a-zA-Z_][a-zA-Z0-9_]*, not "
          "starting with __, not le or quantile"));
    }
  }
  std::lock_guard<std::mutex> lock(mu_);
  for (const Entry& e : families_) {
    const std::string& existing =
        e.counters ? e.counters->name_
                   : (e.gauges ? e.gauges->name_ : e.histograms->name_);
    if (existing == name) {
      return absl::InvalidArgumentError(
          absl::StrCat("metric ", name, " is registered twice"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<Family<Counter>*> Registry::AddCounter(
    absl::string_view name, absl::string_view help,
    std::vector<std::string> label_names) {
  if (name.size() < 6 || name.substr(name.size() - 6) != "_total") {
    return absl::InvalidArgumentError(
        absl::StrCat("counter ", name, " must end in _total"));
  }
  absl::Status status = CheckNew(name, label_names);
  if (!status.ok()) return status;
  std::lock_guard<std::mutex> lock(mu_);
  Entry e{MetricType::kCounter, nullptr, nullptr, nullptr};
  e.counters.reset(new Family<Counter>(
      this, std::string(name), std::string(help), std::move(label_names),
      MetricType::kCounter, {}, max_series_));
  Family<Counter>* out = e.counters.get();
  families_.push_back(std::move(e));
  return out;
}

absl::StatusOr<Family<Gauge>*> Registry::AddGauge(
    absl::string_view name, absl::string_view help,
    std::vector<std::string> label_names) {
  absl::Status status = CheckNew(name, label_names);
  if (!status.ok()) return status;
  std::lock_guard<std::mutex> lock(mu_);
  Entry e{MetricType::kGauge, nullptr, nullptr, nullptr};
  e.gauges.reset(new Family<Gauge>(this, std::string(name), std::string(help),
                                   std::move(label_names), MetricType::kGauge,
                                   {}, max_series_));
  Family<Gauge>* out = e.gauges.get();
  families_.push_back(std::move(e));
  return out;
}

absl::StatusOr<Family<Histogram>*> Registry::AddHistogram(
    absl::string_view name, absl::string_view help,
    std::vector<std::string> label_names, std::vector<double> bounds) {
  for (size_t i = 0; i < bounds.size(); ++i) {
    if (!std::isfinite(bounds[i]) || (i > 0 && bounds[i] <= bounds[i - 1])) {
      return absl::InvalidArgumentError(absl::StrCat(
          "histogram ", name,
          ": bucket bounds must be finite and strictly increasing"));
    }
  }
  absl::Status status = CheckNew(name, label_names);
  if (!status.ok()) return status;
  std::lock_guard<std::mutex> lock(mu_);
  Entry e{MetricType::kHistogram, nullptr, nullptr, nullptr};
  e.histograms.reset(new Family<Histogram>(
      this, std::string(name), std::string(help), std::move(label_names),
      MetricType::kHistogram, std::move(bounds), max_series_));
  Family<Histogram>* out = e.histograms.get();
  families_.push_back(std::move(e));
  return out;
}

void Registry::AddCollectHook(std::function<void()> hook) {
  std::lock_guard<std::mutex> lock(mu_);
  hooks_.push_back(std::move(hook));
}

std::string Registry::Expose(const SeriesFilter& filter) const {
  {
    std::vector<std::function<void()>> hooks;
    {
      std::lock_guard<std::mutex> lock(mu_);
      hooks = hooks_;
    }
    for (const auto& hook : hooks) hook();
  }
  auto keep = [&](const std::vector<std::string>& names,
                  const LabelValues& values) {
    return !filter || filter(names, values);
  };
  std::string out;
  auto header = [&](const std::string& name, const std::string& help,
                    MetricType type) {
    absl::StrAppend(&out, "# HELP ", name, " ", EscapeHelp(help), "\n",
                    "# TYPE ", name, " ", TypeName(type), "\n");
  };
  auto scalar = [&](const auto& family) {
    header(family.name_, family.help_, family.type_);
    std::lock_guard<std::mutex> lock(family.mu_);
    for (const auto& [values, series] : family.series_) {
      if (!keep(family.label_names_, values)) continue;
      absl::StrAppend(&out, family.name_,
                      LabelText(family.label_names_, values, "", ""), " ",
                      FormatValue(series->value()), "\n");
    }
  };
  std::lock_guard<std::mutex> lock(mu_);
  for (const Entry& e : families_) {
    if (e.counters) {
      scalar(*e.counters);
    } else if (e.gauges) {
      scalar(*e.gauges);
    } else {
      const Family<Histogram>& family = *e.histograms;
      header(family.name_, family.help_, family.type_);
      std::lock_guard<std::mutex> family_lock(family.mu_);
      for (const auto& [values, series] : family.series_) {
        if (!keep(family.label_names_, values)) continue;
        const Histogram::Snapshot s = series->snapshot();
        for (size_t i = 0; i <= s.bounds.size(); ++i) {
          const std::string le =
              i < s.bounds.size() ? FormatValue(s.bounds[i]) : "+Inf";
          absl::StrAppend(&out, family.name_, "_bucket",
                          LabelText(family.label_names_, values, "le", le), " ",
                          s.cumulative[i], "\n");
        }
        const std::string labels =
            LabelText(family.label_names_, values, "", "");
        absl::StrAppend(&out, family.name_, "_sum", labels, " ",
                        FormatValue(s.sum), "\n", family.name_, "_count",
                        labels, " ", s.count, "\n");
      }
    }
  }
  return out;
}

bool IsValidMetricName(absl::string_view name) {
  if (name.empty()) return false;
  for (size_t i = 0; i < name.size(); ++i) {
    const char c = name[i];
    const bool alpha = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
                       c == '_' || c == ':';
    if (!alpha && !(i > 0 && c >= '0' && c <= '9')) return false;
  }
  return true;
}

bool IsValidLabelName(absl::string_view name) {
  if (name.empty() || name.substr(0, 2) == "__") return false;
  for (size_t i = 0; i < name.size(); ++i) {
    const char c = name[i];
    const bool alpha =
        (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
    if (!alpha && !(i > 0 && c >= '0' && c <= '9')) return false;
  }
  return true;
}

std::string EscapeLabelValue(absl::string_view value) {
  std::string out;
  for (char c : value) {
    switch (c) {
      case '\\':
        out += "\\\\";
        break;
      case '"':
        out += "\\\"";
        break;
      case '\n':
        out += "\\n";
        break;
      default:
        out += c;
    }
  }
  return out;
}

std::string FormatValue(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "+Inf" : "-Inf";
  char buf[32];
  if (value == std::trunc(value) && std::fabs(value) < 9007199254740992.0) {
    // Whole numbers (byte counts, step numbers) print without an exponent.
    auto [end, ec] =
        std::to_chars(buf, buf + sizeof(buf), static_cast<int64_t>(value));
    return std::string(buf, end);
  }
  auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), value);
  return std::string(buf, end);
}

}  // namespace tandem::metrics
