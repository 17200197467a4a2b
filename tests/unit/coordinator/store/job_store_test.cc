#include "coordinator/store/job_store.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sqlite3.h>
#include <sys/stat.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <limits>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/ir/proto_convert.h"
#include "common/models/graph_builder.h"
#include "common/models/model_config.h"
#include "coordinator/planner/planner.h"

namespace tandem {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

std::string TempDb(const char* name) {
  const std::string path = ::testing::TempDir() + "/" + name;
  std::remove(path.c_str());
  std::remove((path + "-wal").c_str());
  std::remove((path + "-shm").c_str());
  return path;
}

v1::Job MakeJob(const std::string& id, double submitted) {
  v1::Job job;
  job.set_id(id);
  job.set_submitted_unix_s(submitted);
  job.set_state(v1::JOB_STATE_RUNNING);
  job.mutable_spec()->set_name("tiny");
  job.set_step(7);
  return job;
}

TEST(JobStoreTest, Reopen_SameFile_KeepsEverything) {
  const std::string path = TempDb("reopen.db");
  {
    auto store = JobStore::Open(path);
    ASSERT_TRUE(store.ok()) << store.status();
    ASSERT_TRUE((*store)->PutJob(MakeJob("b", 2)).ok());
    ASSERT_TRUE((*store)->PutJob(MakeJob("a", 1)).ok());
    v1::JobEvent e;
    e.set_seq(1);
    e.set_kind("state");
    e.set_message("RUNNING");
    ASSERT_TRUE((*store)->AppendEvent("a", e).ok());
    e.set_seq(2);
    e.set_message("replan");
    ASSERT_TRUE((*store)->AppendEvent("a", e).ok());
    v1::Graph g;
    g.set_name("tiny");
    g.set_hash("0123456789abcdef");
    ASSERT_TRUE((*store)->PutGraph("a", g).ok());
    v1::Schedule s;
    s.set_version(1);
    ASSERT_TRUE((*store)->PutSchedule("a", s, 5).ok());
    s.set_version(2);
    ASSERT_TRUE((*store)->PutSchedule("a", s, 9).ok());
    ASSERT_TRUE(
        (*store)
            ->PutWorker("a", {1, "inc-1", "host", "cpu", int64_t{5} << 30})
            .ok());
    v1::Profile p;
    p.set_first_iteration(3);
    p.set_last_iteration(6);
    ASSERT_TRUE((*store)->PutProfile("a", p).ok());
  }
  auto store = JobStore::Open(path);
  ASSERT_TRUE(store.ok()) << store.status();
  auto jobs = (*store)->LoadJobs();
  ASSERT_TRUE(jobs.ok());
  ASSERT_EQ(jobs->size(), 2u);
  EXPECT_EQ((*jobs)[0].id(), "a");  // oldest first
  EXPECT_EQ((*jobs)[0].step(), 7);
  auto events = (*store)->LoadEvents("a", 1);
  ASSERT_TRUE(events.ok());
  ASSERT_EQ(events->size(), 1u);
  EXPECT_EQ((*events)[0].message(), "replan");
  auto graph = (*store)->LoadGraph("a");
  ASSERT_TRUE(graph.ok() && graph->has_value());
  EXPECT_EQ((*graph)->hash(), "0123456789abcdef");
  EXPECT_FALSE((*(*store)->LoadGraph("b")).has_value());
  auto schedules = (*store)->LoadSchedules("a");
  ASSERT_EQ(schedules->size(), 2u);
  EXPECT_EQ((*schedules)[1].schedule.version(), 2);
  EXPECT_EQ((*schedules)[1].effective_step, 9);
  auto workers = (*store)->LoadWorkers("a");
  ASSERT_EQ(workers->size(), 1u);
  EXPECT_EQ((*workers)[0].incarnation, "inc-1");
  EXPECT_EQ((*workers)[0].device_memory_bytes, int64_t{5} << 30);
  auto profiles = (*store)->LoadProfiles("a");
  ASSERT_EQ(profiles->size(), 1u);
  EXPECT_EQ((*profiles)[0].last_iteration(), 6);
}

// A planned schedule's explanation (common/ir/explanation.h) is part of the
// stored schedule, so a restarted coordinator still has it.
TEST(JobStoreTest, PutSchedule_PlannedSchedule_ReopenKeepsExplanation) {
  absl::StatusOr<ModelConfig> config =
      ParseModelConfig("preset=tiny-llama world=4");
  ASSERT_TRUE(config.ok());
  absl::StatusOr<Graph> graph = BuildModelGraph(*config);
  ASSERT_TRUE(graph.ok());
  HardwareModel hw = HardwareModel::H100(graph->world_size);
  hw.budget_bytes = 100 << 20;
  absl::StatusOr<PlanResult> plan = Plan(*graph, hw, PlanOptions());
  ASSERT_TRUE(plan.ok()) << plan.status();
  Schedule planned = plan->schedule;
  planned.version = 3;
  ASSERT_GT(planned.explanation.decisions.size(), 1u);

  const std::string path = TempDb("explain.db");
  {
    auto store = JobStore::Open(path);
    ASSERT_TRUE(store.ok()) << store.status();
    ASSERT_TRUE((*store)->PutSchedule("j", ToProto(planned), 4).ok());
  }
  auto store = JobStore::Open(path);
  ASSERT_TRUE(store.ok()) << store.status();
  auto schedules = (*store)->LoadSchedules("j");
  ASSERT_TRUE(schedules.ok()) << schedules.status();
  ASSERT_EQ(schedules->size(), 1u);
  absl::StatusOr<Schedule> loaded = FromProto((*schedules)[0].schedule);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->explanation, planned.explanation);
  EXPECT_EQ(*loaded, planned);
}

