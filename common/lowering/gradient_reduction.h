// How a schedule reduces each gradient under gradient accumulation
// (common/README.md, "Schedule"). With K micro-batches a param's gradient is
// either
//   - accumulated unsharded across the micro-batches and reduce-scattered
//     once, after the last backward node producing it (kOnce: fewer bytes on
//     the link, a full-size gradient held from the first micro-batch's
//     backward to that reduce-scatter), or
//   - reduce-scattered after every micro-batch's last backward node producing
//     it, each result added into the rank's sharded fp32 accumulator
//     (kPerMicroBatch, what FSDP and DeepSpeed do: K times the bytes, the
//     full-size gradient held within one micro-batch only).
// The schedule says which by where its REDUCE_SCATTERs are: one of the param
// means kOnce, one per micro-batch that produces it means kPerMicroBatch
// (schedule_semantics.h accepts exactly these two patterns). With one
// micro-batch both are the same schedule. Old schedules keep their meaning:
// they reduce every gradient once.
#ifndef TANDEM_COMMON_LOWERING_GRADIENT_REDUCTION_H_
#define TANDEM_COMMON_LOWERING_GRADIENT_REDUCTION_H_

#include <cstdint>
#include <vector>

#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "common/ir/graph.h"
#include "common/ir/schedule.h"

namespace tandem {

enum class GradientReduction { kNone, kOnce, kPerMicroBatch };
// "none", "once", "micro-batch".
absl::string_view GradientReductionName(GradientReduction reduction);

// The backward nodes of one micro-batch that produce a param's gradient, as
// positions in graph.nodes.
struct GradientProduction {
  int32_t micro_batch = 0;
  int first_pos = 0;
  int last_pos = 0;
};

// Per param (indexed like graph.params), its productions in program order
// (empty for a param no backward node uses, and for a frozen param: its
// backward uses produce no gradient of it).
std::vector<std::vector<GradientProduction>> GradientProductions(
    const Graph& graph);

// Per param (indexed like graph.params), how `schedule` reduces it, by the
// number of REDUCE_SCATTERs naming it: none, one (kOnce), more (kPerMicro
// Batch). Whether the placement is valid is CheckReduceOnce's business.
std::vector<GradientReduction> GradientReductions(const Graph& graph,
                                                  const Schedule& schedule);

// Rewrites the REDUCE_SCATTERs of `param_ids` in `schedule` to `reduction`
// (kOnce or kPerMicroBatch; kNone drops them): each param is taken out of
// every REDUCE_SCATTER (an action left empty is dropped) and added, per
// reduction point, to the REDUCE_SCATTER anchored after that node (one more
// param in an existing collective), or to a new one at the end of the
// node's "after" actions. Params no backward node uses, and frozen params,
// are left alone.
void SetGradientReduction(const Graph& graph,
                          absl::Span<const int32_t> param_ids,
                          GradientReduction reduction, Schedule& schedule);

}  // namespace tandem

#endif  // TANDEM_COMMON_LOWERING_GRADIENT_REDUCTION_H_
