#include "common/sim/simulator.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <deque>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/lowering/anchored_schedule.h"
#include "common/lowering/persistent_refresh.h"

namespace tandem {

namespace {

// Id -> position in a vector of IR elements; the first of duplicate ids wins.
// Dense ids (the common case: 0..n-1) use a plain vector, others a hash map,
// so lookups stay cheap when a pass re-simulates many times.
class IdIndex {
 public:
  template <typename T>
  explicit IdIndex(const std::vector<T>& items) {
    int64_t max_id = -1;
    bool dense = true;
    for (const T& item : items) {
      if (item.id < 0) dense = false;
      max_id = std::max<int64_t>(max_id, item.id);
    }
    dense = dense && max_id < 4 * static_cast<int64_t>(items.size()) + 64;
    if (dense) {
      dense_.assign(static_cast<size_t>(max_id + 1), -1);
      for (size_t i = 0; i < items.size(); ++i) {
        int& slot = dense_[static_cast<size_t>(items[i].id)];
        if (slot < 0) slot = static_cast<int>(i);
      }
    } else {
      use_map_ = true;
      for (size_t i = 0; i < items.size(); ++i) {
        sparse_.emplace(items[i].id, static_cast<int>(i));
      }
    }
  }

  // Position of `id`, or -1.
  int Find(int32_t id) const {
    if (use_map_) {
      auto it = sparse_.find(id);
      return it == sparse_.end() ? -1 : it->second;
    }
    if (id < 0 || static_cast<size_t>(id) >= dense_.size()) return -1;
    return dense_[static_cast<size_t>(id)];
  }

 private:
  bool use_map_ = false;
  std::vector<int> dense_;
  absl::flat_hash_map<int32_t, int> sparse_;
};

enum MemoryKind : uint8_t {
  kShardedParams,
  kPersistentParams,
  kGatheredParams,
  kActivations,
  kGradients,
  kOptimizerStates,
  kCollectiveBuffers,
  kUnmodeled,
  kNumMemoryKinds,
};

// Order of memory events at one instant: allocations by other streams first,
// then the compute stream's own events in program order, then frees by other
// streams. What compute does in sequence (release g0, then gather g1) is
// known; how another stream's event interleaves with it is not, so it gets
// the order that never underestimates the peak.
enum EventOrder : uint8_t {
  // A collective's buffer freed as it ends: what starts at that instant on
  // the communication stream (the next collective) or waited for it on the
  // compute stream (a WAIT) comes after.
  kCollectiveBufferFree,
  kAsyncAllocation,
  kProgramOrder,
  kAsyncFree,
};

struct MemoryEvent {
  double time;
  int64_t delta;
  uint32_t seq;
  EventOrder order;
  MemoryKind kind;
};

bool EventBefore(const MemoryEvent& a, const MemoryEvent& b) {
  if (a.time != b.time) return a.time < b.time;
  if (a.order != b.order) return a.order < b.order;
  return a.seq < b.seq;
}

// Whether the point in program order at `time` where `marker_seq` events had
// been recorded comes before `e`.
bool MarkerBefore(double time, uint32_t marker_seq, const MemoryEvent& e) {
  if (time != e.time) return time < e.time;
  return e.order == kAsyncFree ||
         (e.order == kProgramOrder && marker_seq <= e.seq);
}

struct ParamInfo {
  int64_t full_bytes = 0;
  // This rank's shard, and the padded full buffer a collective moves.
  int64_t shard_bytes = 0;
  int64_t padded_bytes = 0;
  int64_t state_bytes = 0;
  // The gradient shard and the reduce-scatter's padded buffer, in the
  // graph's reduce dtype.
  int64_t grad_shard_bytes = 0;
  int64_t reduce_bytes = 0;
};

struct GroupInfo {
  std::vector<int> param_pos;
  int64_t full_bytes = 0;
  int64_t padded_bytes = 0;
};

std::string DescribeAction(int index, const Action& action) {
  std::string target;
  switch (action.kind) {
    case ActionKind::kAllGather:
    case ActionKind::kWait:
    case ActionKind::kRelease:
      target = absl::StrCat("g", action.group_id);
      break;
    case ActionKind::kReduceScatter:
      for (size_t i = 0; i < action.param_ids.size(); ++i) {
        if (i == 8) {
          absl::StrAppend(&target, ",...");
          break;
        }
        absl::StrAppend(&target, i == 0 ? "p" : ",p", action.param_ids[i]);
      }
      break;
    case ActionKind::kOffload:
    case ActionKind::kReload:
      target = absl::StrCat("o", action.offload_id);
      break;
  }
  return absl::StrCat("action ", index, " (",
                      AnchorPositionName(action.position), " n", action.node_id,
                      " ", ActionKindName(action.kind), " ", target, ")");
}

// One replay. Resolves every id once, buckets the actions by anchor, walks
// the nodes in order keeping the three streams' clocks, and records memory as
// events that are sorted and swept once at the end.
class Replay {
 public:
  Replay(const Graph& graph, const Schedule& schedule, const HardwareModel& hw)
      : graph_(graph),
        schedule_(schedule),
        hw_(hw),
        zero1_(schedule.mode == ShardingMode::kZero1),
        alone_(graph.world_size <= 1),
        param_index_(graph.params),
        node_index_(graph.nodes) {}

