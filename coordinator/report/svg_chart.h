// Charts as inline SVG for the job report (coordinator/README.md, "Job
// report"): line charts over a numeric x axis, grouped bar charts, and lanes
// of spans for a timeline, each with its axes, ticks and an HTML legend, and
// no script. Every mark that shows data carries the class "data" (the
// report's tests count them); every text is escaped.
#ifndef TANDEM_COORDINATOR_REPORT_SVG_CHART_H_
#define TANDEM_COORDINATOR_REPORT_SVG_CHART_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/string_view.h"

namespace tandem::report {

// `text` with &, <, >, " and ' escaped: safe in element text and in quoted
// attribute values.
std::string HtmlEscape(absl::string_view text);

// How an axis or a value reads.
enum class Unit { kNumber, kSeconds, kBytes, kRatio };
// "1.23", "12.5 ms" (seconds), "1.50MiB" (bytes), "87%" (a ratio).
std::string FormatValue(double value, Unit unit);

// Colors by index (a series, a schedule version), cycling.
absl::string_view PaletteColor(int index);

struct Series {
  std::string label;
  // (x, y), in x order. Long series are thinned to at most kMaxPoints,
  // keeping each bucket's lowest and highest point.
  std::vector<std::pair<double, double>> points;
  int color = 0;
  bool dashed = false;
  // A circle at each point (sparse series: a few measured values).
  bool markers = false;
};

// A reference line across the chart: at an x (a schedule switch) or a y
// (the memory budget).
struct Rule {
  double value = 0;
  std::string label;
  int color = 0;
  // Whether the axis range stretches to show it (a budget far above the
  // data would flatten it; the caller says so in text instead).
  bool in_range = true;
};

struct LineChart {
  // The chart's name (data-chart) and its accessible title.
  std::string id;
  std::string title;
  std::string x_label;
  std::string y_label;
  Unit x_unit = Unit::kNumber;
  Unit y_unit = Unit::kNumber;
  // From 0, or from the lowest value (a loss curve).
  bool y_from_zero = true;
  std::vector<Series> series;
  std::vector<Rule> x_rules;
  std::vector<Rule> y_rules;
  int width = 880;
  int height = 260;
};

inline constexpr size_t kMaxPoints = 2000;

// An <svg class="chart"> followed by its legend; a chart without a point
// renders nothing (the caller says why in text).
std::string RenderLineChart(const LineChart& chart);

struct BarGroup {
  std::string label;
  // One per series; a NaN value draws no bar.
  std::vector<double> values;
};

struct BarChart {
  std::string id;
  std::string title;
  std::string y_label;
  Unit y_unit = Unit::kNumber;
  std::vector<std::string> series_labels;
  std::vector<int> series_colors;
  std::vector<BarGroup> groups;
  int width = 880;
  int height = 240;
};

// Bars from 0, each labelled with its value. Nothing when no bar has a
// value.
std::string RenderBarChart(const BarChart& chart);

struct Span {
  double start_s = 0;
  double end_s = 0;
  // The tooltip (an SVG <title>).
  std::string label;
  // The CSS class that colors it ("fwd", "bwd", "opt", "wait", "allgather",
  // "reduce_scatter", "allreduce", "copy", "exchange").
  std::string kind;
};

struct Lane {
  std::string label;
  std::vector<Span> spans;
  // A rule above it: the first lane of a rank, or of the prediction.
  bool starts_group = false;
};

struct LaneChart {
  std::string id;
  std::string title;
  std::vector<Lane> lanes;
  int width = 880;
};

// One row per lane on a shared time axis; spans that would overlap on
// screen within a pixel merge into one mark. Nothing when no lane has a
// span.
std::string RenderLaneChart(const LaneChart& chart);

}  // namespace tandem::report

#endif  // TANDEM_COORDINATOR_REPORT_SVG_CHART_H_