// A database as an older coordinator left it: `sql` run on a new file.
void WriteOldDatabase(const std::string& path, const char* sql) {
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(db, sql, nullptr, nullptr, nullptr), SQLITE_OK);
  sqlite3_close(db);
  ASSERT_EQ(chmod(path.c_str(), 0600), 0);  // the owner's alone, as ours are
}

// A database written by the previous coordinator (schema 1: no device
// memory per worker) opens, keeps its rows, and reads them as unknown (0).
TEST(JobStoreTest, Open_SchemaOne_MigratesWorkers) {
  const std::string path = TempDb("schema1.db");
  WriteOldDatabase(path,
                   "CREATE TABLE workers (job_id TEXT NOT NULL, rank "
                   "INTEGER NOT NULL, incarnation TEXT NOT NULL, "
                   "hostname TEXT NOT NULL, device TEXT NOT NULL, "
                   "PRIMARY KEY (job_id, rank));"
                   "INSERT INTO workers VALUES ('a', 0, 'i', 'h', "
                   "'cpu');"
                   "PRAGMA user_version=1;");
  auto store = JobStore::Open(path);
  ASSERT_TRUE(store.ok()) << store.status();
  auto workers = (*store)->LoadWorkers("a");
  ASSERT_TRUE(workers.ok()) << workers.status();
  ASSERT_EQ(workers->size(), 1u);
  EXPECT_EQ((*workers)[0].hostname, "h");
  EXPECT_EQ((*workers)[0].device_memory_bytes, 0);
  ASSERT_TRUE((*store)->PutWorker("a", {1, "j", "h", "cpu", 42}).ok());
  store->reset();
  // Reopened: now at the current version, the new column kept.
  store = JobStore::Open(path);
  ASSERT_TRUE(store.ok()) << store.status();
  EXPECT_EQ((*(*store)->LoadWorkers("a"))[1].device_memory_bytes, 42);
}

