// The cost model the simulator and the passes price actions with: collective
// time as a function of bytes, the host link, and the device memory budget.
//
// Collective time is piecewise-linear in bytes. Either it is fitted from
// measured (bytes, seconds) points of the running job, or it follows the
// analytic ring model latency + S·(n−1)/(n·B), where S is the full (unsharded)
// buffer and B the per-rank bandwidth of the slowest link the ring crosses:
// NVLink inside a node, the rank's NIC across nodes.
#ifndef TANDEM_COMMON_SIM_HARDWARE_MODEL_H_
#define TANDEM_COMMON_SIM_HARDWARE_MODEL_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/ir/profile.h"

namespace tandem {

// A monotone piecewise-linear function of bytes, through measured points.
// Points with equal bytes are averaged; a point measured below an earlier
// (smaller) one is raised to it, so a larger buffer never costs less. Between
// points it interpolates; below the first it extends the first segment,
// clamped at 0 seconds; past the last it goes on at the steeper of the last
// segment and the line through the first and last points. Two large sizes
// measured close together say little about the rate (their difference is
// mostly noise: 3.2 and 4.3 MB all-gathers at 2 Gbit/s gave 1.2 GB/s
// between them, where the link carries 0.25), and a collective several
// times larger (a refresh of every persistent param) would be priced at a
// rate the link never ran; the first-to-last line keeps the small sizes'
// latency and the large sizes' bandwidth. With a single point (b, s) it is the
// line through the origin s·x/b (a constant s when b = 0): one point cannot
// separate latency from bandwidth.
class PiecewiseLinear {
 public:
  PiecewiseLinear() = default;
  // Points need not be sorted; at least one, bytes >= 0, seconds >= 0.
  static absl::StatusOr<PiecewiseLinear> Fit(
      std::vector<std::pair<int64_t, double>> points);

  bool empty() const { return points_.empty(); }
  double operator()(int64_t bytes) const;
  const std::vector<std::pair<int64_t, double>>& points() const {
    return points_;
  }

 private:
  std::vector<std::pair<int64_t, double>> points_;
};

struct HardwareModel {
  int32_t world_size = 1;
  int32_t ranks_per_node = 8;
  // Per-rank bandwidth, bytes/s: inside a node (NVLink) and across nodes
  // (one NIC per rank).
  double intra_node_bytes_per_s = 370e9;
  double inter_node_bytes_per_s = 50e9;
  double collective_latency_s = 20e-6;
  // Host link, each way, bytes/s; host_link_measured once a profile's
  // host-tier copies set it (FitHostLink).
  double host_bytes_per_s = 50e9;
  bool host_link_measured = false;
  // Device memory per rank.
  int64_t device_memory_bytes = int64_t{80} << 30;
  // Budget the plan must fit (<= device memory); 0 means device memory.
  int64_t budget_bytes = 0;
  // Bytes the runtime holds beyond what the simulator models (autograd
  // temporaries, the loss's buffers), counted at every
  // instant. 0 until measured: CalibrateMemory sets it from a profile.
  int64_t unmodeled_bytes = 0;
  // Count each collective's flat buffer while it runs (the Tandem worker
  // packs every collective into one; see the simulator's memory rules), and
  // the worker's AdamW temporaries during the optimizer (the largest
  // param's fp32 denominator, and its fp32 gradient copy when gradients are
  // not fp32). Off in the analytic model; CalibrateMemory turns it on,
  // since a profile comes from that runtime.
  bool collective_buffers = false;
  // With collective_buffers: the scratch each collective holds beyond its
  // flat buffer while it runs, by kind (the profile's rule, from the
  // worker's communicator; CalibrateToMeasurements sets it).
  CollectiveScratch allgather_scratch;
  CollectiveScratch reduce_scatter_scratch;

