#include "common/metrics/http_exporter.h"

#include <civetweb.h>

#include <mutex>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace tandem::metrics {
namespace {

std::once_flag civetweb_init;

const char* Reason(int status) {
  switch (status) {
    case 200:
      return "OK";
    case 400:
      return "Bad Request";
    case 401:
      return "Unauthorized";
    case 403:
      return "Forbidden";
    case 404:
      return "Not Found";
    case 405:
      return "Method Not Allowed";
    case 503:
      return "Service Unavailable";
    default:
      return status >= 500 ? "Internal Server Error" : "Error";
  }
}

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
  // Threads to spare and a short wait for a request: a few connections
  // that send nothing (half-open, or a slow client) must not stall the
  // scrape (two of them held 2 threads for civetweb's default 30 s).
  const std::string threads = std::to_string(kThreads);
  const std::string timeout_ms = std::to_string(kRequestTimeoutMs);
  const char* options[] = {
      "listening_ports",    ports.c_str(),      "num_threads", threads.c_str(),
      "request_timeout_ms", timeout_ms.c_str(), nullptr};
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

std::optional<HttpExporter::Page> HttpExporter::Refusal(
    struct mg_connection* conn, absl::string_view path) const {
  if (!gate_) return std::nullopt;
  const char* authorization = mg_get_header(conn, "Authorization");
  return gate_(authorization != nullptr ? authorization : "", path);
}

namespace {

void WritePage(struct mg_connection* conn, const HttpExporter::Page& page,
               bool head) {
  mg_printf(conn,
            "HTTP/1.1 %d %s\r\n"
            "Content-Type: %s\r\n"
            "Content-Length: %zu\r\n"
            "Cache-Control: no-store\r\n"
            "%s"
            "Connection: close\r\n\r\n",
            page.status, Reason(page.status), page.content_type.c_str(),
            page.body.size(),
            page.status == 401 ? "WWW-Authenticate: Bearer\r\n" : "");
  if (!head) mg_write(conn, page.body.data(), page.body.size());
}

}  // namespace

int HttpExporter::HandleMetrics(struct mg_connection* conn, void* self) {
  const auto* exporter = static_cast<const HttpExporter*>(self);
  if (std::optional<Page> refused = exporter->Refusal(conn, "/metrics")) {
    WritePage(conn, *refused, false);
    return refused->status;
  }
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

void HttpExporter::AddPage(absl::string_view prefix, PageHandler handler) {
  pages_.push_back({this, std::string(prefix), std::move(handler)});
  mg_set_request_handler(context_, pages_.back().prefix.c_str(), &HandlePage,
                         &pages_.back());
}

int HttpExporter::HandlePage(struct mg_connection* conn, void* entry) {
  const auto* page = static_cast<const PageEntry*>(entry);
  const mg_request_info* info = mg_get_request_info(conn);
  const std::string method = info->request_method ? info->request_method : "";
  const absl::string_view uri = info->local_uri ? info->local_uri : "";
  Page response;
  if (method != "GET" && method != "HEAD") {
    response = {405, "text/plain; charset=utf-8",
                absl::StrCat(method, " is not served here; use GET\n")};
  } else if (!absl::StartsWith(uri, page->prefix)) {
    // civetweb matched a longer path ("/jobsx" for "/jobs").
    response = {404, "text/plain; charset=utf-8",
                absl::StrCat("no page at ", uri, "\n")};
  } else if (std::optional<Page> refused = page->exporter->Refusal(conn, uri)) {
    response = *std::move(refused);
  } else {
    response = page->handler(uri.substr(page->prefix.size()));
  }
  WritePage(conn, response, method == "HEAD");
  return response.status;
}

}  // namespace tandem::metrics
