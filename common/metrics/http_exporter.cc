#include "common/metrics/http_exporter.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <map>
#include <set>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace tandem::metrics {
namespace {

using Clock = std::chrono::steady_clock;

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
    case 431:
      return "Request Header Fields Too Large";
    case 503:
      return "Service Unavailable";
    default:
      return status >= 500 ? "Internal Server Error" : "Error";
  }
}

HttpExporter::Page Text(int status, std::string body) {
  return {status, "text/plain; charset=utf-8", std::move(body)};
}

// The address part of a peer, which the per-peer cap counts.
std::string PeerAddress(const sockaddr_storage& ss) {
  char host[INET6_ADDRSTRLEN] = "?";
  if (ss.ss_family == AF_INET) {
    inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in&>(ss).sin_addr, host,
              sizeof(host));
  } else if (ss.ss_family == AF_INET6) {
    inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6&>(ss).sin6_addr,
              host, sizeof(host));
  }
  return host;
}

// Sends what fits now, without blocking or SIGPIPE; the rest is dropped.
void SendBestEffort(int fd, const std::string& bytes) {
  (void)send(fd, bytes.data(), bytes.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
}

}  // namespace

std::string FormatResponse(const HttpExporter::Page& page, bool head) {
  std::string out =
      absl::StrCat("HTTP/1.1 ", page.status, " ", Reason(page.status), "\r\n",
                   "Content-Type: ", page.content_type, "\r\n",
                   "Content-Length: ", page.body.size(), "\r\n",
                   "Cache-Control: no-store\r\n",
                   page.status == 401 ? "WWW-Authenticate: Bearer\r\n" : "",
                   "Connection: close\r\n\r\n");
  if (!head) out += page.body;
  return out;
}

std::optional<std::string> DecodeTargetPath(absl::string_view target) {
  target = target.substr(0, target.find('?'));
  std::string out;
  out.reserve(target.size());
  for (size_t i = 0; i < target.size(); ++i) {
    if (target[i] != '%') {
      out += target[i];
      continue;
    }
    int value = 0;
    if (i + 2 >= target.size() ||
        !absl::ascii_isxdigit(static_cast<unsigned char>(target[i + 1])) ||
        !absl::ascii_isxdigit(static_cast<unsigned char>(target[i + 2]))) {
      return std::nullopt;
    }
    for (char c : target.substr(i + 1, 2)) {
      value = value * 16 + (absl::ascii_isdigit(static_cast<unsigned char>(c))
                                ? c - '0'
                                : absl::ascii_tolower(c) - 'a' + 10);
    }
    if (value == 0) return std::nullopt;  // no NUL in a path
    out += static_cast<char>(value);
    i += 2;
  }
  return out;
}

// The I/O thread: accepts, reads requests, writes answers, enforces the
// caps and the deadlines. Everything here runs on its thread but Post and
// Stop.
class HttpExporter::Loop {
 public:
  Loop(HttpExporter* exporter, int listen_fd)
      : exporter_(exporter),
        limits_(exporter->limits_),
        listen_fd_(listen_fd) {}

  ~Loop() {
    for (auto& [id, c] : connections_) close(c.fd);
    if (epoll_fd_ >= 0) close(epoll_fd_);
    if (wake_fd_ >= 0) close(wake_fd_);
    close(listen_fd_);
  }

  absl::Status Start() {
    epoll_fd_ = epoll_create1(EPOLL_CLOEXEC);
    wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (epoll_fd_ < 0 || wake_fd_ < 0 ||
        !Watch(listen_fd_, kListenId, EPOLLIN) ||
        !Watch(wake_fd_, kWakeId, EPOLLIN)) {
      return absl::InternalError(
          absl::StrCat("the metrics exporter cannot poll: errno ", errno));
    }
    thread_ = std::thread([this] { Run(); });
    return absl::OkStatus();
  }

