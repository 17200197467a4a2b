// Collectives over one c10d process group, issued by a dedicated
// communication thread so that compute never waits for communication it does
// not yet need.
//
// Contract: every rank submits the same collectives in the same order (the
// executor guarantees it by following one schedule per iteration). The thread
// runs submissions strictly in order, one collective at a time, so they match
// across ranks and a collective's issue→done time is its own.
//
// On Gloo, both collectives are point-to-point sends and receives, every
// receive posted before the sends (libtorch 1.13's Gloo has no
// reduce_scatter, and its alltoall and allgather ran at half the rate of
// these on a shaped link: worker/README.md, "Collectives on Gloo"). A
// reduce-scatter sums what arrives in rank order. Each rank sends (n-1)/n of
// the bytes, as an allreduce's two halves do. A collective whose message to
// one peer is larger than CommOptions::chunk_bytes goes in pieces, pipelined
// (see CommOptions). On NCCL the native collectives are used, whole.
#ifndef TANDEM_WORKER_RUNTIME_COMMUNICATOR_H_
#define TANDEM_WORKER_RUNTIME_COMMUNICATOR_H_

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "ATen/core/Tensor.h"
#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/ir/profile.h"
#include "common/job/job_spec.h"
#include "torch/csrc/distributed/c10d/ProcessGroup.hpp"
#include "worker/runtime/async_work.h"

namespace tandem {

// How collectives are cut into transport calls (the job spec's `comm`; every
// rank of a job must use the same values, since the ranks' calls must match).
struct CommOptions {
  // Gloo: a collective whose message to one peer exceeds this many bytes is
  // sent in pieces of at most this size, in order. On a link with deep
  // buffers, one whole message per direction fills the queue that the other
  // direction's acknowledgements wait in, and halves the rate; on a fast
  // link, pieces cost CPU and time. 0: automatic (TuneChunkBytes).
  int64_t chunk_bytes = 0;
  // Pieces outstanding at once (>= 1): the next is issued while earlier ones
  // are on the wire, and a reduce-scatter sums each finished piece meanwhile.
  int max_in_flight = kDefaultCommMaxInFlight;
};

// The spec's `comm` section; fields left at zero take the defaults.
CommOptions CommOptionsFromSpec(const v1::JobSpec& spec);

// What TuneChunkBytes measured and chose.
struct ChunkTuning {
  // The piece size in use; kWholeMessages when collectives go whole.
  int64_t chunk_bytes = 0;
  // The probe: seconds of an all-gather moving probe_bytes out of each rank
  // in kDefaultCommChunkBytes pieces, on the slowest rank (0: not measured).
  double probe_s = 0;
  int64_t probe_bytes = 0;
  bool tuned() const { return probe_s > 0; }
  // Bytes per second leaving each rank during the probe.
  double rate() const { return tuned() ? probe_bytes / probe_s : 0; }
};
// Links slower than this per direction get pieces. Measured on a tbf-shaped
// veth (bench/e2e): at 200 Mbit/s (23 MB/s in pieces) whole messages ran at
// 12-17 MB/s once traffic was sustained; at 2 Gbit/s (120-170 MB/s) whole
// messages were as fast or faster and cost less CPU than pieces.
inline constexpr double kPiecesBelowBytesPerS = 64e6;
inline constexpr int64_t kWholeMessages = int64_t{1} << 50;

class Communicator {
 public:
  // `group` must be live for the communicator's lifetime.
  explicit Communicator(c10::intrusive_ptr<c10d::ProcessGroup> group,
                        CommOptions options = {});
  // Runs what was submitted, then joins the thread.
  ~Communicator();
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  int rank() const { return rank_; }
  int world_size() const { return world_size_; }

  // Runs `body` on the communication thread after every earlier submission.
  // `body` packs inputs, calls the blocking collectives below and unpacks;
  // an exception it throws becomes the handle's status. After a failure,
  // later submissions fail at once with the same status (the peers are
  // gone or out of step; the job must restart). `buffer_bytes`: the most
  // the body allocates on top of what is in use when it starts (its packed
  // buffers); QueuedBufferBytes reports it while the body waits its turn.
  AsyncHandle Submit(std::function<void()> body, int64_t buffer_bytes = 0);

  // The largest buffer_bytes among the submissions not started yet: what
  // the communication thread may allocate while the caller runs, since one
  // runs at a time (the memory hold counts it: worker/README.md, "Memory
  // hold").
  int64_t QueuedBufferBytes() const;

