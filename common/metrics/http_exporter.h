// Serves a Registry's exposition at GET /metrics over HTTP/1.1, for
// Prometheus to scrape, and any pages a process adds beside it (the
// coordinator's job reports at /jobs/<id>). One per process (coordinator,
// each worker).
//
// Built to stay up under hostile load (coordinator/README.md, "Limits"):
// one thread reads and writes every connection without blocking (epoll), so
// a slow or silent connection holds a file descriptor, never a thread; each
// connection has `request_timeout_ms` to send its whole request and
// `write_timeout_ms` to take the answer; one address may hold
// `max_connections_per_peer` connections and the exporter `max_connections`
// (past either a new connection gets 503 and is closed); the accept queue is
// `backlog` long. Requests are answered by `handler_threads` threads from a
// queue of `max_queued_requests` (past it, 503), so a slow page (a big job
// report) does not stall the scrape.
#ifndef TANDEM_COMMON_METRICS_HTTP_EXPORTER_H_
#define TANDEM_COMMON_METRICS_HTTP_EXPORTER_H_

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/metrics/metrics_registry.h"

namespace tandem::metrics {

class HttpExporter {
 public:
  struct Limits {
    int max_connections = 4096;
    int max_connections_per_peer = 256;
    int request_timeout_ms = 3000;
    int write_timeout_ms = 10000;
    size_t max_request_bytes = 16 << 10;
    int handler_threads = 2;
    int max_queued_requests = 64;
    int backlog = 128;
  };

  // Listens on `address` ("HOST:PORT"; port 0 picks a free one) and serves
  // `registry`, which must outlive the exporter. Errors: InvalidArgument
  // for a malformed address, Unavailable when the port cannot be bound.
  static absl::StatusOr<std::unique_ptr<HttpExporter>> Start(
      absl::string_view address, const Registry* registry);
  static absl::StatusOr<std::unique_ptr<HttpExporter>> Start(
      absl::string_view address, const Registry* registry, Limits limits);
  // Closes the port and every connection; requests being answered finish
  // first.
  ~HttpExporter();
  HttpExporter(const HttpExporter&) = delete;
  HttpExporter& operator=(const HttpExporter&) = delete;

  // The port actually bound.
  int port() const { return port_; }
  const Limits& limits() const { return limits_; }

  // What a page handler answers.
  struct Page {
    int status = 200;
    std::string content_type = "text/html; charset=utf-8";
    std::string body;
  };
  // Gets the request's decoded path below the prefix ("" or "/..."); runs
  // on a handler thread.
  using PageHandler = std::function<Page(absl::string_view path)>;
  // Serves GET (and HEAD) requests for `prefix` and every path below it
  // ("/jobs": "/jobs", "/jobs/x") with `handler`, which must stay callable
  // until the exporter is destroyed; other methods get 405.
  void AddPage(absl::string_view prefix, PageHandler handler);

  // What the gate decides for one request: a refusal answers instead (401,
  // 404), else the request is served, /metrics with only the series
  // `series` keeps (null: all).
  struct Access {
    std::optional<Page> refusal;
    Registry::SeriesFilter series;
  };
  // Asked before every request is served, with its `Authorization` header
  // ("" when absent) and its path ("/metrics", "/jobs/x"). None (the
  // default): everything is served to everyone.
  using Gate = std::function<Access(absl::string_view authorization,
                                    absl::string_view path)>;
  void SetGate(Gate gate);

  // Counts, for the metrics and tests: connections open now, refused at
  // accept (a cap), and closed at a deadline.
  struct Stats {
    int64_t open = 0;
    int64_t refused = 0;
    int64_t timed_out = 0;
  };
  Stats stats() const;

 private:
  struct Request {
    uint64_t connection;
    std::string method;
    std::string path;
    std::string authorization;
  };
  struct Answer {
    uint64_t connection;
    std::string bytes;
  };
  class Loop;

  HttpExporter(const Registry* registry, Limits limits);
  // A handler thread: answers queued requests until stopped.
  void Serve();
  // The response bytes for one request.
  std::string Respond(const Request& request) const;
  // Queues a parsed request; false when the queue is full.
  bool Enqueue(Request request);

  const Registry* registry_;
  const Limits limits_;
  // Set while serving may have begun: read under config_mu_.
  mutable std::mutex config_mu_;
  Gate gate_;
  struct PageEntry {
    std::string prefix;
    PageHandler handler;
  };
  std::vector<PageEntry> pages_;
  int port_ = 0;

  std::unique_ptr<Loop> loop_;
  std::mutex queue_mu_;
  std::condition_variable queue_cv_;
  std::deque<Request> queue_;
  bool stopping_ = false;
  std::vector<std::thread> handlers_;
};

// Formats a whole HTTP/1.1 response that closes the connection (`head`: the
// headers only).
std::string FormatResponse(const HttpExporter::Page& page, bool head);
// Decodes a request target's path: the part before '?', with %XX decoded;
// nullopt for a malformed escape.
std::optional<std::string> DecodeTargetPath(absl::string_view target);

}  // namespace tandem::metrics

#endif  // TANDEM_COMMON_METRICS_HTTP_EXPORTER_H_
