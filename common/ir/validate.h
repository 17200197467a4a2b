// Semantic checks for the IR. Every check returns InvalidArgument with a
// message that names the offending element and says what to fix; lists of
// offenders are capped. Parsing (text_format.h, proto_convert.h) checks only
// syntax, so run these on anything that comes from outside.
#ifndef TANDEM_COMMON_IR_VALIDATE_H_
#define TANDEM_COMMON_IR_VALIDATE_H_

#include "absl/status/status.h"
#include "common/ir/graph.h"
#include "common/ir/profile.h"
#include "common/ir/schedule.h"

namespace tandem {

// A graph is valid when: world_size and micro_batches are >= 1; param and
// node ids are non-negative and unique, and so are their names; every param
// has a non-empty shape of dimensions >= 1; every node names known params,
// has finite non-negative flops, time and byte counts and a micro-batch in
// [0, micro_batches); every backward node names (`of`) a forward node earlier
// in the graph of the same micro-batch that no other backward node mirrors,
// and uses the same params; forward nodes carry no twin and no recompute
// flag; optimizer nodes name no params (they step shards) and come after
// every backward node.
absl::Status ValidateGraph(const Graph& graph);

// A schedule is valid for `graph` when: its graph_hash is the graph's
// structural hash; group, offload and param ids are known and group and
// offload ids are unique; no group is empty and no param is in two groups;
// offload entries name only trained params (a frozen one has no state);
// every action names a known node and, by kind, a known group, a non-empty
// list of known params, or a known offload entry; predictions are finite and
// non-negative. It does not check the plan's semantics (use-before-gather and
// the like): those are the planner's invariant checkers.
absl::Status ValidateSchedule(const Schedule& schedule, const Graph& graph);

// A profile is valid for `graph` when its graph_hash matches, its window is
// ordered, every node and param it names exists, and every time and byte
// count is finite and non-negative.
absl::Status ValidateProfile(const Profile& profile, const Graph& graph);

}  // namespace tandem

#endif  // TANDEM_COMMON_IR_VALIDATE_H_
