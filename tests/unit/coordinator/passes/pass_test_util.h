// Shared by the pass tests: fixtures from tests/testdata/passes, the small
// hardware model they are written for, and the schedule's action text.
#ifndef TANDEM_TESTS_UNIT_COORDINATOR_PASSES_PASS_TEST_UTIL_H_
#define TANDEM_TESTS_UNIT_COORDINATOR_PASSES_PASS_TEST_UTIL_H_

#include <cstdint>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/ir/graph.h"
#include "common/ir/schedule.h"
#include "common/ir/text_format.h"
#include "common/sim/hardware_model.h"

namespace tandem::testing {

// Parses tests/testdata/passes/<name>.
inline absl::StatusOr<Graph> LoadPassGraph(const std::string& name) {
  std::ifstream in(std::string(TANDEM_TESTDATA_DIR) + "/passes/" + name);
  if (!in) {
    return absl::NotFoundError("missing fixture tests/testdata/passes/" + name);
  }
  std::stringstream text;
  text << in.rdbuf();
  return ParseGraph(text.str());
}

// The fixtures' machine: 2 ranks at 0.5e9 B/s each, so a collective of 1e6
// bytes takes 1 ms plus `latency_s`; host link 1e9 B/s; 1 TiB of memory and
// `budget_bytes` of it usable (0: all).
inline HardwareModel PassTestHardware(double latency_s = 0,
                                      int64_t budget_bytes = 0) {
  HardwareModel hw;
  hw.world_size = 2;
  hw.ranks_per_node = 8;
  hw.intra_node_bytes_per_s = 0.5e9;
  hw.inter_node_bytes_per_s = 0.5e9;
  hw.collective_latency_s = latency_s;
  hw.host_bytes_per_s = 1e9;
  hw.device_memory_bytes = int64_t{1} << 40;
  hw.budget_bytes = budget_bytes;
  return hw;
}

// The schedule's text without its header, prediction and provenance lines:
// groups, persistent set, offload entries and actions, one per line.
inline std::string ScheduleBody(const Schedule& schedule) {
  std::vector<std::string> kept;
  for (absl::string_view line :
       absl::StrSplit(PrintSchedule(schedule), '\n', absl::SkipEmpty())) {
    if (absl::StartsWith(line, "schedule ") ||
        absl::StartsWith(line, "predict ") ||
        absl::StartsWith(line, "provenance ")) {
      continue;
    }
    kept.emplace_back(line);
  }
  return absl::StrJoin(kept, "\n") + "\n";
}

}  // namespace tandem::testing

#endif  // TANDEM_TESTS_UNIT_COORDINATOR_PASSES_PASS_TEST_UTIL_H_