  absl::StatusOr<SimResult> Run() {
    absl::Status status = Resolve();
    if (!status.ok()) return status;
    status = Walk();
    if (!status.ok()) return status;
    SweepMemory();
    return std::move(result_);
  }

 private:
  absl::Status Resolve() {
    const int world = std::max(graph_.world_size, 1);
    params_.resize(graph_.params.size());
    for (size_t i = 0; i < graph_.params.size(); ++i) {
      const Param& p = graph_.params[i];
      const int64_t elem = DTypeBytes(p.dtype);
      const int64_t shard = p.shard_numel(world);
      ParamInfo& info = params_[i];
      info.full_bytes = p.bytes();
      info.shard_bytes = shard * elem;
      info.padded_bytes = shard * world * elem;
      info.grad_shard_bytes = graph_.GradShardBytes(p);
      info.reduce_bytes = graph_.ReduceScatterBytes(p);
      // A frozen param has no gradient and no optimizer state.
      info.state_bytes =
          p.trainable ? shard * OptimizerStateBytesPerElement(p.dtype) : 0;
      base_[kShardedParams] += zero1_ ? info.full_bytes : info.shard_bytes;
      if (p.trainable) base_[kGradients] += info.grad_shard_bytes;
      base_[kOptimizerStates] += info.state_bytes;
      if (p.trainable && shard > 0) {
        // The worker's AdamW holds, param by param, an fp32 denominator
        // and (for a gradient not in fp32) an fp32 copy of the gradient:
        // the largest param's are the optimizer's transient.
        const int64_t grad_elem = info.grad_shard_bytes / shard;
        optimizer_transient_bytes_ = std::max(
            optimizer_transient_bytes_, shard * (4 + (grad_elem == 4 ? 0 : 4)));
      }
    }
    base_[kUnmodeled] = std::max<int64_t>(hw_.unmodeled_bytes, 0);
    std::vector<bool> persistent(graph_.params.size(), false);
    std::vector<int32_t> refreshed;
    for (int32_t id : schedule_.persistent_param_ids) {
      const int pos = param_index_.Find(id);
      if (pos < 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            "schedule: persistent param p", id,
            " is not in the graph; drop it or re-plan for this graph"));
      }
      // ZeRO-1 already counts every param in full.
      if (persistent[pos] || zero1_) continue;
      persistent[pos] = true;
      if (!alone_) base_[kPersistentParams] += params_[pos].full_bytes;
      // The optimizer does not update a frozen param: nothing to refresh.
      if (graph_.params[pos].trainable) refreshed.push_back(id);
    }
    // The refresh in the worker's chunks (common/lowering/
    // persistent_refresh.h), each with its params' positions.
    refresh_chunk_of_.assign(graph_.params.size(), -1);
    for (const std::vector<int32_t>& ids :
         PersistentRefreshChunks(graph_, refreshed)) {
      RefreshChunk chunk;
      for (int32_t id : ids) {
        const int pos = param_index_.Find(id);
        refresh_chunk_of_[pos] = static_cast<int>(refresh_chunks_.size());
        chunk.bytes += params_[pos].padded_bytes;
      }
      refresh_chunks_.push_back(chunk);
    }
    // Per node, the last chunk it needs (chunks finish in order).
    node_refresh_chunk_.assign(graph_.nodes.size(), -1);
    for (size_t i = 0; i < graph_.nodes.size() && !refresh_chunks_.empty();
         ++i) {
      for (int32_t id : graph_.nodes[i].param_ids) {
        const int pos = param_index_.Find(id);
        if (pos >= 0) {
          node_refresh_chunk_[i] =
              std::max(node_refresh_chunk_[i], refresh_chunk_of_[pos]);
        }
      }
    }

    node_param_pos_.resize(graph_.nodes.size());
    forward_pos_.assign(graph_.nodes.size(), -1);
    for (size_t i = 0; i < graph_.nodes.size(); ++i) {
      const Node& n = graph_.nodes[i];
      if (n.phase == Phase::kBackward) {
        node_param_pos_[i].reserve(n.param_ids.size());
        for (int32_t id : n.param_ids) {
          const int pos = param_index_.Find(id);
          if (pos < 0) {
            return absl::InvalidArgumentError(
                absl::StrCat("graph: node n", n.id, " uses unknown param p", id,
                             "; run ValidateGraph before simulating"));
          }
          // Backward produces no gradient of a frozen param.
          if (graph_.params[pos].trainable) node_param_pos_[i].push_back(pos);
        }
      }
      if (n.forward_id.has_value()) {
        forward_pos_[i] = node_index_.Find(*n.forward_id);
        if (forward_pos_[i] < 0) {
          return absl::InvalidArgumentError(absl::StrCat(
              "graph: node n", n.id, " mirrors unknown node n", *n.forward_id,
              "; run ValidateGraph before simulating"));
        }
      }
    }

