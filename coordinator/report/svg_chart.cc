#include "coordinator/report/svg_chart.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/bytes.h"

namespace tandem::report {
namespace {

// Tableau 10: distinguishable, and readable on white.
constexpr absl::string_view kPalette[] = {
    "#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f",
    "#edc948", "#b07aa1", "#ff9da7", "#9c755f", "#bab0ac"};

// Span kinds of a timeline and their colors, in legend order.
struct SpanKind {
  absl::string_view kind;
  absl::string_view label;
  absl::string_view color;
};
constexpr SpanKind kSpanKinds[] = {
    {"fwd", "forward", "#4e79a7"},
    {"bwd", "backward", "#59a14f"},
    {"opt", "optimizer", "#b07aa1"},
    {"wait", "waiting for communication", "#e15759"},
    {"exchange", "end-of-step exchange", "#ff9da7"},
    {"allgather", "all-gather", "#f28e2b"},
    {"reduce_scatter", "reduce-scatter", "#edc948"},
    {"allreduce", "all-reduce", "#9c755f"},
    {"copy", "host-tier copy", "#76b7b2"},
};

absl::string_view SpanColor(absl::string_view kind) {
  for (const SpanKind& k : kSpanKinds) {
    if (k.kind == kind) return k.color;
  }
  return "#bab0ac";
}

std::string Num(double v) { return absl::StrFormat("%.1f", v); }

// A range and ticks at 1, 2 or 5 times a power of ten covering [lo, hi].
struct Axis {
  double lo = 0;
  double hi = 1;
  std::vector<double> ticks;
};

Axis NiceAxis(double lo, double hi, int target_ticks) {
  if (!(hi > lo)) {
    const double pad = std::abs(hi) > 0 ? std::abs(hi) * 0.1 : 1;
    lo -= pad;
    hi += pad;
  }
  const double raw = (hi - lo) / std::max(1, target_ticks);
  const double magnitude = std::pow(10, std::floor(std::log10(raw)));
  const double norm = raw / magnitude;
  const double step = (norm < 1.5 ? 1
                       : norm < 3 ? 2
                       : norm < 7 ? 5
                                  : 10) *
                      magnitude;
  Axis axis;
  axis.lo = std::floor(lo / step) * step;
  axis.hi = std::ceil(hi / step) * step;
  for (double v = axis.lo; v <= axis.hi + step * 1e-6; v += step) {
    axis.ticks.push_back(std::abs(v) < step * 1e-9 ? 0 : v);
  }
  return axis;
}

// At most kMaxPoints points: each bucket of consecutive points keeps its
// lowest and highest, in x order, so peaks survive.
std::vector<std::pair<double, double>> Thin(
    const std::vector<std::pair<double, double>>& points) {
  if (points.size() <= kMaxPoints) return points;
  const size_t bucket = (points.size() + kMaxPoints / 2 - 1) / (kMaxPoints / 2);
  std::vector<std::pair<double, double>> out;
  for (size_t i = 0; i < points.size(); i += bucket) {
    const size_t end = std::min(points.size(), i + bucket);
    size_t lo = i;
    size_t hi = i;
    for (size_t j = i; j < end; ++j) {
      if (points[j].second < points[lo].second) lo = j;
      if (points[j].second > points[hi].second) hi = j;
    }
    out.push_back(points[std::min(lo, hi)]);
    if (lo != hi) out.push_back(points[std::max(lo, hi)]);
  }
  return out;
}

std::string LegendItem(absl::string_view color, absl::string_view label,
                       bool dashed) {
  return absl::StrCat("<span><i style=\"background:", color, "\"",
                      dashed ? " class=\"dashed\"" : "", "></i>",
                      HtmlEscape(label), "</span>");
}

std::string SvgOpen(absl::string_view id, absl::string_view title, int width,
                    int height) {
  return absl::StrCat(
      "<svg class=\"chart\" data-chart=\"", HtmlEscape(id),
      "\" xmlns=\"http://www.w3.org/2000/svg\" role=\"img\" viewBox=\"0 0 ",
      width, " ", height, "\" width=\"", width, "\" height=\"", height,
      "\" aria-label=\"", HtmlEscape(title), "\"><title>", HtmlEscape(title),
      "</title>");
}

// The horizontal grid lines at the y ticks and their labels: opens the
// "grid" group and closes it, then opens the "axis" group (left open for
// the caller's x axis).
template <typename ToPixel>
void AppendYGrid(const Axis& ya, Unit unit, double left, double pw,
                 const ToPixel& py, std::string* svg) {
  absl::StrAppend(svg, "<g class=\"grid\">");
  for (double t : ya.ticks) {
    absl::StrAppend(svg, "<line x1=\"", Num(left), "\" x2=\"", Num(left + pw),
                    "\" y1=\"", Num(py(t)), "\" y2=\"", Num(py(t)), "\"/>");
  }
  absl::StrAppend(svg, "</g><g class=\"axis\">");
  for (double t : ya.ticks) {
    absl::StrAppend(svg, "<text x=\"", Num(left - 6), "\" y=\"", Num(py(t) + 4),
                    "\" text-anchor=\"end\">", HtmlEscape(FormatValue(t, unit)),
                    "</text>");
  }
}

}  // namespace

std::string HtmlEscape(absl::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

std::string FormatValue(double value, Unit unit) {
  if (!std::isfinite(value)) return "-";
  switch (unit) {
    case Unit::kSeconds: {
      const double a = std::abs(value);
      if (a == 0) return "0 s";
      if (a >= 1) return absl::StrFormat("%.3g s", value);
      if (a >= 1e-3) return absl::StrFormat("%.3g ms", value * 1e3);
      return absl::StrFormat("%.3g µs", value * 1e6);
    }
    case Unit::kBytes:
      return FormatBytesShort(static_cast<int64_t>(std::llround(value)));
    case Unit::kRatio:
      return absl::StrFormat("%.0f%%", value * 100);
    case Unit::kNumber:
      break;
  }
  return absl::StrFormat("%.4g", value);
}

absl::string_view PaletteColor(int index) {
  constexpr int n = sizeof(kPalette) / sizeof(kPalette[0]);
  return kPalette[((index % n) + n) % n];
}

std::string RenderLineChart(const LineChart& chart) {
  double x_lo = std::numeric_limits<double>::infinity();
  double x_hi = -x_lo;
  double y_lo = x_lo;
  double y_hi = -x_lo;
  std::vector<std::vector<std::pair<double, double>>> thinned;
  for (const Series& s : chart.series) {
    thinned.push_back(Thin(s.points));
    for (const auto& [x, y] : s.points) {
      if (!std::isfinite(x) || !std::isfinite(y)) continue;
      x_lo = std::min(x_lo, x);
      x_hi = std::max(x_hi, x);
      y_lo = std::min(y_lo, y);
      y_hi = std::max(y_hi, y);
    }
  }
  if (!std::isfinite(x_lo)) return "";
  for (const Rule& r : chart.x_rules) {
    if (!r.in_range) continue;
    x_lo = std::min(x_lo, r.value);
    x_hi = std::max(x_hi, r.value);
  }
  for (const Rule& r : chart.y_rules) {
    if (!r.in_range) continue;
    y_lo = std::min(y_lo, r.value);
    y_hi = std::max(y_hi, r.value);
  }
  if (chart.y_from_zero) y_lo = std::min(0.0, y_lo);
  const Axis xa = NiceAxis(x_lo, x_hi, 8);
  const Axis ya = NiceAxis(y_lo, y_hi, 5);
  const double left = 76, right = 16, top = 14, bottom = 38;
  const double pw = chart.width - left - right;
  const double ph = chart.height - top - bottom;
  auto px = [&](double x) { return left + (x - xa.lo) / (xa.hi - xa.lo) * pw; };
  auto py = [&](double y) {
    return top + ph - (y - ya.lo) / (ya.hi - ya.lo) * ph;
  };

  std::string svg = SvgOpen(chart.id, chart.title, chart.width, chart.height);
  AppendYGrid(ya, chart.y_unit, left, pw, py, &svg);
  for (double t : xa.ticks) {
    absl::StrAppend(&svg, "<line x1=\"", Num(px(t)), "\" x2=\"", Num(px(t)),
                    "\" y1=\"", Num(top + ph), "\" y2=\"", Num(top + ph + 4),
                    "\"/><text x=\"", Num(px(t)), "\" y=\"", Num(top + ph + 16),
                    "\" text-anchor=\"middle\">",
                    HtmlEscape(FormatValue(t, chart.x_unit)), "</text>");
  }
  absl::StrAppend(&svg, "<line x1=\"", Num(left), "\" x2=\"", Num(left + pw),
                  "\" y1=\"", Num(top + ph), "\" y2=\"", Num(top + ph),
                  "\"/><line x1=\"", Num(left), "\" x2=\"", Num(left),
                  "\" y1=\"", Num(top), "\" y2=\"", Num(top + ph), "\"/>");
  absl::StrAppend(&svg, "<text x=\"", Num(left + pw / 2), "\" y=\"",
                  Num(chart.height - 4), "\" text-anchor=\"middle\">",
                  HtmlEscape(chart.x_label), "</text>");
  absl::StrAppend(&svg, "<text transform=\"translate(14,", Num(top + ph / 2),
                  ") rotate(-90)\" text-anchor=\"middle\">",
                  HtmlEscape(chart.y_label), "</text></g>");

  // Rules under the data.
  for (const Rule& r : chart.x_rules) {
    if (r.value < xa.lo || r.value > xa.hi) continue;
    absl::StrAppend(&svg, "<g class=\"rule\"><line x1=\"", Num(px(r.value)),
                    "\" x2=\"", Num(px(r.value)), "\" y1=\"", Num(top),
                    "\" y2=\"", Num(top + ph), "\" stroke=\"",
                    PaletteColor(r.color), "\"/><text x=\"",
                    Num(px(r.value) + 3), "\" y=\"", Num(top + 10), "\">",
                    HtmlEscape(r.label), "</text></g>");
  }
  for (const Rule& r : chart.y_rules) {
    if (r.value < ya.lo || r.value > ya.hi) continue;
    absl::StrAppend(&svg, "<g class=\"rule\"><line x1=\"", Num(left),
                    "\" x2=\"", Num(left + pw), "\" y1=\"", Num(py(r.value)),
                    "\" y2=\"", Num(py(r.value)), "\" stroke=\"",
                    PaletteColor(r.color), "\"/><text x=\"", Num(left + pw - 4),
                    "\" y=\"", Num(py(r.value) - 4), "\" text-anchor=\"end\">",
                    HtmlEscape(r.label), "</text></g>");
  }
  std::string legend;
  for (size_t i = 0; i < chart.series.size(); ++i) {
    const Series& s = chart.series[i];
    const std::vector<std::pair<double, double>>& points = thinned[i];
    std::string coords;
    int n = 0;
    for (const auto& [x, y] : points) {
      if (!std::isfinite(x) || !std::isfinite(y)) continue;
      absl::StrAppend(&coords, n++ == 0 ? "" : " ", Num(px(x)), ",",
                      Num(py(y)));
    }
    if (n == 0) continue;
    const absl::string_view color = PaletteColor(s.color);
    if (n > 1) {
      absl::StrAppend(&svg, "<polyline class=\"data\" fill=\"none\" stroke=\"",
                      color, "\" stroke-width=\"1.6\"",
                      s.dashed ? " stroke-dasharray=\"6 4\"" : "", " points=\"",
                      coords, "\"><title>", HtmlEscape(s.label),
                      "</title></polyline>");
    }
    if (s.markers || n == 1) {
      for (const auto& [x, y] : points) {
        if (!std::isfinite(x) || !std::isfinite(y)) continue;
        absl::StrAppend(
            &svg, "<circle class=\"data\" cx=\"", Num(px(x)), "\" cy=\"",
            Num(py(y)), "\" r=\"3\" fill=\"", color, "\"><title>",
            HtmlEscape(absl::StrCat(s.label, ": ", FormatValue(y, chart.y_unit),
                                    " at ", FormatValue(x, chart.x_unit))),
            "</title></circle>");
      }
    }
    absl::StrAppend(&legend, LegendItem(color, s.label, s.dashed));
  }
  for (const Rule& r : chart.y_rules) {
    if (r.value < ya.lo || r.value > ya.hi) continue;
    absl::StrAppend(
        &legend, LegendItem(PaletteColor(r.color), r.label, /*dashed=*/true));
  }
  absl::StrAppend(&svg, "</svg>");
  return absl::StrCat(svg, "<div class=\"legend\">", legend, "</div>");
}

std::string RenderBarChart(const BarChart& chart) {
  double hi = 0;
  bool any = false;
  for (const BarGroup& g : chart.groups) {
    for (double v : g.values) {
      if (!std::isfinite(v)) continue;
      any = true;
      hi = std::max(hi, v);
    }
  }
  if (!any || chart.groups.empty()) return "";
  const Axis ya = NiceAxis(0, hi > 0 ? hi * 1.08 : 1, 5);
  const double left = 76, right = 16, top = 14, bottom = 34;
  const double pw = chart.width - left - right;
  const double ph = chart.height - top - bottom;
  auto py = [&](double y) {
    return top + ph - (y - ya.lo) / (ya.hi - ya.lo) * ph;
  };
  std::string svg = SvgOpen(chart.id, chart.title, chart.width, chart.height);
  AppendYGrid(ya, chart.y_unit, left, pw, py, &svg);
  absl::StrAppend(&svg, "<line x1=\"", Num(left), "\" x2=\"", Num(left + pw),
                  "\" y1=\"", Num(top + ph), "\" y2=\"", Num(top + ph),
                  "\"/><text transform=\"translate(14,", Num(top + ph / 2),
                  ") rotate(-90)\" text-anchor=\"middle\">",
                  HtmlEscape(chart.y_label), "</text>");
  const double group_w = pw / static_cast<double>(chart.groups.size());
  const size_t n_series = std::max<size_t>(1, chart.series_labels.size());
  const double bar_w =
      std::min(48.0, group_w * 0.8 / static_cast<double>(n_series));
  for (size_t g = 0; g < chart.groups.size(); ++g) {
    const double center = left + group_w * (g + 0.5);
    absl::StrAppend(&svg, "<text x=\"", Num(center), "\" y=\"",
                    Num(top + ph + 16), "\" text-anchor=\"middle\">",
                    HtmlEscape(chart.groups[g].label), "</text>");
  }
  absl::StrAppend(&svg, "</g>");
  for (size_t g = 0; g < chart.groups.size(); ++g) {
    const BarGroup& group = chart.groups[g];
    const double start = left + group_w * (g + 0.5) - bar_w * n_series / 2;
    for (size_t s = 0; s < group.values.size() && s < n_series; ++s) {
      const double v = group.values[s];
      if (!std::isfinite(v)) continue;
      const double x = start + bar_w * s;
      const double y = py(std::max(0.0, v));
      const double h = std::max(1.0, top + ph - y);
      const int color = s < chart.series_colors.size() ? chart.series_colors[s]
                                                       : static_cast<int>(s);
      const std::string series =
          s < chart.series_labels.size() ? chart.series_labels[s] : "";
      absl::StrAppend(&svg, "<rect class=\"data\" x=\"", Num(x + 1), "\" y=\"",
                      Num(top + ph - h), "\" width=\"",
                      Num(std::max(1.0, bar_w - 2)), "\" height=\"", Num(h),
                      "\" fill=\"", PaletteColor(color), "\"><title>",
                      HtmlEscape(absl::StrCat(group.label, ", ", series, ": ",
                                              FormatValue(v, chart.y_unit))),
                      "</title></rect><text class=\"value\" x=\"",
                      Num(x + bar_w / 2), "\" y=\"", Num(top + ph - h - 3),
                      "\" text-anchor=\"middle\">",
                      HtmlEscape(FormatValue(v, chart.y_unit)), "</text>");
    }
  }
  absl::StrAppend(&svg, "</svg>");
  std::string legend;
  for (size_t s = 0; s < chart.series_labels.size(); ++s) {
    const int color = s < chart.series_colors.size() ? chart.series_colors[s]
                                                     : static_cast<int>(s);
    absl::StrAppend(&legend, LegendItem(PaletteColor(color),
                                        chart.series_labels[s], false));
  }
  return absl::StrCat(svg, "<div class=\"legend\">", legend, "</div>");
}

std::string RenderLaneChart(const LaneChart& chart) {
  double end = 0;
  bool any = false;
  for (const Lane& lane : chart.lanes) {
    for (const Span& s : lane.spans) {
      any = true;
      end = std::max(end, s.end_s);
    }
  }
  if (!any) return "";
  const Axis xa = NiceAxis(0, end > 0 ? end : 1e-3, 8);
  const double left = 190, right = 16, top = 8, bottom = 30;
  const double lane_h = 14, lane_gap = 5, group_gap = 8;
  double height = top;
  for (const Lane& lane : chart.lanes) {
    height += lane_h + lane_gap + (lane.starts_group ? group_gap : 0);
  }
  const double plot_bottom = height;
  height += bottom;
  const double pw = chart.width - left - right;
  auto px = [&](double x) { return left + (x - xa.lo) / (xa.hi - xa.lo) * pw; };
  std::string svg = SvgOpen(chart.id, chart.title, chart.width,
                            static_cast<int>(std::ceil(height)));
  absl::StrAppend(&svg, "<g class=\"grid\">");
  for (double t : xa.ticks) {
    absl::StrAppend(&svg, "<line x1=\"", Num(px(t)), "\" x2=\"", Num(px(t)),
                    "\" y1=\"", Num(top), "\" y2=\"", Num(plot_bottom), "\"/>");
  }
  absl::StrAppend(&svg, "</g><g class=\"axis\">");
  for (double t : xa.ticks) {
    absl::StrAppend(&svg, "<text x=\"", Num(px(t)), "\" y=\"",
                    Num(plot_bottom + 14), "\" text-anchor=\"middle\">",
                    HtmlEscape(FormatValue(t, Unit::kSeconds)), "</text>");
  }
  absl::StrAppend(&svg, "<text x=\"", Num(left + pw / 2), "\" y=\"",
                  Num(height - 2),
                  "\" text-anchor=\"middle\">time into the iteration</text>");
  absl::StrAppend(&svg, "</g>");
  std::map<std::string, bool> kinds_seen;
  double y = top;
  for (const Lane& lane : chart.lanes) {
    if (lane.starts_group) {
      y += group_gap;
      absl::StrAppend(&svg, "<line class=\"separator\" x1=\"4\" x2=\"",
                      Num(chart.width - right), "\" y1=\"",
                      Num(y - group_gap / 2), "\" y2=\"",
                      Num(y - group_gap / 2), "\"/>");
    }
    absl::StrAppend(&svg, "<text class=\"lane\" x=\"", Num(left - 6), "\" y=\"",
                    Num(y + lane_h - 3), "\" text-anchor=\"end\">",
                    HtmlEscape(lane.label), "</text>");
    // Spans in start order; those that would share a pixel with the mark
    // before (same kind) extend it.
    std::vector<const Span*> spans;
    for (const Span& s : lane.spans) spans.push_back(&s);
    std::stable_sort(
        spans.begin(), spans.end(),
        [](const Span* a, const Span* b) { return a->start_s < b->start_s; });
    struct Mark {
      double x0, x1;
      std::string kind;
      std::string label;
      int count;
      double start_s, end_s;
    };
    std::vector<Mark> marks;
    for (const Span* s : spans) {
      const double x0 = px(std::max(0.0, s->start_s));
      const double x1 = std::max(x0 + 0.5, px(std::max(s->start_s, s->end_s)));
      if (!marks.empty() && marks.back().kind == s->kind &&
          x0 <= marks.back().x1 + 1.0 && x1 - marks.back().x0 < 4.0) {
        Mark& m = marks.back();
        m.x1 = std::max(m.x1, x1);
        m.end_s = std::max(m.end_s, s->end_s);
        ++m.count;
        continue;
      }
      marks.push_back({x0, x1, s->kind, s->label, 1, s->start_s, s->end_s});
    }
    for (const Mark& m : marks) {
      kinds_seen[m.kind] = true;
      const std::string label =
          m.count == 1
              ? absl::StrCat(m.label, ": ",
                             FormatValue(m.end_s - m.start_s, Unit::kSeconds),
                             " from ", FormatValue(m.start_s, Unit::kSeconds))
              : absl::StrCat(m.count, " spans from ",
                             FormatValue(m.start_s, Unit::kSeconds), " to ",
                             FormatValue(m.end_s, Unit::kSeconds), ", first ",
                             m.label);
      absl::StrAppend(&svg, "<rect class=\"data\" x=\"", Num(m.x0), "\" y=\"",
                      Num(y), "\" width=\"",
                      absl::StrFormat("%.2f", m.x1 - m.x0), "\" height=\"",
                      Num(lane_h), "\" fill=\"", SpanColor(m.kind),
                      "\"><title>", HtmlEscape(label), "</title></rect>");
    }
    y += lane_h + lane_gap;
  }
  absl::StrAppend(&svg, "</svg>");
  std::string legend;
  for (const SpanKind& k : kSpanKinds) {
    if (kinds_seen.count(std::string(k.kind))) {
      absl::StrAppend(&legend, LegendItem(k.color, k.label, false));
    }
  }
  return absl::StrCat(svg, "<div class=\"legend\">", legend, "</div>");
}

}  // namespace tandem::report
