#include "coordinator/rpc/coordinator_server.h"

#include <grpcpp/health_check_service_interface.h>

#include "absl/strings/str_cat.h"

namespace tandem {

absl::StatusOr<std::unique_ptr<CoordinatorServer>> CoordinatorServer::Start(
    const CoordinatorOptions& options) {
  std::unique_ptr<CoordinatorServer> s(new CoordinatorServer());
  absl::StatusOr<std::unique_ptr<CoordinatorMetrics>> metrics =
      CoordinatorMetrics::Create(s->registry_);
  if (!metrics.ok()) return metrics.status();
  s->metrics_ = *std::move(metrics);

  absl::StatusOr<std::unique_ptr<JobStore>> store = JobStore::Open(options.db);
  if (!store.ok()) return store.status();
  s->store_ = *std::move(store);
  s->jobs_ = std::make_unique<JobManager>(s->store_.get());
  if (absl::Status st = s->jobs_->Recover(); !st.ok()) return st;
  s->planning_ = std::make_unique<PlanningManager>(
      s->jobs_.get(), s->store_.get(), s->metrics_.get());
  if (absl::Status st = s->planning_->Recover(); !st.ok()) return st;
  WorkerManager::Options worker_options;
  worker_options.heartbeat_timeout = options.heartbeat_timeout;
  s->workers_ = std::make_unique<WorkerManager>(
      s->jobs_.get(), s->store_.get(), s->planning_.get(), &s->kv_,
      s->metrics_.get(), &s->timelines_, worker_options);
  if (absl::Status st = s->workers_->Recover(); !st.ok()) return st;

  CoordinatorServer* self = s.get();
  s->planning_->SetPublisher(
      [self](const std::string& job_id, const v1::ScheduleUpdate& update) {
        v1::CoordinatorMessage message;
        *message.mutable_schedule() = update;
        self->workers_->Broadcast(job_id, message);
      });
  s->jobs_->SetStateListener(
      [self](const std::string& job_id, v1::JobState state) {
        if (IsTerminal(state)) {
          self->workers_->OnJobEnded(job_id, state);
          self->planning_->Forget(job_id);
        }
        self->UpdateJobGauges();
      });
  s->UpdateJobGauges();

  s->job_service_ = std::make_unique<JobServiceImpl>(
      s->jobs_.get(), s->planning_.get(), &s->timelines_);
  s->worker_service_ =
      std::make_unique<WorkerServiceImpl>(s->workers_.get(), &s->kv_);
  // grpc.health.v1 on the same port: "" and each service are SERVING while
  // the server runs (probes and launchers wait on it; tandem-health).
  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder builder;
  builder.AddListeningPort(options.listen, grpc::InsecureServerCredentials(),
                           &s->port_);
  builder.RegisterService(s->job_service_.get());
  builder.RegisterService(s->worker_service_.get());
  // Profiles of big graphs are large; 64 MiB bounds them.
  builder.SetMaxReceiveMessageSize(64 << 20);
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
  }
  return s;
}

CoordinatorServer::~CoordinatorServer() { Shutdown(); }

void CoordinatorServer::Shutdown() {
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
}

void CoordinatorServer::Wait() {
  if (server_ != nullptr) server_->Wait();
}

void CoordinatorServer::UpdateJobGauges() {
  for (v1::JobState state :
       {v1::JOB_STATE_PENDING, v1::JOB_STATE_RUNNING, v1::JOB_STATE_SUCCEEDED,
        v1::JOB_STATE_FAILED, v1::JOB_STATE_CANCELLED}) {
    metrics_->jobs->WithLabels({std::string(JobStateName(state))})
        .Set(static_cast<double>(jobs_->List({state}, 1000).size()));
  }
}

}  // namespace tandem