    IdIndex group_index(schedule_.groups);
    groups_.resize(schedule_.groups.size());
    for (size_t g = 0; g < schedule_.groups.size(); ++g) {
      for (int32_t id : schedule_.groups[g].param_ids) {
        const int pos = param_index_.Find(id);
        if (pos < 0) {
          return absl::InvalidArgumentError(absl::StrCat(
              "schedule: group g", schedule_.groups[g].id,
              " names unknown param p", id, "; re-plan for this graph"));
        }
        groups_[g].param_pos.push_back(pos);
        groups_[g].full_bytes += params_[pos].full_bytes;
        groups_[g].padded_bytes += params_[pos].padded_bytes;
      }
    }

    IdIndex offload_index(schedule_.offloads);
    offload_bytes_.resize(schedule_.offloads.size());
    for (size_t o = 0; o < schedule_.offloads.size(); ++o) {
      const OffloadEntry& entry = schedule_.offloads[o];
      int64_t states = 0;
      for (int32_t id : entry.param_ids) {
        const int pos = param_index_.Find(id);
        if (pos < 0) {
          return absl::InvalidArgumentError(absl::StrCat(
              "schedule: offload o", entry.id, " names unknown param p", id,
              "; re-plan for this graph"));
        }
        states += params_[pos].state_bytes;
      }
      offload_bytes_[o] = std::clamp<int64_t>(entry.bytes, 0, states);
    }

    // Resolve each action's target and bucket it by (node, before/after),
    // keeping list order within a bucket (a stable counting sort).
    const size_t num_actions = schedule_.actions.size();
    target_.assign(num_actions, -1);
    rs_bytes_.assign(num_actions, 0);
    std::vector<int> reduce_count(graph_.params.size(), 0);
    std::vector<int> slot_of(num_actions);
    slot_begin_.assign(2 * graph_.nodes.size() + 1, 0);
    for (size_t i = 0; i < num_actions; ++i) {
      const Action& a = schedule_.actions[i];
      const int index = static_cast<int>(i);
      const int node_pos = node_index_.Find(a.node_id);
      if (node_pos < 0) {
        return absl::InvalidArgumentError(
            absl::StrCat(DescribeAction(index, a), ": unknown node n",
                         a.node_id, "; re-plan for this graph"));
      }
      switch (a.kind) {
        case ActionKind::kAllGather:
        case ActionKind::kWait:
        case ActionKind::kRelease:
          target_[i] = group_index.Find(a.group_id);
          if (target_[i] < 0) {
            return absl::InvalidArgumentError(
                absl::StrCat(DescribeAction(index, a), ": group g", a.group_id,
                             " is not defined by the schedule"));
          }
          break;
        case ActionKind::kReduceScatter:
          for (int32_t id : a.param_ids) {
            const int pos = param_index_.Find(id);
            if (pos < 0) {
              return absl::InvalidArgumentError(
                  absl::StrCat(DescribeAction(index, a), ": unknown param p",
                               id, "; re-plan for this graph"));
            }
            rs_bytes_[i] += params_[pos].reduce_bytes;
            ++reduce_count[pos];
          }
          break;
        case ActionKind::kOffload:
        case ActionKind::kReload:
          target_[i] = offload_index.Find(a.offload_id);
          if (target_[i] < 0) {
            return absl::InvalidArgumentError(
                absl::StrCat(DescribeAction(index, a), ": offload entry o",
                             a.offload_id, " is not defined by the schedule"));
          }
          break;
      }
      slot_of[i] = AnchoredSchedule::Slot(node_pos, a.position);
      ++slot_begin_[slot_of[i] + 1];
    }
    // A gradient reduced per micro-batch accumulates its shards in fp32.
    for (size_t p = 0; p < graph_.params.size(); ++p) {
      if (reduce_count[p] < 2 || !graph_.params[p].trainable) continue;
      const Param& param = graph_.params[p];
      const int64_t elem = DTypeBytes(graph_.GradReduceDType(param));
      base_[kGradients] += params_[p].grad_shard_bytes / elem * (4 - elem);
    }
    for (size_t s = 1; s < slot_begin_.size(); ++s) {
      slot_begin_[s] += slot_begin_[s - 1];
    }
    slot_actions_.resize(num_actions);
    std::vector<int> fill(slot_begin_.begin(), slot_begin_.end() - 1);
    for (size_t i = 0; i < num_actions; ++i) {
      slot_actions_[fill[slot_of[i]]++] = static_cast<int>(i);
    }
    return absl::OkStatus();
  }

