// Serves a Registry's exposition at GET /metrics over HTTP (civetweb), for
// Prometheus to scrape, and any pages a process adds beside it (the
// coordinator's job reports at /jobs/<id>). One per process (coordinator,
// each worker).
#ifndef TANDEM_COMMON_METRICS_HTTP_EXPORTER_H_
#define TANDEM_COMMON_METRICS_HTTP_EXPORTER_H_

#include <functional>
#include <list>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/metrics/metrics_registry.h"

struct mg_context;
struct mg_connection;

namespace tandem::metrics {

class HttpExporter {
 public:
  // Listens on `address` ("HOST:PORT"; port 0 picks a free one) and serves
  // `registry`, which must outlive the exporter. civetweb runs its own
  // threads (two: a listener and one worker, enough for a scraper). Errors:
  // InvalidArgument for a malformed address, Unavailable when the port cannot
  // be bound.
  static absl::StatusOr<std::unique_ptr<HttpExporter>> Start(
      absl::string_view address, const Registry* registry);
  ~HttpExporter();
  HttpExporter(const HttpExporter&) = delete;
  HttpExporter& operator=(const HttpExporter&) = delete;

  // Connections served at once, and how long one may take to send its
  // request before it is dropped: connections that send nothing cannot
  // hold the exporter for long.
  static constexpr int kThreads = 8;
  static constexpr int kRequestTimeoutMs = 3000;

  // The port actually bound.
  int port() const { return port_; }

  // What a page handler answers.
  struct Page {
    int status = 200;
    std::string content_type = "text/html; charset=utf-8";
    std::string body;
  };
  // Gets the request's decoded path below the prefix ("" or "/..."); runs
  // on civetweb's worker thread.
  using PageHandler = std::function<Page(absl::string_view path)>;
  // Serves GET (and HEAD) requests for `prefix` and every path below it
  // ("/jobs": "/jobs", "/jobs/x") with `handler`, which must stay callable
  // until the exporter is destroyed; other methods get 405. Call before the
  // pages are requested.
  void AddPage(absl::string_view prefix, PageHandler handler);

  // Asked before every request is served, with its `Authorization` header
  // ("" when absent) and its path ("/metrics", "/jobs/x"): nullopt serves
  // it, a Page answers instead (401, 403). Set once, before requests come;
  // none: everything is served.
  using Gate = std::function<std::optional<Page>(
      absl::string_view authorization, absl::string_view path)>;
  void SetGate(Gate gate) { gate_ = std::move(gate); }

 private:
  struct PageEntry {
    const HttpExporter* exporter;
    std::string prefix;
    PageHandler handler;
  };
  // The gate's answer for this request, if it refuses it.
  std::optional<Page> Refusal(struct mg_connection* conn,
                              absl::string_view path) const;

  HttpExporter(const Registry* registry) : registry_(registry) {}
  static int HandleMetrics(struct mg_connection* conn, void* self);
  static int HandlePage(struct mg_connection* conn, void* entry);

  const Registry* registry_;
  Gate gate_;
  // Stable addresses: civetweb holds a pointer to each entry.
  std::list<PageEntry> pages_;
  mg_context* context_ = nullptr;
  int port_ = 0;
};

}  // namespace tandem::metrics

#endif  // TANDEM_COMMON_METRICS_HTTP_EXPORTER_H_
