#include "common/metrics/http_exporter.h"

#include <civetweb.h>

#include <mutex>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace tandem::metrics {
namespace {

std::once_flag civetweb_init;

}  // namespace

absl::StatusOr<std::unique_ptr<HttpExporter>> HttpExporter::Start(
    absl::string_view address, const Registry* registry) {
  const size_t colon = address.rfind(':');
  int port = 0;
  if (colon == absl::string_view::npos || colon == 0 ||
      !absl::SimpleAtoi(address.substr(colon + 1), &port) || port < 0 ||
      port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat(
        "metrics address '", address,
        "' is malformed: use HOST:PORT, e.g. 127.0.0.1:9100 (port 0 picks a "
        "free one)"));
  }
  std::call_once(civetweb_init, [] { mg_init_library(0); });

  std::unique_ptr<HttpExporter> exporter(new HttpExporter(registry));
  const std::string ports(address);
  const char* options[] = {"listening_ports", ports.c_str(), "num_threads", "2",
                           nullptr};
  mg_callbacks callbacks{};
  exporter->context_ = mg_start(&callbacks, nullptr, options);
  if (exporter->context_ == nullptr) {
    return absl::UnavailableError(absl::StrCat(
        "cannot serve metrics on ", address,
        ": the port is in use or the host is not a local address; pick "
        "another --metrics-listen"));
  }
  mg_set_request_handler(exporter->context_, "/metrics", &HandleMetrics,
                         exporter.get());
  mg_server_port ports_info[4];
  const int n = mg_get_server_ports(exporter->context_, 4, ports_info);
  exporter->port_ = n > 0 ? ports_info[0].port : port;
  return exporter;
}

HttpExporter::~HttpExporter() {
  if (context_ != nullptr) mg_stop(context_);
}

int HttpExporter::HandleMetrics(struct mg_connection* conn, void* self) {
  const auto* exporter = static_cast<const HttpExporter*>(self);
  const std::string body = exporter->registry_->Expose();
  mg_printf(conn,
            "HTTP/1.1 200 OK\r\n"
            "Content-Type: text/plain; version=0.0.4; charset=utf-8\r\n"
            "Content-Length: %zu\r\n"
            "Connection: close\r\n\r\n",
            body.size());
  mg_write(conn, body.data(), body.size());
  return 200;
}

}  // namespace tandem::metrics