  // Blocking collectives; call them only from a Submit body.
  //   AllGather: `input` [n] from every rank into `output` [world * n],
  //   rank-major.
  void AllGather(const at::Tensor& input, const at::Tensor& output);
  //   ReduceScatterSum: `input` [world * n]; `output` [n] receives the sum
  //   over ranks of chunk `rank` (summed in rank order).
  void ReduceScatterSum(const at::Tensor& input, const at::Tensor& output);

  // All-gathers a few doubles from every rank (blocking, through the thread,
  // in order with the other submissions): rank-major, world * values.size().
  absl::StatusOr<std::vector<double>> AllGatherScalars(
      const std::vector<double>& values);

  // When CommOptions::chunk_bytes is 0 (automatic), times an all-gather of
  // 8 MiB out of each rank in kDefaultCommChunkBytes pieces (the better of
  // two), takes the slowest rank's time, and keeps the pieces on a link
  // slower than kPiecesBelowBytesPerS, whole messages otherwise. (A one-off
  // whole-message probe is no guide: the queue that slows whole messages
  // fills only under sustained traffic, and did not always fill in 8 MiB.)
  // Every rank decides from the same all-gathered times, so all agree. Call
  // it on every rank, before other submissions; a no-op (returning the
  // current choice, not tuned) when the size is fixed, at world size 1 or on
  // NCCL.
  absl::StatusOr<ChunkTuning> TuneChunkBytes();
  // Test seam: when `seconds` > 0, TuneChunkBytes on this rank still runs
  // the probe but reports `seconds` as this rank's time instead of the
  // measured one (so tests can pin a link rate). Call before TuneChunkBytes,
  // from the thread that calls it.
  void SetProbeSecondsForTesting(double seconds) {
    probe_seconds_for_testing_ = seconds;
  }

  // The scratch a packed all-gather or reduce-scatter holds beyond its
  // input and output while it runs (the profile's CollectiveScratch), with
  // the piece size in use. On Gloo an all-gather holds none (it receives
  // into the output), and a reduce-scatter receives all but one peer's
  // contribution into scratch: none at world 2, world - 2 messages per
  // piece in flight beyond; NCCL's own buffers are not counted. Call after
  // TuneChunkBytes.
  CollectiveScratch AllGatherScratch() const;
  CollectiveScratch ReduceScatterScratch() const;

  // Blocks until every submission so far finished; the first failure.
  absl::Status Drain();
  // The first collective that failed (a peer lost, a transport error), or OK.
  // Once set, every later submission fails with it.
  absl::Status failure() const;

 private:
  struct Task {
    AsyncHandle handle;
    std::function<void()> body;
    int64_t buffer_bytes = 0;
  };
  void Loop();
  // The piece size in use: options_.chunk_bytes, or the default pieces
  // while it is 0 (automatic, before or without tuning).
  int64_t ChunkBytes() const;
  // Elements of `t`'s dtype in one piece of ChunkBytes().
  int64_t PieceElements(const at::Tensor& t) const;
  // The tag of the next piece's sends and receives (Gloo). Called on the
  // communication thread only.
  int NextTag();
  static constexpr int kTagMask = (1 << 30) - 1;

  const c10::intrusive_ptr<c10d::ProcessGroup> group_;
  const int rank_;
  const int world_size_;
  const bool native_collectives_;  // NCCL: _allgather_base et al.
  // Changed only by TuneChunkBytes, on the communication thread.
  CommOptions options_;
  // The last tag NextTag drew.
  int next_tag_ = 0;
  // SetProbeSecondsForTesting; 0: use the measured time.
  double probe_seconds_for_testing_ = 0;

  mutable absl::Mutex mu_;
  absl::CondVar cv_;
  std::deque<Task> queue_ ABSL_GUARDED_BY(mu_);
  AsyncHandle last_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status failure_ ABSL_GUARDED_BY(mu_);
  // The communication thread: pops tasks in submission order and runs each
  // to completion (issue, wait, unpack) before the next, so all ranks see the
  // same collective sequence. Declared last: it starts after the state above.
  std::thread thread_;
};

// A collective's failure carried past the Communicator that saw it: the
// status gets a payload, so that a caller holding no Communicator (the job
// failed to start and is gone) can tell a lost peer from the job's own
// error.
absl::Status MarkCollectiveFailure(absl::Status status);
bool IsCollectiveFailure(const absl::Status& status);

}  // namespace tandem

#endif  // TANDEM_WORKER_RUNTIME_COMMUNICATOR_H_
