// The latest iteration timeline (a Chrome trace of one iteration) each rank
// of a job sent, for `tandem timeline` and the job report. Kept in the
// SQLite store once one is attached (one row per rank, replaced by the
// next), so a finished job's timelines survive a coordinator restart; the
// memory holds the most recent jobs' in front of it. Bounded: at most
// kMaxJobs jobs in memory (the one least recently written is forgotten
// first) and kMaxTraceBytes per trace. Thread-safe. No gRPC.
#ifndef TANDEM_COORDINATOR_SERVICE_TIMELINE_STORE_H_
#define TANDEM_COORDINATOR_SERVICE_TIMELINE_STORE_H_

#include <cstdint>
#include <functional>
#include <list>
#include <map>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "coordinator/store/job_store.h"
#include "tandem/v1/job_service.pb.h"
#include "tandem/v1/worker_service.pb.h"

namespace tandem {

class TimelineStore {
 public:
  static constexpr size_t kMaxTraceBytes = size_t{16} << 20;
  static constexpr size_t kMaxJobs = 64;

  // `now_unix_s` stamps each timeline received (tests pass a fake clock).
  explicit TimelineStore(std::function<double()> now_unix_s = nullptr);
  TimelineStore(const TimelineStore&) = delete;
  TimelineStore& operator=(const TimelineStore&) = delete;

  // Where timelines are kept besides memory (must outlive this); null:
  // memory only. Call before the first Put.
  void AttachStore(JobStore* store) { store_ = store; }

  // Keeps `report` as rank's latest. Errors (InvalidArgument, nothing
  // kept): an empty or oversized trace, one that is not a JSON object, a
  // negative step or rank; the store's (kept in memory all the same).
  absl::Status Put(const std::string& job_id, int32_t rank,
                   const v1::TimelineReport& report);
  // The latest timeline of each of `ranks` (every rank when empty) that
  // sent one, by rank; from the store for a job no longer in memory.
  // NotFound when there is none.
  absl::StatusOr<std::vector<v1::RankTimeline>> Get(
      const std::string& job_id, const std::vector<int32_t>& ranks) const;

 private:
  const std::function<double()> now_unix_s_;
  JobStore* store_ = nullptr;
  mutable absl::Mutex mu_;
  std::map<std::string, std::map<int32_t, v1::RankTimeline>> jobs_
      ABSL_GUARDED_BY(mu_);
  // Job ids, least recently written first.
  std::list<std::string> order_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tandem

#endif  // TANDEM_COORDINATOR_SERVICE_TIMELINE_STORE_H_
