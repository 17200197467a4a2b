#include "coordinator/report/job_report_builder.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "common/ir/proto_convert.h"
#include "common/job/job_spec.h"
#include "common/models/graph_builder.h"
#include "coordinator/service/planning_manager.h"
#include "tests/unit/coordinator/report/report_test_util.h"
#include "tests/unit/coordinator/tiny_job_spec.h"

namespace tandem {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;

v1::JobSpec Spec() {
  v1::JobSpec spec = TinyJobSpec("report", 10);
  spec.mutable_optimize()->set_warmup_steps(2);
  // One plan, measured: no trial of its runner-up, no baseline check.
  spec.mutable_optimize()->set_trial_margin(0);
  spec.mutable_optimize()->set_baseline_pairs(0);
  return spec;
}

// One rank's trace of one iteration, as a worker writes it
// (worker/runtime/iteration_timeline.h): two nodes, an all-gather, a wait,
// a copy and three memory samples.
std::string Trace(int rank) {
  return absl::StrCat(
      R"({"traceEvents":[
{"ph":"M","name":"process_name","pid":)",
      rank, R"(,"tid":0,"args":{"name":"rank"}},
{"ph":"X","name":"embed","cat":"node","pid":0,"tid":1,"ts":0,"dur":1000,"args":{"node_id":0,"phase":"fwd"}},
{"ph":"X","name":"wait allgather g1","cat":"wait","pid":0,"tid":1,"ts":1000,"dur":200,"args":{}},
{"ph":"X","name":"embed.bwd","cat":"node","pid":0,"tid":1,"ts":1200,"dur":2000,"args":{"node_id":1,"phase":"bwd"}},
{"ph":"X","name":"allgather g1","cat":"collective","pid":0,"tid":2,"ts":100,"dur":1100,"args":{"collective":"allgather","group_id":1,"bytes":4096}},
{"ph":"X","name":"offload 0","cat":"copy","pid":0,"tid":3,"ts":500,"dur":300,"args":{"bytes":1024}},
{"ph":"C","name":"memory","pid":0,"tid":0,"ts":0,"args":{"allocated_bytes":1000000}},
{"ph":"C","name":"memory","pid":0,"tid":0,"ts":1500,"args":{"allocated_bytes":3000000}},
{"ph":"C","name":"memory","pid":0,"tid":0,"ts":3200,"args":{"allocated_bytes":1200000}}
],"displayTimeUnit":"ms","otherData":{"rank":)",
      rank, R"(,"iteration":9,"schedule_version":1,"iteration_s":0.0032}})");
}

class JobReportBuilderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    store_ = *JobStore::Open(":memory:");
    jobs_ = std::make_unique<JobManager>(store_.get());
    planning_ =
        std::make_unique<PlanningManager>(jobs_.get(), store_.get(), nullptr);
    planning_->SetPublisher(
        [](const std::string&, const v1::ScheduleUpdate&) {});
    history_ = std::make_unique<JobHistory>(jobs_.get(), store_.get());
    builder_ = std::make_unique<JobReportBuilder>(jobs_.get(), store_.get(),
                                                  history_.get(), &timelines_,
                                                  [] { return 1700000000.0; });
    job_ = *jobs_->Submit(Spec());
    graph_ = *BuildModelGraph(*ModelConfigFromJobSpec(job_.spec()));
  }

  v1::Profile MakeProfile(int rank, int64_t first, int64_t last,
                          int64_t version) {
    Profile p;
    p.graph_hash = graph_.StructuralHash();
    p.rank = rank;
    p.schedule_version = version;
    p.first_iteration = first;
    p.last_iteration = last;
    p.iteration_s = 0.05;
    p.peak_bytes = (2 + rank) << 20;
    for (const Node& n : graph_.nodes) p.nodes.push_back({n.id, 1e-3, 2});
    return ToProto(p);
  }

  // What the workers report, to both the planner and the history, as the
  // coordinator's server wires them: steps 1-4 on the baseline, a window,
  // the plan, steps 5-10 on it.
  void RunJob() {
    v1::GraphReport report;
    report.set_graph_hash(graph_.StructuralHash());
    ASSERT_TRUE(planning_->OnGraph(job_.id(), 1, report).ok());
    *report.mutable_graph() = ToProto(graph_);
    ASSERT_TRUE(planning_->OnGraph(job_.id(), 0, report).ok());
    auto step = [&](int64_t s, int64_t version, double seconds) {
      for (int rank = 0; rank < 2; ++rank) {
        v1::IterationProgress p;
        p.set_step(s);
        p.set_loss(6.0 - 0.1 * s);
        // Rank 1 is the slower one.
        p.set_iteration_s(seconds + 0.01 * rank);
        p.set_exposed_comm_s(0.001 * s);
        p.set_peak_bytes((2 + rank) << 20);
        p.set_schedule_version(version);
        planning_->OnProgress(job_.id(), rank, p);
        history_->OnProgress(job_.id(), rank, p);
      }
      v1::IterationProgress rank0;
      rank0.set_step(s);
      rank0.set_loss(6.0 - 0.1 * s);
      rank0.set_schedule_version(version);
      ASSERT_TRUE(jobs_->UpdateProgress(job_.id(), rank0).ok());
    };
    auto window = [&](int64_t first, int64_t last, int64_t version,
                      double exposed) {
      for (int rank = 0; rank < 2; ++rank) {
        v1::Profile p = MakeProfile(rank, first, last, version);
        ASSERT_TRUE(planning_->OnProfile(job_.id(), rank, p).ok());
        // The windows' collectives, as the history summarizes them.
        v1::CollectiveTiming* c = p.add_collectives();
        c->set_kind(v1::COLLECTIVE_KIND_ALLGATHER);
        c->set_run_s(0.02);
        c->set_issue_to_done_s(0.02);
        c->set_exposed_s(exposed * (1 + rank));
        ASSERT_TRUE(history_->OnProfile(job_.id(), rank, p).ok());
      }
    };
    for (int64_t s = 1; s <= 4; ++s) step(s, 0, 0.05);
    window(0, 1, 0, 0.01);
    planning_->Drain();
    ASSERT_EQ(store_->LoadSchedules(job_.id())->size(), 1u);
    for (int64_t s = 5; s <= 10; ++s) step(s, 1, 0.03);
    window(5, 6, 1, 0.002);
    for (int rank = 0; rank < 2; ++rank) {
      v1::TimelineReport t;
      t.set_step(9);
      t.set_schedule_version(1);
      t.set_trace_json(Trace(rank));
      ASSERT_TRUE(timelines_.Put(job_.id(), rank, t).ok());
    }
  }

  std::unique_ptr<JobStore> store_;
  std::unique_ptr<JobManager> jobs_;
  std::unique_ptr<PlanningManager> planning_;
  std::unique_ptr<JobHistory> history_;
  TimelineStore timelines_;
  std::unique_ptr<JobReportBuilder> builder_;
  v1::Job job_;
  Graph graph_;
};

