// The exporter under hostile connections (issue 36 item 5): silent and slow
// connections hold no thread and are dropped at their deadline, one address
// cannot take every place, and the gate's series filter is applied.
#include "common/metrics/http_exporter.h"

#include <arpa/inet.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

namespace tandem::metrics {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using namespace std::chrono_literals;

// A connection to the exporter from `source` (an address of this machine).
int Connect(int port, const char* source = "127.0.0.1") {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in from{};
  from.sin_family = AF_INET;
  inet_pton(AF_INET, source, &from.sin_addr);
  if (bind(fd, reinterpret_cast<sockaddr*>(&from), sizeof(from)) != 0) {
    close(fd);
    return -1;
  }
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

// Everything the server sends until it closes (or `timeout` passes).
std::string ReadAll(int fd, std::chrono::milliseconds timeout = 10s) {
  std::string out;
  char buf[4096];
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    pollfd p{fd, POLLIN, 0};
    if (left.count() <= 0 || poll(&p, 1, static_cast<int>(left.count())) <= 0) {
      break;
    }
    const ssize_t n = read(fd, buf, sizeof(buf));
    if (n <= 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  return out;
}

std::string Request(int port, const std::string& raw,
                    const char* source = "127.0.0.1") {
  const int fd = Connect(port, source);
  if (fd < 0) return "";
  (void)!write(fd, raw.data(), raw.size());
  std::string out = ReadAll(fd);
  close(fd);
  return out;
}

std::string Get(int port, const std::string& path,
                const std::string& headers = "") {
  return Request(port,
                 "GET " + path + " HTTP/1.1\r\nHost: x\r\n" + headers + "\r\n");
}

struct Fixture {
  Fixture(HttpExporter::Limits limits = {}) {
    auto g = registry.AddGauge("tandem_workers", "Workers.", {"job"});
    (*g)->WithLabels({"mine"}).Set(2);
    (*g)->WithLabels({"theirs"}).Set(3);
    auto up = registry.AddGauge("tandem_up", "Up.", {});
    (*up)->WithLabels({}).Set(1);
    auto e = HttpExporter::Start("127.0.0.1:0", &registry, limits);
    EXPECT_TRUE(e.ok()) << e.status();
    exporter = *std::move(e);
  }
  int port() const { return exporter->port(); }
  Registry registry;
  std::unique_ptr<HttpExporter> exporter;
};

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

  const std::string response = Get((*exporter)->port(), "/metrics");
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

TEST(HttpExporterTest, Pages_MethodsPathsAndHead) {
  Fixture f;
  std::string seen;
  f.exporter->AddPage("/jobs", [&](absl::string_view rest) {
    seen = std::string(rest);
    return HttpExporter::Page{200, "text/html; charset=utf-8", "<p>job</p>"};
  });
  EXPECT_THAT(Get(f.port(), "/jobs/a%20b?x=1"), HasSubstr("<p>job</p>"));
  EXPECT_EQ(seen, "/a b");
  EXPECT_THAT(Get(f.port(), "/jobsx"), HasSubstr("404 Not Found"));
  EXPECT_THAT(Get(f.port(), "/nothing"), HasSubstr("no page at /nothing"));
  EXPECT_THAT(Request(f.port(), "POST /metrics HTTP/1.1\r\n\r\n"),
              HasSubstr("405 Method Not Allowed"));
  const std::string head =
      Request(f.port(), "HEAD /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
  EXPECT_THAT(head, HasSubstr("200 OK"));
  EXPECT_THAT(head, Not(HasSubstr("tandem_up 1")));
  EXPECT_THAT(Request(f.port(), "garbage\r\n\r\n"),
              HasSubstr("400 Bad Request"));
  EXPECT_THAT(Get(f.port(), "/jobs/%zz"), HasSubstr("400 Bad Request"));
  EXPECT_THAT(
      Get(f.port(), "/metrics", "X-Big: " + std::string(20000, 'a') + "\r\n"),
      HasSubstr("431"));
}

TEST(HttpExporterTest, Gate_RefusesOrFiltersTheSeries) {
  Fixture f;
  f.exporter->SetGate([](absl::string_view authorization, absl::string_view) {
    HttpExporter::Access access;
    if (authorization != "Bearer t") {
      access.refusal = HttpExporter::Page{401, "text/plain", "no token\n"};
      return access;
    }
    access.series = [](const std::vector<std::string>& names,
                       const LabelValues& values) {
      return names.empty() || values[0] == "mine";
    };
    return access;
  });
  const std::string refused = Get(f.port(), "/metrics");
  EXPECT_THAT(refused, HasSubstr("401 Unauthorized"));
  EXPECT_THAT(refused, HasSubstr("WWW-Authenticate: Bearer"));
  const std::string mine =
      Get(f.port(), "/metrics", "Authorization: Bearer t\r\n");
  EXPECT_THAT(mine, HasSubstr("tandem_workers{job=\"mine\"} 2"));
  EXPECT_THAT(mine, Not(HasSubstr("theirs")));
  EXPECT_THAT(mine, HasSubstr("tandem_up 1"));
}

TEST(HttpExporterTest, CollectHooks_RunBeforeEachScrape) {
  Fixture f;
  auto g = f.registry.AddGauge("tandem_open_streams", "Open.", {});
  int scrapes = 0;
  f.registry.AddCollectHook([&] { (*g)->WithLabels({}).Set(++scrapes); });
  EXPECT_THAT(Get(f.port(), "/metrics"), HasSubstr("tandem_open_streams 1"));
  EXPECT_THAT(Get(f.port(), "/metrics"), HasSubstr("tandem_open_streams 2"));
}

// Many connections that send half a request and stop: the scrape still
// answers before any of them times out (the old exporter, a thread per
// connection, answered after them), and they are closed at their deadline.
TEST(HttpExporterTest, SlowConnections_NeitherStallTheScrapeNorStay) {
  HttpExporter::Limits limits;
  limits.request_timeout_ms = 1500;
  limits.max_connections_per_peer = 1000;
  Fixture f(limits);
  std::vector<int> slow;
  for (int i = 0; i < 300; ++i) {
    const int fd = Connect(f.port(), "127.0.0.2");
    ASSERT_GE(fd, 0);
    (void)!write(fd, "GET /metr", 9);
    slow.push_back(fd);
  }
  const auto start = std::chrono::steady_clock::now();
  EXPECT_THAT(Get(f.port(), "/metrics"), HasSubstr("tandem_up 1"));
  EXPECT_LT(std::chrono::steady_clock::now() - start, 1500ms);
  // Each slow one is closed by the server at its deadline.
  for (int fd : slow) {
    EXPECT_THAT(ReadAll(fd, 10s), Not(HasSubstr("200 OK")));
    close(fd);
  }
  EXPECT_GE(f.exporter->stats().timed_out, 300);
  EXPECT_EQ(f.exporter->stats().open, 0);
}

// One address may hold max_connections_per_peer; another is still served.
TEST(HttpExporterTest, PerPeerCap_RefusesThatAddressOnly) {
  HttpExporter::Limits limits;
  limits.max_connections_per_peer = 4;
  Fixture f(limits);
  std::vector<int> held;
  for (int i = 0; i < 4; ++i) held.push_back(Connect(f.port(), "127.0.0.2"));
  for (int i = 0; i < 200 && f.exporter->stats().open < 4; ++i) {
    std::this_thread::sleep_for(10ms);
  }
  const std::string refused =
      Request(f.port(), "GET /metrics HTTP/1.1\r\n\r\n", "127.0.0.2");
  EXPECT_THAT(refused, HasSubstr("503"));
  EXPECT_THAT(refused, HasSubstr("4 connections from 127.0.0.2"));
  EXPECT_THAT(Get(f.port(), "/metrics"), HasSubstr("tandem_up 1"));
  EXPECT_EQ(f.exporter->stats().refused, 1);
  for (int fd : held) close(fd);
}

TEST(HttpExporterTest, Start_MalformedAddressAndPortInUse) {
  Registry registry;
  auto malformed = HttpExporter::Start("nonsense", &registry);
  EXPECT_EQ(malformed.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(malformed.status().message()),
              HasSubstr("HOST:PORT"));
  auto first = HttpExporter::Start("127.0.0.1:0", &registry);
  ASSERT_TRUE(first.ok());
  EXPECT_EQ(HttpExporter::Start("127.0.0.1:" + std::to_string((*first)->port()),
                                &registry)
                .status()
                .code(),
            absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace tandem::metrics
