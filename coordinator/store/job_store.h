// Durable state of the coordinator in one SQLite file (WAL): jobs, their
// events, workers, graphs, every schedule version, profile summaries and
// each job's history for its report (steps, ranks' profile windows). A
// restarted coordinator reloads everything from here and loses nothing that
// was acknowledged: every write commits before the RPC that caused it answers.
//
// Rows hold serialized tandem.v1 messages next to the columns queries need.
// Thread-safe: one connection, serialized by a mutex (SQLite writes are
// serialized anyway, and the coordinator writes little: per event, not per
// iteration).
#ifndef TANDEM_COORDINATOR_STORE_JOB_STORE_H_
#define TANDEM_COORDINATOR_STORE_JOB_STORE_H_

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "tandem/v1/graph.pb.h"
#include "tandem/v1/job.pb.h"
#include "tandem/v1/job_service.pb.h"
#include "tandem/v1/profile.pb.h"
#include "tandem/v1/schedule.pb.h"

struct sqlite3;

namespace tandem {

struct StoredSchedule {
  v1::Schedule schedule;
  // Step at which every rank switches to it.
  int64_t effective_step = 0;
};

struct StoredWorker {
  int32_t rank = 0;
  std::string incarnation;
  std::string hostname;
  std::string device;
  // What the worker reported it may use (RegisterRequest); 0: unknown.
  int64_t device_memory_bytes = 0;
};

// One step of a job over all its ranks (coordinator/report/job_history.h):
// rank 0's loss, the slowest rank's time, the largest exposed communication
// and peak.
struct StoredStep {
  int64_t step = 0;
  int64_t schedule_version = 0;
  double loss = 0;
  double iteration_s = 0;
  double exposed_comm_s = 0;
  int64_t peak_bytes = 0;
  // The largest work of any rank (IterationProgress.work); 0: not reported.
  int64_t work = 0;
  // The largest cpu_wait_share of any rank that measured it
  // (IterationProgress.cpu_wait_share); -1: none did.
  double cpu_wait_share = -1;
};

// One rank's profile window in brief (coordinator/report/job_history.h).
// Times are means per iteration over the window.
struct StoredRankWindow {
  int32_t rank = 0;
  int64_t schedule_version = 0;
  int64_t first_iteration = 0;
  int64_t last_iteration = 0;
  double iteration_s = 0;
  // Seconds the collectives ran on the communication stream, and the part
  // of them compute waited for.
  double comm_s = 0;
  double exposed_comm_s = 0;
  int64_t peak_bytes = 0;
};

class JobStore {
 public:
  // Opens (creating if needed) the database at `path`; ":memory:" for tests.
  // A new file is created 0600 (its -wal and -shm follow). An existing file
  // is checked first, opened read-only so that nothing in it changes:
  // SQLite's quick integrity check, and only Tandem's tables.
  // Errors: FailedPrecondition when the file, its -wal or -shm is open to
  // other users (the message says how to fix it); Unavailable when the file
  // cannot be opened, is damaged, or is not a Tandem database of a known
  // schema version (the message names the path).
  static absl::StatusOr<std::unique_ptr<JobStore>> Open(
      const std::string& path);
  ~JobStore();
  JobStore(const JobStore&) = delete;
  JobStore& operator=(const JobStore&) = delete;

  // Inserts or replaces the job row.
  absl::Status PutJob(const v1::Job& job);
  // Every job, oldest first.
  absl::StatusOr<std::vector<v1::Job>> LoadJobs();

  // The coordinator's secret key (32 random bytes, made on first use and
  // kept in the database): join secrets are derived from it
  // (coordinator/service/join_secrets.h), so they survive a restart.
  static constexpr size_t kSecretKeyBytes = 32;
  absl::StatusOr<std::string> SecretKey();

  // The rendezvous store's keys (coordinator/service/kv_store.h), written
  // through, so that a restarted coordinator still has what ranks in the
  // middle of a rendezvous have set.
  absl::Status PutKv(absl::string_view key, absl::string_view value);
  absl::Status DeleteKv(absl::string_view key);
  absl::Status DeleteKvPrefix(absl::string_view prefix);
  absl::StatusOr<std::vector<std::pair<std::string, std::string>>> LoadKv();

