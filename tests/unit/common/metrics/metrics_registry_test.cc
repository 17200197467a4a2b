#include "common/metrics/metrics_registry.h"

#include <arpa/inet.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <thread>
#include <vector>

#include "common/metrics/http_exporter.h"

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

// Fetches http://127.0.0.1:port/metrics with a plain socket.
std::string HttpGet(int port, const std::string& path) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return "";
  }
  const std::string req =
      "GET " + path +
      " HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n";
  (void)!write(fd, req.data(), req.size());
  std::string out;
  char buf[4096];
  for (ssize_t n; (n = read(fd, buf, sizeof(buf))) > 0;) out.append(buf, n);
  close(fd);
  return out;
}

TEST(HttpExporterTest, Scrape_ServesExpositionThatPromtoolAccepts) {
  Registry registry;
  auto g = registry.AddGauge("tandem_overlap_ratio", "Overlap.", {"job"});
  (*g)->WithLabels({"j1"}).Set(0.75);
  auto h = registry.AddHistogram("tandem_iteration_seconds", "Iteration.",
                                 {"job"}, ExponentialBuckets(0.01, 2, 8));
  (*h)->WithLabels({"j1"}).Observe(0.2);
  auto exporter = HttpExporter::Start("127.0.0.1:0", &registry);
  ASSERT_TRUE(exporter.ok()) << exporter.status();
  ASSERT_GT((*exporter)->port(), 0);

  const std::string response = HttpGet((*exporter)->port(), "/metrics");
  EXPECT_THAT(response, HasSubstr("200 OK"));
  EXPECT_THAT(response, HasSubstr("text/plain; version=0.0.4"));
  EXPECT_THAT(response, HasSubstr("tandem_overlap_ratio{job=\"j1\"} 0.75"));

  if (system("command -v promtool >/dev/null 2>&1") != 0) {
    GTEST_SKIP() << "promtool not installed";
  }
  const std::string path = ::testing::TempDir() + "/metrics.txt";
  std::ofstream(path) << registry.Expose();
  const std::string cmd = "promtool check metrics < " + path + " 2>&1";
  FILE* pipe = popen(cmd.c_str(), "r");
  std::string lint;
  char buf[512];
  while (fgets(buf, sizeof(buf), pipe) != nullptr) lint += buf;
  EXPECT_EQ(pclose(pipe), 0) << lint;
  EXPECT_EQ(lint, "");
}

// Connections that send nothing (half-open sockets, a stuck client) do not
// stall a scrape: more of them than there used to be threads, and a scrape
// still answers at once; civetweb drops them after kRequestTimeoutMs.
TEST(HttpExporterTest, IdleConnections_DoNotStallTheScrape) {
  Registry registry;
  auto g = registry.AddGauge("tandem_up", "Up.", {});
  (*g)->WithLabels({}).Set(1);
  auto exporter = HttpExporter::Start("127.0.0.1:0", &registry);
  ASSERT_TRUE(exporter.ok()) << exporter.status();
  std::vector<int> idle;
  for (int i = 0; i < 4; ++i) {
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>((*exporter)->port()));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ASSERT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    idle.push_back(fd);
  }
  const auto start = std::chrono::steady_clock::now();
  const std::string response = HttpGet((*exporter)->port(), "/metrics");
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
          .count();
  for (int fd : idle) close(fd);
  EXPECT_THAT(response, HasSubstr("tandem_up 1"));
  // Generous for a loaded machine; the old exporter took 29.5 s.
  EXPECT_LT(seconds, HttpExporter::kRequestTimeoutMs / 1000.0);
}

TEST(HttpExporterTest, Start_MalformedAddress_IsRejected) {
  Registry registry;
  auto e = HttpExporter::Start("nonsense", &registry);
  EXPECT_EQ(e.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(e.status().message()), HasSubstr("HOST:PORT"));
}

TEST(HttpExporterTest, Start_PortInUse_IsUnavailable) {
  Registry registry;
  auto first = HttpExporter::Start("127.0.0.1:0", &registry);
  ASSERT_TRUE(first.ok());
  auto second = HttpExporter::Start(
      "127.0.0.1:" + std::to_string((*first)->port()), &registry);
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace tandem::metrics
