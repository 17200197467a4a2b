#include "coordinator/rpc/job_service_impl.h"

#include <chrono>

#include "absl/strings/str_cat.h"
#include "common/ir/explanation.h"
#include "common/ir/proto_convert.h"
#include "common/ir/text_format.h"
#include "coordinator/rpc/status_util.h"

namespace tandem {
namespace {

grpc::Status CheckJobId(const std::string& id) {
  if (id.empty() || id.size() > 256) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        "job_id must be 1..256 characters; `tandem list` "
                        "shows the ids");
  }
  return grpc::Status::OK;
}

}  // namespace

grpc::Status JobServiceImpl::Authorize(const grpc::ServerContextBase& context,
                                       const std::string& job_id, v1::Job* job,
                                       Principal* caller) {
  if (grpc::Status s = CheckJobId(job_id); !s.ok()) return s;
  Principal who;
  if (grpc::Status s = auth_->Authenticate(context, &who); !s.ok()) {
    return s;
  }
  absl::StatusOr<v1::Job> found = jobs_->Get(job_id);
  if (!found.ok()) return ToGrpc(found.status());
  if (grpc::Status s = auth_->MayAccess(who, *found); !s.ok()) return s;
  if (job != nullptr) *job = *std::move(found);
  if (caller != nullptr) *caller = std::move(who);
  return grpc::Status::OK;
}

grpc::Status JobServiceImpl::Submit(grpc::ServerContext* context,
                                    const v1::SubmitJobRequest* request,
                                    v1::SubmitJobResponse* response) {
  Principal caller;
  if (grpc::Status s = auth_->Authenticate(*context, &caller); !s.ok()) {
    return s;
  }
  absl::StatusOr<v1::Job> job = jobs_->Submit(request->spec(), caller.user);
  if (!job.ok()) return ToGrpc(job.status());
  response->set_join_secret(auth_->join_secrets().For(job->id()));
  *response->mutable_job() = *std::move(job);
  return grpc::Status::OK;
}

grpc::Status JobServiceImpl::Get(grpc::ServerContext* context,
                                 const v1::GetJobRequest* request,
                                 v1::GetJobResponse* response) {
  v1::Job job;
  if (grpc::Status s = Authorize(*context, request->job_id(), &job); !s.ok()) {
    return s;
  }
  absl::StatusOr<std::vector<v1::JobEvent>> events =
      jobs_->Events(request->job_id(), 0);
  if (!events.ok()) return ToGrpc(events.status());
  absl::StatusOr<std::vector<v1::WorkerStatus>> workers =
      workers_->Describe(request->job_id());
  if (!workers.ok()) return ToGrpc(workers.status());
  response->set_join_secret(auth_->join_secrets().For(job.id()));
  *response->mutable_job() = std::move(job);
  for (v1::JobEvent& e : *events) *response->add_events() = std::move(e);
  for (v1::WorkerStatus& w : *workers) *response->add_workers() = std::move(w);
  return grpc::Status::OK;
}

grpc::Status JobServiceImpl::List(grpc::ServerContext* context,
                                  const v1::ListJobsRequest* request,
                                  v1::ListJobsResponse* response) {
  Principal caller;
  if (grpc::Status s = auth_->Authenticate(*context, &caller); !s.ok()) {
    return s;
  }
  std::vector<v1::JobState> states;
  for (int s : request->states())
    states.push_back(static_cast<v1::JobState>(s));
  for (v1::Job& job :
       jobs_->List(states, request->limit(), auth_->ListFilter(caller))) {
    *response->add_jobs() = std::move(job);
  }
  return grpc::Status::OK;
}

grpc::Status JobServiceImpl::Cancel(grpc::ServerContext* context,
                                    const v1::CancelJobRequest* request,
                                    v1::CancelJobResponse* response) {
  if (grpc::Status s = Authorize(*context, request->job_id()); !s.ok()) {
    return s;
  }
  const std::string reason = request->reason().empty()
                                 ? "cancelled by the user"
                                 : request->reason().substr(0, 1024);
  if (absl::Status s =
          jobs_->Transition(request->job_id(), v1::JOB_STATE_CANCELLED, reason);
      !s.ok()) {
    return ToGrpc(s);
  }
  absl::StatusOr<v1::Job> job = jobs_->Get(request->job_id());
  if (!job.ok()) return ToGrpc(job.status());
  *response->mutable_job() = *std::move(job);
  return grpc::Status::OK;
}