  // Records `delta` bytes of `kind` at `time`, which is now (the compute
  // stream's clock: program order) or later (another stream's completion).
  // A transfer's events are known when it starts and ends, but belong to
  // the instant it was issued: `now` is that (the compute clock by default).
  void Record(double time, int64_t delta, MemoryKind kind,
              std::optional<double> now = std::nullopt) {
    if (delta == 0) return;
    const EventOrder order = time > now.value_or(now_)
                                 ? (delta > 0 ? kAsyncAllocation : kAsyncFree)
                                 : kProgramOrder;
    events_.push_back(
        {time, delta, static_cast<uint32_t>(events_.size()), order, kind});
  }
  void Allocate(double time, int64_t bytes, MemoryKind kind) {
    Record(time, bytes, kind);
  }
  void Free(double time, int64_t bytes, MemoryKind kind) {
    Record(time, -bytes, kind);
  }

  // A transfer issued and not yet finished on one stream, and the memory it
  // changes when it starts and ends.
  struct Transfer {
    size_t entry = 0;        // into the stream's timeline entries
    double remaining_s = 0;  // of its time alone, at anchor_s
    // Since anchor_s (its start, or when compute last started or stopped
    // running alongside it) it moves at one rate: it ends at
    // anchor_s + remaining_s·(stretch while compute runs, else 1).
    double anchor_s = 0;
    bool anchor_busy = false;
    double stretch = 1;         // its rate is 1/stretch while compute runs
    double share = 0;           // of compute it takes while both run
    int64_t staging_bytes = 0;  // a collective's buffers, held start..end
    int64_t alloc_at_start = 0;
    int64_t free_at_start = 0;
    int64_t free_at_end = 0;
    MemoryKind kind = kGradients;  // of the three above
  };
  // One stream: its transfers run one at a time in issue order.
  struct Stream {
    std::vector<CollectiveTimelineEntry>* entries = nullptr;
    std::deque<Transfer> queue;
    double free_s = 0;  // when the last one finished
  };

  // The share of compute a transfer of `bytes` running `seconds` takes.
  static double ComputeShare(int64_t bytes, double seconds, double per_byte) {
    if (per_byte <= 0 || seconds <= 0 || bytes <= 0) return 0;
    return std::min(HardwareModel::kMaxComputeShare,
                    per_byte * static_cast<double>(bytes) / seconds);
  }

  // Issues `t` on `stream` at the compute clock; it starts now when the
  // stream is idle. Returns its timeline entry's index.
  size_t Issue(Stream& stream, Transfer t, int index, ActionKind kind,
               int64_t bytes) {
    // What ended by now has ended: this one starts now if nothing else runs.
    while (!stream.queue.empty()) {
      const Transfer& f = stream.queue.front();
      const double end =
          f.anchor_s + f.remaining_s * (f.anchor_busy ? f.stretch : 1);
      if (end > now_) break;
      FinishFront(stream, end);
    }
    t.entry = stream.entries->size();
    stream.entries->push_back({index, kind, now_, -1, -1, bytes});
    if (t.remaining_s <= 0) t.staging_bytes = 0;
    stream.queue.push_back(t);
    if (stream.queue.size() == 1) StartFront(stream, now_);
    return t.entry;
  }

  // The front transfer starts at `time`; one of no time ends there too.
  void StartFront(Stream& stream, double time) {
    while (!stream.queue.empty()) {
      Transfer& t = stream.queue.front();
      t.anchor_s = time;
      t.anchor_busy = false;
      CollectiveTimelineEntry& entry = (*stream.entries)[t.entry];
      entry.start_s = time;
      Record(time, t.staging_bytes, kCollectiveBuffers, entry.issue_s);
      Record(time, t.alloc_at_start, t.kind, entry.issue_s);
      Record(time, -t.free_at_start, t.kind, entry.issue_s);
      if (t.remaining_s > 0) return;
      FinishFront(stream, time, /*start_next=*/false);
    }
  }

  // The front transfer ends at `time`; the next one starts then.
  void FinishFront(Stream& stream, double time, bool start_next = true) {
    const Transfer t = stream.queue.front();
    stream.queue.pop_front();
    CollectiveTimelineEntry& entry = (*stream.entries)[t.entry];
    entry.end_s = time;
    stream.free_s = time;
    if (t.staging_bytes > 0) {
      events_.push_back({time, -t.staging_bytes,
                         static_cast<uint32_t>(events_.size()),
                         kCollectiveBufferFree, kCollectiveBuffers});
    }
    Record(time, -t.free_at_end, t.kind, entry.issue_s);
    if (start_next) StartFront(stream, time);
  }