// Schema 2 had no work per step: its steps read as 0, new ones keep theirs.
TEST(JobStoreTest, Open_SchemaTwo_MigratesSteps) {
  const std::string path = TempDb("schema2.db");
  WriteOldDatabase(path,
                   "CREATE TABLE steps (job_id TEXT NOT NULL, step "
                   "INTEGER NOT NULL, schedule_version INTEGER NOT "
                   "NULL, loss REAL NOT NULL, iteration_s REAL NOT "
                   "NULL, exposed_comm_s REAL NOT NULL, peak_bytes "
                   "INTEGER NOT NULL, PRIMARY KEY (job_id, step));"
                   "INSERT INTO steps VALUES ('a', 1, 0, 2.5, 0.1, "
                   "0, 7);"
                   "PRAGMA user_version=2;");
  auto store = JobStore::Open(path);
  ASSERT_TRUE(store.ok()) << store.status();
  StoredStep two;
  two.step = 2;
  two.iteration_s = 0.2;
  two.work = 4096;
  ASSERT_TRUE((*store)->PutSteps("a", {two}).ok());
  auto steps = (*store)->LoadSteps("a");
  ASSERT_TRUE(steps.ok()) << steps.status();
  ASSERT_EQ(steps->size(), 2u);
  EXPECT_DOUBLE_EQ((*steps)[0].loss, 2.5);
  EXPECT_EQ((*steps)[0].work, 0);
  EXPECT_EQ((*steps)[1].work, 4096);
  EXPECT_EQ((*steps)[0].cpu_wait_share, -1);
}

// Schema 3 had no wait share per step: its steps read as not measured (-1),
// new ones keep theirs.
TEST(JobStoreTest, Open_SchemaThree_MigratesSteps) {
  const std::string path = TempDb("schema3.db");
  WriteOldDatabase(path,
                   "CREATE TABLE steps (job_id TEXT NOT NULL, step "
                   "INTEGER NOT NULL, schedule_version INTEGER NOT "
                   "NULL, loss REAL NOT NULL, iteration_s REAL NOT "
                   "NULL, exposed_comm_s REAL NOT NULL, peak_bytes "
                   "INTEGER NOT NULL, work INTEGER NOT NULL DEFAULT 0, "
                   "PRIMARY KEY (job_id, step));"
                   "INSERT INTO steps VALUES ('a', 1, 0, 2.5, 0.1, "
                   "0, 7, 64);"
                   "PRAGMA user_version=3;");
  auto store = JobStore::Open(path);
  ASSERT_TRUE(store.ok()) << store.status();
  StoredStep two;
  two.step = 2;
  two.iteration_s = 0.2;
  two.cpu_wait_share = 0.07;
  ASSERT_TRUE((*store)->PutSteps("a", {two}).ok());
  auto steps = (*store)->LoadSteps("a");
  ASSERT_TRUE(steps.ok()) << steps.status();
  ASSERT_EQ(steps->size(), 2u);
  EXPECT_EQ((*steps)[0].work, 64);
  EXPECT_EQ((*steps)[0].cpu_wait_share, -1);
  EXPECT_DOUBLE_EQ((*steps)[1].cpu_wait_share, 0.07);
}

// A diverged loss is history too: the steps are kept (SQLite turns a bound
// NaN into NULL, which the NOT NULL column refused: the probe found 0 rows
// for such a job) and read back as NaN and infinities.
TEST(JobStoreTest, PutSteps_NonFiniteLoss_KeptAsSuch) {
  auto store = JobStore::Open(":memory:");
  ASSERT_TRUE(store.ok());
  std::vector<StoredStep> steps(4);
  const double losses[] = {2.5, std::numeric_limits<double>::infinity(),
                           std::nan(""),
                           -std::numeric_limits<double>::infinity()};
  for (int i = 0; i < 4; ++i) {
    steps[i].step = i + 1;
    steps[i].loss = losses[i];
    steps[i].iteration_s = 0.1;
  }
  ASSERT_TRUE((*store)->PutSteps("a", steps).ok());
  auto back = (*store)->LoadSteps("a");
  ASSERT_TRUE(back.ok()) << back.status();
  ASSERT_EQ(back->size(), 4u);
  EXPECT_EQ((*back)[0].loss, 2.5);
  EXPECT_EQ((*back)[1].loss, std::numeric_limits<double>::infinity());
  EXPECT_TRUE(std::isnan((*back)[2].loss));
  EXPECT_EQ((*back)[3].loss, -std::numeric_limits<double>::infinity());
  EXPECT_EQ((*back)[2].step, 3);
}

TEST(JobStoreTest, PutJob_SameId_Replaces) {
  auto store = JobStore::Open(":memory:");
  ASSERT_TRUE(store.ok());
  v1::Job job = MakeJob("a", 1);
  ASSERT_TRUE((*store)->PutJob(job).ok());
  job.set_state(v1::JOB_STATE_SUCCEEDED);
  ASSERT_TRUE((*store)->PutJob(job).ok());
  auto jobs = (*store)->LoadJobs();
  ASSERT_EQ(jobs->size(), 1u);
  EXPECT_EQ((*jobs)[0].state(), v1::JOB_STATE_SUCCEEDED);
}