  // From a handler thread: the answer to a request.
  void Post(Answer answer) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      answers_.push_back(std::move(answer));
    }
    Wake();
  }

  void Stop() {
    stop_ = true;
    Wake();
    if (thread_.joinable()) thread_.join();
  }

  Stats stats() const {
    return {open_.load(), refused_.load(), timed_out_.load()};
  }

 private:
  static constexpr uint64_t kListenId = 0;
  static constexpr uint64_t kWakeId = 1;
  enum class State { kReading, kAnswering, kWriting };
  struct Connection {
    int fd;
    std::string peer;
    State state = State::kReading;
    Clock::time_point deadline;
    std::string in;
    std::string out;
    size_t written = 0;
  };

  bool Watch(int fd, uint64_t id, uint32_t events) {
    epoll_event e{};
    e.events = events;
    e.data.u64 = id;
    return epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd, &e) == 0;
  }
  void Modify(const Connection& c, uint64_t id, uint32_t events) {
    epoll_event e{};
    e.events = events;
    e.data.u64 = id;
    epoll_ctl(epoll_fd_, EPOLL_CTL_MOD, c.fd, &e);
  }
  void Wake() {
    const uint64_t one = 1;
    (void)!write(wake_fd_, &one, sizeof(one));
  }

  void SetDeadline(uint64_t id, Connection& c, Clock::time_point deadline) {
    deadlines_.erase({c.deadline, id});
    c.deadline = deadline;
    deadlines_.emplace(deadline, id);
  }

  void Run() {
    std::vector<epoll_event> events(256);
    while (!stop_) {
      int timeout_ms = 1000;
      const Clock::time_point now = Clock::now();
      if (!deadlines_.empty()) {
        timeout_ms = static_cast<int>(std::clamp<int64_t>(
            std::chrono::duration_cast<std::chrono::milliseconds>(
                deadlines_.begin()->first - now)
                    .count() +
                1,
            0, 1000));
      }
      if (listen_paused_ && now >= resume_listen_) {
        listen_paused_ = !Watch(listen_fd_, kListenId, EPOLLIN);
      }
      if (listen_paused_) timeout_ms = std::min(timeout_ms, 100);
      const int n = epoll_wait(epoll_fd_, events.data(),
                               static_cast<int>(events.size()), timeout_ms);
      for (int i = 0; i < n && !stop_; ++i) {
        const uint64_t id = events[i].data.u64;
        if (id == kListenId) {
          Accept();
        } else if (id == kWakeId) {
          uint64_t count;
          (void)!read(wake_fd_, &count, sizeof(count));
          Deliver();
        } else {
          OnEvent(id, events[i].events);
        }
      }
      const Clock::time_point after = Clock::now();
      while (!deadlines_.empty() && deadlines_.begin()->first <= after) {
        const uint64_t id = deadlines_.begin()->second;
        ++timed_out_;
        Close(id);
      }
    }
  }

  void Accept() {
    for (;;) {
      sockaddr_storage ss{};
      socklen_t len = sizeof(ss);
      const int fd = accept4(listen_fd_, reinterpret_cast<sockaddr*>(&ss), &len,
                             SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) {
        if (errno == EINTR || errno == ECONNABORTED) continue;
        if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS ||
            errno == ENOMEM) {
          // Out of descriptors: stop accepting for a while rather than
          // spin on a listen socket that stays readable.
          epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, listen_fd_, nullptr);
          listen_paused_ = true;
          resume_listen_ = Clock::now() + std::chrono::milliseconds(100);
        }
        return;
      }
      std::string peer = PeerAddress(ss);
      int& from_peer = per_peer_[peer];
      std::string refusal;
      if (from_peer >= limits_.max_connections_per_peer) {
        refusal = absl::StrCat(from_peer, " connections from ", peer,
                               " are open, the most one address may have\n");
      } else if (static_cast<int>(connections_.size()) >=
                 limits_.max_connections) {
        refusal = absl::StrCat(connections_.size(),
                               " connections are open, the most this "
                               "exporter holds\n");
      }
      if (!refusal.empty()) {
        if (from_peer == 0) per_peer_.erase(peer);
        ++refused_;
        SendBestEffort(fd, FormatResponse(Text(503, refusal), false));
        close(fd);
        continue;
      }
      const uint64_t id = next_id_++;
      if (!Watch(fd, id, EPOLLIN | EPOLLRDHUP)) {
        if (from_peer == 0) per_peer_.erase(peer);
        close(fd);
        continue;
      }
      ++from_peer;
      Connection& c = connections_[id];
      c.fd = fd;
      c.peer = std::move(peer);
      c.deadline =
          Clock::now() + std::chrono::milliseconds(limits_.request_timeout_ms);
      deadlines_.emplace(c.deadline, id);
      ++open_;
    }
  }

  void OnEvent(uint64_t id, uint32_t events) {
    auto it = connections_.find(id);
    if (it == connections_.end()) return;
    Connection& c = it->second;
    switch (c.state) {
      case State::kReading:
        Read(id, c);
        return;
      case State::kAnswering:
        // The client went away while its page was being made.
        if (events & (EPOLLHUP | EPOLLERR)) Close(id);
        return;
      case State::kWriting:
        if (events & (EPOLLHUP | EPOLLERR)) {
          Close(id);
        } else {
          Write(id, c);
        }
        return;
    }
  }

  void Read(uint64_t id, Connection& c) {
    char buf[4096];
    for (;;) {
      const ssize_t n = recv(c.fd, buf, sizeof(buf), 0);
      if (n == 0) {
        Close(id);
        return;
      }
      if (n < 0) {
        if (errno == EINTR) continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK) Close(id);
        return;
      }
      c.in.append(buf, static_cast<size_t>(n));
      const size_t end = c.in.find("\r\n\r\n");
      if (end == std::string::npos ? c.in.size() > limits_.max_request_bytes
                                   : end > limits_.max_request_bytes) {
        Reply(
            id, c,
            FormatResponse(
                Text(431, absl::StrCat("a request's headers may take ",
                                       limits_.max_request_bytes, " bytes\n")),
                false));
        return;
      }
      if (end == std::string::npos) continue;
      Parse(id, c, absl::string_view(c.in).substr(0, end));
      return;
    }
  }

  void Parse(uint64_t id, Connection& c, absl::string_view head) {
    std::vector<absl::string_view> lines = absl::StrSplit(head, "\r\n");
    std::vector<absl::string_view> parts =
        absl::StrSplit(lines[0], ' ', absl::SkipEmpty());
    std::optional<std::string> path;
    if (parts.size() == 3 && absl::StartsWith(parts[2], "HTTP/1.")) {
      path = DecodeTargetPath(parts[1]);
    }
    if (!path.has_value() || !absl::StartsWith(*path, "/")) {
      Reply(id, c,
            FormatResponse(Text(400, "a request reads 'GET /path HTTP/1.1'\n"),
                           false));
      return;
    }
    Request request{id, std::string(parts[0]), *std::move(path), ""};
    for (size_t i = 1; i < lines.size(); ++i) {
      const size_t colon = lines[i].find(':');
      if (colon == absl::string_view::npos) continue;
      if (absl::EqualsIgnoreCase(lines[i].substr(0, colon), "authorization")) {
        request.authorization =
            std::string(absl::StripAsciiWhitespace(lines[i].substr(colon + 1)));
      }
    }
    c.state = State::kAnswering;
    deadlines_.erase({c.deadline, id});
    c.deadline = {};
    // Only a reset or a full hang-up ends it now (a client may half-close
    // once its request is sent).
    Modify(c, id, 0);
    const bool head_only = request.method == "HEAD";
    if (!exporter_->Enqueue(std::move(request))) {
      Reply(id, c,
            FormatResponse(Text(503,
                                "the exporter is answering too many requests; "
                                "retry shortly\n"),
                           head_only));
    }
  }

  void Reply(uint64_t id, Connection& c, std::string bytes) {
    c.state = State::kWriting;
    c.out = std::move(bytes);
    c.written = 0;
    c.in.clear();
    SetDeadline(
        id, c,
        Clock::now() + std::chrono::milliseconds(limits_.write_timeout_ms));
    Modify(c, id, EPOLLOUT);
    Write(id, c);
  }

  void Write(uint64_t id, Connection& c) {
    while (c.written < c.out.size()) {
      const ssize_t n = send(c.fd, c.out.data() + c.written,
                             c.out.size() - c.written, MSG_NOSIGNAL);
      if (n < 0) {
        if (errno == EINTR) continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK) Close(id);
        return;
      }
      c.written += static_cast<size_t>(n);
    }
    // All sent: read what the client may still have sent (so that close
    // does not reset the connection before it reads the answer), then
    // close.
    shutdown(c.fd, SHUT_WR);
    char buf[1024];
    while (recv(c.fd, buf, sizeof(buf), MSG_DONTWAIT) > 0) {
    }
    Close(id);
  }

  void Deliver() {
    std::deque<Answer> answers;
    {
      std::lock_guard<std::mutex> lock(mu_);
      answers.swap(answers_);
    }
    for (Answer& a : answers) {
      auto it = connections_.find(a.connection);
      if (it == connections_.end() || it->second.state != State::kAnswering) {
        continue;  // its client went away meanwhile
      }
      Reply(a.connection, it->second, std::move(a.bytes));
    }
  }

  void Close(uint64_t id) {
    auto it = connections_.find(id);
    if (it == connections_.end()) return;
    Connection& c = it->second;
    deadlines_.erase({c.deadline, id});
    close(c.fd);  // also leaves the epoll set
    auto p = per_peer_.find(c.peer);
    if (p != per_peer_.end() && --p->second <= 0) per_peer_.erase(p);
    connections_.erase(it);
    --open_;
  }

  HttpExporter* exporter_;
  const Limits& limits_;
  const int listen_fd_;
  int epoll_fd_ = -1;
  int wake_fd_ = -1;
  std::thread thread_;
  std::atomic<bool> stop_{false};

  std::map<uint64_t, Connection> connections_;
  std::set<std::pair<Clock::time_point, uint64_t>> deadlines_;
  std::map<std::string, int> per_peer_;
  uint64_t next_id_ = 2;
  bool listen_paused_ = false;
  Clock::time_point resume_listen_;

  std::mutex mu_;
  std::deque<Answer> answers_;

  std::atomic<int64_t> open_{0};
  std::atomic<int64_t> refused_{0};
  std::atomic<int64_t> timed_out_{0};
};

