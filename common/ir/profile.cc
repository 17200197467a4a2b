#include "common/ir/profile.h"

#include <algorithm>

namespace tandem {

int64_t CollectiveScratch::Bytes(int64_t padded) const {
  const int64_t bytes = copies * std::max<int64_t>(padded, 0);
  return cap_bytes > 0 ? std::min(bytes, cap_bytes) : bytes;
}

absl::string_view CollectiveKindName(CollectiveKind kind) {
  switch (kind) {
    case CollectiveKind::kAllGather:
      return "allgather";
    case CollectiveKind::kReduceScatter:
      return "reduce_scatter";
    case CollectiveKind::kAllReduce:
      return "allreduce";
  }
  return "?";
}

std::optional<CollectiveKind> ParseCollectiveKind(absl::string_view name) {
  for (CollectiveKind k :
       {CollectiveKind::kAllGather, CollectiveKind::kReduceScatter,
        CollectiveKind::kAllReduce}) {
    if (CollectiveKindName(k) == name) return k;
  }
  return std::nullopt;
}

bool NodeTiming::operator==(const NodeTiming& other) const {
  return node_id == other.node_id && time_s == other.time_s &&
         samples == other.samples &&
         allgather_overlap_bytes == other.allgather_overlap_bytes &&
         reduce_scatter_overlap_bytes == other.reduce_scatter_overlap_bytes &&
         copy_overlap_bytes == other.copy_overlap_bytes;
}

bool CollectiveTiming::operator==(const CollectiveTiming& other) const {
  return kind == other.kind && group_id == other.group_id &&
         param_ids == other.param_ids && bytes == other.bytes &&
         issue_to_done_s == other.issue_to_done_s &&
         exposed_s == other.exposed_s && node_id == other.node_id &&
         run_s == other.run_s && computing_s == other.computing_s;
}

bool MemorySample::operator==(const MemorySample& other) const {
  return node_id == other.node_id && before_bytes == other.before_bytes &&
         after_bytes == other.after_bytes && rise_bytes == other.rise_bytes &&
         net_bytes == other.net_bytes;
}

bool Profile::operator==(const Profile& other) const {
  return graph_hash == other.graph_hash && rank == other.rank &&
         schedule_version == other.schedule_version &&
         first_iteration == other.first_iteration &&
         last_iteration == other.last_iteration &&
         iteration_s == other.iteration_s && peak_bytes == other.peak_bytes &&
         peak_min_bytes == other.peak_min_bytes && work == other.work &&
         host_copy_bytes == other.host_copy_bytes &&
         host_copy_s == other.host_copy_s &&
         compute_s_per_allgather_byte == other.compute_s_per_allgather_byte &&
         compute_s_per_reduce_scatter_byte ==
             other.compute_s_per_reduce_scatter_byte &&
         compute_s_per_copy_byte == other.compute_s_per_copy_byte &&
         allgather_stretch == other.allgather_stretch &&
         reduce_scatter_stretch == other.reduce_scatter_stretch &&
         copy_stretch == other.copy_stretch &&
         allgather_scratch == other.allgather_scratch &&
         reduce_scatter_scratch == other.reduce_scatter_scratch &&
         nodes == other.nodes && collectives == other.collectives &&
         memory == other.memory;
}

}  // namespace tandem
