// The profile IR: what one rank (or the aggregate over ranks) measured over a
// window of iterations under one schedule version.
#ifndef TANDEM_COMMON_IR_PROFILE_H_
#define TANDEM_COMMON_IR_PROFILE_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"

namespace tandem {

struct NodeTiming {
  int32_t node_id = 0;
  double time_s = 0;
  int32_t samples = 0;
  // Bytes all-gathers, reduce-scatters and host-tier copies moved while the
  // node computed, mean per sample (each transfer's bytes times the share of
  // its run inside the node, waits excluded): with the compute_s_per_*_byte
  // below, the time the node lost to them.
  int64_t allgather_overlap_bytes = 0;
  int64_t reduce_scatter_overlap_bytes = 0;
  int64_t copy_overlap_bytes = 0;
  bool operator==(const NodeTiming& other) const;
};

enum class CollectiveKind { kAllGather, kReduceScatter, kAllReduce };
// "allgather", "reduce_scatter", "allreduce".
absl::string_view CollectiveKindName(CollectiveKind kind);
std::optional<CollectiveKind> ParseCollectiveKind(absl::string_view name);

struct CollectiveTiming {
  CollectiveKind kind = CollectiveKind::kAllGather;
  // kAllGather: the gather group.
  int32_t group_id = 0;
  // kReduceScatter / kAllReduce: the params reduced.
  std::vector<int32_t> param_ids;
  // Full (unsharded) bytes.
  int64_t bytes = 0;
  double issue_to_done_s = 0;
  // Part of issue_to_done_s compute waited for.
  double exposed_s = 0;
  // Node the collective was issued at.
  int32_t node_id = 0;
  // Time it ran on the stream (issue_to_done_s less queueing); 0: unknown.
  double run_s = 0;
  // Part of run_s this rank's compute thread was computing (not waiting):
  // with the profile's stretch, what the collective took alone.
  double computing_s = 0;
  bool operator==(const CollectiveTiming& other) const;
};

struct MemorySample {
  int32_t node_id = 0;
  int64_t before_bytes = 0;
  int64_t after_bytes = 0;
  // The node's own memory (worker/README.md, "Profiling"): the most the
  // compute thread's allocations rose above their level at the node's
  // start while it ran (its temporaries and what it left), and where they
  // stood at its end against that level (negative: it freed more than it
  // kept). Other threads' buffers and frees are left out. Both 0: not
  // measured.
  int64_t rise_bytes = 0;
  int64_t net_bytes = 0;
  bool operator==(const MemorySample& other) const;
};

// Scratch memory a collective holds beyond its flat buffers (its packed
// input and output) while it runs, as the worker's communicator allocates
// it: for a collective of `padded` bytes, min(copies·padded, cap_bytes)
// (cap_bytes 0: no cap). On Gloo an all-gather receives straight into its
// output (copies 0), and a reduce-scatter receives all but one peer's
// contribution into scratch (none at world 2; at most one copy beyond,
// capped at the pieces in flight when collectives go in pieces); NCCL's own
// buffers are not counted (copies 0). Profiles from older workers carry
// their own, larger rules.
inline constexpr int32_t kMaxScratchCopies = 4;
struct CollectiveScratch {
  int32_t copies = 0;
  int64_t cap_bytes = 0;
  int64_t Bytes(int64_t padded) const;
  bool operator==(const CollectiveScratch& other) const {
    return copies == other.copies && cap_bytes == other.cap_bytes;
  }
};

struct Profile {
  static constexpr int32_t kAggregateRank = -1;

  std::string graph_hash;
  int32_t rank = 0;
  int64_t schedule_version = 0;
  int64_t first_iteration = 0;
  int64_t last_iteration = 0;
  double iteration_s = 0;
  int64_t peak_bytes = 0;
  // The smallest iteration peak in the window (an aggregate: the smallest
  // rank's); peak_bytes - peak_min_bytes is the spread of peaks the planner
  // keeps headroom for. 0: not measured.
  int64_t peak_min_bytes = 0;
  // Elements of the rank's batch inputs in the window's median iteration
  // (an aggregate: the largest rank's): the work the node times were
  // measured at. It varies with variable-length batches; the coordinator
  // scales step times to a common work before judging drift. 0: not
  // measured.
  double work = 0;
  // Host-tier copies (OFFLOAD and RELOAD) over the window: bytes moved and
  // seconds the copy stream spent moving them. Their ratio is the host link
  // the planner prices offloading with. When no copy ran, the worker's
  // probe copy (worker/README.md, "Profiling"); 0 without either.
  int64_t host_copy_bytes = 0;
  double host_copy_s = 0;
  // Compute time a transfer takes from compute per byte it moves (the
  // worker's interference probe; 0: not measured). Bytes: a collective's
  // full padded buffer, a copy's bytes.
  double compute_s_per_allgather_byte = 0;
  double compute_s_per_reduce_scatter_byte = 0;
  double compute_s_per_copy_byte = 0;
  // How many times longer a transfer runs while compute runs than alone
  // (the probe's; 0: not measured, else 1..4).
  double allgather_stretch = 0;
  double reduce_scatter_stretch = 0;
  double copy_stretch = 0;
  // The communicator's scratch rule per collective kind (not measured:
  // copies 0).
  CollectiveScratch allgather_scratch;
  CollectiveScratch reduce_scatter_scratch;
  std::vector<NodeTiming> nodes;
  std::vector<CollectiveTiming> collectives;
  std::vector<MemorySample> memory;

  bool operator==(const Profile& other) const;
  bool operator!=(const Profile& other) const { return !(*this == other); }
};

}  // namespace tandem

#endif  // TANDEM_COMMON_IR_PROFILE_H_