HttpExporter::HttpExporter(const Registry* registry, Limits limits)
    : registry_(registry), limits_(limits) {}

absl::StatusOr<std::unique_ptr<HttpExporter>> HttpExporter::Start(
    absl::string_view address, const Registry* registry) {
  return Start(address, registry, Limits());
}

absl::StatusOr<std::unique_ptr<HttpExporter>> HttpExporter::Start(
    absl::string_view address, const Registry* registry, Limits limits) {
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
  std::string host(address.substr(0, colon));
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const std::string service = std::to_string(port);
  if (getaddrinfo(host.empty() ? nullptr : host.c_str(), service.c_str(),
                  &hints, &found) != 0 ||
      found == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "metrics address '", address,
        "': the host does not resolve; use an address of this machine, e.g. "
        "127.0.0.1:9100"));
  }
  int fd = -1;
  for (addrinfo* a = found; a != nullptr && fd < 0; a = a->ai_next) {
    fd = socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC,
                a->ai_protocol);
    if (fd < 0) continue;
    const int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(fd, a->ai_addr, a->ai_addrlen) != 0 ||
        listen(fd, limits.backlog) != 0) {
      close(fd);
      fd = -1;
    }
  }
  freeaddrinfo(found);
  if (fd < 0) {
    return absl::UnavailableError(absl::StrCat(
        "cannot serve metrics on ", address,
        ": the port is in use or the host is not a local address; pick "
        "another --metrics-listen"));
  }
  sockaddr_storage bound{};
  socklen_t len = sizeof(bound);
  getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &len);
  std::unique_ptr<HttpExporter> exporter(new HttpExporter(registry, limits));
  exporter->port_ = ntohs(bound.ss_family == AF_INET6
                              ? reinterpret_cast<sockaddr_in6&>(bound).sin6_port
                              : reinterpret_cast<sockaddr_in&>(bound).sin_port);
  exporter->loop_ = std::make_unique<Loop>(exporter.get(), fd);
  if (absl::Status s = exporter->loop_->Start(); !s.ok()) return s;
  for (int i = 0; i < std::max(1, limits.handler_threads); ++i) {
    exporter->handlers_.emplace_back([e = exporter.get()] { e->Serve(); });
  }
  return exporter;
}

