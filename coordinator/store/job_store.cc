#include "coordinator/store/job_store.h"

#include <fcntl.h>
#include <openssl/rand.h>
#include <sqlite3.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <limits>
#include <optional>
#include <set>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace tandem {
namespace {

// 2: workers.device_memory_bytes (a version-1 file is migrated on open).
// 3: steps.work. 4: steps.cpu_wait_share.
// Tables added since (steps, rank_windows) are created on open like the
// others: a file from before them just has no history yet, and an older
// coordinator ignores them.
constexpr int kSchemaVersion = 4;

constexpr const char* kSchema = R"sql(
CREATE TABLE IF NOT EXISTS jobs (
  id TEXT PRIMARY KEY,
  submitted REAL NOT NULL,
  state INTEGER NOT NULL,
  job BLOB NOT NULL
);
CREATE TABLE IF NOT EXISTS events (
  job_id TEXT NOT NULL,
  seq INTEGER NOT NULL,
  event BLOB NOT NULL,
  PRIMARY KEY (job_id, seq)
);
CREATE TABLE IF NOT EXISTS graphs (
  job_id TEXT PRIMARY KEY,
  hash TEXT NOT NULL,
  graph BLOB NOT NULL
);
CREATE TABLE IF NOT EXISTS schedules (
  job_id TEXT NOT NULL,
  version INTEGER NOT NULL,
  effective_step INTEGER NOT NULL,
  schedule BLOB NOT NULL,
  PRIMARY KEY (job_id, version)
);
CREATE TABLE IF NOT EXISTS workers (
  job_id TEXT NOT NULL,
  rank INTEGER NOT NULL,
  incarnation TEXT NOT NULL,
  hostname TEXT NOT NULL,
  device TEXT NOT NULL,
  device_memory_bytes INTEGER NOT NULL DEFAULT 0,
  PRIMARY KEY (job_id, rank)
);
CREATE TABLE IF NOT EXISTS profiles (
  job_id TEXT NOT NULL,
  first_iteration INTEGER NOT NULL,
  last_iteration INTEGER NOT NULL,
  profile BLOB NOT NULL,
  PRIMARY KEY (job_id, first_iteration, last_iteration)
);
CREATE TABLE IF NOT EXISTS steps (
  job_id TEXT NOT NULL,
  step INTEGER NOT NULL,
  schedule_version INTEGER NOT NULL,
  loss REAL NOT NULL,
  iteration_s REAL NOT NULL,
  exposed_comm_s REAL NOT NULL,
  peak_bytes INTEGER NOT NULL,
  work INTEGER NOT NULL DEFAULT 0,
  cpu_wait_share REAL NOT NULL DEFAULT -1,
  PRIMARY KEY (job_id, step)
);
CREATE TABLE IF NOT EXISTS timelines (
  job_id TEXT NOT NULL,
  rank INTEGER NOT NULL,
  timeline BLOB NOT NULL,
  PRIMARY KEY (job_id, rank)
);
CREATE TABLE IF NOT EXISTS rank_windows (
  job_id TEXT NOT NULL,
  rank INTEGER NOT NULL,
  first_iteration INTEGER NOT NULL,
  last_iteration INTEGER NOT NULL,
  schedule_version INTEGER NOT NULL,
  iteration_s REAL NOT NULL,
  comm_s REAL NOT NULL,
  exposed_comm_s REAL NOT NULL,
  peak_bytes INTEGER NOT NULL,
  PRIMARY KEY (job_id, rank, first_iteration, last_iteration)
);
CREATE TABLE IF NOT EXISTS kv (
  key TEXT PRIMARY KEY,
  value BLOB NOT NULL
);
CREATE TABLE IF NOT EXISTS meta (
  key TEXT PRIMARY KEY,
  value BLOB NOT NULL
);
)sql";

// How a NaN is stored in a REAL column (Statement::BindNumber).
constexpr const char* kNaNText = "NaN";

// A prepared statement, finalized on scope exit.
class Statement {
 public:
  Statement(sqlite3* db, const char* sql) : db_(db) {
    rc_ = sqlite3_prepare_v2(db, sql, -1, &stmt_, nullptr);
  }
  ~Statement() { sqlite3_finalize(stmt_); }
  Statement(const Statement&) = delete;
  Statement& operator=(const Statement&) = delete;

