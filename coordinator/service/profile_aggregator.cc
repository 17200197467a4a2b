#include "coordinator/service/profile_aggregator.h"

#include <algorithm>
#include <iterator>

#include "absl/strings/str_cat.h"
#include "common/ir/profile_fields.h"
#include "common/ir/proto_convert.h"
#include "common/ir/validate.h"
#include "common/status_macros.h"

namespace tandem {

absl::StatusOr<Profile> AggregateProfiles(
    const std::map<int32_t, Profile>& by_rank) {
  if (by_rank.empty()) {
    return absl::InvalidArgumentError("no profiles to aggregate");
  }
  Profile out = by_rank.begin()->second;
  out.rank = Profile::kAggregateRank;
  // Node id -> index in out.nodes, for the per-node maxima.
  std::map<int32_t, size_t> node_index;
  for (size_t i = 0; i < out.nodes.size(); ++i) {
    node_index.emplace(out.nodes[i].node_id, i);
  }
  for (const auto& [rank, p] : by_rank) {
    // The header's measured fields by their rules (common/ir/profile.cc):
    // the slowest rank's time, the largest peak, the rank with the most
    // work, the smallest positive peak, the probe's largest coefficients.
    CombineFields(p, ProfileHeaderFields(), &out);
    // The host link (Combine::kOwnRule): the slowest rank's measured rate
    // (the most seconds per byte), its bytes and seconds kept together.
    if (p.host_copy_bytes > 0 && p.host_copy_s > 0 &&
        (out.host_copy_bytes <= 0 ||
         p.host_copy_s * static_cast<double>(out.host_copy_bytes) >
             out.host_copy_s * static_cast<double>(p.host_copy_bytes))) {
      out.host_copy_bytes = p.host_copy_bytes;
      out.host_copy_s = p.host_copy_s;
    }
    // Ranks run the same communicator: the most any reports.
    for (auto [mine, theirs] :
         {std::pair{&out.allgather_scratch, &p.allgather_scratch},
          std::pair{&out.reduce_scatter_scratch, &p.reduce_scatter_scratch}}) {
      mine->copies = std::max(mine->copies, theirs->copies);
      mine->cap_bytes = std::max(mine->cap_bytes, theirs->cap_bytes);
    }
    for (const NodeTiming& t : p.nodes) {
      auto [it, inserted] = node_index.emplace(t.node_id, out.nodes.size());
      if (inserted) {
        out.nodes.push_back(t);
      } else {
        // The slowest rank's time, with the bytes that moved alongside it
        // on that rank (so the interference it suffered stays paired).
        CombineFields(t, NodeTimingFields(), &out.nodes[it->second]);
      }
    }
    if (p.collectives.size() == out.collectives.size()) {
      for (size_t i = 0; i < p.collectives.size(); ++i) {
        CombineFields(p.collectives[i], CollectiveTimingFields(),
                      &out.collectives[i]);
      }
    }
    if (p.memory.size() == out.memory.size()) {
      for (size_t i = 0; i < p.memory.size(); ++i) {
        CombineFields(p.memory[i], MemorySampleFields(), &out.memory[i]);
      }
    }
  }
  // Duplicate node ids within one profile all carry the node's maximum.
  for (NodeTiming& t : out.nodes) {
    t.time_s = std::max(t.time_s, out.nodes[node_index[t.node_id]].time_s);
  }
  return out;
}

int64_t ProfileAggregator::ProfileBytes(const Profile& profile) {
  int64_t bytes =
      sizeof(Profile) + static_cast<int64_t>(profile.graph_hash.capacity()) +
      static_cast<int64_t>(profile.nodes.capacity() * sizeof(NodeTiming)) +
      static_cast<int64_t>(profile.collectives.capacity() *
                           sizeof(CollectiveTiming)) +
      static_cast<int64_t>(profile.memory.capacity() * sizeof(MemorySample));
  for (const CollectiveTiming& c : profile.collectives) {
    bytes += static_cast<int64_t>(c.param_ids.capacity() * sizeof(int32_t));
  }
  return bytes;
}

void ProfileAggregator::EraseWindows(
    std::map<WindowKey, std::map<int32_t, Profile>>::iterator first,
    std::map<WindowKey, std::map<int32_t, Profile>>::iterator last) {
  for (auto it = first; it != last; ++it) {
    for (const auto& [rank, profile] : it->second) {
      held_bytes_ -= ProfileBytes(profile);
    }
  }
  windows_.erase(first, last);
}

absl::Status ProfileAggregator::CheckQuota(int32_t rank, int64_t adding,
                                           int64_t replacing) {
  const int64_t after = held_bytes_ - replacing + adding;
  if (after <= max_held_bytes_) return absl::OkStatus();
  return absl::ResourceExhaustedError(absl::StrCat(
      "profile from rank ", rank, " (", adding,
      " B) would make the job's profiles awaiting the other ranks take ", after,
      " B, past the per-job quota of ", max_held_bytes_, " B (",
      windows_.size(), " open windows, ", early_profiles_.size(),
      " profiles held before the graph): every rank must report the same "
      "windows, and a window this large should be cut shorter "
      "(optimize.warmup_steps)"));
}

std::string ProfileAggregator::Mismatch(int32_t rank, const std::string& hash,
                                        const std::string& reference) {
  return absl::StrCat(
      "graph hash mismatch: rank ", rank, " built graph ", hash,
      " but rank 0 built ", reference,
      "; every rank must build the same model from the same spec");
}

absl::StatusOr<ProfileAggregator::GraphAccepted> ProfileAggregator::SetGraph(
    Graph graph) {
  if (absl::Status s = ValidateGraph(graph); !s.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank 0 sent a malformed graph: ", s.message()));
  }
  const std::string hash = graph.StructuralHash();
  GraphAccepted accepted;
  if (graph_.has_value()) {
    if (hash != graph_hash_) {
      return absl::FailedPreconditionError(absl::StrCat(
          "graph hash mismatch: rank 0 reported graph ", hash, " after graph ",
          graph_hash_,
          "; every rank must build the same model from the same spec"));
    }
    return accepted;
  }
  graph_hash_ = hash;
  graph_ = std::move(graph);
  accepted.is_new = true;
  std::map<int32_t, std::string> hashes = std::move(early_hashes_);
  std::vector<std::pair<int32_t, Profile>> held = std::move(early_profiles_);
  early_hashes_.clear();
  early_profiles_.clear();
  for (const auto& [rank, profile] : held) held_bytes_ -= ProfileBytes(profile);
  for (const auto& [rank, h] : hashes) {
    if (h != graph_hash_) {
      return absl::FailedPreconditionError(Mismatch(rank, h, graph_hash_));
    }
  }
  for (auto& [rank, profile] : held) {
    absl::StatusOr<std::optional<Profile>> aggregate =
        AddProfile(rank, std::move(profile));
    if (!aggregate.ok()) {
      accepted.dropped.emplace_back(aggregate.status().message());
    } else if (aggregate->has_value()) {
      accepted.completed.push_back(**std::move(aggregate));
    }
  }
  return accepted;
}

absl::Status ProfileAggregator::CheckHash(int32_t rank,
                                          const std::string& hash) {
  if (!graph_.has_value()) {
    early_hashes_[rank] = hash;
    return absl::OkStatus();
  }
  if (hash != graph_hash_) {
    return absl::FailedPreconditionError(Mismatch(rank, hash, graph_hash_));
  }
  return absl::OkStatus();
}

absl::StatusOr<Profile> ProfileAggregator::Decode(int32_t rank,
                                                  const v1::Profile& proto) {
  const int64_t entries = int64_t{proto.nodes_size()} +
                          proto.collectives_size() + proto.memory_size();
  if (entries > kMaxProfileEntries) {
    return absl::InvalidArgumentError(absl::StrCat(
        "profile from rank ", rank, " has ", entries, " entries; at most ",
        kMaxProfileEntries, " are accepted: send shorter windows"));
  }
  return FromProto(proto);
}

absl::StatusOr<std::optional<Profile>> ProfileAggregator::AddProfile(
    int32_t rank, Profile profile) {
  if (rank < 0 || rank >= world_size_) {
    return absl::InvalidArgumentError(absl::StrCat("profile from rank ", rank,
                                                   ": the job's ranks are 0..",
                                                   world_size_ - 1));
  }
  if (!graph_.has_value()) {
    const int held = static_cast<int>(
        std::count_if(early_profiles_.begin(), early_profiles_.end(),
                      [rank](const auto& e) { return e.first == rank; }));
    if (held >= kMaxEarlyProfilesPerRank) {
      return absl::FailedPreconditionError(absl::StrCat(
          "rank ", rank, " sent more than ", kMaxEarlyProfilesPerRank,
          " profiles before the graph: rank 0 must report the graph first"));
    }
    const int64_t bytes = ProfileBytes(profile);
    RETURN_IF_ERROR(CheckQuota(rank, bytes, 0));
    held_bytes_ += bytes;
    early_profiles_.emplace_back(rank, std::move(profile));
    return std::nullopt;
  }
  if (absl::Status s = ValidateProfile(profile, *graph_); !s.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("profile from rank ", rank, ": ", s.message()));
  }
  const WindowKey key(profile.first_iteration, profile.last_iteration);
  if (last_completed_.has_value() && key <= *last_completed_) {
    return std::nullopt;
  }
  const int64_t bytes = ProfileBytes(profile);
  auto window = windows_.find(key);
  int64_t replacing = 0;
  if (window != windows_.end()) {
    auto earlier = window->second.find(rank);
    if (earlier != window->second.end()) {
      replacing = ProfileBytes(earlier->second);
    }
  }
  // The profile that completes its window is aggregated at once and held
  // by nobody: only one that waits counts against the quota.
  const bool completes =
      window != windows_.end() &&
      static_cast<int32_t>(window->second.size() + (replacing > 0 ? 0 : 1)) >=
          world_size_;
  if (!completes && world_size_ > 1) {
    RETURN_IF_ERROR(CheckQuota(rank, bytes, replacing));
  }
  if (window == windows_.end()) {
    if (static_cast<int>(windows_.size()) >= kMaxOpenWindows) {
      // Full: the oldest window goes, which may be this one.
      if (key < windows_.begin()->first) return std::nullopt;
      EraseWindows(windows_.begin(), std::next(windows_.begin()));
    }
    window = windows_.emplace(key, std::map<int32_t, Profile>()).first;
  }
  held_bytes_ += bytes - replacing;
  window->second[rank] = std::move(profile);
  if (static_cast<int32_t>(window->second.size()) < world_size_) {
    return std::nullopt;
  }
  absl::StatusOr<Profile> aggregate = AggregateProfiles(window->second);
  EraseWindows(windows_.begin(), std::next(window));
  last_completed_ = key;
  if (!aggregate.ok()) return aggregate.status();
  return std::optional<Profile>(*std::move(aggregate));
}

}  // namespace tandem