TEST_F(JobReportBuilderTest, Build_RanJob_VersionsMeasuredAndPredicted) {
  RunJob();
  absl::StatusOr<JobReport> r = builder_->Build(job_.id());
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->steps.size(), 10u);
  EXPECT_DOUBLE_EQ(r->steps[0].iteration_s, 0.06);  // the slower rank
  ASSERT_EQ(r->versions.size(), 2u);
  const ReportVersion& v0 = r->versions[0];
  const ReportVersion& v1 = r->versions[1];
  EXPECT_EQ(v0.version, 0);
  EXPECT_EQ(v0.reason, "baseline");
  EXPECT_EQ(v0.first_step, 1);
  EXPECT_EQ(v0.last_step, 4);
  // Steps 2-4 (the job's first step left out), each 0.06 s.
  EXPECT_EQ(v0.measured_steps, 3);
  EXPECT_DOUBLE_EQ(v0.measured_s, 0.06);
  EXPECT_EQ(v0.measured_peak_bytes, 3 << 20);
  const v1::Schedule stored = (*store_->LoadSchedules(job_.id()))[0].schedule;
  EXPECT_DOUBLE_EQ(v0.predicted_s, stored.explanation().baseline_iteration_s());
  EXPECT_GT(v0.predicted_s, 0);
  EXPECT_EQ(v1.version, 1);
  EXPECT_EQ(v1.reason, "initial");
  EXPECT_EQ(v1.first_step, 5);
  EXPECT_EQ(v1.last_step, 10);
  // Step 5 switched: steps 6-10 count.
  EXPECT_EQ(v1.measured_steps, 5);
  EXPECT_DOUBLE_EQ(v1.measured_s, 0.04);
  EXPECT_DOUBLE_EQ(v1.predicted_s, stored.prediction().iteration_s());
  ASSERT_EQ(r->plans.size(), 1u);
  EXPECT_EQ(r->plans[0].version, 1);
  EXPECT_FALSE(r->plans[0].explanation.decisions.empty());
}