  absl::Status status() const {
    return rc_ == SQLITE_OK ? absl::OkStatus() : Error("prepare");
  }
  Statement& Bind(int i, absl::string_view text) {
    sqlite3_bind_text(stmt_, i, text.data(), static_cast<int>(text.size()),
                      SQLITE_TRANSIENT);
    return *this;
  }
  Statement& BindBlob(int i, const std::string& blob) {
    sqlite3_bind_blob(stmt_, i, blob.data(), static_cast<int>(blob.size()),
                      SQLITE_TRANSIENT);
    return *this;
  }
  Statement& Bind(int i, int64_t v) {
    sqlite3_bind_int64(stmt_, i, v);
    return *this;
  }
  Statement& Bind(int i, double v) {
    sqlite3_bind_double(stmt_, i, v);
    return *this;
  }
  // A value that may be NaN (a diverged loss): SQLite turns a bound NaN
  // into NULL, which a NOT NULL column refuses and the row is lost; the
  // text 'NaN' is kept as text by a REAL column (SQLite's columns hold any
  // type; infinities are REALs already). Read back with Number.
  Statement& BindNumber(int i, double v) {
    if (std::isnan(v)) return Bind(i, absl::string_view(kNaNText));
    return Bind(i, v);
  }
  // SQLITE_ROW or SQLITE_DONE on success.
  absl::StatusOr<bool> Step() {
    const int rc = sqlite3_step(stmt_);
    if (rc == SQLITE_ROW) return true;
    if (rc == SQLITE_DONE) return false;
    return Error("step");
  }
  std::string Text(int col) const {
    const auto* p =
        reinterpret_cast<const char*>(sqlite3_column_text(stmt_, col));
    return p == nullptr ? "" : std::string(p, sqlite3_column_bytes(stmt_, col));
  }
  std::string Blob(int col) const {
    const auto* p = static_cast<const char*>(sqlite3_column_blob(stmt_, col));
    return p == nullptr ? "" : std::string(p, sqlite3_column_bytes(stmt_, col));
  }
  int64_t Int(int col) const { return sqlite3_column_int64(stmt_, col); }
  double Real(int col) const { return sqlite3_column_double(stmt_, col); }
  double Number(int col) const {
    if (sqlite3_column_type(stmt_, col) == SQLITE_TEXT &&
        Text(col) == kNaNText) {
      return std::numeric_limits<double>::quiet_NaN();
    }
    return Real(col);
  }
  absl::Status Reset() {
    sqlite3_clear_bindings(stmt_);
    return sqlite3_reset(stmt_) == SQLITE_OK ? absl::OkStatus()
                                             : Error("reset");
  }

 private:
  absl::Status Error(const char* what) const {
    return absl::InternalError(
        absl::StrCat("sqlite ", what, ": ", sqlite3_errmsg(db_)));
  }
  sqlite3* db_;
  sqlite3_stmt* stmt_ = nullptr;
  int rc_;
};

absl::Status Done(Statement& stmt) {
  absl::StatusOr<bool> row = stmt.Step();
  return row.status();
}

template <typename Message>
absl::Status ParseBlob(const std::string& blob, Message& out,
                       absl::string_view what) {
  if (!out.ParseFromString(blob)) {
    return absl::DataLossError(absl::StrCat(
        "stored ", what,
        " does not parse; the database is damaged: restore it from a backup"));
  }
  return absl::OkStatus();
}

// The tables any schema version of ours has had.
const std::set<std::string>& TandemTables() {
  static const auto* tables = new std::set<std::string>{
      "jobs",  "events",    "graphs",       "schedules", "workers", "profiles",
      "steps", "timelines", "rank_windows", "kv",        "meta"};
  return *tables;
}

// The database holds the key join secrets are derived from (and every
// job's history): it and its -wal and -shm must be the owner's alone. Group
// bits are allowed only for the coordinator's own group: a Kubernetes
// volume with fsGroup adds g+rw to every file on each mount
// (deploy/k8s/base/coordinator-deployment.yaml runs as that group).
absl::Status CheckPrivate(const std::string& path) {
  for (const std::string& f : {path, path + "-wal", path + "-shm"}) {
    struct stat st;
    if (stat(f.c_str(), &st) != 0) continue;  // not there (yet)
    const mode_t open_to = st.st_gid == getegid() ? 007 : 077;
    if ((st.st_mode & open_to) != 0) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "%s is open to other users (mode %04o): it holds the key that "
          "join secrets are derived from. Run `chmod 600 %s*` and start "
          "the coordinator again",
          f, st.st_mode & 07777, path));
    }
  }
  return absl::OkStatus();
}