HttpExporter::~HttpExporter() {
  if (loop_ != nullptr) loop_->Stop();  // no new requests from here on
  {
    std::lock_guard<std::mutex> lock(queue_mu_);
    stopping_ = true;
  }
  queue_cv_.notify_all();
  for (std::thread& t : handlers_) t.join();
  loop_.reset();
}

void HttpExporter::AddPage(absl::string_view prefix, PageHandler handler) {
  std::lock_guard<std::mutex> lock(config_mu_);
  pages_.push_back({std::string(prefix), std::move(handler)});
}

void HttpExporter::SetGate(Gate gate) {
  std::lock_guard<std::mutex> lock(config_mu_);
  gate_ = std::move(gate);
}

HttpExporter::Stats HttpExporter::stats() const { return loop_->stats(); }

bool HttpExporter::Enqueue(Request request) {
  {
    std::lock_guard<std::mutex> lock(queue_mu_);
    if (stopping_ ||
        static_cast<int>(queue_.size()) >= limits_.max_queued_requests) {
      return false;
    }
    queue_.push_back(std::move(request));
  }
  queue_cv_.notify_one();
  return true;
}

void HttpExporter::Serve() {
  for (;;) {
    Request request;
    {
      std::unique_lock<std::mutex> lock(queue_mu_);
      queue_cv_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;
      request = std::move(queue_.front());
      queue_.pop_front();
    }
    loop_->Post({request.connection, Respond(request)});
  }
}

