#include "coordinator/service/plan_cache.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "absl/algorithm/container.h"
#include "absl/strings/match.h"
#include "coordinator/service/plan_decision.h"
#include "google/protobuf/util/message_differencer.h"

namespace tandem {

std::optional<CachedPlan> FindCachedPlan(
    JobManager& jobs, JobStore& store, const v1::Job& job,
    const std::string& graph_hash, const std::vector<RankDevice>& devices) {
  absl::StatusOr<std::vector<std::string>> candidates =
      store.JobsWithGraph(graph_hash);
  if (!candidates.ok()) return std::nullopt;
  const v1::JobSpec& spec = job.spec();
  const HardwareModel mine = HardwareForJob(spec, devices).hw;
  std::optional<CachedPlan> found;
  double found_submitted = -1;
  for (const std::string& id : *candidates) {
    if (id == job.id()) continue;
    absl::StatusOr<v1::Job> other = jobs.Get(id);
    if (!other.ok() || other->submitted_unix_s() <= found_submitted ||
        (other->state() != v1::JOB_STATE_RUNNING &&
         other->state() != v1::JOB_STATE_SUCCEEDED)) {
      continue;
    }
    const v1::JobSpec& o = other->spec();
    using ::google::protobuf::util::MessageDifferencer;
    if (!MessageDifferencer::Equals(o.model(), spec.model()) ||
        !MessageDifferencer::Equals(o.batch(), spec.batch()) ||
        !MessageDifferencer::Equals(o.parallel(), spec.parallel()) ||
        !MessageDifferencer::Equals(o.memory(), spec.memory()) ||
        !MessageDifferencer::Equals(o.hardware(), spec.hardware()) ||
        !MessageDifferencer::Equals(o.comm(), spec.comm()) ||
        o.optimize().policy() != spec.optimize().policy() ||
        !std::equal(o.optimize().passes().begin(), o.optimize().passes().end(),
                    spec.optimize().passes().begin(),
                    spec.optimize().passes().end())) {
      continue;
    }
    absl::StatusOr<std::vector<StoredWorker>> workers = store.LoadWorkers(id);
    if (!workers.ok()) continue;
    std::vector<RankDevice> theirs;
    for (const StoredWorker& w : *workers) {
      theirs.push_back({w.hostname, w.device, w.device_memory_bytes});
    }
    // The same budget: declared budgets are equal (compared above); a budget
    // of 0 is the memory the devices report, which moves a little between
    // runs: within 5%, and the plan's predicted peak must fit the new one.
    const HardwareModel hw = HardwareForJob(o, theirs).hw;
    const double budgets =
        static_cast<double>(std::max(hw.budget(), mine.budget()));
    if (hw.ranks_per_node != mine.ranks_per_node ||
        std::abs(static_cast<double>(hw.budget() - mine.budget())) >
            kCachedBudgetTolerance * budgets) {
      continue;
    }
    absl::StatusOr<std::vector<StoredSchedule>> schedules =
        store.LoadSchedules(id);
    if (!schedules.ok()) continue;
    // The newest schedule that is no comparison's candidate (a trial, a
    // rollback or a drift plan being checked): one still last was never decided
    // (a decided one is followed by its "kept" or "rollback" version), and an
    // undecided plan is not handed out.
    const StoredSchedule* newest = nullptr;
    for (auto s = schedules->rbegin(); s != schedules->rend(); ++s) {
      const v1::Provenance& p = s->schedule.provenance();
      auto has_pass = [&p](absl::string_view prefix) {
        return absl::c_any_of(p.passes(), [prefix](const std::string& pass) {
          return absl::StartsWith(pass, prefix);
        });
      };
      const bool checked_rollback =
          p.reason() == PlanReasonName(PlanReason::kRollback) &&
          has_pass(kRollbackCheckPass);
      const bool checked_drift =
          p.reason() == PlanReasonName(PlanReason::kDrift) &&
          has_pass(kDriftCheckPass);
      if (p.reason() != PlanReasonName(PlanReason::kTrial) &&
          !checked_rollback && !checked_drift) {
        newest = &*s;
        break;
      }
    }
    if (newest == nullptr ||
        newest->schedule.prediction().peak_bytes() > mine.budget()) {
      continue;
    }
    found = CachedPlan{id, newest->schedule};
    found_submitted = other->submitted_unix_s();
  }
  return found;
}

}  // namespace tandem
