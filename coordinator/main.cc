// tandem-coordinator: the long-running daemon. Parses flags and runs
// CoordinatorServer until SIGINT or SIGTERM.
#include <chrono>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/marshalling.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/flags/command_line.h"
#include "common/flags/flag_checks.h"
#include "coordinator/rpc/coordinator_server.h"

ABSL_FLAG(std::string, listen, "127.0.0.1:50051",
          "gRPC address, HOST:PORT (port 0 picks a free one)");
ABSL_FLAG(std::string, db, "tandem.db",
          "SQLite file: jobs, graphs, schedules and events survive a restart");
ABSL_FLAG(std::string, metrics_listen, "",
          "serve Prometheus /metrics on HOST:PORT (port 0 picks a free one)");
ABSL_FLAG(double, heartbeat_timeout_s, 15,
          "fail a running job whose worker is silent this many seconds");
ABSL_FLAG(std::string, tls_cert, "",
          "serve TLS with this PEM certificate chain (with --tls-key)");
ABSL_FLAG(std::string, tls_key, "", "the PEM private key of --tls-cert");
ABSL_FLAG(std::string, tls_client_ca, "",
          "require workers to present a client certificate from this PEM CA "
          "(mutual TLS; needs --tls-cert)");
ABSL_FLAG(std::string, auth_tokens, "",
          "authenticate: a file of 'TOKEN USER [admin]' lines (re-read on "
          "SIGHUP); jobs belong to their submitter and workers need the "
          "job's join secret");
ABSL_FLAG(int, max_rpc_threads, 2048,
          "server threads for calls in flight (streams and waiting KvGets "
          "hold none); past the cap calls get RESOURCE_EXHAUSTED");
ABSL_FLAG(double, session_hello_timeout_s, 10,
          "end a worker session that sends no hello within this many "
          "seconds");
ABSL_FLAG(int, max_pending_sessions, 4096,
          "worker sessions that may wait for their hello at once; past it a "
          "new one gets RESOURCE_EXHAUSTED");
ABSL_FLAG(int, max_pending_sessions_per_peer, 256,
          "worker sessions one address may have waiting for their hello");
ABSL_FLAG(int, max_streams_per_user, 128,
          "watch streams one user may hold open (everyone is one user "
          "without --auth-tokens)");
ABSL_FLAG(int, max_active_jobs, 10000,
          "jobs not yet ended (PENDING or RUNNING) this coordinator holds; "
          "past it Submit gets RESOURCE_EXHAUSTED");
ABSL_FLAG(int, max_active_jobs_per_user, 1000,
          "jobs not yet ended per user (everyone is one user without "
          "--auth-tokens)");
ABSL_FLAG(int, max_events_per_job, 10000,
          "events kept per job, in memory and in --db; the oldest go first");
ABSL_FLAG(int64_t, max_profile_bytes_per_job, int64_t{256} << 20,
          "bytes of profiles a job may hold awaiting its other ranks");
ABSL_FLAG(int64_t, max_stored_profile_bytes_per_job, int64_t{256} << 20,
          "bytes of window profiles kept per job in --db; the oldest go "
          "first");
ABSL_FLAG(int, max_ended_jobs, 100000,
          "ended jobs kept, in memory and in --db; past it the one that "
          "ended longest ago is deleted with its history");
ABSL_FLAG(int64_t, max_history_rows_per_job, 100000,
          "steps, and rank profile windows, kept per job in --db for its "
          "report; past it the older ones thin out (every second dropped)");
ABSL_FLAG(std::vector<std::string>, data_roots, {},
          "comma-separated absolute directories jobs may read from "
          "(data.path, model.path, model.init_from); empty: anywhere outside "
          "the system's directories");
ABSL_FLAG(std::vector<std::string>, checkpoint_roots, {},
          "comma-separated absolute directories jobs may write checkpoints "
          "under (checkpoint.dir; jobs may read there too); empty: anywhere "
          "outside the system's directories");