  absl::Status AppendEvent(absl::string_view job_id, const v1::JobEvent& event);
  // Drops the job's events with seq < `seq` (retention).
  absl::Status DeleteEventsBefore(absl::string_view job_id, int64_t seq);
  // Events with seq > after_seq, in order, at most `limit`.
  absl::StatusOr<std::vector<v1::JobEvent>> LoadEvents(absl::string_view job_id,
                                                       int64_t after_seq = 0,
                                                       int64_t limit = 100000);

  absl::Status PutGraph(absl::string_view job_id, const v1::Graph& graph);
  absl::StatusOr<std::optional<v1::Graph>> LoadGraph(absl::string_view job_id);
  // The jobs whose graph has structural hash `hash`, in no particular order.
  absl::StatusOr<std::vector<std::string>> JobsWithGraph(
      absl::string_view hash);

  absl::Status PutSchedule(absl::string_view job_id,
                           const v1::Schedule& schedule,
                           int64_t effective_step);
  // Every version of the job's schedules, oldest first.
  absl::StatusOr<std::vector<StoredSchedule>> LoadSchedules(
      absl::string_view job_id);

  absl::Status PutWorker(absl::string_view job_id, const StoredWorker& worker);
  // Forgets a job's workers (a restart: every rank registers again).
  absl::Status DeleteWorkers(absl::string_view job_id);
  // The job's graph (it resumed at another world size: a new one comes).
  absl::Status DeleteGraph(absl::string_view job_id);
  // Everything stored for the job (its row, events, graph, schedules,
  // workers, profiles, steps, timelines and rank windows), in one
  // transaction.
  absl::Status DeleteJob(absl::string_view job_id);
  absl::StatusOr<std::vector<StoredWorker>> LoadWorkers(
      absl::string_view job_id);

  // The aggregated profile a plan was made from (one row per window).
  // Window aggregates a job keeps by default: past it the oldest go.
  static constexpr int64_t kDefaultMaxStoredProfileBytes = int64_t{256} << 20;
  // Stores a window's aggregate, then drops the job's oldest ones until
  // what it keeps takes at most `max_job_bytes` (the newest always stays).
  absl::Status PutProfile(
      absl::string_view job_id, const v1::Profile& profile,
      int64_t max_job_bytes = kDefaultMaxStoredProfileBytes);
  absl::StatusOr<std::vector<v1::Profile>> LoadProfiles(
      absl::string_view job_id);

  // A job's steps, in one transaction (a step stored again replaces it).
  absl::Status PutSteps(absl::string_view job_id,
                        const std::vector<StoredStep>& steps);
  // In step order.
  absl::StatusOr<std::vector<StoredStep>> LoadSteps(absl::string_view job_id);

  // Each rank's latest iteration timeline (`tandem timeline`): one per
  // rank, replaced by the next.
  absl::Status PutTimeline(absl::string_view job_id,
                           const v1::RankTimeline& timeline);
  // By rank.
  absl::StatusOr<std::vector<v1::RankTimeline>> LoadTimelines(
      absl::string_view job_id);

  absl::Status PutRankWindow(absl::string_view job_id,
                             const StoredRankWindow& window);
  // By first iteration, then rank.
  absl::StatusOr<std::vector<StoredRankWindow>> LoadRankWindows(
      absl::string_view job_id);

  // Keeps a job's step history and its rank windows to at most `max_rows`
  // rows each: past it, the newest rows that fit in half of it stay whole
  // and every second step (window, all its ranks) before them is dropped,
  // so the history thins out with age (1 in 2, then 1 in 4, ...). Returns
  // the rows dropped.
  absl::StatusOr<int64_t> ThinHistory(absl::string_view job_id,
                                      int64_t max_rows);

 private:
  explicit JobStore(sqlite3* db) : db_(db) {}
  absl::Status Exec(const char* sql);
  // ThinHistory for one table, whose rows are grouped by `key` (a column).
  // Requires mu_.
  absl::StatusOr<int64_t> ThinTableLocked(const char* table, const char* key,
                                          absl::string_view job_id,
                                          int64_t max_rows);

  std::mutex mu_;
  sqlite3* db_;
};

}  // namespace tandem

#endif  // TANDEM_COORDINATOR_STORE_JOB_STORE_H_