  bool Done(const Stream& stream, int64_t entry) const {
    return entry < 0 || (*stream.entries)[entry].end_s >= 0;
  }

  // Runs the two transfer streams from the compute clock on, together with
  // compute when `work` is given (a node with *work seconds of compute
  // left), until the node's work is done or, without one, until `until()`
  // holds; returns the time reached. Compute runs at 1 − s, s the shares of
  // the transfers running (capped at kMaxComputeShare together); a transfer
  // moves at 1/stretch of its alone rate while compute runs and at its alone
  // rate while compute waits. Rates are constant between a transfer's start
  // or end and the node's end, so each step to the next of these is exact.
  template <typename Until>
  double Advance(double* work, Until until) {
    const bool busy = work != nullptr;
    double t = now_;
    Stream* streams[] = {&comm_, &copy_};
    // When the front transfer of `s` ends at the current rates.
    auto front_end = [busy](const Stream& s) {
      const Transfer& f = s.queue.front();
      return f.anchor_s + f.remaining_s * (busy ? f.stretch : 1);
    };
    while (true) {
      if (busy ? *work <= 0 : until()) return t;
      double share = 0;
      double next = std::numeric_limits<double>::infinity();
      for (Stream* s : streams) {
        if (s->queue.empty()) continue;
        Transfer& f = s->queue.front();
        if (f.anchor_busy != busy && f.stretch != 1) {
          // Its rate changes now: what is left, in its time alone.
          const double factor = f.anchor_busy ? f.stretch : 1;
          f.remaining_s =
              std::max(0.0, f.remaining_s - (t - f.anchor_s) / factor);
          f.anchor_s = t;
        }
        f.anchor_busy = busy;
        if (busy) share += f.share;
        next = std::min(next, front_end(*s));
      }
      if (busy) {
        const double rate =
            1 - std::min(HardwareModel::kMaxComputeShare, share);
        if (t + *work / rate <= next) {
          t += *work / rate;
          *work = 0;
          return t;
        }
        *work -= (next - t) * rate;
      }
      // Nothing runs and nothing computes: what `until` waits for was never
      // issued (the callers' checks rule that out).
      if (!std::isfinite(next)) return t;
      t = next;
      for (Stream* s : streams) {
        while (!s->queue.empty() && front_end(*s) <= t) FinishFront(*s, t);
      }
    }
  }

  // Issues a collective of `bytes` taking `alone` seconds by itself, at the
  // compute clock. While it runs it holds its flat buffer: the padded full
  // bytes and this rank's shard.
  size_t IssueCollective(int index, ActionKind kind, int64_t bytes,
                         double alone, int64_t free_at_start = 0,
                         int64_t free_at_end = 0) {
    const bool rs = kind == ActionKind::kReduceScatter;
    if (alone_) alone = 0;  // a local copy: nothing on the link
    result_.comm_s += alone;
    Transfer t;
    t.remaining_s = alone;
    t.stretch =
        std::clamp(rs ? hw_.reduce_scatter_stretch : hw_.allgather_stretch, 1.0,
                   HardwareModel::kMaxStretch);
    t.share = ComputeShare(bytes, alone * t.stretch,
                           rs ? hw_.compute_s_per_reduce_scatter_byte
                              : hw_.compute_s_per_allgather_byte);
    if (hw_.collective_buffers && !alone_) {
      const CollectiveScratch& scratch =
          rs ? hw_.reduce_scatter_scratch : hw_.allgather_scratch;
      t.staging_bytes =
          bytes + bytes / std::max(graph_.world_size, 1) + scratch.Bytes(bytes);
    }
    t.free_at_start = free_at_start;
    t.free_at_end = free_at_end;
    t.kind = kGradients;
    return Issue(comm_, t, index, kind, bytes);
  }

  // Issues a host-tier copy of `bytes` at the compute clock; an offload
  // frees `free_at_end` of optimizer states when done, a reload allocates
  // `alloc_at_start` when it starts.
  size_t IssueCopy(int index, ActionKind kind, int64_t bytes,
                   int64_t alloc_at_start, int64_t free_at_end) {
    const double alone = hw_.HostCopySeconds(bytes);
    result_.copy_s += alone;
    Transfer t;
    t.remaining_s = alone;
    t.stretch = std::clamp(hw_.copy_stretch, 1.0, HardwareModel::kMaxStretch);
    t.share =
        ComputeShare(bytes, alone * t.stretch, hw_.compute_s_per_copy_byte);
    t.alloc_at_start = alloc_at_start;
    t.free_at_end = free_at_end;
    t.kind = kOptimizerStates;
    return Issue(copy_, t, index, kind, bytes);
  }

  // When a node needing `work` seconds of compute, started at the compute
  // clock, ends (Advance's rule).
  double ComputeEnd(double work) {
    const double start = now_;
    double left = work;
    const double end = Advance(&left, [] { return true; });
    result_.interference_s += (end - start) - work;
    return end;
  }

