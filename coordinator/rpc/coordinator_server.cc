#include "coordinator/rpc/coordinator_server.h"

#include <grpcpp/health_check_service_interface.h>

#include <algorithm>
#include <atomic>
#include <map>
#include <memory>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "common/security/grpc_credentials.h"
#include "common/security/listen_policy.h"

namespace tandem {
namespace {

// The metrics port under authentication: /metrics for any known token,
// showing an admin every series and anyone else only the series of their
// own jobs (and those of no job); a job's report (/jobs/<id>) for its owner
// or an admin; anyone else gets the page of a job that does not exist.
metrics::HttpExporter::Access GateHttp(const RpcAuth& auth,
                                       const JobManager& jobs,
                                       absl::string_view authorization,
                                       absl::string_view path) {
  metrics::HttpExporter::Access access;
  Principal caller;
  grpc::Status s = auth.Authenticate(
      authorization.empty() ? std::nullopt
                            : std::optional<absl::string_view>(authorization),
      &caller);
  if (!s.ok()) {
    access.refusal =
        metrics::HttpExporter::Page{401, "text/plain; charset=utf-8",
                                    absl::StrCat(s.error_message(), "\n")};
    return access;
  }
  absl::string_view rest = path;
  if (absl::ConsumePrefix(&rest, "/jobs/")) {
    const absl::string_view id = rest.substr(0, rest.find('/'));
    if (absl::StatusOr<v1::Job> job = jobs.Get(id); job.ok()) {
      if (grpc::Status denied = auth.MayAccess(caller, *job); !denied.ok()) {
        // The page a job that does not exist gets: a stranger cannot tell.
        access.refusal = JobReportBuilder::ErrorPage(404, NoSuchJob(id));
      }
    }
    return access;
  }
  if (auth.ListFilter(caller).has_value()) {
    // A job's series carry its id as "job": kept when the caller owns it.
    // The filter runs during this scrape only; owners are looked up once.
    auto owned = std::make_shared<std::map<std::string, bool>>();
    access.series = [&jobs, owned, user = caller.user](
                        const std::vector<std::string>& names,
                        const metrics::LabelValues& values) {
      for (size_t i = 0; i < names.size(); ++i) {
        if (names[i] != "job") continue;
        auto [it, fresh] = owned->emplace(values[i], false);
        if (fresh) {
          absl::StatusOr<v1::Job> job = jobs.Get(values[i]);
          it->second = job.ok() && job->owner() == user;
        }
        return it->second;
      }
      return true;
    };
  }
  return access;
}

}  // namespace

absl::StatusOr<std::unique_ptr<CoordinatorServer>> CoordinatorServer::Start(
    const CoordinatorOptions& options) {
  // Refused before anything is opened: a public address needs TLS and
  // tokens, or --insecure.
  const ListenProtection protection{!options.tls_cert.empty(),
                                    !options.auth_tokens.empty(),
                                    options.insecure};
  if (absl::Status st = CheckListen("--listen", options.listen, protection);
      !st.ok()) {
    return st;
  }
  // The metrics port speaks plain HTTP (tokens, when on, but no TLS):
  // public only with --insecure.
  if (!options.metrics_listen.empty()) {
    if (absl::Status st = CheckListen(
            "--metrics-listen", options.metrics_listen,
            {false, !options.auth_tokens.empty(), options.insecure});
        !st.ok()) {
      return st;
    }
  }
  absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> credentials =
      MakeServerCredentials(
          {options.tls_cert, options.tls_key, options.tls_client_ca});
  if (!credentials.ok()) return credentials.status();
  std::unique_ptr<TokenFile> tokens;
  if (!options.auth_tokens.empty()) {
    absl::StatusOr<std::unique_ptr<TokenFile>> file =
        TokenFile::Open(options.auth_tokens);
    if (!file.ok()) {
      return absl::Status(
          file.status().code(),
          absl::StrCat("--auth-tokens: ", file.status().message()));
    }
    tokens = *std::move(file);
  }

  std::unique_ptr<CoordinatorServer> s(new CoordinatorServer());
  absl::StatusOr<std::unique_ptr<CoordinatorMetrics>> metrics =
      CoordinatorMetrics::Create(s->registry_);
  if (!metrics.ok()) return metrics.status();
  s->metrics_ = *std::move(metrics);

  absl::StatusOr<std::unique_ptr<JobStore>> store = JobStore::Open(options.db);
  if (!store.ok()) return store.status();
  s->store_ = *std::move(store);
  s->timelines_.AttachStore(s->store_.get());
  if (absl::Status st = s->kv_.AttachStore(s->store_.get()); !st.ok()) {
    return st;
  }
  s->jobs_ = std::make_unique<JobManager>(s->store_.get(), options.job_limits);
  if (absl::Status st = s->jobs_->Recover(); !st.ok()) return st;
  s->history_ =
      std::make_unique<JobHistory>(s->jobs_.get(), s->store_.get(), nullptr,
                                   options.max_history_rows_per_job);
  s->reports_ = std::make_unique<JobReportBuilder>(
      s->jobs_.get(), s->store_.get(), s->history_.get(), &s->timelines_);
  WorkerManager::Options worker_options;
  worker_options.heartbeat_timeout = options.heartbeat_timeout;
  s->workers_ = std::make_unique<WorkerManager>(s->jobs_.get(), s->store_.get(),
                                                &s->kv_, s->metrics_.get(),
                                                &s->timelines_, worker_options);
  if (absl::Status st = s->workers_->Recover(); !st.ok()) return st;
  s->planning_ = std::make_unique<PlanningManager>(
      s->jobs_.get(), s->store_.get(), s->metrics_.get());
  s->planning_->SetProfileQuotas(options.max_held_profile_bytes,
                                 options.max_stored_profile_bytes);
  if (absl::Status st = s->planning_->Recover(); !st.ok()) return st;

  // The managers report to each other only through these hooks; each
  // captures just what it reaches.
  CoordinatorServer* self = s.get();
  WorkerManager* workers = s->workers_.get();
  PlanningManager* planning = s->planning_.get();
  JobHistory* history = s->history_.get();
  // Planning first: the history keeps only the profiles planning accepted.
  workers->AddListener(planning);
  workers->AddListener(history);
  workers->SetScheduleLookup([planning](const std::string& job_id) {
    return planning->LatestUpdate(job_id);
  });
  planning->SetPublisher(
      [workers](const std::string& job_id, const v1::ScheduleUpdate& update) {
        v1::CoordinatorMessage message;
        *message.mutable_schedule() = update;
        workers->Broadcast(job_id, message);
      });
  s->jobs_->SetStateListener(
      [self, workers, history](const std::string& job_id, v1::JobState state) {
        if (IsTerminal(state)) {
          workers->OnJobEnded(job_id, state);
          history->OnJobEnded(job_id);
        }
        self->UpdateJobGauges();
      });
  s->UpdateJobGauges();

  absl::StatusOr<std::string> secret_key = s->store_->SecretKey();
  if (!secret_key.ok()) return secret_key.status();
  s->auth_ = std::make_unique<RpcAuth>(std::move(tokens),
                                       JoinSecrets(*std::move(secret_key)),
                                       !options.tls_client_ca.empty());
  WatchHub::Limits watch_limits;
  watch_limits.max_streams_per_user = options.max_streams_per_user;
  s->job_service_ = std::make_unique<JobServiceImpl>(
      s->jobs_.get(), s->planning_.get(), s->workers_.get(), &s->timelines_,
      s->reports_.get(), s->auth_.get(), watch_limits);
  // Workers heartbeat every second; a session silent for twice the
  // heartbeat timeout (at least 30 s) belongs to a worker already failed.
  WorkerServiceImpl::SessionLimits session_limits;
  session_limits.hello_timeout = options.session_hello_timeout;
  session_limits.max_pending = options.max_pending_sessions;
  session_limits.max_pending_per_peer = options.max_pending_sessions_per_peer;
  session_limits.idle_timeout =
      std::max(std::chrono::milliseconds(30000), 2 * options.heartbeat_timeout);
  s->worker_service_ = std::make_unique<WorkerServiceImpl>(
      s->workers_.get(), &s->kv_, s->auth_.get(), session_limits);
  // grpc.health.v1 on the same port: "" and each service are SERVING while
  // the server runs (probes and launchers wait on it; tandem-health).
  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder builder;
  builder.AddListeningPort(options.listen, *credentials, &s->port_);
  builder.RegisterService(s->job_service_.get());
  builder.RegisterService(s->worker_service_.get());
  // Profiles of big graphs are large; 64 MiB bounds them.
  builder.SetMaxReceiveMessageSize(64 << 20);
  // A bounded pool for the unary calls; the streams and KvGet are callback
  // handlers and hold no thread while they wait.
  grpc::ResourceQuota quota("tandem-coordinator");
  quota.SetMaxThreads(options.max_rpc_threads);
  builder.SetResourceQuota(quota);
  // A second coordinator on the same port must fail, not share it.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  s->server_ = builder.BuildAndStart();
  if (s->server_ == nullptr || s->port_ == 0) {
    return absl::UnavailableError(absl::StrCat(
        "cannot listen on ", options.listen,
        ": the address is malformed or the port is in use; change --listen"));
  }
  if (grpc::HealthCheckServiceInterface* health =
          s->server_->GetHealthCheckService()) {
    health->SetServingStatus(true);
    health->SetServingStatus(v1::JobService::service_full_name(), true);
    health->SetServingStatus(v1::WorkerService::service_full_name(), true);
  }
  if (!options.metrics_listen.empty()) {
    absl::StatusOr<std::unique_ptr<metrics::HttpExporter>> exporter =
        metrics::HttpExporter::Start(options.metrics_listen, &s->registry_);
    if (!exporter.ok()) {
      return absl::Status(
          exporter.status().code(),
          absl::StrCat("--metrics-listen: ", exporter.status().message()));
    }
    s->exporter_ = *std::move(exporter);
    s->metrics_port_ = s->exporter_->port();
    // The job reports beside the metrics: GET /jobs/<id>.
    s->exporter_->AddPage("/jobs",
                          [reports = s->reports_.get()](absl::string_view p) {
                            return reports->ServePage(p);
                          });
    if (s->auth_->enabled()) {
      s->exporter_->SetGate(
          [auth = s->auth_.get(), jobs = s->jobs_.get()](
              absl::string_view authorization, absl::string_view path) {
            return GateHttp(*auth, *jobs, authorization, path);
          });
    }
    // Gauges read at each scrape, on the exporter's handler threads (which
    // its destructor joins, so the pointers outlive every call).
    s->registry_.AddCollectHook(
        [metrics = s->metrics_.get(), jobs = s->job_service_.get(),
         workers = s->worker_service_.get(), kv = &s->kv_,
         http = s->exporter_.get(),
         refused = std::make_shared<std::atomic<int64_t>>(0)] {
          const int64_t open = workers->sessions_open();
          const int64_t pending = workers->sessions_pending();
          metrics->open_streams->WithLabels({"session"})
              .Set(static_cast<double>(open - pending));
          metrics->open_streams->WithLabels({"pending_session"})
              .Set(static_cast<double>(pending));
          metrics->open_streams->WithLabels({"watch"}).Set(
              static_cast<double>(jobs->watches()));
          metrics->waiting_kv_gets->WithLabels({}).Set(
              static_cast<double>(kv->waiters()));
          const metrics::HttpExporter::Stats stats = http->stats();
          metrics->http_connections->WithLabels({}).Set(
              static_cast<double>(stats.open));
          // Counted once however many scrapes run at once.
          int64_t seen = refused->load();
          while (stats.refused > seen &&
                 !refused->compare_exchange_weak(seen, stats.refused)) {
          }
          if (stats.refused > seen) {
            metrics->http_refused->WithLabels({}).Increment(
                static_cast<double>(stats.refused - seen));
          }
        });
  }
  return s;
}

CoordinatorServer::~CoordinatorServer() { Stop(); }

void CoordinatorServer::Stop() {
  std::call_once(stopped_, [this] {
    if (server_ != nullptr) {
      // NOT_SERVING from now on, so that probes see the stop before the port
      // closes.
      if (grpc::HealthCheckServiceInterface* health =
              server_->GetHealthCheckService()) {
        health->Shutdown();
      }
      server_->Shutdown(std::chrono::system_clock::now() +
                        std::chrono::seconds(2));
    }
    if (planning_ != nullptr) planning_->Stop();
    if (workers_ != nullptr) workers_->Stop();
    exporter_.reset();
  });
}

absl::Status CoordinatorServer::ReloadTokens() {
  if (auth_ == nullptr) return absl::OkStatus();
  return auth_->Reload();
}

void CoordinatorServer::Wait() {
  if (server_ != nullptr) server_->Wait();
}

void CoordinatorServer::UpdateJobGauges() {
  const absl::flat_hash_map<v1::JobState, int64_t> counts =
      jobs_->CountByState();
  for (v1::JobState state :
       {v1::JOB_STATE_PENDING, v1::JOB_STATE_RUNNING, v1::JOB_STATE_SUCCEEDED,
        v1::JOB_STATE_FAILED, v1::JOB_STATE_CANCELLED}) {
    metrics_->jobs->WithLabels({std::string(JobStateName(state))})
        .Set(
            static_cast<double>(counts.contains(state) ? counts.at(state) : 0));
  }
}

}  // namespace tandem
