#include "coordinator/report/job_report.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tests/unit/coordinator/report/report_test_util.h"

namespace tandem {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;

// A job that ran a baseline and one plan, with every section's data.
JobReport FullReport() {
  JobReport r;
  r.job.set_id("tiny-1234");
  r.job.mutable_spec()->set_name("tiny");
  r.job.mutable_spec()->mutable_train()->set_steps(8);
  r.job.mutable_spec()->mutable_parallel()->set_world_size(2);
  r.job.mutable_spec()->mutable_batch()->set_micro_batch(2);
  r.job.mutable_spec()->mutable_batch()->set_seq_len(16);
  r.job.set_state(v1::JOB_STATE_SUCCEEDED);
  r.job.set_step(8);
  r.job.set_schedule_version(1);
  for (int step = 1; step <= 8; ++step) {
    r.steps.push_back({step, step >= 5 ? 1 : 0, 6.0 - 0.1 * step,
                       step >= 5 ? 0.04 : 0.06, 0.01, 1 << 20});
  }
  ReportVersion v0;
  v0.reason = "baseline";
  v0.first_step = 1;
  v0.last_step = 4;
  v0.predicted_s = 0.055;
  v0.measured_s = 0.06;
  v0.measured_steps = 3;
  ReportVersion v1;
  v1.version = 1;
  v1.reason = "initial";
  v1.passes = "zero3-insert, prefetch";
  v1.effective_step = 5;
  v1.first_step = 5;
  v1.last_step = 8;
  v1.predicted_s = 0.038;
  v1.measured_s = 0.04;
  v1.measured_steps = 3;
  r.versions = {v0, v1};
  for (int rank = 0; rank < 2; ++rank) {
    r.ranks.push_back({rank, 0, 1, 0.06, 0.02, 0.01, 1 << 20});
    r.ranks.push_back({rank, 1, 1, 0.04, 0.02, 0.002, 1 << 20});
  }
  ReportMemory m;
  m.version = 1;
  m.simulated = {{0.01, 1e6}, {0.02, 2e6}, {0.03, 1.5e6}};
  m.simulated_peak_bytes = 2000000;
  m.simulated_peak_s = 0.02;
  m.simulated_note = "Simulated as the planner does.";
  m.predicted_peak_bytes = 2000000;
  m.peaks_version = 1;
  m.measured_peaks = {{0, 2100000}, {1, 2050000}};
  m.measured.push_back({0, 8, 1, {{0, 1e6}, {0.02, 2.1e6}, {0.04, 1e6}}});
  m.budget_bytes = 4 << 20;
  r.memory = m;
  r.timeline.lanes.push_back(
      {"v1 predicted · compute", {{0, 0.01, "embed", "fwd"}}, true});
  r.timeline.lanes.push_back({"rank 0 · communication",
                              {{0, 0.005, "allgather g0", "allgather"}},
                              true});
  r.timeline.captions.push_back("rank 0: step 8 under v1");
  Schedule plan;
  plan.version = 1;
  plan.provenance.reason = "initial";
  plan.prediction.iteration_s = 0.038;
  plan.explanation.baseline_iteration_s = 0.055;
  Decision d;
  d.kind = DecisionKind::kPrefetch;
  d.pass = "prefetch";
  d.what = "g1 gathered before n0";
  d.gain_s = 0.017;
  d.binding.kind = BindingKind::kMemory;
  d.binding.node_id = 3;
  d.binding.bytes = 2000000;
  d.binding.limit_bytes = 4000000;
  plan.explanation.decisions.push_back(d);
  r.plans.push_back(plan);
  v1::JobEvent e;
  e.set_kind("schedule");
  e.set_message("v1 active on all 2 ranks from step 5");
  r.events.push_back(e);
  r.generated_unix_s = 1700000000;
  return r;
}

TEST(RenderJobReportTest, FullReport_EveryChartDrawsData) {
  const std::string html = RenderJobReport(FullReport());
  const std::map<std::string, int> charts = ChartDataMarks(html);
  for (const char* name :
       {"loss", "iteration-time", "throughput", "peak-by-step",
        "predicted-vs-measured", "exposed-communication", "overlap", "memory",
        "timeline"}) {
    ASSERT_TRUE(charts.count(name)) << name << " missing";
    EXPECT_GT(charts.at(name), 0) << name << " has no data";
  }
  EXPECT_EQ(charts.size(), 9u);
  // Two bars per version; four bars (2 ranks x 2 versions) per rank chart.
  EXPECT_EQ(charts.at("predicted-vs-measured"), 4);
  EXPECT_EQ(charts.at("exposed-communication"), 4);
  EXPECT_THAT(html, AllOf(HasSubstr("g1 gathered before n0"),
                          HasSubstr("memory at n3: 1.91MiB of 3.81MiB"),
                          HasSubstr("v1 active on all 2 ranks from step 5"),
                          HasSubstr("2023-11-14 22:13:20 UTC"),
                          HasSubstr("-8.3%"), HasSubstr("-5.0%")));
}

// What an FSDP user needs to read the rest: the baseline in their terms,
// throughput in tokens per second (2 ranks x 2 x 16 tokens a step), and the
// decisions summed up by kind with what they changed (v1, the initial plan,
// measured 0.04 s against v0's 0.06: 1.5x).
TEST(RenderJobReportTest, FullReport_BaselineThroughputAndDecisionsByKind) {
  const std::string html = RenderJobReport(FullReport());
  EXPECT_THAT(html, AllOf(HasSubstr("FSDP-style on-demand gathers"),
                          HasSubstr("Throughput by step (tokens per second)"),
                          HasSubstr("world x micro_batch x grad_accum x "
                                    "seq_len tokens"),
                          HasSubstr("Decisions by kind"),
                          HasSubstr("1.500\u00d7 (faster by 33.3%, over 1 "
                                    "version)"),
                          HasSubstr("No budget: memory.budget_bytes is 0.")));
  // An exported model counts samples; ZeRO-1's baseline is DDP-like.
  JobReport exported = FullReport();
  exported.job.mutable_spec()->mutable_model()->set_path("/m/model.tdm");
  exported.job.mutable_spec()->mutable_parallel()->set_zero_stage(1);
  const std::string other = RenderJobReport(exported);
  EXPECT_THAT(other, AllOf(HasSubstr("(samples per second)"),
                           HasSubstr("ZeRO-1, DDP-style")));
}

// Dynamic loss scaling: the scale and the steps skipped; without it, no
// such line.
TEST(RenderJobReportTest, LossScale_ScaleAndSkippedStepsShown) {
  EXPECT_THAT(RenderJobReport(FullReport()), Not(HasSubstr("loss scale")));
  JobReport r = FullReport();
  r.job.set_loss_scale(32768);
  r.job.set_skipped_steps(3);
  EXPECT_THAT(RenderJobReport(r),
              HasSubstr("32768, 3 steps skipped (a gradient held an infinity "
                        "or a NaN: no param changed, the scale backed off)"));
}

TEST(RenderJobReportTest, FullReport_SelfContainedWithoutScript) {
  const std::string html = RenderJobReport(FullReport());
  EXPECT_THAT(html, HasSubstr("<!DOCTYPE html>"));
  EXPECT_THAT(html, Not(HasSubstr("<script")));
  EXPECT_THAT(html, Not(HasSubstr("src=")));
  EXPECT_THAT(html, Not(HasSubstr("<link")));
  EXPECT_THAT(html, Not(HasSubstr("url(")));
  EXPECT_THAT(html, Not(HasSubstr("@import")));
}

TEST(RenderJobReportTest, NothingRunYet_SectionsSaySoWithoutCharts) {
  JobReport r;
  r.job.set_id("new-job");
  r.job.set_state(v1::JOB_STATE_PENDING);
  r.memory_missing = "No memory to show: no graph yet.";
  r.timeline_missing = "No measured timeline yet.";
  const std::string html = RenderJobReport(r);
  EXPECT_THAT(html, Not(HasSubstr("<svg")));
  EXPECT_THAT(html, AllOf(HasSubstr("No step yet"),
                          HasSubstr("Nothing predicted or measured yet"),
                          HasSubstr("No profile window yet"),
                          HasSubstr("No memory to show: no graph yet."),
                          HasSubstr("No measured timeline yet."),
                          HasSubstr("No plan yet"), HasSubstr("PENDING")));
}

TEST(RenderJobReportTest, UserText_IsEscapedEverywhere) {
  JobReport r = FullReport();
  const std::string evil = "<script>alert('x')</script><img src=x>";
  r.job.set_id(evil);
  r.job.mutable_spec()->set_name(evil);
  r.job.set_error(evil);
  r.events[0].set_message(evil);
  r.events[0].set_kind(evil);
  r.plans[0].explanation.decisions[0].what = evil;
  r.plans[0].explanation.decisions[0].pass = evil;
  r.plans[0].provenance.reason = evil;
  r.versions[1].reason = evil;
  r.versions[1].passes = evil;
  r.timeline.lanes[0].spans[0].label = evil;
  r.timeline.captions[0] = evil;
  r.memory->simulated_note = evil;
  const std::string html = RenderJobReport(r);
  EXPECT_THAT(html, Not(HasSubstr("<script")));
  EXPECT_THAT(html, Not(HasSubstr("<img")));
  EXPECT_THAT(html, HasSubstr("&lt;script&gt;alert(&#39;x&#39;)"));
}

TEST(RenderJobReportTest, BudgetFarAboveTheCurves_SaidInTextNotDrawn) {
  JobReport r = FullReport();
  r.memory->budget_bytes = int64_t{64} << 30;
  const std::string html = RenderJobReport(r);
  EXPECT_THAT(html, HasSubstr("is far above these curves"));
  EXPECT_THAT(html, Not(HasSubstr(">budget 64.00GiB</text>")));
  r.memory->budget_bytes = 0;
  EXPECT_THAT(RenderJobReport(r), HasSubstr("No budget"));
}

}  // namespace
}  // namespace tandem