ABSL_FLAG(bool, insecure, false,
          "allow a non-loopback --listen/--metrics-listen without TLS and "
          "tokens (a private network you trust)");

namespace {

volatile std::sig_atomic_t g_stop = 0;
volatile std::sig_atomic_t g_reload = 0;

constexpr char kUsage[] =
    "usage: tandem-coordinator [--listen HOST:PORT] [--db FILE] "
    "[--metrics-listen HOST:PORT] [--heartbeat-timeout-s N]\n"
    "         [--tls-cert FILE --tls-key FILE [--tls-client-ca FILE]] "
    "[--auth-tokens FILE] [--insecure]\n"
    "         [--max-rpc-threads N] [--session-hello-timeout-s S]\n"
    "         [--max-pending-sessions N] [--max-pending-sessions-per-peer N]\n"
    "         [--max-streams-per-user N]\n"
    "         [--max-active-jobs N] [--max-active-jobs-per-user N] "
    "[--max-events-per-job N]\n"
    "         [--max-profile-bytes-per-job B] "
    "[--max-stored-profile-bytes-per-job B]\n"
    "         [--data-roots DIR,...] [--checkpoint-roots DIR,...]\n"
    "A --listen or --metrics-listen address other than loopback needs TLS "
    "and --auth-tokens, or --insecure.\n";

absl::Status CheckRoots(const char* flag,
                        const std::vector<std::string>& dirs) {
  for (const std::string& dir : dirs) {
    if (dir.empty() || dir[0] != '/') {
      return absl::InvalidArgumentError(
          absl::StrCat(flag, " takes absolute directories, got '", dir, "'"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

int main(int argc, char** argv) {
  const tandem::CommandLineSpec spec{"tandem-coordinator", kUsage};
  tandem::ParseCommandLineOrExit(spec, argc, argv);
  tandem::CoordinatorOptions options;
  options.listen = absl::GetFlag(FLAGS_listen);
  options.db = absl::GetFlag(FLAGS_db);
  options.metrics_listen = absl::GetFlag(FLAGS_metrics_listen);
  options.tls_cert = absl::GetFlag(FLAGS_tls_cert);
  options.tls_key = absl::GetFlag(FLAGS_tls_key);
  options.tls_client_ca = absl::GetFlag(FLAGS_tls_client_ca);
  options.auth_tokens = absl::GetFlag(FLAGS_auth_tokens);
  options.insecure = absl::GetFlag(FLAGS_insecure);
  options.max_rpc_threads = absl::GetFlag(FLAGS_max_rpc_threads);
  options.max_pending_sessions = absl::GetFlag(FLAGS_max_pending_sessions);
  options.max_pending_sessions_per_peer =
      absl::GetFlag(FLAGS_max_pending_sessions_per_peer);
  options.max_streams_per_user = absl::GetFlag(FLAGS_max_streams_per_user);
  options.job_limits.max_active_jobs = absl::GetFlag(FLAGS_max_active_jobs);
  options.job_limits.max_active_jobs_per_user =
      absl::GetFlag(FLAGS_max_active_jobs_per_user);
  options.job_limits.max_events_per_job =
      absl::GetFlag(FLAGS_max_events_per_job);
  options.job_limits.max_ended_jobs = absl::GetFlag(FLAGS_max_ended_jobs);
  options.job_limits.roots.read = absl::GetFlag(FLAGS_data_roots);
  options.job_limits.roots.write = absl::GetFlag(FLAGS_checkpoint_roots);
  options.max_held_profile_bytes =
      absl::GetFlag(FLAGS_max_profile_bytes_per_job);
  options.max_stored_profile_bytes =
      absl::GetFlag(FLAGS_max_stored_profile_bytes_per_job);
  options.max_history_rows_per_job =
      absl::GetFlag(FLAGS_max_history_rows_per_job);
  const double hello_timeout_s = absl::GetFlag(FLAGS_session_hello_timeout_s);
  const double heartbeat_timeout_s = absl::GetFlag(FLAGS_heartbeat_timeout_s);
  tandem::ExitIfInvalid(
      spec,
      {tandem::CheckHostPort("--listen", options.listen,
                             tandem::PortZero::kAllowed),
       options.metrics_listen.empty()
           ? absl::OkStatus()
           : tandem::CheckHostPort("--metrics-listen", options.metrics_listen,
                                   tandem::PortZero::kAllowed),
       options.db.empty() ? absl::InvalidArgumentError("--db needs a file name")
                          : absl::OkStatus(),
       tandem::CheckPositive("--heartbeat-timeout-s", heartbeat_timeout_s),
       tandem::CheckAtLeast("--max-rpc-threads", options.max_rpc_threads, 8),
       tandem::CheckPositive("--session-hello-timeout-s", hello_timeout_s),
       tandem::CheckAtLeast("--max-pending-sessions",
                            options.max_pending_sessions, 1),
       tandem::CheckAtLeast("--max-pending-sessions-per-peer",
                            options.max_pending_sessions_per_peer, 1),
       tandem::CheckAtLeast("--max-streams-per-user",
                            options.max_streams_per_user, 1),
       tandem::CheckAtLeast("--max-active-jobs",
                            options.job_limits.max_active_jobs, 1),
       tandem::CheckAtLeast("--max-active-jobs-per-user",
                            options.job_limits.max_active_jobs_per_user, 1),
       tandem::CheckAtLeast("--max-events-per-job",
                            options.job_limits.max_events_per_job, 16),
       tandem::CheckAtLeast("--max-ended-jobs",
                            options.job_limits.max_ended_jobs, 1),
       tandem::CheckAtLeast("--max-profile-bytes-per-job",
                            options.max_held_profile_bytes, int64_t{1} << 20),
       tandem::CheckAtLeast("--max-stored-profile-bytes-per-job",
                            options.max_stored_profile_bytes, int64_t{1} << 20),
       tandem::CheckAtLeast("--max-history-rows-per-job",
                            options.max_history_rows_per_job, int64_t{100}),
       CheckRoots("--data-roots", options.job_limits.roots.read),
       CheckRoots("--checkpoint-roots", options.job_limits.roots.write)});
  options.session_hello_timeout =
      std::chrono::milliseconds(static_cast<int64_t>(hello_timeout_s * 1000));
  options.heartbeat_timeout = std::chrono::milliseconds(
      static_cast<int64_t>(heartbeat_timeout_s * 1000));

  auto server = tandem::CoordinatorServer::Start(options);
  if (!server.ok()) {
    std::fprintf(stderr, "tandem-coordinator: %s\n",
                 std::string(server.status().message()).c_str());
    // A refused configuration (a public address unprotected, a bad flag
    // file) is a usage error.
    return server.status().code() == absl::StatusCode::kFailedPrecondition ||
                   server.status().code() == absl::StatusCode::kInvalidArgument
               ? 2
               : 1;
  }
  std::signal(SIGINT, [](int) { g_stop = 1; });
  std::signal(SIGTERM, [](int) { g_stop = 1; });
  std::signal(SIGHUP, [](int) { g_reload = 1; });
  std::printf("tandem-coordinator listening on port %d", (*server)->port());
  if ((*server)->metrics_port() != 0) {
    std::printf(", metrics on port %d", (*server)->metrics_port());
  }
  std::printf(" (db %s%s%s)\n", options.db.c_str(),
              options.tls_cert.empty() ? "" : ", TLS",
              options.auth_tokens.empty() ? "" : ", tokens");
  std::fflush(stdout);
  std::thread waiter([&] { (*server)->Wait(); });
  while (!g_stop) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    if (g_reload) {
      g_reload = 0;
      const absl::Status reloaded = (*server)->ReloadTokens();
      const std::string what =
          reloaded.ok()
              ? std::string("token file re-read")
              : absl::StrCat("kept the old tokens: ", reloaded.message());
      std::fprintf(stderr, "tandem-coordinator: SIGHUP: %s\n", what.c_str());
    }
  }
  (*server)->Stop();
  waiter.join();
  return 0;
}
