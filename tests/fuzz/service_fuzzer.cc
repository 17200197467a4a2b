// Every JobService and WorkerService request through the coordinator's
// service layer (coordinator/rpc/*_service_impl.h and the managers behind
// them, on a real SQLite file), as a hostile client would send them: the
// first byte picks the call, the rest is the request's protobuf encoding.
// A request that names no job is aimed at the newest job submitted, so that
// fuzzed calls reach real jobs, ranks and sessions. Nothing may crash,
// hang or leak; every refusal is a status. Watch and Session streams are
// driven through the managers they map onto (a stream object cannot be made
// outside a server).
#include <google/protobuf/stubs/logging.h>
#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <type_traits>

#include "coordinator/report/job_history.h"
#include "coordinator/report/job_report_builder.h"
#include "coordinator/rpc/job_service_impl.h"
#include "coordinator/rpc/rpc_auth.h"
#include "coordinator/rpc/worker_service_impl.h"
#include "coordinator/service/job_manager.h"
#include "coordinator/service/kv_store.h"
#include "coordinator/service/planning_manager.h"
#include "coordinator/service/timeline_store.h"
#include "coordinator/service/worker_manager.h"
#include "coordinator/store/job_store.h"

namespace tandem {
namespace {

class NullSink : public SessionSink {
 public:
  bool Send(const v1::CoordinatorMessage&) override { return true; }
};

struct Coordinator {
  Coordinator() {
    // Invalid UTF-8 in string fields is refused by the parser, which also
    // logs it once per input: noise here.
    google::protobuf::SetLogHandler(nullptr);
    const std::string db =
        (std::filesystem::temp_directory_path() /
         ("tandem-service-fuzz-" + std::to_string(getpid()) + ".db"))
            .string();
    std::filesystem::remove(db);
    store = *JobStore::Open(db);
    timelines.AttachStore(store.get());
    (void)kv.AttachStore(store.get());
    jobs = std::make_unique<JobManager>(store.get());
    history = std::make_unique<JobHistory>(jobs.get(), store.get());
    reports = std::make_unique<JobReportBuilder>(jobs.get(), store.get(),
                                                 history.get(), &timelines);
    WorkerManager::Options options;
    options.heartbeat_timeout = std::chrono::hours(1);
    workers = std::make_unique<WorkerManager>(jobs.get(), store.get(), &kv,
                                              nullptr, &timelines, options);
    planning =
        std::make_unique<PlanningManager>(jobs.get(), store.get(), nullptr);
    auth = std::make_unique<RpcAuth>(nullptr, JoinSecrets(std::string(32, 'k')),
                                     false);
    job_service = std::make_unique<JobServiceImpl>(jobs.get(), planning.get(),
                                                   workers.get(), &timelines,
                                                   reports.get(), auth.get());
    worker_service = std::make_unique<WorkerServiceImpl>(
        workers.get(), &kv, auth.get(), WorkerServiceImpl::SessionLimits{});
  }

