#include "common/metrics/metrics_registry.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <thread>
#include <vector>

namespace tandem::metrics {
namespace {

using ::testing::HasSubstr;

TEST(RegistryTest, Expose_CounterGaugeHistogram_MatchesTextFormat) {
  Registry registry;
  auto counter = registry.AddCounter("tandem_replans_total",
                                     "Re-plans by reason.", {"job", "reason"});
  ASSERT_TRUE(counter.ok());
  (*counter)->WithLabels({"j1", "drift"}).Increment(2);
  auto gauge =
      registry.AddGauge("tandem_memory_bytes", "Memory by kind.", {"kind"});
  ASSERT_TRUE(gauge.ok());
  (*gauge)->WithLabels({"peak"}).Set(1.5e9);
  auto hist = registry.AddHistogram("tandem_iteration_seconds",
                                    "Iteration time.", {}, {0.1, 1});
  ASSERT_TRUE(hist.ok());
  Histogram& h = (*hist)->WithLabels({});
  h.Observe(0.05);
  h.Observe(0.5);
  h.Observe(3);

  const std::string text = registry.Expose();
  EXPECT_THAT(text, HasSubstr("# HELP tandem_replans_total Re-plans by "
                              "reason.\n# TYPE tandem_replans_total counter\n"
                              "tandem_replans_total{job=\"j1\",reason="
                              "\"drift\"} 2\n"));
  EXPECT_THAT(text,
              HasSubstr("# TYPE tandem_memory_bytes gauge\n"
                        "tandem_memory_bytes{kind=\"peak\"} 1500000000\n"));
  EXPECT_THAT(text, HasSubstr("tandem_iteration_seconds_bucket{le=\"0.1\"} 1\n"
                              "tandem_iteration_seconds_bucket{le=\"1\"} 2\n"
                              "tandem_iteration_seconds_bucket{le=\"+Inf\"} 3\n"
                              "tandem_iteration_seconds_sum 3.55\n"
                              "tandem_iteration_seconds_count 3\n"));
}

TEST(RegistryTest, AddCounter_WithoutTotalSuffix_IsRejected) {
  Registry registry;
  auto c = registry.AddCounter("tandem_replans", "x");
  EXPECT_THAT(std::string(c.status().message()),
              HasSubstr("must end in _total"));
}

TEST(RegistryTest, Add_MalformedNames_AreRejected) {
  Registry registry;
  EXPECT_FALSE(registry.AddGauge("1bad", "x").ok());
  EXPECT_FALSE(registry.AddGauge("bad-name", "x").ok());
  EXPECT_FALSE(registry.AddGauge("ok_name", "x", {"__reserved"}).ok());
  EXPECT_FALSE(registry.AddGauge("ok_name", "x", {"le"}).ok());
  EXPECT_FALSE(registry.AddHistogram("h_seconds", "x", {}, {1, 1}).ok());
  ASSERT_TRUE(registry.AddGauge("ok_name", "x").ok());
  EXPECT_THAT(std::string(registry.AddGauge("ok_name", "y").status().message()),
              HasSubstr("registered twice"));
}

TEST(RegistryTest, LabelValues_AreEscaped) {
  Registry registry;
  auto g = registry.AddGauge("g", "help with \\ and\nnewline", {"job"});
  (*g)->WithLabels({"a\"b\\c\nd"}).Set(1);
  const std::string text = registry.Expose();
  EXPECT_THAT(text, HasSubstr("g{job=\"a\\\"b\\\\c\\nd\"} 1\n"));
  EXPECT_THAT(text, HasSubstr("# HELP g help with \\\\ and\\nnewline\n"));
}

TEST(RegistryTest, WithLabels_BeyondMaxSeries_DropsAndCounts) {
  Registry registry(/*max_series_per_family=*/2);
  auto g = registry.AddGauge("g", "x", {"rank"});
  for (int r = 0; r < 5; ++r) (*g)->WithLabels({std::to_string(r)}).Set(r);
  const std::string text = registry.Expose();
  EXPECT_THAT(text, HasSubstr("g{rank=\"1\"} 1\n"));
  EXPECT_THAT(text, ::testing::Not(HasSubstr("rank=\"2\"")));
  EXPECT_THAT(text, HasSubstr("tandem_metrics_dropped_series_total 3\n"));
}

TEST(RegistryTest, Remove_DropsSeries) {
  Registry registry;
  auto g = registry.AddGauge("g", "x", {"job"});
  (*g)->WithLabels({"a"}).Set(1);
  (*g)->Remove({"a"});
  EXPECT_THAT(registry.Expose(), ::testing::Not(HasSubstr("g{job=\"a\"}")));
}

TEST(RegistryTest, Counter_ConcurrentIncrements_AreAllCounted) {
  Registry registry;
  Counter& c = (*registry.AddCounter("c_total", "x"))->WithLabels({});
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 10000; ++i) c.Increment();
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(c.value(), 40000);
  c.Increment(-5);  // ignored: counters only rise
  EXPECT_EQ(c.value(), 40000);
}

TEST(FormatValueTest, SpecialValues) {
  EXPECT_EQ(FormatValue(1.0 / 0.0), "+Inf");
  EXPECT_EQ(FormatValue(-1.0 / 0.0), "-Inf");
  EXPECT_EQ(FormatValue(0.1), "0.1");
  EXPECT_EQ(FormatValue(0.0 / 0.0), "NaN");
}

}  // namespace
}  // namespace tandem::metrics