  absl::Status RunActions(size_t slot) {
    for (int s = slot_begin_[slot]; s < slot_begin_[slot + 1]; ++s) {
      const int i = slot_actions_[s];
      const Action& a = schedule_.actions[i];
      const int target = target_[i];
      switch (a.kind) {
        case ActionKind::kAllGather: {
          GroupState& g = group_state_[target];
          const int64_t bytes = groups_[target].padded_bytes;
          g.entry = static_cast<int64_t>(
              IssueCollective(i, a.kind, bytes, hw_.AllGatherSeconds(bytes)));
          ++g.outstanding;
          if (!zero1_ && !alone_) {
            Allocate(now_, groups_[target].full_bytes, kGatheredParams);
          }
          break;
        }
        case ActionKind::kWait: {
          GroupState& g = group_state_[target];
          if (g.outstanding == 0) {
            return absl::InvalidArgumentError(absl::StrCat(
                DescribeAction(i, a), ": node n", a.node_id,
                " waits on group g", a.group_id,
                " but no ALLGATHER of it was issued since its last RELEASE "
                "(or ever); issue one before the WAIT"));
          }
          if (!Done(comm_, g.entry)) {
            const double done =
                Advance(nullptr, [&] { return Done(comm_, g.entry); });
            const double stall = done - now_;
            result_.group_exposed_s[target] += stall;
            result_.exposed_comm_s += stall;
            now_ = done;
          }
          break;
        }
        case ActionKind::kRelease: {
          GroupState& g = group_state_[target];
          if (!zero1_ && !alone_) {
            Free(now_, g.outstanding * groups_[target].full_bytes,
                 kGatheredParams);
          }
          g.outstanding = 0;
          break;
        }
        case ActionKind::kReduceScatter: {
          int64_t grads = 0;
          for (int32_t id : a.param_ids) {
            const int pos = param_index_.Find(id);
            if (!grad_live_[pos]) continue;
            grad_live_[pos] = false;
            grads += params_[pos].full_bytes;
          }
          // With collective buffers, the gradients are copied into the
          // buffer when the collective starts, and freed then.
          last_rs_ = static_cast<int64_t>(IssueCollective(
              i, a.kind, rs_bytes_[i], hw_.ReduceScatterSeconds(rs_bytes_[i]),
              hw_.collective_buffers ? grads : 0,
              hw_.collective_buffers ? 0 : grads));
          break;
        }
        case ActionKind::kOffload: {
          const int64_t bytes = offload_bytes_[target];
          const bool moves = !on_host_[target];
          if (moves) {
            on_host_[target] = true;
            host_bytes_ += bytes;
            result_.offloaded_bytes =
                std::max(result_.offloaded_bytes, host_bytes_);
          }
          IssueCopy(i, a.kind, bytes, 0, moves ? bytes : 0);
          break;
        }
        case ActionKind::kReload: {
          const int64_t bytes = offload_bytes_[target];
          const bool moves = on_host_[target];
          if (moves) {
            on_host_[target] = false;
            host_bytes_ -= bytes;
          }
          last_reload_ = static_cast<int64_t>(
              IssueCopy(i, a.kind, bytes, moves ? bytes : 0, 0));
          break;
        }
      }
    }
    return absl::OkStatus();
  }