TEST_F(JobReportBuilderTest, Build_RanJob_RanksMemoryAndTimeline) {
  RunJob();
  absl::StatusOr<JobReport> r = builder_->Build(job_.id());
  ASSERT_TRUE(r.ok()) << r.status();
  // By rank, then version.
  ASSERT_EQ(r->ranks.size(), 4u);
  EXPECT_EQ(r->ranks[0].rank, 0);
  EXPECT_EQ(r->ranks[0].version, 0);
  EXPECT_DOUBLE_EQ(r->ranks[0].comm_s, 0.02);
  EXPECT_DOUBLE_EQ(r->ranks[0].exposed_comm_s, 0.01);
  EXPECT_DOUBLE_EQ(r->ranks[0].overlap(), 0.5);
  EXPECT_EQ(r->ranks[3].rank, 1);
  EXPECT_EQ(r->ranks[3].version, 1);
  EXPECT_DOUBLE_EQ(r->ranks[3].exposed_comm_s, 0.004);
  EXPECT_DOUBLE_EQ(r->ranks[3].overlap(), 0.8);

  ASSERT_TRUE(r->memory.has_value()) << r->memory_missing;
  const ReportMemory& m = *r->memory;
  EXPECT_EQ(m.version, 1);
  EXPECT_EQ(m.simulated.size(), graph_.nodes.size());
  EXPECT_GT(m.simulated_peak_bytes, 0);
  double highest = 0;
  for (const auto& [_, bytes] : m.simulated) highest = std::max(highest, bytes);
  EXPECT_LE(highest, m.simulated_peak_bytes);
  EXPECT_THAT(m.simulated_note, HasSubstr("steps 5-6 under v1"));
  EXPECT_EQ(m.peaks_version, 1);
  ASSERT_EQ(m.measured_peaks.size(), 2u);
  EXPECT_EQ(m.measured_peaks[1], std::make_pair(1, int64_t{3} << 20));
  ASSERT_EQ(m.measured.size(), 2u);
  ASSERT_EQ(m.measured[0].points.size(), 3u);
  EXPECT_DOUBLE_EQ(m.measured[0].points[1].first, 1.5e-3);
  EXPECT_DOUBLE_EQ(m.measured[0].points[1].second, 3e6);

  // Predicted streams, then each rank's.
  ASSERT_EQ(r->timeline.lanes.size(), 9u);
  EXPECT_EQ(r->timeline.lanes[0].label, "v1 predicted · compute");
  EXPECT_GE(r->timeline.lanes[0].spans.size(), graph_.nodes.size());
  EXPECT_FALSE(r->timeline.lanes[1].spans.empty());
  EXPECT_EQ(r->timeline.lanes[3].label, "rank 0 · compute");
  ASSERT_EQ(r->timeline.lanes[3].spans.size(), 3u);
  EXPECT_EQ(r->timeline.lanes[3].spans[1].kind, "wait");
  EXPECT_EQ(r->timeline.lanes[3].spans[2].kind, "bwd");
  EXPECT_DOUBLE_EQ(r->timeline.lanes[3].spans[2].end_s, 3.2e-3);
  ASSERT_EQ(r->timeline.lanes[4].spans.size(), 1u);
  EXPECT_EQ(r->timeline.lanes[4].spans[0].kind, "allgather");
  EXPECT_EQ(r->timeline.lanes[5].spans[0].kind, "copy");
  EXPECT_THAT(r->timeline.captions[1], HasSubstr("rank 0: step 9 under v1"));
  EXPECT_EQ(r->timeline_missing, "");
}

TEST_F(JobReportBuilderTest, RenderHtml_RanJob_EveryChartDrawsData) {
  RunJob();
  absl::StatusOr<std::string> html = builder_->RenderHtml(job_.id());
  ASSERT_TRUE(html.ok()) << html.status();
  const std::map<std::string, int> charts = ChartDataMarks(*html);
  for (const char* name :
       {"loss", "iteration-time", "predicted-vs-measured",
        "exposed-communication", "overlap", "memory", "timeline"}) {
    ASSERT_TRUE(charts.count(name)) << name << " missing";
    EXPECT_GT(charts.at(name), 0) << name << " has no data";
  }
  EXPECT_THAT(*html, Not(HasSubstr("<script")));
}

TEST_F(JobReportBuilderTest, Build_NothingRunYet_SaysWhyPerSection) {
  absl::StatusOr<JobReport> r = builder_->Build(job_.id());
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->steps.empty());
  EXPECT_FALSE(r->memory.has_value());
  EXPECT_THAT(r->memory_missing, HasSubstr("no graph yet"));
  EXPECT_THAT(r->timeline_missing, HasSubstr("No measured timeline yet"));
  EXPECT_TRUE(r->timeline.lanes.empty());
  const std::string html = RenderJobReport(*r);
  EXPECT_THAT(html, Not(HasSubstr("<svg")));
  EXPECT_THAT(html, HasSubstr(job_.id()));
}

TEST_F(JobReportBuilderTest, Build_UnknownJob_NotFound) {
  absl::StatusOr<JobReport> r = builder_->Build("no-such-job");
  EXPECT_EQ(r.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("no-such-job"));
}

TEST_F(JobReportBuilderTest, ServePage_ReportMissingAndUnknownIds) {
  RunJob();
  metrics::HttpExporter::Page page = builder_->ServePage("/" + job_.id());
  EXPECT_EQ(page.status, 200);
  EXPECT_THAT(page.content_type, HasSubstr("text/html"));
  EXPECT_THAT(page.body, AllOf(HasSubstr("<!DOCTYPE html>"),
                               HasSubstr("data-chart=\"memory\"")));
  EXPECT_EQ(builder_->ServePage("/" + job_.id() + "/").status, 200);

  page = builder_->ServePage("");
  EXPECT_EQ(page.status, 404);
  EXPECT_THAT(page.body, HasSubstr("/jobs/&lt;job id&gt;"));
  page = builder_->ServePage("/<script>alert(1)</script>");
  EXPECT_EQ(page.status, 404);
  EXPECT_THAT(page.body, Not(HasSubstr("<script>")));
  EXPECT_THAT(page.body, HasSubstr("&lt;script&gt;alert(1)&lt;/script&gt;"));
  EXPECT_EQ(builder_->ServePage("/" + std::string(300, 'x')).status, 400);
}

}  // namespace
}  // namespace tandem
