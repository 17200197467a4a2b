#include "common/ir/profile.h"

#include <algorithm>

#include "common/ir/profile_fields.h"

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
  return node_id == other.node_id &&
         FieldsEqual(*this, other, NodeTimingFields());
}

bool CollectiveTiming::operator==(const CollectiveTiming& other) const {
  return kind == other.kind && group_id == other.group_id &&
         param_ids == other.param_ids && node_id == other.node_id &&
         FieldsEqual(*this, other, CollectiveTimingFields());
}

bool MemorySample::operator==(const MemorySample& other) const {
  return node_id == other.node_id &&
         FieldsEqual(*this, other, MemorySampleFields());
}

bool Profile::operator==(const Profile& other) const {
  return graph_hash == other.graph_hash && rank == other.rank &&
         schedule_version == other.schedule_version &&
         first_iteration == other.first_iteration &&
         last_iteration == other.last_iteration &&
         FieldsEqual(*this, other, ProfileHeaderFields()) &&
         allgather_scratch == other.allgather_scratch &&
         reduce_scatter_scratch == other.reduce_scatter_scratch &&
         nodes == other.nodes && collectives == other.collectives &&
         memory == other.memory;
}

// ---------------------------------------------------------------------------
// The measured fields (profile_fields.h), in print order.

namespace {

// A stretch: how many times longer a transfer runs while compute runs.
constexpr FieldBounds kStretch{1, 4, true, "1 to 4 (0: not measured)"};

constexpr ProfileField<Profile> kHeaderFields[] = {
    {"iteration_s", "iteration", &Profile::iteration_s, FieldUnit::kSeconds,
     /*always_printed=*/true, false, kNonNegative, "the iteration time"},
    {"peak_bytes", "peak", &Profile::peak_bytes, FieldUnit::kBytes, true, false,
     kNonNegative, "the peak bytes"},
    // The smallest rank's smallest iteration peak.
    {"peak_min_bytes", "peak_min", &Profile::peak_min_bytes, FieldUnit::kBytes,
     false, false, kNonNegative, "the smallest peak", Combine::kMinPositive},
    // Like node times: the rank with the most work sets the pace.
    {"work", "work", &Profile::work, FieldUnit::kNumber, false, false,
     kNonNegative, "the work"},
    // The host link: the aggregator keeps the slowest rank's bytes and
    // seconds together.
    {"host_copy_bytes", "copied", &Profile::host_copy_bytes, FieldUnit::kBytes,
     false, false, kNonNegative, "the host-copy bytes", Combine::kOwnRule},
    {"host_copy_s", "copy_time", &Profile::host_copy_s, FieldUnit::kSeconds,
     false, false, kNonNegative, "the host-copy time", Combine::kOwnRule},
    {"compute_s_per_allgather_byte", "ag_cpu_per_byte",
     &Profile::compute_s_per_allgather_byte, FieldUnit::kNumber, false, false,
     kNonNegative, "the compute seconds per transferred byte (all-gathers)"},
    {"compute_s_per_reduce_scatter_byte", "rs_cpu_per_byte",
     &Profile::compute_s_per_reduce_scatter_byte, FieldUnit::kNumber, false,
     false, kNonNegative,
     "the compute seconds per transferred byte (reduce-scatters)"},
    {"compute_s_per_copy_byte", "copy_cpu_per_byte",
     &Profile::compute_s_per_copy_byte, FieldUnit::kNumber, false, false,
     kNonNegative, "the compute seconds per transferred byte (host copies)"},
    {"allgather_stretch", "ag_stretch", &Profile::allgather_stretch,
     FieldUnit::kNumber, false, false, kStretch,
     "how many times longer a transfer runs while compute runs"},
    {"reduce_scatter_stretch", "rs_stretch", &Profile::reduce_scatter_stretch,
     FieldUnit::kNumber, false, false, kStretch,
     "how many times longer a transfer runs while compute runs"},
    {"copy_stretch", "copy_stretch", &Profile::copy_stretch, FieldUnit::kNumber,
     false, false, kStretch,
     "how many times longer a transfer runs while compute runs"},
};

constexpr ProfileField<NodeTiming> kNodeFields[] = {
    {"time_s", "time", &NodeTiming::time_s, FieldUnit::kSeconds, true,
     /*positional=*/true, kNonNegative, "the node's time", Combine::kPace},
    {"samples", "samples", &NodeTiming::samples, FieldUnit::kCount, true, false,
     kNonNegative, "the samples", Combine::kFirst},
    // The bytes that moved alongside the slowest rank's time, on that rank.
    {"allgather_overlap_bytes", "ag_overlap",
     &NodeTiming::allgather_overlap_bytes, FieldUnit::kBytes, false, false,
     kNonNegative, "the all-gather bytes moved alongside", Combine::kWithPace},
    {"reduce_scatter_overlap_bytes", "rs_overlap",
     &NodeTiming::reduce_scatter_overlap_bytes, FieldUnit::kBytes, false, false,
     kNonNegative, "the reduce-scatter bytes moved alongside",
     Combine::kWithPace},
    {"copy_overlap_bytes", "copy_overlap", &NodeTiming::copy_overlap_bytes,
     FieldUnit::kBytes, false, false, kNonNegative,
     "the host-copy bytes moved alongside", Combine::kWithPace},
};

constexpr ProfileField<CollectiveTiming> kCollectiveFields[] = {
    {"bytes", "bytes", &CollectiveTiming::bytes, FieldUnit::kBytes, true, false,
     kNonNegative, "the bytes", Combine::kFirst},
    {"issue_to_done_s", "issue_to_done", &CollectiveTiming::issue_to_done_s,
     FieldUnit::kSeconds, true, false, kNonNegative, "the issue-to-done time"},
    {"exposed_s", "exposed", &CollectiveTiming::exposed_s, FieldUnit::kSeconds,
     true, false, kNonNegative, "the exposed time"},
    // The slowest rank's run, with the compute that ran alongside it on
    // that rank (the part the stretch applies to stays paired).
    {"run_s", "run", &CollectiveTiming::run_s, FieldUnit::kSeconds, false,
     false, kNonNegative, "the run time", Combine::kPace},
    {"computing_s", "computing", &CollectiveTiming::computing_s,
     FieldUnit::kSeconds, false, false, kNonNegative,
     "the compute alongside the run", Combine::kWithPace},
};

constexpr ProfileField<MemorySample> kMemoryFields[] = {
    {"before_bytes", "before", &MemorySample::before_bytes, FieldUnit::kBytes,
     true, false, kNonNegative, "the bytes before the node"},
    {"after_bytes", "after", &MemorySample::after_bytes, FieldUnit::kBytes,
     true, false, kNonNegative, "the bytes after the node"},
    {"rise_bytes", "rise", &MemorySample::rise_bytes, FieldUnit::kBytes, false,
     false, kNonNegative, "the node's own rise"},
    // Negative: the node freed more than it kept.
    {"net_bytes", "net", &MemorySample::net_bytes, FieldUnit::kBytes, false,
     false, kAnyFinite, "the node's own net change"},
};

}  // namespace

absl::Span<const ProfileField<Profile>> ProfileHeaderFields() {
  return kHeaderFields;
}
absl::Span<const ProfileField<NodeTiming>> NodeTimingFields() {
  return kNodeFields;
}
absl::Span<const ProfileField<CollectiveTiming>> CollectiveTimingFields() {
  return kCollectiveFields;
}
absl::Span<const ProfileField<MemorySample>> MemorySampleFields() {
  return kMemoryFields;
}

}  // namespace tandem
