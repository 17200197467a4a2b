#include "coordinator/report/job_report.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "common/bytes.h"
#include "common/ir/explanation.h"
#include "common/json_string.h"
#include "coordinator/service/job_manager.h"

namespace tandem {
namespace {

using report::BarChart;
using report::BarGroup;
using report::FormatValue;
using report::HtmlEscape;
using report::LaneChart;
using report::LineChart;
using report::Rule;
using report::Series;
using report::Unit;

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

constexpr absl::string_view kStyle = R"css(
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif;
       color: #1f2328; margin: 0 auto; max-width: 960px; padding: 16px 24px; }
h1 { font-size: 22px; margin: 8px 0 4px; }
h1 .id { font-family: ui-monospace, monospace; font-weight: 600; }
h2 { font-size: 17px; margin: 28px 0 6px; border-bottom: 1px solid #d0d7de;
     padding-bottom: 4px; }
h3 { font-size: 14px; margin: 14px 0 4px; }
p { margin: 4px 0 8px; }
p.empty { color: #656d76; font-style: italic; }
p.note { color: #656d76; font-size: 13px; }
table { border-collapse: collapse; margin: 6px 0 10px; font-size: 13px; }
th, td { text-align: left; padding: 3px 10px 3px 0; vertical-align: top;
         border-bottom: 1px solid #eaeef2; }
th { font-weight: 600; color: #424a53; }
td.num { text-align: right; font-variant-numeric: tabular-nums;
         white-space: nowrap; }
table.facts th { width: 120px; }
svg.chart { display: block; max-width: 100%; height: auto; margin: 4px 0 0;
            font-size: 11px; }
svg.chart .grid line { stroke: #eaeef2; }
svg.chart .axis line { stroke: #8c959f; }
svg.chart .axis text, svg.chart text.lane { fill: #424a53; }
svg.chart .rule line { stroke-dasharray: 4 3; stroke-width: 1.2; }
svg.chart .rule text { fill: #424a53; font-size: 10px; }
svg.chart text.value { fill: #424a53; font-size: 10px; }
svg.chart line.separator { stroke: #d0d7de; }
.legend { display: flex; flex-wrap: wrap; gap: 4px 14px; font-size: 12px;
          color: #424a53; margin: 2px 0 12px 76px; }
.legend i { display: inline-block; width: 14px; height: 10px;
            margin-right: 5px; vertical-align: middle; }
.legend i.dashed { height: 3px; }
details { margin: 6px 0; }
summary { cursor: pointer; font-weight: 600; }
code, .mono { font-family: ui-monospace, monospace; font-size: 12.5px; }
footer { color: #656d76; font-size: 12px; margin: 32px 0 8px; }
)css";

int VersionColor(int64_t version) {
  return version < 0 ? 2 : static_cast<int>(version % 10);
}

std::string VersionName(int64_t version) {
  return version < 0 ? "least-memory" : absl::StrCat("v", version);
}

std::string Seconds(double s) {
  return s > 0 ? FormatValue(s, Unit::kSeconds) : "-";
}

std::string Bytes(int64_t b) { return b > 0 ? FormatBytesShort(b) : "-"; }

std::string Td(absl::string_view text) {
  return absl::StrCat("<td>", HtmlEscape(text), "</td>");
}

std::string TdNum(absl::string_view text) {
  return absl::StrCat("<td class=\"num\">", HtmlEscape(text), "</td>");
}

std::string Empty(absl::string_view why) {
  return absl::StrCat("<p class=\"empty\">", HtmlEscape(why), "</p>\n");
}

std::string Note(absl::string_view text) {
  return absl::StrCat("<p class=\"note\">", HtmlEscape(text), "</p>\n");
}

std::string TimeUtc(double unix_s) {
  if (unix_s <= 0) return "-";
  return absl::FormatTime(
      "%Y-%m-%d %H:%M:%S UTC",
      absl::FromUnixMicros(static_cast<int64_t>(std::llround(unix_s * 1e6))),
      absl::UTCTimeZone());
}

// The baseline schedule (v0) in the terms of what users run today.
std::string BaselineText(const v1::JobSpec& spec) {
  if (spec.parallel().zero_stage() == 1) {
    return "v0: ZeRO-1, DDP-style: every param stays whole on every rank, "
           "gradients are reduce-scattered and the optimizer states sharded, "
           "the updated shards all-gathered after the step";
  }
  return "v0: FSDP-style on-demand gathers (FULL_SHARD, no prefetch; "
         "DeepSpeed ZeRO-3 without prefetch or persistence): each layer's "
         "params all-gathered just before its forward and again before its "
         "backward, freed after use, its gradients reduce-scattered after its "
         "backward";
}

std::string Header(const JobReport& r) {
  const v1::Job& job = r.job;
  const v1::JobSpec& spec = job.spec();
  std::vector<std::pair<std::string, std::string>> facts;
  facts.emplace_back("name", spec.name());
  facts.emplace_back("state", std::string(JobStateName(job.state())));
  facts.emplace_back("step",
                     absl::StrCat(job.step(), " of ", spec.train().steps()));
  if (job.step() > 0) {
    // A diverged loss as such, not as a missing value ("-").
    facts.emplace_back(
        "loss", std::isfinite(job.loss())
                    ? FormatValue(job.loss(), Unit::kNumber)
                    : absl::StrCat(NonFiniteName(job.loss()),
                                   " (training diverged: see the events)"));
  }
  if (job.loss_scale() > 0 || job.skipped_steps() > 0) {
    facts.emplace_back(
        "loss scale",
        absl::StrFormat("%g, %d step%s skipped (a gradient held an infinity "
                        "or a NaN: no param changed, the scale backed off)",
                        job.loss_scale(), job.skipped_steps(),
                        job.skipped_steps() == 1 ? "" : "s"));
  }
  facts.emplace_back("schedule", job.schedule_version() == 0
                                     ? std::string("baseline (v0)")
                                     : VersionName(job.schedule_version()));
  facts.emplace_back("baseline", BaselineText(spec));
  // What the plan bought, as the coordinator measured it interleaved with
  // the baseline (with its interval and basis), or why it has no figure.
  if (job.schedule_version() > 0 && !job.speedup_text().empty()) {
    facts.emplace_back(
        "bought",
        job.measured_iteration_s() > 0
            ? absl::StrCat(job.speedup_text(), "; predicted ",
                           Seconds(job.predicted_iteration_s()), ", measured ",
                           Seconds(job.measured_iteration_s()),
                           " per iteration")
            : job.speedup_text());
  }
  const v1::ModelSpec& m = spec.model();
  std::string model = m.preset().empty() ? "model" : m.preset();
  if (!job.model_text().empty()) {
    model = job.model_text();
  } else if (m.layers() > 0) {
    absl::StrAppend(&model, ": ", m.layers(), " layers, d_model ", m.d_model(),
                    ", vocab ", m.vocab());
  }
  if (!m.path().empty()) absl::StrAppend(&model, " (", m.path(), ")");
  facts.emplace_back("model", model);
  facts.emplace_back(
      "batch",
      absl::StrCat(spec.parallel().world_size(), " ranks x micro_batch ",
                   spec.batch().micro_batch(), " x seq_len ",
                   spec.batch().seq_len(), " x grad_accum ",
                   std::max(1, spec.batch().grad_accum()), ", ZeRO stage ",
                   spec.parallel().zero_stage()));
  facts.emplace_back(
      "plan", spec.optimize().passes_size() > 0
                  ? absl::StrCat("passes ",
                                 absl::StrJoin(spec.optimize().passes(), ", "))
                  : absl::StrCat("policy ", spec.optimize().policy().empty()
                                                ? "tandem"
                                                : spec.optimize().policy()));
  if (spec.memory().budget_bytes() > 0) {
    facts.emplace_back("budget", FormatBytes(spec.memory().budget_bytes()));
  }
  facts.emplace_back("submitted", TimeUtc(job.submitted_unix_s()));
  if (!job.error().empty()) facts.emplace_back("error", job.error());
  std::string out = absl::StrCat("<header><h1>Tandem job <span class=\"id\">",
                                 HtmlEscape(job.id()),
                                 "</span></h1>\n<table class=\"facts\">");
  for (const auto& [k, v] : facts) {
    absl::StrAppend(&out, "<tr><th>", HtmlEscape(k), "</th>", Td(v), "</tr>");
  }
  absl::StrAppend(&out, "</table></header>\n");
  return out;
}

// Samples (or tokens, for a builtin language model) one step trains over
// every rank: what throughput is counted in.
struct StepUnits {
  double per_step = 0;
  std::string name;
};
StepUnits UnitsPerStep(const v1::Job& job) {
  // What the coordinator said at submit (DescribeJobModel), for jobs
  // submitted since it does.
  if (!job.throughput_unit().empty() && job.items_per_step() > 0) {
    return {static_cast<double>(job.items_per_step()), job.throughput_unit()};
  }
  const v1::JobSpec& spec = job.spec();
  const double samples = static_cast<double>(spec.parallel().world_size()) *
                         spec.batch().micro_batch() *
                         std::max(1, spec.batch().grad_accum());
  // An exported model's inputs need not be tokens: samples.
  if (!spec.model().path().empty() || spec.batch().seq_len() <= 0) {
    return {samples, "samples"};
  }
  return {samples * spec.batch().seq_len(), "tokens"};
}

const ReportVersion* FindVersion(const JobReport& r, int64_t version) {
  for (const ReportVersion& v : r.versions) {
    if (v.version == version) return &v;
  }
  return nullptr;
}

// A rule at each step whose version differs from the step before.
std::vector<Rule> SwitchRules(const JobReport& r) {
  std::vector<Rule> rules;
  for (size_t i = 1; i < r.steps.size(); ++i) {
    const int64_t v = r.steps[i].schedule_version;
    if (v == r.steps[i - 1].schedule_version) continue;
    const ReportVersion* info = FindVersion(r, v);
    std::string label = VersionName(v);
    if (info != nullptr && !info->reason.empty() && v > 0) {
      absl::StrAppend(&label, " ", info->reason);
    }
    rules.push_back(
        {static_cast<double>(r.steps[i].step), label, VersionColor(v), true});
  }
  return rules;
}

// A chart over the job's steps, schedule switches marked.
LineChart StepChart(std::string id, std::string title, std::string y_label,
                    Unit y_unit, const std::vector<Rule>& switches) {
  LineChart chart;
  chart.id = std::move(id);
  chart.title = std::move(title);
  chart.x_label = "step";
  chart.y_label = std::move(y_label);
  chart.y_unit = y_unit;
  chart.x_rules = switches;
  return chart;
}

std::string ProgressSection(const JobReport& r) {
  std::string out =
      "<section id=\"progress\"><h2>Loss and iteration time by step</h2>\n";
  if (r.steps.empty()) {
    absl::StrAppend(
        &out,
        Empty("No step yet: the charts appear once every rank has reported a "
              "step."),
        "</section>\n");
    return out;
  }
  const std::vector<Rule> switches = SwitchRules(r);
  LineChart loss =
      StepChart("loss", "Loss by step", "loss", Unit::kNumber, switches);
  loss.y_from_zero = false;
  Series loss_series{"loss (rank 0)", {}, 0};
  for (const StoredStep& s : r.steps) {
    if (std::isfinite(s.loss)) loss_series.points.emplace_back(s.step, s.loss);
  }
  loss.series.push_back(std::move(loss_series));

  LineChart time = StepChart("iteration-time", "Iteration time by step",
                             "seconds per iteration", Unit::kSeconds, switches);
  Series measured{"measured (slowest rank)", {}, 0};
  Series exposed{"exposed communication (largest rank)", {}, 9};
  bool any_exposed = false;
  for (const StoredStep& s : r.steps) {
    measured.points.emplace_back(s.step, s.iteration_s);
    exposed.points.emplace_back(s.step, s.exposed_comm_s);
    any_exposed |= s.exposed_comm_s > 0;
  }
  time.series.push_back(std::move(measured));
  if (any_exposed) time.series.push_back(std::move(exposed));
  for (const ReportVersion& v : r.versions) {
    if (v.predicted_s <= 0 || v.first_step < 0) continue;
    Series predicted{absl::StrCat(VersionName(v.version), " predicted"),
                     {{static_cast<double>(v.first_step), v.predicted_s},
                      {static_cast<double>(v.last_step), v.predicted_s}},
                     VersionColor(v.version),
                     /*dashed=*/true};
    if (v.first_step == v.last_step) predicted.points.resize(1);
    time.series.push_back(std::move(predicted));
  }
  // Throughput: what a step trains over all ranks per second of it.
  const StepUnits units = UnitsPerStep(r.job);
  LineChart rate = StepChart(
      "throughput",
      absl::StrCat("Throughput by step (", units.name, " per second)"),
      absl::StrCat(units.name, " per second"), Unit::kNumber, switches);
  Series rate_series{absl::StrCat(units.name, "/s, all ranks"), {}, 1};
  for (const StoredStep& s : r.steps) {
    if (s.iteration_s > 0) {
      rate_series.points.emplace_back(s.step, units.per_step / s.iteration_s);
    }
  }
  rate.series.push_back(std::move(rate_series));

  // Peak memory per step against the budget.
  LineChart memory =
      StepChart("peak-by-step", "Peak memory by step (largest rank)",
                "peak bytes", Unit::kBytes, switches);
  Series peaks{"peak (largest rank)", {}, 3};
  double peak_max = 0;
  for (const StoredStep& s : r.steps) {
    if (s.peak_bytes <= 0) continue;
    peaks.points.emplace_back(s.step, static_cast<double>(s.peak_bytes));
    peak_max = std::max(peak_max, static_cast<double>(s.peak_bytes));
  }
  const int64_t budget = r.job.spec().memory().budget_bytes();
  // A budget far above the peaks would flatten them: said in text instead.
  const bool budget_drawn = budget > 0 && budget <= 4 * std::max(1.0, peak_max);
  if (budget_drawn) {
    memory.y_rules.push_back({static_cast<double>(budget),
                              absl::StrCat("budget ", FormatBytesShort(budget)),
                              2, true});
  }
  const bool any_peak = !peaks.points.empty();
  memory.series.push_back(std::move(peaks));

  absl::StrAppend(&out, "<h3>Loss</h3>\n", report::RenderLineChart(loss),
                  "<h3>Iteration time</h3>\n", report::RenderLineChart(time),
                  "<h3>Throughput</h3>\n", report::RenderLineChart(rate));
  if (any_peak) {
    absl::StrAppend(&out, "<h3>Peak memory</h3>\n",
                    report::RenderLineChart(memory));
    if (budget <= 0) {
      absl::StrAppend(&out, Note("No budget: memory.budget_bytes is 0."));
    } else if (!budget_drawn) {
      absl::StrAppend(
          &out, Note(absl::StrCat("The budget, ", FormatBytes(budget),
                                  ", is far above every step's peak (",
                                  FormatBytes(static_cast<int64_t>(peak_max)),
                                  " at most): not drawn.")));
    }
  }
  absl::StrAppend(
      &out,
      Note(absl::StrCat(
          r.steps.size(),
          " steps, each once every rank reported it: the "
          "slowest rank's time, the largest exposed communication and the "
          "largest peak; throughput is ",
          units.name == "tokens"
              ? "world x micro_batch x grad_accum x seq_len tokens"
              : "world x micro_batch x grad_accum samples",
          " over the slowest rank's time. Dashed rules mark schedule "
          "switches; dashed lines are each version's prediction over the "
          "steps it ran.")),
      "</section>\n");
  return out;
}

// The versions grouped by why they were published (the reason), each kind
// with its count, the steps its versions ran and what they changed: the
// product, over its versions, of the measured median of the version before
// each against its own (above 1: faster).
std::string DecisionsByKind(const JobReport& r) {
  struct Kind {
    int versions = 0;
    int64_t steps = 0;
    double gain = 1;
    int judged = 0;
  };
  std::vector<std::string> order;
  std::map<std::string, Kind> kinds;
  const ReportVersion* before = nullptr;
  for (const ReportVersion& v : r.versions) {
    if (v.version > 0) {
      const std::string why = v.reason.empty() ? "unknown" : v.reason;
      if (!kinds.count(why)) order.push_back(why);
      Kind& k = kinds[why];
      ++k.versions;
      if (v.first_step >= 0) k.steps += v.last_step - v.first_step + 1;
      if (before != nullptr && before->measured_steps > 0 &&
          v.measured_steps > 0 && v.measured_s > 0) {
        k.gain *= before->measured_s / v.measured_s;
        ++k.judged;
      }
    }
    if (v.measured_steps > 0) before = &v;
  }
  if (order.empty()) return "";
  std::string out =
      "<h3>Decisions by kind</h3>\n<table><tr><th>kind</th><th>versions"
      "</th><th>steps run</th><th>what they changed</th></tr>";
  for (const std::string& why : order) {
    const Kind& k = kinds[why];
    std::string change = "-";
    if (k.judged > 0) {
      change = absl::StrFormat("%.3f\u00d7 (%s %.1f%%, over %d version%s)",
                               k.gain, k.gain >= 1 ? "faster by" : "slower by",
                               100 * std::abs(1 - 1 / k.gain), k.judged,
                               k.judged == 1 ? "" : "s");
    }
    absl::StrAppend(&out, "<tr>", Td(why), TdNum(absl::StrCat(k.versions)),
                    TdNum(absl::StrCat(k.steps)), TdNum(change), "</tr>");
  }
  absl::StrAppend(
      &out, "</table>\n",
      Note("What each kind changed: the measured median of the version "
           "running before each of its versions against its own, multiplied "
           "over them. These medians were measured one after the other, not "
           "interleaved: the speedup over the baseline above, measured "
           "interleaved, is the figure to quote."));
  return out;
}

std::string VersionsSection(const JobReport& r) {
  std::string out =
      "<section id=\"versions\"><h2>Predicted and measured, by schedule "
      "version</h2>\n";
  BarChart chart;
  chart.id = "predicted-vs-measured";
  chart.title = "Predicted and measured iteration time by schedule version";
  chart.y_label = "seconds per iteration";
  chart.y_unit = Unit::kSeconds;
  chart.series_labels = {"predicted", "measured (median)"};
  chart.series_colors = {0, 1};
  for (const ReportVersion& v : r.versions) {
    if (v.predicted_s <= 0 && v.measured_steps == 0) continue;
    chart.groups.push_back({absl::StrCat(VersionName(v.version), " ", v.reason),
                            {v.predicted_s > 0 ? v.predicted_s : kNaN,
                             v.measured_steps > 0 ? v.measured_s : kNaN}});
  }
  const std::string svg = report::RenderBarChart(chart);
  if (svg.empty()) {
    absl::StrAppend(&out,
                    Empty("Nothing predicted or measured yet: the baseline "
                          "is measured from the job's second step, and the "
                          "first plan comes after optimize.warmup_steps."),
                    "</section>\n");
    return out;
  }
  absl::StrAppend(&out, svg);
  absl::StrAppend(
      &out,
      "<table><tr><th>version</th><th>why</th><th>from step</th><th>ran "
      "steps</th><th>predicted</th><th>measured median</th><th>error</th>"
      "<th>predicted peak</th><th>measured peak</th><th>passes</th></tr>");
  for (const ReportVersion& v : r.versions) {
    std::string ran = v.first_step < 0
                          ? "never"
                          : absl::StrCat(v.first_step, "-", v.last_step);
    std::string measured = "-";
    if (v.measured_steps > 0) {
      measured =
          absl::StrFormat("%s ± %.0f%% (%d steps)", Seconds(v.measured_s),
                          v.measured_relative_mad * 100, v.measured_steps);
    }
    std::string error = "-";
    if (v.measured_steps > 0 && v.predicted_s > 0 && v.measured_s > 0) {
      error = absl::StrFormat(
          "%+.1f%%", 100 * (v.predicted_s - v.measured_s) / v.measured_s);
    }
    absl::StrAppend(&out, "<tr>", Td(VersionName(v.version)), Td(v.reason),
                    TdNum(absl::StrCat(v.effective_step)), TdNum(ran),
                    TdNum(Seconds(v.predicted_s)), TdNum(measured),
                    TdNum(error), TdNum(Bytes(v.predicted_peak_bytes)),
                    TdNum(Bytes(v.measured_peak_bytes)), "<td class=\"mono\">",
                    HtmlEscape(v.passes), "</td></tr>");
  }
  absl::StrAppend(&out, "</table>\n", DecisionsByKind(r));
  absl::StrAppend(
      &out,
      Note("Measured: the median of the slowest rank's step times under the "
           "version, the first step after each switch (it pays for the "
           "switch) and the job's first step left out; ± the median absolute "
           "deviation. Error: predicted against measured. The baseline's "
           "prediction is the first plan's simulation of the starting "
           "schedule."),
      "</section>\n");
  return out;
}

std::string RanksSection(const JobReport& r) {
  std::string out =
      "<section id=\"ranks\"><h2>Overlap and exposed communication by "
      "rank</h2>\n";
  if (r.ranks.empty()) {
    absl::StrAppend(&out,
                    Empty("No profile window yet: each rank sends one every "
                          "optimize.warmup_steps steps."),
                    "</section>\n");
    return out;
  }
  std::vector<int64_t> versions;
  std::vector<int32_t> ranks;
  for (const ReportRankVersion& rv : r.ranks) {
    if (std::find(versions.begin(), versions.end(), rv.version) ==
        versions.end()) {
      versions.push_back(rv.version);
    }
    if (std::find(ranks.begin(), ranks.end(), rv.rank) == ranks.end()) {
      ranks.push_back(rv.rank);
    }
  }
  std::sort(versions.begin(), versions.end());
  auto find = [&](int32_t rank, int64_t version) -> const ReportRankVersion* {
    for (const ReportRankVersion& rv : r.ranks) {
      if (rv.rank == rank && rv.version == version) return &rv;
    }
    return nullptr;
  };
  BarChart exposed;
  exposed.id = "exposed-communication";
  exposed.title = "Exposed communication per iteration by rank";
  exposed.y_label = "exposed seconds per iteration";
  exposed.y_unit = Unit::kSeconds;
  BarChart overlap;
  overlap.id = "overlap";
  overlap.title = "Communication hidden behind compute by rank";
  overlap.y_label = "overlap";
  overlap.y_unit = Unit::kRatio;
  for (int64_t v : versions) {
    exposed.series_labels.push_back(VersionName(v));
    exposed.series_colors.push_back(VersionColor(v));
  }
  overlap.series_labels = exposed.series_labels;
  overlap.series_colors = exposed.series_colors;
  for (int32_t rank : ranks) {
    BarGroup e{absl::StrCat("rank ", rank), {}};
    BarGroup o{e.label, {}};
    for (int64_t v : versions) {
      const ReportRankVersion* rv = find(rank, v);
      e.values.push_back(rv != nullptr ? rv->exposed_comm_s : kNaN);
      o.values.push_back(rv != nullptr && rv->comm_s > 0 ? rv->overlap()
                                                         : kNaN);
    }
    exposed.groups.push_back(std::move(e));
    overlap.groups.push_back(std::move(o));
  }
  absl::StrAppend(&out, "<h3>Exposed communication</h3>\n",
                  report::RenderBarChart(exposed));
  const std::string overlap_svg = report::RenderBarChart(overlap);
  absl::StrAppend(&out, "<h3>Overlap</h3>\n",
                  overlap_svg.empty()
                      ? Empty("No rank measured a collective: nothing to "
                              "overlap.")
                      : overlap_svg);
  absl::StrAppend(
      &out,
      "<table><tr><th>rank</th><th>version</th><th>windows</th><th>iteration"
      "</th><th>communication</th><th>exposed</th><th>overlap</th><th>peak"
      "</th></tr>");
  for (const ReportRankVersion& rv : r.ranks) {
    absl::StrAppend(&out, "<tr>", TdNum(absl::StrCat(rv.rank)),
                    Td(VersionName(rv.version)),
                    TdNum(absl::StrCat(rv.windows)),
                    TdNum(Seconds(rv.iteration_s)), TdNum(Seconds(rv.comm_s)),
                    TdNum(FormatValue(rv.exposed_comm_s, Unit::kSeconds)),
                    TdNum(FormatValue(rv.overlap(), Unit::kRatio)),
                    TdNum(Bytes(rv.peak_bytes)), "</tr>");
  }
  absl::StrAppend(
      &out, "</table>\n",
      Note("From each rank's profile windows (means per iteration, averaged "
           "over the windows of a version): communication is the time its "
           "collectives ran on the communication stream, exposed the part "
           "compute waited for, overlap 1 - exposed / communication."),
      "</section>\n");
  return out;
}

std::string MemorySection(const JobReport& r) {
  std::string out =
      "<section id=\"memory\"><h2>Memory over one iteration</h2>\n";
  if (!r.memory.has_value()) {
    absl::StrAppend(&out, Empty(r.memory_missing), "</section>\n");
    return out;
  }
  const ReportMemory& m = *r.memory;
  LineChart chart;
  chart.id = "memory";
  chart.title = absl::StrCat("Device memory over one iteration of ",
                             VersionName(m.version));
  chart.x_label = "time into the iteration";
  chart.x_unit = Unit::kSeconds;
  chart.y_label = "device bytes per rank";
  chart.y_unit = Unit::kBytes;
  double data_max = 0;
  if (!m.simulated.empty()) {
    Series sim{absl::StrCat(VersionName(m.version), " simulated"), m.simulated,
               VersionColor(m.version)};
    for (const auto& [_, y] : m.simulated) data_max = std::max(data_max, y);
    chart.series.push_back(std::move(sim));
  }
  for (size_t i = 0; i < m.measured.size(); ++i) {
    const ReportMemory::Curve& c = m.measured[i];
    Series s{absl::StrCat("rank ", c.rank, " measured (step ", c.step, ", ",
                          VersionName(c.version), ")"),
             c.points, 3 + static_cast<int>(i) * 2};
    for (const auto& [_, y] : c.points) data_max = std::max(data_max, y);
    chart.series.push_back(std::move(s));
  }
  for (size_t i = 0; i < m.measured_peaks.size(); ++i) {
    const auto& [rank, peak] = m.measured_peaks[i];
    data_max = std::max(data_max, static_cast<double>(peak));
    chart.y_rules.push_back(
        {static_cast<double>(peak),
         absl::StrCat("rank ", rank, " peak ", FormatBytesShort(peak)),
         4 + static_cast<int>(i) * 2, true});
  }
  if (m.simulated_peak_bytes > 0) {
    chart.series.push_back(
        {absl::StrCat("simulated peak ",
                      FormatBytesShort(m.simulated_peak_bytes)),
         {{m.simulated_peak_s, static_cast<double>(m.simulated_peak_bytes)}},
         VersionColor(m.version),
         false,
         true});
  }
  // A budget far above the data would flatten it: said in text instead.
  const bool budget_in_range =
      m.budget_bytes > 0 && m.budget_bytes <= 4 * std::max(1.0, data_max);
  if (budget_in_range) {
    chart.y_rules.push_back(
        {static_cast<double>(m.budget_bytes),
         absl::StrCat("budget ", FormatBytesShort(m.budget_bytes)), 2, true});
  }
  const std::string svg = report::RenderLineChart(chart);
  if (svg.empty()) {
    absl::StrAppend(
        &out, Empty(absl::StrCat(
                  "No memory curve: ", m.simulated_note,
                  m.measured.empty() ? "; no rank sent a timeline yet" : "")));
  } else {
    absl::StrAppend(&out, svg);
  }
  std::vector<std::string> notes;
  if (!m.simulated_note.empty() && !svg.empty()) {
    notes.push_back(m.simulated_note);
  }
  if (m.budget_bytes <= 0) {
    notes.push_back(
        "No budget: memory.budget_bytes is 0 and the devices "
        "reported no memory.");
  } else if (!budget_in_range) {
    notes.push_back(absl::StrCat("The budget, ", FormatBytes(m.budget_bytes),
                                 ", is far above these curves (not drawn)."));
  }
  if (!notes.empty()) absl::StrAppend(&out, Note(absl::StrJoin(notes, " ")));
  absl::StrAppend(&out,
                  "<table><tr><th></th><th>peak</th><th>of the budget</th>"
                  "</tr>");
  auto row = [&](absl::string_view what, int64_t bytes) {
    absl::StrAppend(
        &out, "<tr>", Td(what), TdNum(Bytes(bytes)),
        TdNum(m.budget_bytes > 0 && bytes > 0
                  ? FormatValue(static_cast<double>(bytes) / m.budget_bytes,
                                Unit::kRatio)
                  : "-"),
        "</tr>");
  };
  if (m.predicted_peak_bytes > 0) {
    row(absl::StrCat(VersionName(m.version), " predicted (when planned)"),
        m.predicted_peak_bytes);
  }
  if (m.simulated_peak_bytes > 0) {
    row(absl::StrCat(VersionName(m.version), " simulated (above)"),
        m.simulated_peak_bytes);
  }
  for (const auto& [rank, peak] : m.measured_peaks) {
    row(absl::StrCat("rank ", rank, " measured (", VersionName(m.peaks_version),
                     ", largest window peak)"),
        peak);
  }
  absl::StrAppend(&out, "</table>\n</section>\n");
  return out;
}

std::string TimelineSection(const JobReport& r) {
  std::string out =
      "<section id=\"timeline\"><h2>One iteration: compute, communication "
      "and copy streams</h2>\n";
  LaneChart chart;
  chart.id = "timeline";
  chart.title = "One iteration's streams, predicted and measured";
  chart.lanes = r.timeline.lanes;
  const std::string svg = report::RenderLaneChart(chart);
  if (svg.empty()) {
    absl::StrAppend(&out, Empty(r.timeline_missing), "</section>\n");
    return out;
  }
  absl::StrAppend(&out, svg);
  if (!r.timeline.captions.empty()) {
    absl::StrAppend(&out, "<ul>");
    for (const std::string& c : r.timeline.captions) {
      absl::StrAppend(&out, "<li>", HtmlEscape(c), "</li>");
    }
    absl::StrAppend(&out, "</ul>\n");
  }
  if (!r.timeline_missing.empty()) {
    absl::StrAppend(&out, Note(r.timeline_missing));
  }
  absl::StrAppend(&out,
                  Note("Hover a span for its name and times. `tandem "
                       "timeline JOB -o trace.json` writes the ranks' traces "
                       "for https://ui.perfetto.dev."),
                  "</section>\n");
  return out;
}

std::string BindingText(const Binding& b) {
  switch (b.kind) {
    case BindingKind::kNone:
      return "-";
    case BindingKind::kMemory:
      return absl::StrCat(
          "memory",
          b.node_id.has_value() ? absl::StrCat(" at n", *b.node_id) : "", ": ",
          FormatBytesShort(b.bytes), " of ", FormatBytesShort(b.limit_bytes));
    case BindingKind::kLink:
      return "the link";
    case BindingKind::kHostLink:
      return "the host link";
  }
  return "-";
}

std::string ExplainSection(const JobReport& r) {
  std::string out =
      "<section id=\"explain\"><h2>The planner's decisions</h2>\n";
  if (r.plans.empty()) {
    absl::StrAppend(&out,
                    Empty("No plan yet: the job runs its baseline until the "
                          "first plan, made from the first profile window "
                          "after optimize.warmup_steps."),
                    "</section>\n");
    return out;
  }
  for (size_t i = r.plans.size(); i-- > 0;) {
    const Schedule& s = r.plans[i];
    const Explanation& e = s.explanation;
    absl::StrAppend(
        &out, i + 1 == r.plans.size() ? "<details open>" : "<details>",
        "<summary>",
        HtmlEscape(absl::StrCat(
            VersionName(s.version), " (", s.provenance.reason, "): ",
            e.baseline_iteration_s > 0
                ? absl::StrCat("baseline ", Seconds(e.baseline_iteration_s),
                               " → plan ")
                : "predicted ",
            Seconds(s.prediction.iteration_s), ", ", e.decisions.size(),
            e.decisions.size() == 1 ? " decision" : " decisions")),
        "</summary>\n");
    if (e.decisions.empty()) {
      absl::StrAppend(
          &out,
          Empty(absl::StrCat(
              "No decisions recorded with this version: ",
              s.provenance.passes.empty()
                  ? std::string("it was not planned here")
                  : absl::StrCat("it came from ", s.provenance.passes.back()),
              " (a rollback or cached version reruns an earlier plan).")));
    } else {
      absl::StrAppend(
          &out,
          "<table><tr><th>#</th><th>decision</th><th>pass</th><th>what</th>"
          "<th>gain</th><th>exposed gain</th><th>holds / moves</th>"
          "<th>peak change</th><th>bound by</th></tr>");
      for (size_t d = 0; d < e.decisions.size(); ++d) {
        const Decision& dec = e.decisions[d];
        absl::StrAppend(
            &out, "<tr>", TdNum(absl::StrCat(d + 1)),
            Td(DecisionKindName(dec.kind)), Td(dec.pass), Td(dec.what),
            TdNum(FormatValue(dec.gain_s, Unit::kSeconds)),
            TdNum(FormatValue(dec.exposed_gain_s, Unit::kSeconds)),
            TdNum(Bytes(dec.held_bytes)),
            TdNum(dec.peak_delta_bytes == 0
                      ? "0"
                      : absl::StrCat(dec.peak_delta_bytes > 0 ? "+" : "",
                                     FormatBytesShort(dec.peak_delta_bytes))),
            Td(BindingText(dec.binding)), "</tr>");
      }
      absl::StrAppend(
          &out, "</table>\n",
          Note(absl::StrFormat(
              "Gains are simulated, each against the state the decision "
              "before left, from the baseline: they add up to %s (baseline "
              "%s, plan %s; exposed communication %s → %s).",
              FormatValue(e.TotalGain(), Unit::kSeconds),
              Seconds(e.baseline_iteration_s),
              Seconds(s.prediction.iteration_s),
              FormatValue(e.baseline_exposed_comm_s, Unit::kSeconds),
              FormatValue(s.prediction.exposed_comm_s, Unit::kSeconds))));
    }
    absl::StrAppend(&out, "</details>\n");
  }
  absl::StrAppend(&out, "</section>\n");
  return out;
}

std::string EventsSection(const JobReport& r) {
  std::string out = "<section id=\"events\"><h2>Events</h2>\n";
  if (r.events.empty()) {
    absl::StrAppend(&out, Empty("No events."), "</section>\n");
    return out;
  }
  absl::StrAppend(&out, "<details><summary>", r.events.size(),
                  r.events.size() == 1 ? " event" : " events",
                  "</summary><table><tr><th>time</th><th>kind</th><th>what"
                  "</th></tr>");
  for (const v1::JobEvent& e : r.events) {
    absl::StrAppend(&out, "<tr><td class=\"num\">",
                    HtmlEscape(TimeUtc(e.time_unix_s())), "</td>", Td(e.kind()),
                    Td(e.message()), "</tr>");
  }
  absl::StrAppend(&out, "</table></details>\n</section>\n");
  return out;
}

}  // namespace

std::string RenderJobReport(const JobReport& report) {
  std::string out = absl::StrCat(
      "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
      "<meta name=\"viewport\" content=\"width=device-width, "
      "initial-scale=1\"><title>Tandem job ",
      HtmlEscape(report.job.id()), "</title><style>", kStyle,
      "</style></head>\n<body>\n");
  absl::StrAppend(&out, Header(report), ProgressSection(report),
                  VersionsSection(report), RanksSection(report),
                  MemorySection(report), TimelineSection(report),
                  ExplainSection(report), EventsSection(report));
  absl::StrAppend(&out, "<footer>Generated by tandem-coordinator at ",
                  HtmlEscape(TimeUtc(report.generated_unix_s)),
                  ". coordinator/README.md, \"Job report\", says where each "
                  "figure comes from.</footer>\n</body></html>\n");
  return out;
}

}  // namespace tandem
