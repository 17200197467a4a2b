// Checks every planned schedule's explanation must pass (common/ir/
// explanation.h), shared by the explanation tests and the planner's
// property test. The reference numbers come from simulating the starting
// schedule and the plan directly, not from the decision log.
#ifndef TANDEM_TESTS_UNIT_COORDINATOR_PLANNER_EXPLANATION_CHECKS_H_
#define TANDEM_TESTS_UNIT_COORDINATOR_PLANNER_EXPLANATION_CHECKS_H_

#include <algorithm>
#include <cmath>
#include <string>

#include "common/ir/explanation.h"
#include "common/ir/text_format.h"
#include "common/lowering/lowering.h"
#include "common/sim/simulator.h"
#include "coordinator/planner/planner.h"
#include "gtest/gtest.h"

namespace tandem {

// The rule: the listed gains add up, within 5%, to the predicted
// difference against the baseline (iteration time and exposed
// communication). Attribution by successive re-simulation makes the sum
// telescope, so it is also checked to rounding.
inline void ExpectGainsAddUp(const Graph& graph, const PlanResult& result,
                             ShardingMode mode) {
  const Explanation& e = result.schedule.explanation;
  absl::StatusOr<Schedule> starting = StartingSchedule(graph, mode);
  ASSERT_TRUE(starting.ok()) << starting.status();
  absl::StatusOr<SimResult> baseline = Simulate(graph, *starting, result.hw);
  ASSERT_TRUE(baseline.ok()) << baseline.status();
  absl::StatusOr<SimResult> plan = Simulate(graph, result.schedule, result.hw);
  ASSERT_TRUE(plan.ok()) << plan.status();
  const std::string table =
      FormatExplanation(e, plan->iteration_s, plan->exposed_comm_s);
  SCOPED_TRACE(table);

  EXPECT_EQ(e.baseline_iteration_s, baseline->iteration_s);
  EXPECT_EQ(e.baseline_exposed_comm_s, baseline->exposed_comm_s);
  EXPECT_EQ(e.baseline_peak_bytes, baseline->peak_bytes);

  const double predicted = baseline->iteration_s - plan->iteration_s;
  const double exposed = baseline->exposed_comm_s - plan->exposed_comm_s;
  const double scale = std::max(baseline->iteration_s, 1e-9);
  EXPECT_LE(std::abs(e.TotalGain() - predicted),
            0.05 * std::abs(predicted) + 1e-9 * scale)
      << "gains " << e.TotalGain() << " vs baseline - plan " << predicted;
  EXPECT_LE(std::abs(e.TotalExposedGain() - exposed),
            0.05 * std::abs(exposed) + 1e-9 * scale)
      << "exposed gains " << e.TotalExposedGain() << " vs " << exposed;
  // Telescoping: exact up to rounding.
  EXPECT_NEAR(e.TotalGain(), predicted, 1e-9 * scale);
  EXPECT_NEAR(e.TotalExposedGain(), exposed, 1e-9 * scale);
  int64_t peak_delta = 0;
  for (const Decision& d : e.decisions) peak_delta += d.peak_delta_bytes;
  EXPECT_EQ(peak_delta, plan->peak_bytes - baseline->peak_bytes);

  // Every decision names a pass that ran (or the planner itself).
  for (const Decision& d : e.decisions) {
    EXPECT_FALSE(d.what.empty());
    if (d.pass == "planner") continue;
    EXPECT_NE(std::find(result.schedule.provenance.passes.begin(),
                        result.schedule.provenance.passes.end(), d.pass),
              result.schedule.provenance.passes.end())
        << "decision by '" << d.pass << "', which is not in the provenance";
    if (d.binding.kind == BindingKind::kMemory) {
      EXPECT_TRUE(d.binding.node_id.has_value());
      EXPECT_GT(d.binding.limit_bytes, 0);
    }
  }
  if (result.adopted_policy.has_value()) {
    ASSERT_FALSE(e.decisions.empty());
    EXPECT_EQ(e.decisions.back().kind, DecisionKind::kPolicy);
  }
}

}  // namespace tandem

#endif  // TANDEM_TESTS_UNIT_COORDINATOR_PLANNER_EXPLANATION_CHECKS_H_
