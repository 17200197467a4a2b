// The plan cache (coordinator/README.md, "Plan cache"): a job identical to
// an earlier one starts on that job's plan from step 1 instead of learning
// it again through the warm-up. Pure lookup over the store and the job
// manager; the planning manager queues what it finds as a "cached" version.
#ifndef TANDEM_COORDINATOR_SERVICE_PLAN_CACHE_H_
#define TANDEM_COORDINATOR_SERVICE_PLAN_CACHE_H_

#include <optional>
#include <string>
#include <vector>

#include "coordinator/planner/job_plan.h"
#include "coordinator/service/job_manager.h"
#include "coordinator/store/job_store.h"
#include "tandem/v1/schedule.pb.h"

namespace tandem {

// How far the budget of a job with memory.budget_bytes 0 (the memory its
// devices report) may move between runs for a cached plan to apply.
inline constexpr double kCachedBudgetTolerance = 0.05;

struct CachedPlan {
  // The earlier job and its schedule.
  std::string job_id;
  v1::Schedule schedule;
};

// The newest schedule that is no undecided trial (a trial still last: a
// decided one is followed by its "kept" or "rollback" version) of the most
// recently submitted earlier job, running or succeeded, with the same graph
// hash, model, batch, world, declared budget and hardware, pipeline and
// comm settings, the same ranks per node, and a budget within
// kCachedBudgetTolerance (a budget of 0 follows the memory the devices
// report) that the plan's predicted peak fits. Nullopt when none.
std::optional<CachedPlan> FindCachedPlan(
    JobManager& jobs, JobStore& store, const v1::Job& job,
    const std::string& graph_hash, const std::vector<RankDevice>& devices);

}  // namespace tandem

#endif  // TANDEM_COORDINATOR_SERVICE_PLAN_CACHE_H_
