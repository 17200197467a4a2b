// JobService over gRPC: maps each RPC onto the job and planning managers.
// Handlers validate request sizes; everything else is the managers' logic.
// Watch uses the callback API (WatchHub: no thread per stream); the other
// calls answer at once on the server's bounded pool.
#ifndef TANDEM_COORDINATOR_RPC_JOB_SERVICE_IMPL_H_
#define TANDEM_COORDINATOR_RPC_JOB_SERVICE_IMPL_H_

#include "coordinator/report/job_report_builder.h"
#include "coordinator/rpc/rpc_auth.h"
#include "coordinator/rpc/watch_hub.h"
#include "coordinator/service/job_manager.h"
#include "coordinator/service/planning_manager.h"
#include "coordinator/service/timeline_store.h"
#include "coordinator/service/worker_manager.h"
#include "tandem/v1/job_service.grpc.pb.h"

namespace tandem {

class JobServiceImpl final
    : public v1::JobService::WithCallbackMethod_Watch<v1::JobService::Service> {
 public:
  JobServiceImpl(JobManager* jobs, PlanningManager* planning,
                 WorkerManager* workers, const TimelineStore* timelines,
                 const JobReportBuilder* reports, const RpcAuth* auth,
                 WatchHub::Limits watch_limits = {})
      : jobs_(jobs),
        planning_(planning),
        workers_(workers),
        timelines_(timelines),
        reports_(reports),
        auth_(auth),
        watches_(jobs, auth, watch_limits) {}

  // Watch streams open now.
  int64_t watches() const { return watches_.streams(); }

  grpc::Status Submit(grpc::ServerContext* context,
                      const v1::SubmitJobRequest* request,
                      v1::SubmitJobResponse* response) override;
  grpc::Status Get(grpc::ServerContext* context,
                   const v1::GetJobRequest* request,
                   v1::GetJobResponse* response) override;
  grpc::Status List(grpc::ServerContext* context,
                    const v1::ListJobsRequest* request,
                    v1::ListJobsResponse* response) override;
  grpc::Status Cancel(grpc::ServerContext* context,
                      const v1::CancelJobRequest* request,
                      v1::CancelJobResponse* response) override;
  grpc::Status Reoptimize(grpc::ServerContext* context,
                          const v1::ReoptimizeRequest* request,
                          v1::ReoptimizeResponse* response) override;
  // Streams the job and every event (replaying those after after_seq) until
  // the job ends or the client hangs up.
  grpc::ServerWriteReactor<v1::WatchJobResponse>* Watch(
      grpc::CallbackServerContext* context,
      const v1::WatchJobRequest* request) override;
  grpc::Status GetSchedule(grpc::ServerContext* context,
                           const v1::GetScheduleRequest* request,
                           v1::GetScheduleResponse* response) override;
  grpc::Status GetTimeline(grpc::ServerContext* context,
                           const v1::GetTimelineRequest* request,
                           v1::GetTimelineResponse* response) override;
  grpc::Status GetReport(grpc::ServerContext* context,
                         const v1::GetReportRequest* request,
                         v1::GetReportResponse* response) override;

 private:
  // The calls on one job: a well-formed id, an authenticated caller who may
  // access the job, which exists. Fills `job` and `caller` when given.
  grpc::Status Authorize(const grpc::ServerContextBase& context,
                         const std::string& job_id, v1::Job* job = nullptr,
                         Principal* caller = nullptr);

  JobManager* jobs_;
  PlanningManager* planning_;
  WorkerManager* workers_;
  const TimelineStore* timelines_;
  const JobReportBuilder* reports_;
  const RpcAuth* auth_;
  // Declared last: its thread reaches the members above.
  WatchHub watches_;
};

}  // namespace tandem

#endif  // TANDEM_COORDINATOR_RPC_JOB_SERVICE_IMPL_H_
