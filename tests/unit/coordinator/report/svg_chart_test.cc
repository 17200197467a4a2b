#include "coordinator/report/svg_chart.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <regex>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"

namespace tandem::report {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

int Count(const std::string& text, const std::string& needle) {
  int n = 0;
  for (size_t at = text.find(needle); at != std::string::npos;
       at = text.find(needle, at + needle.size())) {
    ++n;
  }
  return n;
}

// The (x, y) pairs of the first data polyline.
std::vector<std::pair<double, double>> PolylinePoints(const std::string& svg) {
  std::smatch m;
  const std::regex re("<polyline class=\"data\"[^>]* points=\"([^\"]*)\"");
  std::vector<std::pair<double, double>> out;
  if (!std::regex_search(svg, m, re)) return out;
  for (absl::string_view pair : absl::StrSplit(m[1].str(), ' ')) {
    std::vector<absl::string_view> xy = absl::StrSplit(pair, ',');
    double x = 0, y = 0;
    if (xy.size() == 2 && absl::SimpleAtod(xy[0], &x) &&
        absl::SimpleAtod(xy[1], &y)) {
      out.emplace_back(x, y);
    }
  }
  return out;
}

TEST(HtmlEscapeTest, Markup_IsEscaped) {
  EXPECT_EQ(HtmlEscape("<a href=\"x\">'&'</a>"),
            "&lt;a href=&quot;x&quot;&gt;&#39;&amp;&#39;&lt;/a&gt;");
  EXPECT_EQ(HtmlEscape("plain v1 step 3"), "plain v1 step 3");
}

TEST(FormatValueTest, Units_ReadAsPeopleWriteThem) {
  EXPECT_EQ(FormatValue(0.0125, Unit::kSeconds), "12.5 ms");
  EXPECT_EQ(FormatValue(2.5, Unit::kSeconds), "2.5 s");
  EXPECT_EQ(FormatValue(4e-6, Unit::kSeconds), "4 µs");
  EXPECT_EQ(FormatValue(0, Unit::kSeconds), "0 s");
  EXPECT_EQ(FormatValue(1.5 * 1024 * 1024, Unit::kBytes), "1.50MiB");
  EXPECT_EQ(FormatValue(0.874, Unit::kRatio), "87%");
  EXPECT_EQ(FormatValue(std::nan(""), Unit::kNumber), "-");
}

TEST(LineChartTest, Render_PointsInsidePlotAndHigherValuesHigher) {
  LineChart c;
  c.id = "loss";
  c.title = "Loss";
  c.series.push_back({"loss", {{1, 5.0}, {2, 4.0}, {3, 3.5}}, 0});
  const std::string svg = RenderLineChart(c);
  EXPECT_THAT(svg, HasSubstr("data-chart=\"loss\""));
  const auto pts = PolylinePoints(svg);
  ASSERT_EQ(pts.size(), 3u);
  for (const auto& [x, y] : pts) {
    EXPECT_GE(x, 0);
    EXPECT_LE(x, c.width);
    EXPECT_GE(y, 0);
    EXPECT_LE(y, c.height);
  }
  EXPECT_LT(pts[0].first, pts[1].first);
  EXPECT_LT(pts[1].first, pts[2].first);
  // SVG y grows downwards: the largest loss is drawn highest.
  EXPECT_LT(pts[0].second, pts[1].second);
  EXPECT_LT(pts[1].second, pts[2].second);
  EXPECT_THAT(svg, HasSubstr("<div class=\"legend\">"));
}

TEST(LineChartTest, Render_NoPoints_RendersNothing) {
  LineChart c;
  c.id = "empty";
  c.series.push_back({"nothing", {}, 0});
  c.y_rules.push_back({1.0, "budget", 2, true});
  EXPECT_EQ(RenderLineChart(c), "");
}

TEST(LineChartTest, Render_LongSeries_ThinnedKeepingItsPeak) {
  LineChart c;
  c.id = "long";
  Series s{"long", {}, 0};
  for (int i = 0; i < 20000; ++i) {
    s.points.emplace_back(i, i == 12345 ? 100.0 : 1.0);
  }
  c.series.push_back(s);
  const auto pts = PolylinePoints(RenderLineChart(c));
  EXPECT_LE(pts.size(), kMaxPoints);
  EXPECT_GT(pts.size(), kMaxPoints / 4);
  double top = 1e9;
  for (const auto& [_, y] : pts) top = std::min(top, y);
  // The spike is the chart's maximum: drawn at the top of the plot (the
  // axis rounds 100 up to itself).
  EXPECT_LT(top, 20);
}

TEST(LineChartTest, Render_UserTextEscaped) {
  LineChart c;
  c.id = "x\"><script>";
  c.title = "<b>title</b>";
  c.series.push_back({"<script>alert(1)</script>", {{0, 1}, {1, 2}}, 0});
  c.x_rules.push_back({0.5, "<img src=x>", 1, true});
  const std::string svg = RenderLineChart(c);
  EXPECT_THAT(svg, Not(HasSubstr("<script")));
  EXPECT_THAT(svg, Not(HasSubstr("<img")));
  EXPECT_THAT(svg, Not(HasSubstr("<b>")));
  EXPECT_THAT(svg, HasSubstr("&lt;script&gt;alert(1)&lt;/script&gt;"));
}

TEST(LineChartTest, Render_OutOfRangeRule_NotDrawnAndRangeKept) {
  LineChart c;
  c.id = "memory";
  c.series.push_back({"curve", {{0, 10}, {1, 20}}, 0});
  c.y_rules.push_back({1e6, "budget far above", 2, /*in_range=*/false});
  const std::string svg = RenderLineChart(c);
  EXPECT_THAT(svg, Not(HasSubstr(">budget far above</text>")));
  // The curve still spans the plot: its top is near the top.
  const auto pts = PolylinePoints(svg);
  ASSERT_EQ(pts.size(), 2u);
  EXPECT_LT(pts[1].second, 40);
}

TEST(BarChartTest, Render_NaNValue_DrawsNoBar) {
  BarChart c;
  c.id = "bars";
  c.y_unit = Unit::kSeconds;
  c.series_labels = {"predicted", "measured"};
  c.series_colors = {0, 1};
  c.groups.push_back({"v0", {0.02, 0.03}});
  c.groups.push_back({"v1", {0.01, std::numeric_limits<double>::quiet_NaN()}});
  const std::string svg = RenderBarChart(c);
  EXPECT_EQ(Count(svg, "<rect class=\"data\""), 3);
  EXPECT_THAT(svg, HasSubstr("v1, predicted: 10 ms"));
  EXPECT_THAT(svg, HasSubstr("v0, measured: 30 ms"));
}

TEST(BarChartTest, Render_NoValue_RendersNothing) {
  BarChart c;
  c.id = "bars";
  c.series_labels = {"a"};
  c.groups.push_back({"g", {std::numeric_limits<double>::quiet_NaN()}});
  EXPECT_EQ(RenderBarChart(c), "");
}

TEST(LaneChartTest, Render_TinyNeighbouringSpansMergeKindsDoNot) {
  LaneChart c;
  c.id = "timeline";
  Lane compute{"rank 0 · compute", {}, true};
  // 1000 spans of 1 µs in a 1 s iteration: far below a pixel each.
  for (int i = 0; i < 1000; ++i) {
    compute.spans.push_back({i * 1e-6, (i + 1) * 1e-6, "n", "fwd"});
  }
  compute.spans.push_back({0.5, 1.0, "big", "bwd"});
  Lane comm{"rank 0 · communication", {}, false};
  comm.spans.push_back({0.1, 0.2, "allgather g1", "allgather"});
  comm.spans.push_back({0.2, 0.3, "reduce_scatter", "reduce_scatter"});
  c.lanes = {compute, comm};
  const std::string svg = RenderLaneChart(c);
  const int rects = Count(svg, "<rect class=\"data\"");
  EXPECT_GE(rects, 4);
  EXPECT_LE(rects, 8);
  EXPECT_THAT(svg, HasSubstr("spans from"));
  EXPECT_THAT(svg, HasSubstr("big: 500 ms from 500 ms"));
  EXPECT_THAT(svg, HasSubstr(">rank 0 · communication</text>"));
  EXPECT_THAT(svg, HasSubstr("all-gather"));  // legend
}

TEST(LaneChartTest, Render_NoSpans_RendersNothing) {
  LaneChart c;
  c.lanes.push_back({"empty", {}, true});
  EXPECT_EQ(RenderLaneChart(c), "");
}

}  // namespace
}  // namespace tandem::report