  absl::Status Walk() {
    const size_t num_nodes = graph_.nodes.size();
    group_state_.assign(groups_.size(), GroupState{});
    grad_live_.assign(graph_.params.size(), false);
    on_host_.assign(schedule_.offloads.size(), false);
    std::vector<int64_t> live_activation(num_nodes, 0);
    node_start_seq_.assign(num_nodes, 0);
    node_marker_seq_.assign(num_nodes, 0);
    result_.group_exposed_s.assign(groups_.size(), 0.0);
    result_.nodes.resize(num_nodes);
    result_.collectives.reserve(schedule_.actions.size() + 1);
    comm_.entries = &result_.collectives;
    copy_.entries = &result_.copies;
    events_.reserve(4 * num_nodes + 2 * schedule_.actions.size() +
                    2 * graph_.params.size());

    double previous_end = 0;
    // The running sum of the nodes' measured carries, and what of it is
    // held (when positive).
    int64_t carry_sum = 0;
    int64_t carry_held = 0;
    // The persistent params' refresh after the previous step, in chunks in
    // forward order: in the steady state it is issued as this step
    // begins, and a node waits only for the chunk of its params.
    for (RefreshChunk& chunk : refresh_chunks_) {
      chunk.entry = static_cast<int64_t>(
          IssueCollective(-1, ActionKind::kAllGather, chunk.bytes,
                          hw_.AllGatherSeconds(chunk.bytes)));
    }
    for (size_t pos = 0; pos < num_nodes; ++pos) {
      const Node& node = graph_.nodes[pos];
      absl::Status status = RunActions(AnchoredSchedule::BeforeSlot(pos));
      if (!status.ok()) return status;
      if (const int c = node_refresh_chunk_[pos];
          c >= 0 && !Done(comm_, refresh_chunks_[c].entry)) {
        const int64_t entry = refresh_chunks_[c].entry;
        const double done =
            Advance(nullptr, [&] { return Done(comm_, entry); });
        result_.exposed_comm_s += done - now_;
        now_ = done;
      }
      if (node.phase == Phase::kOptimizer) {
        // The optimizer needs every gradient shard and state issued so far.
        auto ready = [&] {
          return Done(comm_, last_rs_) && Done(copy_, last_reload_);
        };
        if (!ready()) {
          const double done = Advance(nullptr, ready);
          const double rs_done =
              last_rs_ < 0 ? 0 : result_.collectives[last_rs_].end_s;
          if (rs_done > now_) result_.exposed_comm_s += rs_done - now_;
          now_ = done;
        }
      }
      const double start = now_;
      const double end = ComputeEnd(node.time_s);
      node_start_seq_[pos] = static_cast<uint32_t>(events_.size());
      NodeTimelineEntry& entry = result_.nodes[pos];
      entry.node_id = node.id;
      entry.start_s = start;
      entry.end_s = end;
      entry.stall_s = start - previous_end;
      result_.compute_s += node.time_s;

      Allocate(start, node.workspace_bytes, kActivations);
      const int64_t optimizer_transient =
          node.phase == Phase::kOptimizer && hw_.collective_buffers
              ? optimizer_transient_bytes_
              : 0;
      Allocate(start, optimizer_transient, kOptimizerStates);
      // What the model puts on top of the memory at the node's start, and
      // what the node leaves at its end.
      int64_t new_gradients = 0;
      if (node.phase == Phase::kBackward) {
        for (int p : node_param_pos_[pos]) {
          if (grad_live_[p]) continue;
          grad_live_[p] = true;
          Allocate(start, params_[p].full_bytes, kGradients);
          new_gradients += params_[p].full_bytes;
        }
      }
      entry.modeled_rise_bytes = node.workspace_bytes + new_gradients;
      entry.modeled_net_bytes = new_gradients;
      if (node.phase == Phase::kForward) {
        entry.modeled_rise_bytes += node.activation_bytes;
        entry.modeled_net_bytes += node.activation_bytes;
      }
      const int64_t measured_extra = node.measured_extra_bytes;
      Allocate(start, measured_extra, kActivations);
      now_ = end;
      previous_end = end;
      // Activations appear while the workspace is still held.
      if (node.phase == Phase::kForward) {
        Allocate(end, node.activation_bytes, kActivations);
        live_activation[pos] = node.activation_bytes;
      }
      Free(end, node.workspace_bytes + measured_extra, kActivations);
      Free(end, optimizer_transient, kOptimizerStates);
      if (node.phase == Phase::kBackward) {
        const int twin = forward_pos_[pos];
        if (twin >= 0 && static_cast<size_t>(twin) < pos) {
          Free(end, live_activation[twin], kActivations);
          entry.modeled_net_bytes -= live_activation[twin];
          live_activation[twin] = 0;
        }
      }
      carry_sum += node.measured_carry_bytes;
      const int64_t carried = std::max<int64_t>(0, carry_sum);
      Allocate(end, carried - carry_held, kActivations);
      carry_held = carried;
      status = RunActions(AnchoredSchedule::AfterSlot(pos));
      if (!status.ok()) return status;
      // memory_after_bytes is read after every event so far at this instant.
      node_marker_seq_[pos] = static_cast<uint32_t>(events_.size());
    }

    const double compute_end = now_;
    // What is still in flight finishes with nothing computing.
    Advance(nullptr,
            [&] { return comm_.queue.empty() && copy_.queue.empty(); });
    const double comm_free = comm_.free_s;
    const double copy_free = copy_.free_s;
    result_.exposed_comm_s += std::max(0.0, comm_free - compute_end);
    result_.iteration_s = std::max({compute_end, comm_free, copy_free});
    result_.lower_bound_s =
        std::max({result_.compute_s, result_.comm_s, result_.copy_s});
    result_.overlap_ratio =
        result_.comm_s > 0
            ? std::clamp(1 - result_.exposed_comm_s / result_.comm_s, 0.0, 1.0)
            : 1.0;
    return absl::OkStatus();
  }