// An existing, non-empty file, opened read-only so that nothing in it
// changes: SQLite's quick integrity check, and only Tandem's tables at a
// schema version this coordinator knows (an empty database passes).
absl::Status CheckExisting(const std::string& path) {
  sqlite3* db = nullptr;
  int rc = sqlite3_open_v2(
      path.c_str(), &db, SQLITE_OPEN_READONLY | SQLITE_OPEN_FULLMUTEX, nullptr);
  auto close = [&db] {
    sqlite3_close(db);
    db = nullptr;
  };
  if (rc != SQLITE_OK) {
    std::string msg = db != nullptr ? sqlite3_errmsg(db) : "out of memory";
    close();
    return absl::UnavailableError(
        absl::StrCat("cannot open database ", path, ": ", msg, " (--db)"));
  }
  // Every row of a query's first column, as text.
  auto rows =
      [&db](const char* sql) -> absl::StatusOr<std::vector<std::string>> {
    sqlite3_stmt* stmt = nullptr;
    std::vector<std::string> out;
    int code = sqlite3_prepare_v2(db, sql, -1, &stmt, nullptr);
    while (code == SQLITE_OK && (code = sqlite3_step(stmt)) == SQLITE_ROW) {
      const unsigned char* text = sqlite3_column_text(stmt, 0);
      out.emplace_back(text != nullptr ? reinterpret_cast<const char*>(text)
                                       : "");
      code = SQLITE_OK;
    }
    const std::string msg = sqlite3_errmsg(db);
    sqlite3_finalize(stmt);
    if (code != SQLITE_DONE) {
      return absl::UnavailableError(
          absl::StrCat(msg, " (sqlite code ", code, ")"));
    }
    return out;
  };
  const auto not_ours = [&path](absl::string_view why) {
    return absl::UnavailableError(absl::StrCat(
        path, " is not a Tandem database: ", why,
        ". Nothing in it was changed; point --db at a Tandem database or a "
        "new file"));
  };
  absl::StatusOr<std::vector<std::string>> tables = rows(
      "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT "
      "LIKE 'sqlite_%' ORDER BY name");
  if (!tables.ok()) {
    close();
    return absl::UnavailableError(absl::StrCat(
        path,
        " is not a SQLite database, or is damaged: ", tables.status().message(),
        "; point --db at a Tandem database or a new file"));
  }
  absl::StatusOr<std::vector<std::string>> check = rows("PRAGMA quick_check;");
  if (!check.ok() || check->empty() || (*check)[0] != "ok") {
    const std::string said = !check.ok()
                                 ? std::string(check.status().message())
                                 : (check->empty() ? "no answer" : (*check)[0]);
    close();
    return absl::UnavailableError(absl::StrCat(
        path, " is damaged: SQLite's integrity check says \"", said,
        "\". Restore it from a backup, or point --db at a new file (the "
        "jobs in it are lost to this coordinator)"));
  }
  absl::StatusOr<std::vector<std::string>> version =
      rows("PRAGMA user_version;");
  close();
  if (!version.ok() || version->empty()) {
    return not_ours("it has no schema version");
  }
  if (tables->empty()) return absl::OkStatus();
  std::vector<std::string> foreign;
  for (const std::string& t : *tables) {
    if (!TandemTables().count(t)) foreign.push_back(t);
  }
  if (!foreign.empty()) {
    return not_ours(absl::StrCat("it has tables Tandem never writes (",
                                 absl::StrJoin(foreign, ", "), ")"));
  }
  if ((*version)[0] == "0") {
    return not_ours("it has Tandem's table names but no Tandem schema version");
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<JobStore>> JobStore::Open(
    const std::string& path) {
  // A file on disk (not ":memory:" or a URI): private, and checked before
  // SQLite may write to it.
  if (!path.empty() && path != ":memory:" && !absl::StartsWith(path, "file:")) {
    if (absl::Status s = CheckPrivate(path); !s.ok()) return s;
    struct stat st;
    if (stat(path.c_str(), &st) == 0) {
      if (st.st_size > 0) {
        if (absl::Status s = CheckExisting(path); !s.ok()) return s;
      }
    } else if (errno == ENOENT) {
      // Created by us, 0600: SQLite gives its -wal and -shm the database
      // file's mode.
      const int fd =
          ::open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
      if (fd < 0 && errno != EEXIST) {
        return absl::UnavailableError(absl::StrCat(
            "cannot open database ", path, ": ", std::strerror(errno),
            "; check that its directory exists and is writable (--db)"));
      }
      if (fd >= 0) ::close(fd);
    }
  }
  sqlite3* db = nullptr;
  const int rc = sqlite3_open_v2(
      path.c_str(), &db,
      SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_FULLMUTEX,
      nullptr);
  if (rc != SQLITE_OK) {
    std::string msg = db != nullptr ? sqlite3_errmsg(db) : "out of memory";
    sqlite3_close(db);
    return absl::UnavailableError(absl::StrCat(
        "cannot open database ", path, ": ", msg,
        "; check that its directory exists and is writable (--db)"));
  }
  std::unique_ptr<JobStore> store(new JobStore(db));
  sqlite3_busy_timeout(db, 5000);
  if (absl::Status s = store->Exec("PRAGMA journal_mode=WAL;"); !s.ok()) {
    return absl::UnavailableError(
        absl::StrCat(path, " is not a usable SQLite database: ", s.message()));
  }
  if (absl::Status s = store->Exec("PRAGMA synchronous=NORMAL;"); !s.ok()) {
    return s;
  }
  Statement version(db, "PRAGMA user_version;");
  if (!version.status().ok()) {
    return absl::UnavailableError(absl::StrCat(
        path,
        " is not a usable SQLite database: ", version.status().message()));
  }
  absl::StatusOr<bool> row = version.Step();
  if (!row.ok()) {
    return absl::UnavailableError(absl::StrCat(
        path, " is not a SQLite database: ", row.status().message(),
        "; point --db at a Tandem database or a new file"));
  }
  const int64_t found = *row ? version.Int(0) : 0;
  if (found >= 1 && found < kSchemaVersion) {
    // Each column came with a version; older databases get it as unknown:
    // a worker's device memory (2) and a step's work (3) as 0, a step's
    // cpu_wait_share (4) as -1.
    // A table the database does not have yet comes whole from kSchema.
    struct Migration {
      int64_t version;
      const char* table;
      const char* sql;
    };
    for (const Migration& m :
         {Migration{2, "workers",
                    "ALTER TABLE workers ADD COLUMN device_memory_bytes "
                    "INTEGER NOT NULL DEFAULT 0;"},
          Migration{3, "steps",
                    "ALTER TABLE steps ADD COLUMN work INTEGER NOT NULL "
                    "DEFAULT 0;"},
          Migration{4, "steps",
                    "ALTER TABLE steps ADD COLUMN cpu_wait_share REAL NOT "
                    "NULL DEFAULT -1;"}}) {
      if (found >= m.version) continue;
      Statement table(db,
                      "SELECT 1 FROM sqlite_master WHERE type = 'table' AND "
                      "name = ?");
      table.Bind(1, m.table);
      absl::StatusOr<bool> exists = table.Step();
      if (!exists.ok()) return exists.status();
      if (!*exists) continue;
      if (absl::Status s = store->Exec(m.sql); !s.ok()) {
        return absl::UnavailableError(absl::StrCat("cannot migrate ", path,
                                                   " from schema version ",
                                                   found, ": ", s.message()));
      }
    }
  } else if (found != 0 && found != kSchemaVersion) {
    return absl::UnavailableError(absl::StrCat(
        path, " has schema version ", found, ", this coordinator reads ",
        kSchemaVersion, "; use a matching coordinator or a new --db"));
  }
  if (absl::Status s = store->Exec(kSchema); !s.ok()) return s;
  if (absl::Status s = store->Exec(
          absl::StrCat("PRAGMA user_version=", kSchemaVersion, ";").c_str());
      !s.ok()) {
    return s;
  }
  return store;
}

JobStore::~JobStore() { sqlite3_close(db_); }

absl::Status JobStore::Exec(const char* sql) {
  char* err = nullptr;
  if (sqlite3_exec(db_, sql, nullptr, nullptr, &err) != SQLITE_OK) {
    std::string msg = err != nullptr ? err : "unknown error";
    sqlite3_free(err);
    return absl::InternalError(absl::StrCat("sqlite: ", msg));
  }
  return absl::OkStatus();
}

absl::Status JobStore::PutJob(const v1::Job& job) {
  std::lock_guard<std::mutex> lock(mu_);
  Statement stmt(db_,
                 "INSERT OR REPLACE INTO jobs (id, submitted, state, job) "
                 "VALUES (?, ?, ?, ?)");
  if (!stmt.status().ok()) return stmt.status();
  stmt.Bind(1, job.id())
      .Bind(2, job.submitted_unix_s())
      .Bind(3, static_cast<int64_t>(job.state()))
      .BindBlob(4, job.SerializeAsString());
  return Done(stmt);
}

absl::Status JobStore::PutKv(absl::string_view key, absl::string_view value) {
  std::lock_guard<std::mutex> lock(mu_);
  Statement stmt(db_, "INSERT OR REPLACE INTO kv (key, value) VALUES (?, ?)");
  if (!stmt.status().ok()) return stmt.status();
  stmt.Bind(1, key).BindBlob(2, std::string(value));
  return Done(stmt);
}

absl::Status JobStore::DeleteKv(absl::string_view key) {
  std::lock_guard<std::mutex> lock(mu_);
  Statement stmt(db_, "DELETE FROM kv WHERE key = ?");
  if (!stmt.status().ok()) return stmt.status();
  stmt.Bind(1, key);
  return Done(stmt);
}

absl::Status JobStore::DeleteKvPrefix(absl::string_view prefix) {
  std::lock_guard<std::mutex> lock(mu_);
  // substr, not LIKE: keys may hold '%' and '_'.
  Statement stmt(db_, "DELETE FROM kv WHERE substr(key, 1, ?) = ?");
  if (!stmt.status().ok()) return stmt.status();
  stmt.Bind(1, static_cast<int64_t>(prefix.size())).Bind(2, prefix);
  return Done(stmt);
}

absl::StatusOr<std::vector<std::pair<std::string, std::string>>>
JobStore::LoadKv() {
  std::lock_guard<std::mutex> lock(mu_);
  Statement stmt(db_, "SELECT key, value FROM kv ORDER BY key");
  if (!stmt.status().ok()) return stmt.status();
  std::vector<std::pair<std::string, std::string>> out;
  for (;;) {
    absl::StatusOr<bool> row = stmt.Step();
    if (!row.ok()) return row.status();
    if (!*row) break;
    out.emplace_back(stmt.Text(0), stmt.Blob(1));
  }
  return out;
}

absl::StatusOr<std::string> JobStore::SecretKey() {
  std::lock_guard<std::mutex> lock(mu_);
  {
    Statement stmt(db_, "SELECT value FROM meta WHERE key = 'secret_key'");
    if (!stmt.status().ok()) return stmt.status();
    absl::StatusOr<bool> row = stmt.Step();
    if (!row.ok()) return row.status();
    if (*row) {
      std::string key = stmt.Blob(0);
      if (key.size() == kSecretKeyBytes) return key;
      return absl::DataLossError(absl::StrCat(
          "the database's secret key has ", key.size(), " bytes, not ",
          kSecretKeyBytes, "; the file is damaged"));
    }
  }
  std::string key(kSecretKeyBytes, '\0');
  if (RAND_bytes(reinterpret_cast<unsigned char*>(key.data()),
                 static_cast<int>(key.size())) != 1) {
    return absl::InternalError("no random bytes for the secret key (OpenSSL)");
  }
  Statement stmt(db_, "INSERT INTO meta (key, value) VALUES ('secret_key', ?)");
  if (!stmt.status().ok()) return stmt.status();
  stmt.BindBlob(1, key);
  if (absl::Status s = Done(stmt); !s.ok()) return s;
  return key;
}

absl::StatusOr<std::vector<v1::Job>> JobStore::LoadJobs() {
  std::lock_guard<std::mutex> lock(mu_);
  Statement stmt(db_, "SELECT job FROM jobs ORDER BY submitted, id");
  if (!stmt.status().ok()) return stmt.status();
  std::vector<v1::Job> out;
  for (;;) {
    absl::StatusOr<bool> row = stmt.Step();
    if (!row.ok()) return row.status();
    if (!*row) break;
    v1::Job job;
    if (absl::Status s = ParseBlob(stmt.Blob(0), job, "job"); !s.ok()) return s;
    out.push_back(std::move(job));
  }
  return out;
}

absl::Status JobStore::AppendEvent(absl::string_view job_id,
                                   const v1::JobEvent& event) {
  std::lock_guard<std::mutex> lock(mu_);
  Statement stmt(db_,
                 "INSERT INTO events (job_id, seq, event) VALUES (?, ?, ?)");
  if (!stmt.status().ok()) return stmt.status();
  stmt.Bind(1, job_id)
      .Bind(2, event.seq())
      .BindBlob(3, event.SerializeAsString());
  return Done(stmt);
}

absl::Status JobStore::DeleteEventsBefore(absl::string_view job_id,
                                          int64_t seq) {
  std::lock_guard<std::mutex> lock(mu_);
  Statement stmt(db_, "DELETE FROM events WHERE job_id = ? AND seq < ?");
  if (!stmt.status().ok()) return stmt.status();
  stmt.Bind(1, job_id).Bind(2, seq);
  return Done(stmt);
}

absl::StatusOr<std::vector<v1::JobEvent>> JobStore::LoadEvents(
    absl::string_view job_id, int64_t after_seq, int64_t limit) {
  std::lock_guard<std::mutex> lock(mu_);
  Statement stmt(db_,
                 "SELECT event FROM events WHERE job_id = ? AND seq > ? "
                 "ORDER BY seq LIMIT ?");
  if (!stmt.status().ok()) return stmt.status();
  stmt.Bind(1, job_id).Bind(2, after_seq).Bind(3, limit);
  std::vector<v1::JobEvent> out;
  for (;;) {
    absl::StatusOr<bool> row = stmt.Step();
    if (!row.ok()) return row.status();
    if (!*row) break;
    v1::JobEvent event;
    if (absl::Status s = ParseBlob(stmt.Blob(0), event, "event"); !s.ok()) {
      return s;
    }
    out.push_back(std::move(event));
  }
  return out;
}

absl::Status JobStore::PutGraph(absl::string_view job_id,
                                const v1::Graph& graph) {
  std::lock_guard<std::mutex> lock(mu_);
  Statement stmt(db_,
                 "INSERT OR REPLACE INTO graphs (job_id, hash, graph) "
                 "VALUES (?, ?, ?)");
  if (!stmt.status().ok()) return stmt.status();
  stmt.Bind(1, job_id)
      .Bind(2, graph.hash())
      .BindBlob(3, graph.SerializeAsString());
  return Done(stmt);
}

absl::StatusOr<std::vector<std::string>> JobStore::JobsWithGraph(
    absl::string_view hash) {
  std::lock_guard<std::mutex> lock(mu_);
  Statement stmt(db_, "SELECT job_id FROM graphs WHERE hash = ?");
  if (!stmt.status().ok()) return stmt.status();
  stmt.Bind(1, hash);
  std::vector<std::string> out;
  for (;;) {
    absl::StatusOr<bool> row = stmt.Step();
    if (!row.ok()) return row.status();
    if (!*row) break;
    out.push_back(stmt.Text(0));
  }
  return out;
}

absl::StatusOr<std::optional<v1::Graph>> JobStore::LoadGraph(
    absl::string_view job_id) {
  std::lock_guard<std::mutex> lock(mu_);
  Statement stmt(db_, "SELECT graph FROM graphs WHERE job_id = ?");
  if (!stmt.status().ok()) return stmt.status();
  stmt.Bind(1, job_id);
  absl::StatusOr<bool> row = stmt.Step();
  if (!row.ok()) return row.status();
  if (!*row) return std::optional<v1::Graph>();
  v1::Graph graph;
  if (absl::Status s = ParseBlob(stmt.Blob(0), graph, "graph"); !s.ok()) {
    return s;
  }
  return std::optional<v1::Graph>(std::move(graph));
}

absl::Status JobStore::PutSchedule(absl::string_view job_id,
                                   const v1::Schedule& schedule,
                                   int64_t effective_step) {
  std::lock_guard<std::mutex> lock(mu_);
  Statement stmt(db_,
                 "INSERT OR REPLACE INTO schedules "
                 "(job_id, version, effective_step, schedule) "
                 "VALUES (?, ?, ?, ?)");
  if (!stmt.status().ok()) return stmt.status();
  stmt.Bind(1, job_id)
      .Bind(2, schedule.version())
      .Bind(3, effective_step)
      .BindBlob(4, schedule.SerializeAsString());
  return Done(stmt);
}

absl::StatusOr<std::vector<StoredSchedule>> JobStore::LoadSchedules(
    absl::string_view job_id) {
  std::lock_guard<std::mutex> lock(mu_);
  Statement stmt(db_,
                 "SELECT schedule, effective_step FROM schedules "
                 "WHERE job_id = ? ORDER BY version");
  if (!stmt.status().ok()) return stmt.status();
  stmt.Bind(1, job_id);
  std::vector<StoredSchedule> out;
  for (;;) {
    absl::StatusOr<bool> row = stmt.Step();
    if (!row.ok()) return row.status();
    if (!*row) break;
    StoredSchedule s;
    if (absl::Status st = ParseBlob(stmt.Blob(0), s.schedule, "schedule");
        !st.ok()) {
      return st;
    }
    s.effective_step = stmt.Int(1);
    out.push_back(std::move(s));
  }
  return out;
}

absl::Status JobStore::DeleteWorkers(absl::string_view job_id) {
  std::lock_guard<std::mutex> lock(mu_);
  Statement stmt(db_, "DELETE FROM workers WHERE job_id = ?");
  if (!stmt.status().ok()) return stmt.status();
  stmt.Bind(1, job_id);
  return Done(stmt);
}

absl::Status JobStore::DeleteGraph(absl::string_view job_id) {
  std::lock_guard<std::mutex> lock(mu_);
  Statement stmt(db_, "DELETE FROM graphs WHERE job_id = ?");
  if (!stmt.status().ok()) return stmt.status();
  stmt.Bind(1, job_id);
  return Done(stmt);
}

absl::Status JobStore::DeleteJob(absl::string_view job_id) {
  std::lock_guard<std::mutex> lock(mu_);
  if (absl::Status s = Exec("BEGIN;"); !s.ok()) return s;
  absl::Status status = [&]() -> absl::Status {
    for (const char* table :
         {"jobs", "events", "graphs", "schedules", "workers", "profiles",
          "steps", "timelines", "rank_windows"}) {
      const std::string sql = absl::StrCat(
          "DELETE FROM ", table, " WHERE ",
          std::string_view(table) == "jobs" ? "id" : "job_id", " = ?");
      Statement stmt(db_, sql.c_str());
      if (!stmt.status().ok()) return stmt.status();
      stmt.Bind(1, job_id);
      if (absl::Status s = Done(stmt); !s.ok()) return s;
    }
    return absl::OkStatus();
  }();
  if (!status.ok()) {
    (void)Exec("ROLLBACK;");
    return status;
  }
  return Exec("COMMIT;");
}

absl::Status JobStore::PutWorker(absl::string_view job_id,
                                 const StoredWorker& worker) {
  std::lock_guard<std::mutex> lock(mu_);
  Statement stmt(db_,
                 "INSERT OR REPLACE INTO workers "
                 "(job_id, rank, incarnation, hostname, device, "
                 "device_memory_bytes) VALUES (?, ?, ?, ?, ?, ?)");
  if (!stmt.status().ok()) return stmt.status();
  stmt.Bind(1, job_id)
      .Bind(2, static_cast<int64_t>(worker.rank))
      .Bind(3, worker.incarnation)
      .Bind(4, worker.hostname)
      .Bind(5, worker.device)
      .Bind(6, worker.device_memory_bytes);
  return Done(stmt);
}

absl::StatusOr<std::vector<StoredWorker>> JobStore::LoadWorkers(
    absl::string_view job_id) {
  std::lock_guard<std::mutex> lock(mu_);
  Statement stmt(db_,
                 "SELECT rank, incarnation, hostname, device, "
                 "device_memory_bytes FROM workers "
                 "WHERE job_id = ? ORDER BY rank");
  if (!stmt.status().ok()) return stmt.status();
  stmt.Bind(1, job_id);
  std::vector<StoredWorker> out;
  for (;;) {
    absl::StatusOr<bool> row = stmt.Step();
    if (!row.ok()) return row.status();
    if (!*row) break;
    out.push_back({static_cast<int32_t>(stmt.Int(0)), stmt.Text(1),
                   stmt.Text(2), stmt.Text(3), stmt.Int(4)});
  }
  return out;
}

absl::Status JobStore::PutProfile(absl::string_view job_id,
                                  const v1::Profile& profile,
                                  int64_t max_job_bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  {
    Statement stmt(db_,
                   "INSERT OR REPLACE INTO profiles "
                   "(job_id, first_iteration, last_iteration, profile) "
                   "VALUES (?, ?, ?, ?)");
    if (!stmt.status().ok()) return stmt.status();
    stmt.Bind(1, job_id)
        .Bind(2, profile.first_iteration())
        .Bind(3, profile.last_iteration())
        .BindBlob(4, profile.SerializeAsString());
    if (absl::Status s = Done(stmt); !s.ok()) return s;
  }
  // Retention: newest first, keep while the sum fits.
  Statement sizes(db_,
                  "SELECT first_iteration, last_iteration, length(profile) "
                  "FROM profiles WHERE job_id = ? "
                  "ORDER BY first_iteration DESC, last_iteration DESC");
  if (!sizes.status().ok()) return sizes.status();
  sizes.Bind(1, job_id);
  int64_t kept = 0;
  std::optional<std::pair<int64_t, int64_t>> oldest_kept;
  bool over = false;
  for (;;) {
    absl::StatusOr<bool> row = sizes.Step();
    if (!row.ok()) return row.status();
    if (!*row) break;
    const int64_t bytes = sizes.Int(2);
    if (oldest_kept.has_value() && kept + bytes > max_job_bytes) {
      over = true;
      break;
    }
    kept += bytes;
    oldest_kept = {sizes.Int(0), sizes.Int(1)};
  }
  if (!over) return absl::OkStatus();
  if (absl::Status s = sizes.Reset(); !s.ok()) return s;
  Statement drop(db_,
                 "DELETE FROM profiles WHERE job_id = ? AND "
                 "(first_iteration < ? OR (first_iteration = ? AND "
                 "last_iteration < ?))");
  if (!drop.status().ok()) return drop.status();
  drop.Bind(1, job_id)
      .Bind(2, oldest_kept->first)
      .Bind(3, oldest_kept->first)
      .Bind(4, oldest_kept->second);
  return Done(drop);
}

absl::StatusOr<std::vector<v1::Profile>> JobStore::LoadProfiles(
    absl::string_view job_id) {
  std::lock_guard<std::mutex> lock(mu_);
  Statement stmt(db_,
                 "SELECT profile FROM profiles WHERE job_id = ? "
                 "ORDER BY first_iteration");
  if (!stmt.status().ok()) return stmt.status();
  stmt.Bind(1, job_id);
  std::vector<v1::Profile> out;
  for (;;) {
    absl::StatusOr<bool> row = stmt.Step();
    if (!row.ok()) return row.status();
    if (!*row) break;
    v1::Profile p;
    if (absl::Status s = ParseBlob(stmt.Blob(0), p, "profile"); !s.ok()) {
      return s;
    }
    out.push_back(std::move(p));
  }
  return out;
}

absl::Status JobStore::PutSteps(absl::string_view job_id,
                                const std::vector<StoredStep>& steps) {
  if (steps.empty()) return absl::OkStatus();
  std::lock_guard<std::mutex> lock(mu_);
  if (absl::Status s = Exec("BEGIN;"); !s.ok()) return s;
  absl::Status status = [&]() -> absl::Status {
    Statement stmt(db_,
                   "INSERT OR REPLACE INTO steps (job_id, step, "
                   "schedule_version, loss, iteration_s, exposed_comm_s, "
                   "peak_bytes, work, cpu_wait_share) VALUES (?, ?, ?, ?, ?, "
                   "?, ?, ?, ?)");
    if (!stmt.status().ok()) return stmt.status();
    for (const StoredStep& s : steps) {
      stmt.Bind(1, job_id)
          .Bind(2, s.step)
          .Bind(3, s.schedule_version)
          .BindNumber(4, s.loss)
          .Bind(5, s.iteration_s)
          .Bind(6, s.exposed_comm_s)
          .Bind(7, s.peak_bytes)
          .Bind(8, s.work)
          .Bind(9, s.cpu_wait_share);
      if (absl::Status st = Done(stmt); !st.ok()) return st;
      if (absl::Status st = stmt.Reset(); !st.ok()) return st;
    }
    return absl::OkStatus();
  }();
  if (!status.ok()) {
    (void)Exec("ROLLBACK;");
    return status;
  }
  return Exec("COMMIT;");
}

absl::StatusOr<std::vector<StoredStep>> JobStore::LoadSteps(
    absl::string_view job_id) {
  std::lock_guard<std::mutex> lock(mu_);
  Statement stmt(db_,
                 "SELECT step, schedule_version, loss, iteration_s, "
                 "exposed_comm_s, peak_bytes, work, cpu_wait_share FROM steps "
                 "WHERE job_id = ? ORDER BY step");
  if (!stmt.status().ok()) return stmt.status();
  stmt.Bind(1, job_id);
  std::vector<StoredStep> out;
  for (;;) {
    absl::StatusOr<bool> row = stmt.Step();
    if (!row.ok()) return row.status();
    if (!*row) break;
    out.push_back({stmt.Int(0), stmt.Int(1), stmt.Number(2), stmt.Real(3),
                   stmt.Real(4), stmt.Int(5), stmt.Int(6), stmt.Real(7)});
  }
  return out;
}

absl::Status JobStore::PutTimeline(absl::string_view job_id,
                                   const v1::RankTimeline& timeline) {
  std::lock_guard<std::mutex> lock(mu_);
  Statement stmt(db_,
                 "INSERT OR REPLACE INTO timelines (job_id, rank, timeline) "
                 "VALUES (?, ?, ?)");
  if (!stmt.status().ok()) return stmt.status();
  stmt.Bind(1, job_id)
      .Bind(2, static_cast<int64_t>(timeline.rank()))
      .BindBlob(3, timeline.SerializeAsString());
  return Done(stmt);
}

absl::StatusOr<std::vector<v1::RankTimeline>> JobStore::LoadTimelines(
    absl::string_view job_id) {
  std::lock_guard<std::mutex> lock(mu_);
  Statement stmt(db_,
                 "SELECT timeline FROM timelines WHERE job_id = ? ORDER BY "
                 "rank");
  if (!stmt.status().ok()) return stmt.status();
  stmt.Bind(1, job_id);
  std::vector<v1::RankTimeline> out;
  for (;;) {
    absl::StatusOr<bool> row = stmt.Step();
    if (!row.ok()) return row.status();
    if (!*row) break;
    v1::RankTimeline& t = out.emplace_back();
    if (absl::Status s = ParseBlob(stmt.Blob(0), t, "timeline"); !s.ok()) {
      return s;
    }
  }
  return out;
}

absl::Status JobStore::PutRankWindow(absl::string_view job_id,
                                     const StoredRankWindow& w) {
  std::lock_guard<std::mutex> lock(mu_);
  Statement stmt(db_,
                 "INSERT OR REPLACE INTO rank_windows (job_id, rank, "
                 "first_iteration, last_iteration, schedule_version, "
                 "iteration_s, comm_s, exposed_comm_s, peak_bytes) "
                 "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)");
  if (!stmt.status().ok()) return stmt.status();
  stmt.Bind(1, job_id)
      .Bind(2, static_cast<int64_t>(w.rank))
      .Bind(3, w.first_iteration)
      .Bind(4, w.last_iteration)
      .Bind(5, w.schedule_version)
      .Bind(6, w.iteration_s)
      .Bind(7, w.comm_s)
      .Bind(8, w.exposed_comm_s)
      .Bind(9, w.peak_bytes);
  return Done(stmt);
}

absl::StatusOr<int64_t> JobStore::ThinHistory(absl::string_view job_id,
                                              int64_t max_rows) {
  std::lock_guard<std::mutex> lock(mu_);
  int64_t dropped = 0;
  for (const auto& [table, key] :
       {std::pair{"steps", "step"},
        std::pair{"rank_windows", "first_iteration"}}) {
    absl::StatusOr<int64_t> n = ThinTableLocked(table, key, job_id, max_rows);
    if (!n.ok()) return n.status();
    dropped += *n;
  }
  return dropped;
}

absl::StatusOr<int64_t> JobStore::ThinTableLocked(const char* table,
                                                  const char* key,
                                                  absl::string_view job_id,
                                                  int64_t max_rows) {
  // Each group's size, newest first.
  const std::string select = absl::StrCat("SELECT ", key, ", COUNT(*) FROM ",
                                          table, " WHERE job_id = ? GROUP BY ",
                                          key, " ORDER BY ", key, " DESC");
  Statement groups(db_, select.c_str());
  if (!groups.status().ok()) return groups.status();
  groups.Bind(1, job_id);
  std::vector<std::pair<int64_t, int64_t>> sizes;
  int64_t rows = 0;
  for (;;) {
    absl::StatusOr<bool> row = groups.Step();
    if (!row.ok()) return row.status();
    if (!*row) break;
    sizes.emplace_back(groups.Int(0), groups.Int(1));
    rows += groups.Int(1);
  }
  if (rows <= max_rows) return 0;
  size_t older = 0;  // the first group past the newest half
  for (int64_t whole = 0; older < sizes.size(); ++older) {
    whole += sizes[older].second;
    if (whole > max_rows / 2) break;
  }
  const std::string remove = absl::StrCat(
      "DELETE FROM ", table, " WHERE job_id = ? AND ", key, " = ?");
  if (absl::Status s = Exec("BEGIN;"); !s.ok()) return s;
  int64_t dropped = 0;
  absl::Status status = [&]() -> absl::Status {
    Statement stmt(db_, remove.c_str());
    if (!stmt.status().ok()) return stmt.status();
    // Every second group of the older ones, counted from the oldest.
    for (size_t i = sizes.size(); i-- > older;) {
      if ((sizes.size() - 1 - i) % 2 == 0) continue;
      stmt.Bind(1, job_id).Bind(2, sizes[i].first);
      if (absl::Status st = Done(stmt); !st.ok()) return st;
      if (absl::Status st = stmt.Reset(); !st.ok()) return st;
      dropped += sizes[i].second;
    }
    return absl::OkStatus();
  }();
  if (!status.ok()) {
    (void)Exec("ROLLBACK;");
    return status;
  }
  if (absl::Status s = Exec("COMMIT;"); !s.ok()) return s;
  return dropped;
}

absl::StatusOr<std::vector<StoredRankWindow>> JobStore::LoadRankWindows(
    absl::string_view job_id) {
  std::lock_guard<std::mutex> lock(mu_);
  Statement stmt(db_,
                 "SELECT rank, schedule_version, first_iteration, "
                 "last_iteration, iteration_s, comm_s, exposed_comm_s, "
                 "peak_bytes FROM rank_windows WHERE job_id = ? "
                 "ORDER BY first_iteration, rank");
  if (!stmt.status().ok()) return stmt.status();
  stmt.Bind(1, job_id);
  std::vector<StoredRankWindow> out;
  for (;;) {
    absl::StatusOr<bool> row = stmt.Step();
    if (!row.ok()) return row.status();
    if (!*row) break;
    out.push_back({static_cast<int32_t>(stmt.Int(0)), stmt.Int(1), stmt.Int(2),
                   stmt.Int(3), stmt.Real(4), stmt.Real(5), stmt.Real(6),
                   stmt.Int(7)});
  }
  return out;
}

}  // namespace tandem
