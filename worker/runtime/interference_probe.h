// Measures what transfers take from compute (worker/README.md, "Interference
// probe"): the compute time an all-gather, a reduce-scatter and a host-tier
// copy cost per byte they move, on this machine, with this job's
// communicator and device. On a CPU the same cores that compute also run
// Gloo's copies and sums, the kernel's network stack and the memcpy into the
// host tier, so compute slows while they run; on a GPU, DMA engines and a few
// SMs move the bytes and the cost is ~0.
//
// Method, per kind: a small matmul loop runs alone for a short window (its
// rate r0); the ranks meet; one transfer of known size B runs alone
// (nothing computing, d0 seconds), then at once again while the loop runs
// (its rate r1 over the transfer's d seconds). The transfer took
// d·(1 − r1/r0) seconds of compute, and compute made it d/d0 times as long
// (its stretch). For a collective the ranks then take the larger of their
// two losses (a step pays the slower rank at every collective). Over
// twenty-four repetitions the totals are kept: compute lost over bytes
// moved (c per byte), time under compute over time alone (clamped to
// 1..4); the ranks then average their figures (one small all-gather), so
// every rank reports the same. The profile carries them
// (Profile::compute_s_per_*_byte) and the planner's simulator charges them
// (common/README.md, "Simulator").
//
// Collective: every rank calls it at the same point, after
// Communicator::TuneChunkBytes and before any other submission. Takes about
// three seconds on the bench's 2000 Mbit/s link. Eight starts of the same job
// there read an all-gather stretch of 1.32-1.73x and 2.6-3.3 s of compute
// per GB; with five repetitions, medians, and ranks that left their alone
// windows apart, 1.14-2.03x and 1.6-2.7 s, and the first plans priced from
// them were 10-14% fast (bench/README.md). On the faster runtime of
// 2026-12-03, the ranks' mean loss over 25 ms transfers read 0.66-1.03 s
// per GB all-gathered where wide-short's steps pay about 1.9; the slower
// rank's over 8 ms transfers reads 1.45-2.12.
#ifndef TANDEM_WORKER_RUNTIME_INTERFERENCE_PROBE_H_
#define TANDEM_WORKER_RUNTIME_INTERFERENCE_PROBE_H_

#include <cstdint>
#include <string>

#include "ATen/core/Tensor.h"
#include "absl/status/statusor.h"
#include "worker/runtime/communicator.h"

namespace tandem {

struct InterferenceProbe {
  // Compute seconds per byte moved (a collective's full buffer, a copy's
  // bytes); 0 at world size 1 for the collectives (nothing moves). For a
  // collective, the slower rank's loss at each repetition.
  double compute_s_per_allgather_byte = 0;
  double compute_s_per_reduce_scatter_byte = 0;
  double compute_s_per_copy_byte = 0;
  // This rank's own loss per byte for the collectives (the log's; never
  // above the figures above).
  double own_compute_s_per_allgather_byte = 0;
  double own_compute_s_per_reduce_scatter_byte = 0;
  // How many times longer each kind ran with the compute loop running than
  // alone (1: not slowed).
  double allgather_stretch = 1;
  double reduce_scatter_stretch = 1;
  double copy_stretch = 1;
  // The probe's host-tier copy: bytes and the seconds the copy thread took
  // (this rank's own; the host link's rate).
  int64_t host_copy_bytes = 0;
  double host_copy_s = 0;
  // Wall time the probe took.
  double probe_s = 0;
};

struct InterferenceProbeOptions {
  // Bytes each rank sends per probe collective (0: sized from the link rate
  // `link_bytes_per_s` so one collective lasts about 8 ms, within
  // [512 KiB, 16 MiB]; 2 MiB when the rate is unknown).
  int64_t collective_bytes = 0;
  double link_bytes_per_s = 0;
  // Repetitions per kind (their totals are kept).
  int repetitions = 24;
  // Seconds the matmul loop runs alone per repetition.
  double alone_window_s = 0.02;
  // The host tier's directory (HostTier::Create) for the copy probe.
  std::string offload_dir;
};

absl::StatusOr<InterferenceProbe> MeasureInterference(
    Communicator& comm, at::Device device,
    const InterferenceProbeOptions& options);

}  // namespace tandem

#endif  // TANDEM_WORKER_RUNTIME_INTERFERENCE_PROBE_H_