// Per-job retention of window profiles: past the quota the oldest go, the
// newest always stays, and other jobs keep theirs.
TEST(JobStoreTest, PutProfile_PastJobQuota_OldestDropped) {
  auto store = JobStore::Open(":memory:");
  ASSERT_TRUE(store.ok());
  auto window = [](int first) {
    v1::Profile p;
    p.set_first_iteration(first);
    p.set_last_iteration(first + 1);
    p.set_graph_hash(std::string(1000, 'h'));
    return p;
  };
  const int64_t one =
      static_cast<int64_t>(window(2).SerializeAsString().size());
  ASSERT_TRUE((*store)->PutProfile("other", window(0), 3 * one).ok());
  for (int w = 0; w < 6; ++w) {
    ASSERT_TRUE((*store)->PutProfile("a", window(2 * w), 3 * one).ok());
  }
  auto kept = (*store)->LoadProfiles("a");
  ASSERT_TRUE(kept.ok()) << kept.status();
  ASSERT_EQ(kept->size(), 3u);
  EXPECT_EQ(kept->front().first_iteration(), 6);
  EXPECT_EQ(kept->back().first_iteration(), 10);
  EXPECT_EQ((*store)->LoadProfiles("other")->size(), 1u);
  // One window larger than the quota is still kept, alone.
  v1::Profile big = window(12);
  big.set_graph_hash(std::string(10 * one, 'x'));
  ASSERT_TRUE((*store)->PutProfile("a", big, 3 * one).ok());
  kept = (*store)->LoadProfiles("a");
  ASSERT_EQ(kept->size(), 1u);
  EXPECT_EQ(kept->front().first_iteration(), 12);
}

TEST(JobStoreTest, AppendEvent_DuplicateSeq_Fails) {
  auto store = JobStore::Open(":memory:");
  v1::JobEvent e;
  e.set_seq(1);
  ASSERT_TRUE((*store)->AppendEvent("a", e).ok());
  EXPECT_FALSE((*store)->AppendEvent("a", e).ok());
}

TEST(JobStoreTest, Open_NotADatabase_SaysWhatToDo) {
  const std::string path = TempDb("garbage.db");
  std::ofstream(path) << std::string(4096, 'x');
  ASSERT_EQ(chmod(path.c_str(), 0600), 0);
  auto store = JobStore::Open(path);
  ASSERT_FALSE(store.ok());
  EXPECT_EQ(store.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(store.status().message()), HasSubstr(path));
}

int Mode(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0 ? static_cast<int>(st.st_mode & 0777)
                                      : -1;
}

std::string Bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// The database holds the key join secrets are derived from: it, its -wal
// and -shm are created for the owner alone, whatever the umask.
TEST(JobStoreTest, Open_NewFile_OwnerOnly) {
  const std::string path = TempDb("private.db");
  const mode_t old_umask = umask(0);  // the most permissive a user may have
  auto store = JobStore::Open(path);
  umask(old_umask);
  ASSERT_TRUE(store.ok()) << store.status();
  ASSERT_TRUE((*store)->PutJob(MakeJob("a", 1)).ok());
  EXPECT_EQ(Mode(path), 0600);
  EXPECT_EQ(Mode(path + "-wal"), 0600);
  EXPECT_EQ(Mode(path + "-shm"), 0600);
}