std::string HttpExporter::Respond(const Request& request) const {
  const bool head = request.method == "HEAD";
  const bool get = request.method == "GET" || head;
  Gate gate_now;
  std::vector<PageEntry> pages;
  {
    std::lock_guard<std::mutex> lock(config_mu_);
    gate_now = gate_;
    pages = pages_;
  }
  auto gate = [&](absl::string_view path) {
    return gate_now ? gate_now(request.authorization, path) : Access{};
  };
  auto not_get = [&] {
    return FormatResponse(
        Text(405,
             absl::StrCat(request.method, " is not served here; use GET\n")),
        head);
  };
  if (request.path == "/metrics") {
    if (!get) return not_get();
    Access access = gate("/metrics");
    if (access.refusal.has_value()) {
      return FormatResponse(*access.refusal, head);
    }
    return FormatResponse({200, "text/plain; version=0.0.4; charset=utf-8",
                           registry_->Expose(access.series)},
                          head);
  }
  for (const PageEntry& page : pages) {
    absl::string_view rest = request.path;
    if (!absl::ConsumePrefix(&rest, page.prefix) ||
        !(rest.empty() || rest.front() == '/')) {
      continue;
    }
    if (!get) return not_get();
    Access access = gate(request.path);
    if (access.refusal.has_value()) {
      return FormatResponse(*access.refusal, head);
    }
    return FormatResponse(page.handler(rest), head);
  }
  return FormatResponse(
      Text(404, absl::StrCat("no page at ", request.path, "\n")), head);
}

}  // namespace tandem::metrics
