// One job's profiles, from what each rank sends to what the planner reads:
//
//   - graph agreement: rank 0 sends the graph, every rank the structural hash
//     of the graph it built; a rank whose hash differs ran a different model,
//     which no schedule can serve, so it is an error that fails the job;
//   - early profiles: a rank may profile before rank 0's graph arrives; a few
//     per rank are held and checked once it comes;
//   - windows: each rank profiles the same window of iterations; a window
//     completes when every rank has reported it, and its aggregate is what
//     the job ran at: time of the slowest rank, memory of the largest.
//
// Pure logic with no lock: the owner (PlanningManager) serializes calls.
#ifndef TANDEM_COORDINATOR_SERVICE_PROFILE_AGGREGATOR_H_
#define TANDEM_COORDINATOR_SERVICE_PROFILE_AGGREGATOR_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/ir/graph.h"
#include "common/ir/profile.h"
#include "tandem/v1/profile.pb.h"

namespace tandem {

// The aggregate of one window over ranks: iteration time, peak, work and
// each node's time are the maxima over ranks (a node absent from the first
// rank's profile is added; a node's overlap bytes are those of the rank whose
// time is kept), and so are the interference probe's compute seconds per byte.
// Collectives and memory samples are matched by position, and only against
// ranks whose lists have the first rank's length (a rank that recorded a
// different sequence cannot be matched entry by entry); issue-to-done and
// exposed times, before and after bytes take the maxima. Everything else
// (window, schedule version, samples, run times) is the first rank's; rank is
// Profile::kAggregateRank. InvalidArgument when `by_rank` is empty.
absl::StatusOr<Profile> AggregateProfiles(
    const std::map<int32_t, Profile>& by_rank);

class ProfileAggregator {
 public:
  // Profiles held per rank while rank 0's graph is on its way.
  static constexpr int kMaxEarlyProfilesPerRank = 4;
  // Entries (nodes, collectives and memory samples) one profile may hold,
  // against oversized messages.
  static constexpr int kMaxProfileEntries = 200000;
  // Windows that some ranks reported and others not yet. Ranks run in
  // lockstep, so more than a couple means a rank cuts windows differently;
  // the oldest is dropped rather than held forever (and a profile of a window
  // older than every open one is then ignored).
  static constexpr int kMaxOpenWindows = 8;

  // What taking rank 0's graph produced.
  struct GraphAccepted {
    // False when rank 0 sent the same graph again (a reconnect): nothing to
    // persist.
    bool is_new = false;
    // Windows that the held profiles completed, oldest first.
    std::vector<Profile> completed;
    // Why held profiles were refused (each message names the rank); they are
    // dropped.
    std::vector<std::string> dropped;
  };

  // Bytes of profiles one job may hold before aggregation (early profiles
  // and open windows together), against a client that sends large windows
  // nobody completes; past it AddProfile is refused (coordinator/README.md,
  // "Limits").
  static constexpr int64_t kDefaultMaxHeldBytes = int64_t{256} << 20;

  explicit ProfileAggregator(int32_t world_size,
                             int64_t max_held_bytes = kDefaultMaxHeldBytes)
      : world_size_(world_size), max_held_bytes_(max_held_bytes) {}

  // Rank 0's graph: the reference for every hash and profile. Errors:
  // InvalidArgument for a malformed graph (what is wrong), nothing changes;
  // FailedPrecondition when a rank's hash differs from this graph's, or
  // rank 0 sent a different graph before ("graph hash mismatch: rank R built
  // graph H but rank 0 built H0; ..."). The job cannot run then; on a
  // mismatch with held hashes the graph is still kept and the held profiles
  // are dropped.
  absl::StatusOr<GraphAccepted> SetGraph(Graph graph);
  // A rank's graph hash (rank 0's too when it sent no graph): compared with
  // rank 0's graph, or held until it comes. FailedPrecondition on a mismatch,
  // as SetGraph.
  absl::Status CheckHash(int32_t rank, const std::string& hash);

  // One rank's profile of a window. Returns the window's aggregate when this
  // profile completes it (older open windows are then dropped: the job moved
  // past them), else nullopt; a profile of a window at or before the last
  // completed one is stale and ignored. A rank that reports a window again
  // replaces its earlier profile. Before rank 0's graph, the profile is held
  // (nullopt). Errors, after which nothing is recorded: InvalidArgument for a
  // rank outside the world or a profile not valid for the graph ("profile
  // from rank R: ..."); FailedPrecondition when the rank already has
  // kMaxEarlyProfilesPerRank profiles held before the graph;
  // ResourceExhausted when holding it would pass the job's byte quota.
  absl::StatusOr<std::optional<Profile>> AddProfile(int32_t rank,
                                                    Profile profile);
  // A rank's profile as it arrives, the one way in from the wire (README.md,
  // "The path of a profile"): its size bound (kMaxProfileEntries) and its
  // one conversion (FromProto); AddProfile then validates it against the
  // graph. Static, so that the owner converts outside its lock.
  // InvalidArgument for a profile over the bound ("profile from rank R has
  // N entries; ...") or one that does not convert.
  static absl::StatusOr<Profile> Decode(int32_t rank, const v1::Profile& proto);

  // Rank 0's graph; null until it arrives.
  const Graph* graph() const { return graph_ ? &*graph_ : nullptr; }
  const std::string& graph_hash() const { return graph_hash_; }
  // Profiles held before the graph, over all ranks.
  int held_profiles() const { return static_cast<int>(early_profiles_.size()); }
  // Windows some but not all ranks reported.
  int open_windows() const { return static_cast<int>(windows_.size()); }
  // What the held profiles take, about (their vectors' sizes).
  int64_t held_bytes() const { return held_bytes_; }
  // About what one profile takes in memory.
  static int64_t ProfileBytes(const Profile& profile);

 private:
  using WindowKey = std::pair<int64_t, int64_t>;  // first, last iteration

  static std::string Mismatch(int32_t rank, const std::string& hash,
                              const std::string& reference);

  // Erases windows_ [first, last), keeping held_bytes_.
  void EraseWindows(std::map<std::pair<int64_t, int64_t>,
                             std::map<int32_t, Profile>>::iterator first,
                    std::map<std::pair<int64_t, int64_t>,
                             std::map<int32_t, Profile>>::iterator last);
  absl::Status CheckQuota(int32_t rank, int64_t adding, int64_t replacing);

  int32_t world_size_;
  int64_t max_held_bytes_;
  int64_t held_bytes_ = 0;
  std::optional<Graph> graph_;
  std::string graph_hash_;
  // Before the graph: each rank's hash and its profiles, in arrival order.
  std::map<int32_t, std::string> early_hashes_;
  std::vector<std::pair<int32_t, Profile>> early_profiles_;
  std::map<WindowKey, std::map<int32_t, Profile>> windows_;
  std::optional<WindowKey> last_completed_;
};

}  // namespace tandem

#endif  // TANDEM_COORDINATOR_SERVICE_PROFILE_AGGREGATOR_H_