// A database others can read (made by an older coordinator, or chmod'ed)
// is refused with the command that fixes it; so is a stray -wal. Group bits
// pass for the coordinator's own group only (the file's group here is the
// test's).
TEST(JobStoreTest, Open_OpenToOthers_RefusedWithTheFix) {
  const std::string path = TempDb("shared.db");
  ASSERT_TRUE(JobStore::Open(path).ok());
  ASSERT_EQ(chmod(path.c_str(), 0644), 0);
  auto store = JobStore::Open(path);
  ASSERT_FALSE(store.ok());
  EXPECT_EQ(store.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(store.status().message()),
              AllOf(HasSubstr(path + " is open to other users (mode 0644)"),
                    HasSubstr("chmod 600 " + path + "*")));
  ASSERT_EQ(chmod(path.c_str(), 0600), 0);
  EXPECT_TRUE(JobStore::Open(path).ok());
  // The coordinator's own group may (a Kubernetes fsGroup volume adds g+rw).
  ASSERT_EQ(chmod(path.c_str(), 0660), 0);
  EXPECT_TRUE(JobStore::Open(path).ok());
  ASSERT_EQ(chmod(path.c_str(), 0600), 0);
  std::ofstream(path + "-wal").flush();
  ASSERT_EQ(chmod((path + "-wal").c_str(), 0604), 0);
  store = JobStore::Open(path);
  ASSERT_FALSE(store.ok());
  EXPECT_THAT(std::string(store.status().message()),
              HasSubstr(path + "-wal is open to other users"));
}

// A damaged page is found at start, not by the first Submit after it.
TEST(JobStoreTest, Open_DamagedPage_RefusedAtStart) {
  const std::string path = TempDb("damaged.db");
  {
    auto store = JobStore::Open(path);
    ASSERT_TRUE(store.ok()) << store.status();
    for (int i = 0; i < 200; ++i) {
      v1::Job job = MakeJob(absl::StrCat("job-", i), i);
      job.mutable_spec()->set_name(std::string(300, 'n'));
      ASSERT_TRUE((*store)->PutJob(job).ok());
    }
  }  // closed: the WAL is checkpointed into the file
  std::string bytes = Bytes(path);
  ASSERT_GT(bytes.size(), 8u * 4096);
  // Page 2 (the jobs table's root) overwritten.
  for (size_t i = 4096; i < 2 * 4096; ++i) bytes[i] = static_cast<char>(0xA5);
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
  auto store = JobStore::Open(path);
  ASSERT_FALSE(store.ok());
  EXPECT_EQ(store.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(store.status().message()),
              AllOf(HasSubstr(path), HasSubstr("damaged")));
}

// Another program's SQLite file: refused, and left exactly as it was (no
// Tandem tables added, not switched to WAL).
TEST(JobStoreTest, Open_AnotherProgramsDatabase_RefusedUnchanged) {
  const std::string path = TempDb("photos.db");
  WriteOldDatabase(path,
                   "CREATE TABLE photos (id INTEGER PRIMARY KEY, name TEXT);"
                   "INSERT INTO photos VALUES (1, 'lake');");
  const std::string before = Bytes(path);
  auto store = JobStore::Open(path);
  ASSERT_FALSE(store.ok());
  EXPECT_EQ(store.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(
      std::string(store.status().message()),
      AllOf(HasSubstr(path + " is not a Tandem database"),
            HasSubstr("(photos)"), HasSubstr("Nothing in it was changed")));
  EXPECT_EQ(Bytes(path), before);
  EXPECT_EQ(Mode(path + "-wal"), -1);
  // Tandem's table names without Tandem's schema version: refused too.
  const std::string lookalike = TempDb("lookalike.db");
  WriteOldDatabase(lookalike, "CREATE TABLE jobs (id TEXT);");
  store = JobStore::Open(lookalike);
  ASSERT_FALSE(store.ok());
  EXPECT_THAT(std::string(store.status().message()),
              HasSubstr("no Tandem schema version"));
}

// An empty file (made by `install -m 600 /dev/null`) is a new database.
TEST(JobStoreTest, Open_EmptyPrivateFile_IsANewDatabase) {
  const std::string path = TempDb("empty.db");
  std::ofstream(path).flush();
  ASSERT_EQ(chmod(path.c_str(), 0600), 0);
  auto store = JobStore::Open(path);
  ASSERT_TRUE(store.ok()) << store.status();
  EXPECT_TRUE((*store)->PutJob(MakeJob("a", 1)).ok());
}

TEST(JobStoreTest, Open_MissingDirectory_NamesFlag) {
  auto store = JobStore::Open("/nonexistent-dir/x/tandem.db");
  ASSERT_FALSE(store.ok());
  EXPECT_THAT(std::string(store.status().message()), HasSubstr("--db"));
}

}  // namespace
}  // namespace tandem