  std::unique_ptr<JobStore> store;
  KvStore kv;
  TimelineStore timelines;
  std::unique_ptr<JobManager> jobs;
  std::unique_ptr<JobHistory> history;
  std::unique_ptr<JobReportBuilder> reports;
  std::unique_ptr<WorkerManager> workers;
  std::unique_ptr<PlanningManager> planning;
  std::unique_ptr<RpcAuth> auth;
  std::unique_ptr<JobServiceImpl> job_service;
  std::unique_ptr<WorkerServiceImpl> worker_service;
  std::string last_job;
  int64_t session = -1;
};

Coordinator& C() {
  static Coordinator* c = new Coordinator();
  return *c;
}

// Parses the request and calls `method` on `service` with a fresh context.
// `aim`: a request that names no job is aimed at the newest one.
template <typename Request, typename Response, typename Service,
          typename Method>
bool Unary(Service* service, Method method, const uint8_t* data, size_t size,
           bool aim, Response* response = nullptr) {
  Request request;
  if (!request.ParseFromArray(data, static_cast<int>(size))) return false;
  if constexpr (std::is_same_v<Request, v1::KvGetRequest>) {
    request.set_timeout_ms(0);  // a wait is a timeout, not a finding
  } else if constexpr (std::is_same_v<Request, v1::RegisterRequest> ||
                       std::is_same_v<Request, v1::GetJobRequest> ||
                       std::is_same_v<Request, v1::CancelJobRequest> ||
                       std::is_same_v<Request, v1::ReoptimizeRequest> ||
                       std::is_same_v<Request, v1::GetScheduleRequest> ||
                       std::is_same_v<Request, v1::GetTimelineRequest> ||
                       std::is_same_v<Request, v1::GetReportRequest>) {
    if (aim && request.job_id().empty()) request.set_job_id(C().last_job);
  }
  Response local;
  Response* out = response != nullptr ? response : &local;
  grpc::ServerContext context;
  return (service->*method)(&context, &request, out).ok();
}

}  // namespace
}  // namespace tandem

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tandem;
  if (size == 0) return 0;
  Coordinator& c = C();
  const uint8_t op = data[0];
  ++data;
  --size;
  JobServiceImpl* jobs = c.job_service.get();
  WorkerServiceImpl* workers = c.worker_service.get();
  switch (op % 17) {
    case 0: {
      v1::SubmitJobResponse submitted;
      if (Unary<v1::SubmitJobRequest>(jobs, &JobServiceImpl::Submit, data, size,
                                      false, &submitted)) {
        c.last_job = submitted.job().id();
        c.session = -1;
      }
      break;
    }
    case 1:
      Unary<v1::GetJobRequest, v1::GetJobResponse>(jobs, &JobServiceImpl::Get,
                                                   data, size, true);
      break;
    case 2:
      Unary<v1::ListJobsRequest, v1::ListJobsResponse>(
          jobs, &JobServiceImpl::List, data, size, false);
      break;
    case 3:
      Unary<v1::CancelJobRequest, v1::CancelJobResponse>(
          jobs, &JobServiceImpl::Cancel, data, size, true);
      break;
    case 4:
      Unary<v1::ReoptimizeRequest, v1::ReoptimizeResponse>(
          jobs, &JobServiceImpl::Reoptimize, data, size, true);
      break;
    case 5:
      Unary<v1::GetScheduleRequest, v1::GetScheduleResponse>(
          jobs, &JobServiceImpl::GetSchedule, data, size, true);
      break;
    case 6:
      Unary<v1::GetTimelineRequest, v1::GetTimelineResponse>(
          jobs, &JobServiceImpl::GetTimeline, data, size, true);
      break;
    case 7:
      Unary<v1::GetReportRequest, v1::GetReportResponse>(
          jobs, &JobServiceImpl::GetReport, data, size, true);
      break;
    case 8: {
      // A worker registers, then opens a session: later inputs talk on it.
      v1::RegisterResponse registered;
      if (!Unary<v1::RegisterRequest>(workers, &WorkerServiceImpl::Register,
                                      data, size, true, &registered)) {
        return 0;
      }
      v1::SessionHello hello;
      hello.set_job_id(c.last_job);
      hello.set_rank(registered.rank());
      hello.set_incarnation(registered.incarnation());
      absl::StatusOr<int64_t> s =
          c.workers->OpenSession(hello, std::make_shared<NullSink>());
      if (s.ok()) c.session = *s;
      break;
    }
    case 9:
      Unary<v1::KvSetRequest, v1::KvSetResponse>(
          workers, &WorkerServiceImpl::KvSet, data, size, false);
      break;
    case 10:
      Unary<v1::KvGetRequest, v1::KvGetResponse>(
          workers, &WorkerServiceImpl::KvGetNow, data, size, false);
      break;
    case 11:
      Unary<v1::KvAddRequest, v1::KvAddResponse>(
          workers, &WorkerServiceImpl::KvAdd, data, size, false);
      break;
    case 12:
      Unary<v1::KvCompareSetRequest, v1::KvCompareSetResponse>(
          workers, &WorkerServiceImpl::KvCompareSet, data, size, false);
      break;
    case 13:
      Unary<v1::KvCheckRequest, v1::KvCheckResponse>(
          workers, &WorkerServiceImpl::KvCheck, data, size, false);
      break;
    case 14:
      Unary<v1::KvDeleteRequest, v1::KvDeleteResponse>(
          workers, &WorkerServiceImpl::KvDelete, data, size, false);
      break;
    case 15:
      Unary<v1::KvNumKeysRequest, v1::KvNumKeysResponse>(
          workers, &WorkerServiceImpl::KvNumKeys, data, size, false);
      break;
    default: {
      // A message on the open session: graph, profile, progress, errors...
      v1::WorkerMessage message;
      if (c.session < 0 ||
          !message.ParseFromArray(data, static_cast<int>(size))) {
        return 0;
      }
      (void)c.workers->OnMessage(c.session, message);
      break;
    }
  }
  return 0;
}
