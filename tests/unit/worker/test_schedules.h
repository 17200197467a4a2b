// Schedules the worker's numerics tests run (executor_test.cc,
// archive_program_test.cc): the standard ones of
// worker/runtime/standard_schedules.h, failing the test (not aborting) when
// the graph does not admit them.
#ifndef TANDEM_TESTS_UNIT_WORKER_TEST_SCHEDULES_H_
#define TANDEM_TESTS_UNIT_WORKER_TEST_SCHEDULES_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "common/ir/graph.h"
#include "common/ir/schedule.h"
#include "gtest/gtest.h"
#include "worker/runtime/standard_schedules.h"

namespace tandem {

// Each param gathered just before its use and released after.
inline Schedule OnDemand(const Graph& g, int64_t version = 1) {
  absl::StatusOr<Schedule> s = OnDemandSchedule(g, version);
  EXPECT_TRUE(s.ok()) << s.status();
  return *s;
}

// On-demand with every gather issued two nodes early.
inline Schedule Prefetch(const Graph& g, int64_t version = 1) {
  absl::StatusOr<Schedule> s = HoistGathers(g, OnDemand(g, version), 2);
  EXPECT_TRUE(s.ok()) << s.status();
  return *s;
}

// Every param gathered once and kept.
inline Schedule Persistent(const Graph& g, int64_t version = 1) {
  absl::StatusOr<Schedule> s = AllPersistentSchedule(g, version);
  EXPECT_TRUE(s.ok()) << s.status();
  return *s;
}

}  // namespace tandem

#endif  // TANDEM_TESTS_UNIT_WORKER_TEST_SCHEDULES_H_