  void SweepMemory() {
    std::sort(events_.begin(), events_.end(), EventBefore);
    std::array<int64_t, kNumMemoryKinds> level_by_kind = base_;
    int64_t level = 0;
    for (int64_t bytes : base_) level += bytes;
    int64_t peak = level;
    std::array<int64_t, kNumMemoryKinds> peak_by_kind = level_by_kind;
    // Nodes started before the peak event; the last of them was running.
    size_t peak_started = 0;

    std::vector<NodeTimelineEntry>& nodes = result_.nodes;
    size_t next_end = 0;
    size_t started = 0;
    for (const MemoryEvent& e : events_) {
      while (
          next_end < nodes.size() &&
          MarkerBefore(nodes[next_end].end_s, node_marker_seq_[next_end], e)) {
        nodes[next_end++].memory_after_bytes = level;
      }
      while (
          started < nodes.size() &&
          MarkerBefore(nodes[started].start_s, node_start_seq_[started], e)) {
        ++started;
      }
      level += e.delta;
      level_by_kind[e.kind] += e.delta;
      if (level > peak) {
        peak = level;
        peak_by_kind = level_by_kind;
        peak_started = started;
      }
    }
    for (; next_end < nodes.size(); ++next_end) {
      nodes[next_end].memory_after_bytes = level;
    }

    result_.peak_bytes = peak;
    MemoryBreakdown& b = result_.peak_breakdown;
    b.sharded_params = peak_by_kind[kShardedParams];
    b.persistent_params = peak_by_kind[kPersistentParams];
    b.gathered_params = peak_by_kind[kGatheredParams];
    b.activations = peak_by_kind[kActivations];
    b.gradients = peak_by_kind[kGradients];
    b.optimizer_states = peak_by_kind[kOptimizerStates];
    b.collective_buffers = peak_by_kind[kCollectiveBuffers];
    b.unmodeled = peak_by_kind[kUnmodeled];
    if (!nodes.empty()) {
      result_.peak_node_id =
          nodes[peak_started > 0 ? peak_started - 1 : 0].node_id;
    }
  }

  struct GroupState {
    // ALLGATHERs issued since the last RELEASE, and the latest one's
    // timeline entry (-1: none).
    int outstanding = 0;
    int64_t entry = -1;
  };

  const Graph& graph_;
  const Schedule& schedule_;
  const HardwareModel& hw_;
  const bool zero1_;
  // A world of one: the worker's full tensors alias the shards, so gathered
  // and persistent params hold no memory of their own, and its collectives
  // are local copies on the compute thread with no staging buffers: nothing
  // moves (worker/README.md, "A world of one").
  const bool alone_;
  const IdIndex param_index_;
  const IdIndex node_index_;

  // Resolved once per replay.
  std::vector<ParamInfo> params_;
  std::vector<GroupInfo> groups_;
  std::vector<int64_t> offload_bytes_;
  std::vector<std::vector<int>> node_param_pos_;
  std::vector<int> forward_pos_;
  // Per action: its group or offload position, and a REDUCE_SCATTER's bytes.
  std::vector<int> target_;
  std::vector<int64_t> rs_bytes_;
  // Actions of anchor slot s (2·node position, +1 for after) are
  // slot_actions_[slot_begin_[s] .. slot_begin_[s+1]).
  std::vector<int> slot_begin_;
  std::vector<int> slot_actions_;
  // Bytes held for the whole iteration, by kind.
  std::array<int64_t, kNumMemoryKinds> base_{};

  // Replay state.
  double now_ = 0;
  // ZeRO-3 persistent params, padded: re-gathered after the optimizer.
  struct RefreshChunk {
    int64_t bytes = 0;
    int64_t entry = -1;  // its collective
  };
  std::vector<RefreshChunk> refresh_chunks_;
  // Per param position, its refresh chunk (-1: none); per node, the last
  // chunk its params need (-1: none).
  std::vector<int> refresh_chunk_of_;
  std::vector<int> node_refresh_chunk_;
  // The optimizer's largest per-param temporaries (Resolve).
  int64_t optimizer_transient_bytes_ = 0;
  // The communication and copy streams (their entries: result_'s).
  Stream comm_;
  Stream copy_;
  // Timeline entries of the last REDUCE_SCATTER and RELOAD issued (-1:
  // none): the optimizer waits for them, and with them for all before.
  int64_t last_rs_ = -1;
  int64_t last_reload_ = -1;
  int64_t host_bytes_ = 0;
  std::vector<GroupState> group_state_;
  std::vector<bool> grad_live_;
  std::vector<bool> on_host_;
  std::vector<MemoryEvent> events_;
  // Per node: events_.size() when it started and after its "after" actions
  // ran, to place its start and its memory_after_bytes among the events.
  std::vector<uint32_t> node_start_seq_;
  std::vector<uint32_t> node_marker_seq_;
  SimResult result_;
};

}  // namespace

absl::StatusOr<SimResult> Simulate(const Graph& graph, const Schedule& schedule,
                                   const HardwareModel& hw) {
  Replay replay(graph, schedule, hw);
  return replay.Run();
}

}  // namespace tandem
