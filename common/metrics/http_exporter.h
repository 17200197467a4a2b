// Serves a Registry's exposition at GET /metrics over HTTP (civetweb), for
// Prometheus to scrape. One per process (coordinator, each worker).
#ifndef TANDEM_COMMON_METRICS_HTTP_EXPORTER_H_
#define TANDEM_COMMON_METRICS_HTTP_EXPORTER_H_

#include <memory>
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

  // The port actually bound.
  int port() const { return port_; }

 private:
  HttpExporter(const Registry* registry) : registry_(registry) {}
  static int HandleMetrics(struct mg_connection* conn, void* self);

  const Registry* registry_;
  mg_context* context_ = nullptr;
  int port_ = 0;
};

}  // namespace tandem::metrics

#endif  // TANDEM_COMMON_METRICS_HTTP_EXPORTER_H_
