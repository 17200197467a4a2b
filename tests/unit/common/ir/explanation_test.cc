// The explanation stored with a schedule (common/ir/explanation.h): names,
// text and proto round trips (every field, absent node ids, negative gains,
// awkward strings), parse errors that say what to write, and the table.
#include "common/ir/explanation.h"

#include <limits>
#include <string>

#include "common/ir/proto_convert.h"
#include "common/ir/schedule.h"
#include "common/ir/text_format.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tandem {
namespace {

using ::testing::HasSubstr;

Schedule ExplainedSchedule() {
  Schedule s;
  s.graph_hash = "0123456789abcdef";
  s.version = 4;
  s.groups = {{0, {1, 2}}};
  s.prediction.iteration_s = 0.25;
  s.prediction.exposed_comm_s = 0.01;
  s.explanation.baseline_iteration_s = 0.5;
  s.explanation.baseline_exposed_comm_s = 0.125;
  s.explanation.baseline_peak_bytes = int64_t{3} << 30;

  Decision prefetch;
  prefetch.kind = DecisionKind::kPrefetch;
  prefetch.pass = "prefetch";
  prefetch.what = "g0 (a, b, 1MiB) gathered before n3 \"x y\" instead of n5";
  prefetch.group_ids = {0};
  prefetch.node_id = 3;
  prefetch.gain_s = 0.1;
  prefetch.exposed_gain_s = 0.1;
  prefetch.held_bytes = 1 << 20;
  prefetch.peak_delta_bytes = 1 << 20;
  prefetch.binding.kind = BindingKind::kLink;

  Decision offload;
  offload.kind = DecisionKind::kOffload;
  offload.pass = "offload";
  offload.what = "optimizer states of p7\tto the host, back\\later";
  offload.param_ids = {7};
  offload.offload_ids = {0, 2};
  offload.gain_s = -0.0125;  // copies cost time
  offload.exposed_gain_s = 0;
  offload.held_bytes = 96 << 20;
  offload.peak_delta_bytes = -(96 << 20);
  offload.binding = {BindingKind::kMemory, 0, int64_t{3} << 30,
                     int64_t{2} << 30};

  Decision policy;
  policy.kind = DecisionKind::kPolicy;
  policy.pass = "planner";
  policy.what = "fsdp's plan chosen";
  policy.gain_s = 1.0 / 3.0;
  policy.exposed_gain_s = std::numeric_limits<double>::denorm_min();

  s.explanation.decisions = {prefetch, offload, policy};
  return s;
}

TEST(ExplanationTest, KindNames_RoundTrip) {
  for (DecisionKind k :
       {DecisionKind::kPrefetch, DecisionKind::kFuse, DecisionKind::kKeep,
        DecisionKind::kPersist, DecisionKind::kOffload, DecisionKind::kReturn,
        DecisionKind::kZero1Buckets, DecisionKind::kPass, DecisionKind::kPolicy,
        DecisionKind::kLeastMemory}) {
    EXPECT_EQ(ParseDecisionKind(DecisionKindName(k)), k);
  }
  for (BindingKind k : {BindingKind::kNone, BindingKind::kMemory,
                        BindingKind::kLink, BindingKind::kHostLink}) {
    EXPECT_EQ(ParseBindingKind(BindingKindName(k)), k);
  }
  EXPECT_EQ(DecisionKindName(DecisionKind::kZero1Buckets), "zero1-buckets");
  EXPECT_FALSE(ParseDecisionKind("prefetched").has_value());
}

TEST(ExplanationTest, Totals_SumTheGains) {
  const Explanation e = ExplainedSchedule().explanation;
  EXPECT_DOUBLE_EQ(e.TotalGain(), 0.1 - 0.0125 + 1.0 / 3.0);
  EXPECT_DOUBLE_EQ(e.TotalExposedGain(), 0.1);
}

TEST(ExplanationTest, PrintSchedule_Explanation_RoundTripsBitExact) {
  const Schedule s = ExplainedSchedule();
  const std::string text = PrintSchedule(s);
  EXPECT_THAT(text, HasSubstr("explain baseline=0.5 baseline_exposed=0.125 "
                              "baseline_peak=3221225472\n"));
  EXPECT_THAT(text,
              HasSubstr("decision prefetch pass=prefetch gain=0.1 "
                        "exposed_gain=0.1 held=1048576 peak_delta=1048576 "
                        "at=n3 groups=g0 bind=link what="));
  EXPECT_THAT(text, HasSubstr("bind=memory bind_at=n0 bind_bytes=3221225472 "
                              "bind_limit=2147483648"));
  absl::StatusOr<Schedule> parsed = ParseSchedule(text);
  ASSERT_TRUE(parsed.ok()) << parsed.status() << "\n" << text;
  EXPECT_EQ(parsed->explanation, s.explanation);
  EXPECT_FALSE(parsed->explanation.decisions[1].node_id.has_value());
  EXPECT_EQ(*parsed, s);
}

TEST(ExplanationTest, ProtoForm_Explanation_RoundTrips) {
  const Schedule s = ExplainedSchedule();
  const v1::Schedule proto = ToProto(s);
  ASSERT_TRUE(proto.has_explanation());
  EXPECT_EQ(proto.explanation().decisions(0).kind(),
            v1::DECISION_KIND_PREFETCH);
  EXPECT_EQ(proto.explanation().decisions(1).binding().kind(),
            v1::BINDING_KIND_MEMORY);
  EXPECT_FALSE(proto.explanation().decisions(1).has_node_id());
  v1::Schedule wire;
  ASSERT_TRUE(wire.ParseFromString(proto.SerializeAsString()));
  absl::StatusOr<Schedule> back = FromProto(wire);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->explanation, s.explanation);
}