grpc::Status JobServiceImpl::Reoptimize(grpc::ServerContext* context,
                                        const v1::ReoptimizeRequest* request,
                                        v1::ReoptimizeResponse* response) {
  if (grpc::Status s = Authorize(*context, request->job_id()); !s.ok()) {
    return s;
  }
  absl::StatusOr<int64_t> version =
      planning_->RequestReplan(request->job_id(), "reoptimize");
  if (!version.ok()) return ToGrpc(version.status());
  if (!request->reason().empty()) {
    (void)jobs_->RecordEvent(request->job_id(), "replan",
                             absl::StrCat("re-optimize requested: ",
                                          request->reason().substr(0, 1024)));
  }
  response->set_next_version(*version);
  return grpc::Status::OK;
}

grpc::ServerWriteReactor<v1::WatchJobResponse>* JobServiceImpl::Watch(
    grpc::CallbackServerContext* context, const v1::WatchJobRequest* request) {
  v1::Job known;
  Principal caller;
  if (grpc::Status s = Authorize(*context, request->job_id(), &known, &caller);
      !s.ok()) {
    return WatchHub::Refuse(s);
  }
  return watches_.Open(context, *request, caller, std::move(known));
}

grpc::Status JobServiceImpl::GetSchedule(grpc::ServerContext* context,
                                         const v1::GetScheduleRequest* request,
                                         v1::GetScheduleResponse* response) {
  if (grpc::Status s = Authorize(*context, request->job_id()); !s.ok()) {
    return s;
  }
  absl::StatusOr<StoredSchedule> stored =
      request->has_version()
          ? planning_->GetScheduleVersion(request->job_id(), request->version())
          : planning_->GetSchedule(request->job_id(), 0);
  if (!stored.ok()) return ToGrpc(stored.status());
  absl::StatusOr<Schedule> ir = FromProto(stored->schedule);
  if (!ir.ok()) return ToGrpc(ir.status());
  *response->mutable_schedule() = stored->schedule;
  // Params and nodes by their model names, when the graph is at hand and is
  // the one the schedule was planned for (a schedule of a graph the job ran
  // before a resize keeps its ids alone).
  absl::StatusOr<Graph> graph = planning_->JobGraph(request->job_id());
  const bool named = graph.ok() && graph->StructuralHash() == ir->graph_hash;
  response->set_text(PrintSchedule(*ir, named ? &*graph : nullptr));
  response->set_explanation(FormatExplanation(ir->explanation,
                                              ir->prediction.iteration_s,
                                              ir->prediction.exposed_comm_s));
  return grpc::Status::OK;
}

grpc::Status JobServiceImpl::GetTimeline(grpc::ServerContext* context,
                                         const v1::GetTimelineRequest* request,
                                         v1::GetTimelineResponse* response) {
  if (grpc::Status s = Authorize(*context, request->job_id()); !s.ok()) {
    return s;
  }
  if (request->ranks_size() > 4096) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        "ask for at most 4096 ranks, or none for all");
  }
  absl::StatusOr<std::vector<v1::RankTimeline>> timelines = timelines_->Get(
      request->job_id(), {request->ranks().begin(), request->ranks().end()});
  if (!timelines.ok()) return ToGrpc(timelines.status());
  for (v1::RankTimeline& t : *timelines) {
    *response->add_timelines() = std::move(t);
  }
  return grpc::Status::OK;
}

grpc::Status JobServiceImpl::GetReport(grpc::ServerContext* context,
                                       const v1::GetReportRequest* request,
                                       v1::GetReportResponse* response) {
  if (grpc::Status s = Authorize(*context, request->job_id()); !s.ok()) {
    return s;
  }
  absl::StatusOr<std::string> html = reports_->RenderHtml(request->job_id());
  if (!html.ok()) return ToGrpc(html.status());
  response->set_html(*std::move(html));
  return grpc::Status::OK;
}

}  // namespace tandem