  // Compute time a transfer takes from the compute stream per byte it moves:
  // the CPU work of the cores that also compute (Gloo's copies and local
  // sums, the kernel's network stack, the memcpy into the host tier). ~0 on
  // a GPU, where DMA engines and NCCL's few SMs move the bytes; a real share
  // on a CPU. A transfer of B bytes running d seconds takes the share
  // min(c·B/d, kMaxComputeShare) of compute while it runs (the simulator's
  // rule). Bytes: a collective's padded full buffer, a copy's bytes. From
  // the profile's interference probe (CalibrateToMeasurements); 0 in the
  // analytic model.
  double compute_s_per_allgather_byte = 0;
  double compute_s_per_reduce_scatter_byte = 0;
  double compute_s_per_copy_byte = 0;
  static constexpr double kMaxComputeShare = 0.95;

  // How many times longer a transfer takes while compute runs than alone:
  // the other side of the same contention (the cores that compute also run
  // the transfer's copies and sums). 1 on a GPU. The fits above give a
  // transfer's time alone; while the compute stream is busy it moves at
  // 1/stretch of that rate, and takes the share c·B/(stretch·d) of compute,
  // d its time alone, so a transfer overlapped throughout still costs c·B
  // seconds of compute. From the profile's interference probe
  // (CalibrateToMeasurements); 1 in the analytic model.
  double allgather_stretch = 1;
  double reduce_scatter_stretch = 1;
  double copy_stretch = 1;
  static constexpr double kMaxStretch = 4;
  bool stretched() const {
    return allgather_stretch > 1 || reduce_scatter_stretch > 1 ||
           copy_stretch > 1;
  }

  // What the measured times were scaled by so that the schedule a profile
  // ran under simulates to the iteration time the profile measured
  // (CalibrateToMeasurements; 1: not scaled). A profile gives each node's
  // and each collective's median, and the iteration's median is more than
  // their sum: waits and nodes are skewed (a collective now and then takes
  // twice its median on a shared link) and the compute thread spends time
  // between nodes. Every measured duration (node times, collectives, host
  // copies, the compute transfers take) is scaled alike, so every schedule's
  // prediction is scaled by it too.
  double time_scale = 1;
  static constexpr double kMinTimeScale = 0.67;
  static constexpr double kMaxTimeScale = 1.5;

  // Fitted from the job's measurements; override the analytic model.
  PiecewiseLinear allgather_fit;
  PiecewiseLinear reduce_scatter_fit;

  // The H100 defaults (common/README.md, "Hardware model") for `world_size`
  // ranks, 8 per node.
  static HardwareModel H100(int32_t world_size);

  int64_t budget() const {
    return budget_bytes > 0 ? budget_bytes : device_memory_bytes;
  }
  // Seconds to all-gather (reduce-scatter) a buffer of `full_bytes`: the
  // fit when there is one, else the ring model with B = intra-node bandwidth
  // when world_size <= ranks_per_node and the NIC's otherwise. 0 when
  // world_size is 1 or the buffer is empty: nothing moves.
  double AllGatherSeconds(int64_t full_bytes) const;
  double ReduceScatterSeconds(int64_t full_bytes) const;
  // Seconds to move `bytes` over the host link one way.
  double HostCopySeconds(int64_t bytes) const;

 private:
  double RingSeconds(int64_t full_bytes) const;
};

// Parses "key=value" overrides (space- or comma-separated) onto the H100
// defaults for world 1: world, ranks_per_node (integers >= 1), intra_gbps,
// inter_gbps, host_gbps (GB/s = 1e9 bytes/s, > 0), latency_us (>= 0),
// ag_cpu_s_per_gb, rs_cpu_s_per_gb, copy_cpu_s_per_gb (seconds of compute a
// GB moved by an all-gather, a reduce-scatter or a host copy takes, >= 0),
// ag_stretch, rs_stretch, copy_stretch (how many times longer the transfer
// takes while compute runs, 1..4),
// memory
// (bytes > 0, with an optional B/KiB/MiB/GiB/TiB suffix), budget (same, 0 =
// memory), e.g. "world=64 inter_gbps=25 budget=70GiB". Each key at most once.
// Errors (InvalidArgument) name the key and what it takes, list the valid
// keys for an unknown one, and reject a budget above device memory. Fits are
// not parsed: they come from profiles.
absl::StatusOr<HardwareModel> ParseHardwareModel(absl::string_view text);

}  // namespace tandem

#endif  // TANDEM_COMMON_SIM_HARDWARE_MODEL_H_