TEST(ExplanationTest, ProtoForm_NoExplanation_StaysAbsent) {
  Schedule s = ExplainedSchedule();
  s.explanation = Explanation();
  EXPECT_FALSE(ToProto(s).has_explanation());
  EXPECT_THAT(PrintSchedule(s), ::testing::Not(HasSubstr("explain")));
}

TEST(ExplanationTest, ProtoForm_UnknownKind_IsRejected) {
  v1::Schedule proto = ToProto(ExplainedSchedule());
  proto.mutable_explanation()->mutable_decisions(1)->set_kind(
      v1::DECISION_KIND_UNSPECIFIED);
  absl::StatusOr<Schedule> back = FromProto(proto);
  ASSERT_FALSE(back.ok());
  EXPECT_THAT(back.status().message(),
              HasSubstr("explanation decision 1: kind is unspecified"));
}

TEST(ExplanationTest, ParseSchedule_BadDecision_SaysWhatToWrite) {
  const std::string header = "schedule v1 graph=0123456789abcdef\n";
  absl::StatusOr<Schedule> s =
      ParseSchedule(header + "decision prefetched pass=prefetch\n");
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.status().message(), HasSubstr("line 2"));
  EXPECT_THAT(s.status().message(), HasSubstr("unknown decision 'prefetched'"));
  s = ParseSchedule(header + "decision keep bind=disk\n");
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.status().message(),
              HasSubstr("expected none, memory, link or host-link"));
  s = ParseSchedule(header + "explain baseline=1\nexplain baseline=2\n");
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.status().message(), HasSubstr("duplicate 'explain'"));
}

TEST(ExplanationTest, FormatExplanation_ShowsEveryDecisionAndTotals) {
  const Schedule s = ExplainedSchedule();
  const std::string table = FormatExplanation(
      s.explanation, s.prediction.iteration_s, s.prediction.exposed_comm_s);
  EXPECT_THAT(table, HasSubstr("# baseline: iteration 0.500000 s"));
  EXPECT_THAT(table, HasSubstr("memory at n0 (3.00GiB of 2.00GiB)"));
  EXPECT_THAT(table, HasSubstr("-96.00MiB"));
  EXPECT_THAT(table, HasSubstr(s.explanation.decisions[0].what));
  EXPECT_THAT(table, HasSubstr("# total gain 0.420833 s"));
  EXPECT_THAT(table, HasSubstr("predicted baseline - plan 0.250000 s"));
}

}  // namespace
}  // namespace tandem
