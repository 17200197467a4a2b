#include "worker/runtime/interference_probe.h"

#include <algorithm>
#include <chrono>
#include <functional>
#include <memory>
#include <vector>

#include "ATen/ATen.h"
#include "absl/status/status.h"
#include "common/status_macros.h"
#include "worker/runtime/host_tier.h"

namespace tandem {
namespace {

using Clock = std::chrono::steady_clock;

double SecondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// A unit of compute like a model's: a small matmul, read back so that a
// device finishes it before the next starts.
class ComputeLoop {
 public:
  explicit ComputeLoop(at::Device device)
      // Constants, not random: the probe must not draw from the generator
      // the model's initialization and data use.
      : a_(at::full({192, 192}, 0.5, at::TensorOptions().device(device))),
        b_(at::full({192, 192}, 0.25, at::TensorOptions().device(device))),
        stream_(at::full({int64_t{1} << 20}, 1.0,
                         at::TensorOptions().device(device))) {}

  // A matmul (compute-bound, like a layer's projections) and a pass over
  // 4 MiB (memory-bound, like its norms and activations): a model's nodes
  // are both, and transfers slow the second more.
  void Once() {
    const at::Tensor c = at::mm(a_, b_);
    stream_.mul_(0.5).add_(0.5);
    sink_ += c.select(0, 0).select(0, 0).item<float>() +
             stream_.select(0, 0).item<float>();
  }

  // Units per second over about `seconds`.
  double RateAlone(double seconds) {
    const Clock::time_point start = Clock::now();
    int64_t units = 0;
    double elapsed = 0;
    do {
      Once();
      ++units;
      elapsed = SecondsSince(start);
    } while (elapsed < seconds);
    return static_cast<double>(units) / elapsed;
  }

  // Runs units until `done()` and returns the rate and the seconds it ran.
  std::pair<double, double> RateUntil(const std::function<bool()>& done) {
    const Clock::time_point start = Clock::now();
    int64_t units = 0;
    do {
      Once();
      ++units;
    } while (!done());
    const double elapsed = SecondsSince(start);
    return {static_cast<double>(units) / elapsed, elapsed};
  }

 private:
  at::Tensor a_;
  at::Tensor b_;
  at::Tensor stream_;
  float sink_ = 0;
};

// How long one probe collective lasts on the measured link: about a
// layer's node on the bench (3-15 ms), so that which rank a transfer slows
// changes no more often within one than within a step's nodes. With 25 ms
// transfers the slower rank's loss read 1.09-2.22 s per GB all-gathered on
// wide-short's 2000 Mbit/s link, with 8 ms ones 1.45-2.12, against the
// 1.94 its steps pay (bench/README.md, e2e, "Why first plans miss").
constexpr double kTransferSeconds = 0.008;

// HardwareModel::kMaxStretch (common/sim; not a worker dependency).
constexpr double kMaxStretch = 4;

double Median(std::vector<double> values) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

// What one kind of transfer takes from compute and compute from it.
struct KindInterference {
  // Compute seconds per byte moved (the slower rank's at each repetition
  // when `slowest` is given), and this rank's own.
  double per_byte = 0;
  double own_per_byte = 0;
  // Its run time with the compute loop running against alone (>= 1).
  double stretch = 1;
  // Its median run time alone.
  double alone_s = 0;
};

// `start` submits a transfer of `bytes` and returns its handle; `barrier`
// returns once every rank has reached it (nothing at world 1); `slowest`,
// for a collective, returns the largest of the ranks' values (the ranks
// call it together). Each
// repetition measures the loop's rate alone, meets the other ranks, runs the
// transfer alone (nothing computes until it is done), then at once again
// under the compute loop. Both transfers start on every rank within a
// latency of each other: a rank that started one earlier would count its
// wait for the others as the transfer's time.
//
// The figures are totals over the repetitions (compute lost over bytes
// moved, time under compute over time alone), not medians: one repetition
// varies several-fold on a shared machine (a 4 MB all-gather at 2000 Mbit/s
// ran 10-20 ms alone and 13-40 ms under compute), and what a plan pays is
// the sum over its many transfers. Medians of five read a stretch of
// 1.14-2.03x from run to run of the same job.
//
// A collective's compute loss is the slower rank's at each repetition: the
// cores that move the bytes slow one rank's compute more than the other's,
// in turn, and a training step pays the slower side at every collective
// (the next one waits for it). The ranks' mean read wide-short's loss at
// about half of what its steps pay (bench/README.md, e2e, "Why first plans
// miss"). `own_per_byte` keeps this rank's own, for the log.
absl::StatusOr<KindInterference> MeasureKind(
    ComputeLoop& loop, int64_t bytes, const InterferenceProbeOptions& options,
    const std::function<AsyncHandle()>& start,
    const std::function<absl::Status()>& barrier,
    const std::function<absl::StatusOr<double>(double)>& slowest) {
  double lost_s = 0;
  double own_lost_s = 0;
  double solo_s = 0;
  double with_s = 0;
  int64_t moved = 0;
  std::vector<double> alone_runs;
  for (int rep = 0; rep < std::max(options.repetitions, 1); ++rep) {
    const double alone = loop.RateAlone(options.alone_window_s);
    RETURN_IF_ERROR(barrier());
    AsyncHandle solo = start();
    RETURN_IF_ERROR(solo->Wait());
    alone_runs.push_back(solo->run_s());
    AsyncHandle handle = start();
    const auto [with, elapsed] =
        loop.RateUntil([&handle] { return handle->done(); });
    RETURN_IF_ERROR(handle->Wait());
    const double lost = elapsed * std::max(0.0, 1 - with / alone);
    own_lost_s += lost;
    if (slowest) {
      ASSIGN_OR_RETURN(const double worst, slowest(lost));
      lost_s += worst;
    } else {
      lost_s += lost;
    }
    moved += bytes;
    solo_s += solo->run_s();
    with_s += handle->run_s();
  }
  KindInterference out;
  out.per_byte = moved > 0 ? lost_s / static_cast<double>(moved) : 0;
  out.own_per_byte = moved > 0 ? own_lost_s / static_cast<double>(moved) : 0;
  out.alone_s = Median(std::move(alone_runs));
  if (solo_s > 0 && with_s > 0) {
    out.stretch = std::clamp(with_s / solo_s, 1.0, kMaxStretch);
  }
  return out;
}

}  // namespace

absl::StatusOr<InterferenceProbe> MeasureInterference(
    Communicator& comm, at::Device device,
    const InterferenceProbeOptions& options) {
  const Clock::time_point begin = Clock::now();
  InterferenceProbe probe;
  ComputeLoop loop(device);
  loop.Once();  // warm up the kernel and its buffers
  const int world = comm.world_size();
  if (world > 1) {
    int64_t out_bytes = options.collective_bytes;
    if (out_bytes <= 0) {
      out_bytes = options.link_bytes_per_s > 0
                      ? static_cast<int64_t>(options.link_bytes_per_s *
                                             kTransferSeconds)
                      : (int64_t{2} << 20);
      out_bytes =
          std::clamp<int64_t>(out_bytes, int64_t{512} << 10, int64_t{16} << 20);
    }
    // Each rank sends its n floats to the world − 1 others.
    const int64_t n = std::max<int64_t>(
        1, out_bytes / static_cast<int64_t>(sizeof(float)) / (world - 1));
    const auto options_f = at::TensorOptions().device(device);
    const at::Tensor shard = at::zeros({n}, options_f);
    const at::Tensor full = at::zeros({n * world}, options_f);
    const int64_t full_bytes = n * world * static_cast<int64_t>(sizeof(float));
    const auto barrier = [&comm] {
      return comm.AllGatherScalars({0.0}).status();
    };
    const auto slowest = [&comm](double value) -> absl::StatusOr<double> {
      ASSIGN_OR_RETURN(const std::vector<double> all,
                       comm.AllGatherScalars({value}));
      return *std::max_element(all.begin(), all.end());
    };
    ASSIGN_OR_RETURN(
        const KindInterference allgather,
        MeasureKind(
            loop, full_bytes, options,
            [&] { return comm.Submit([&] { comm.AllGather(shard, full); }); },
            barrier, slowest));
    ASSIGN_OR_RETURN(
        const KindInterference reduce_scatter,
        MeasureKind(
            loop, full_bytes, options,
            [&] {
              return comm.Submit([&] { comm.ReduceScatterSum(full, shard); });
            },
            barrier, slowest));
    probe.compute_s_per_allgather_byte = allgather.per_byte;
    probe.own_compute_s_per_allgather_byte = allgather.own_per_byte;
    probe.own_compute_s_per_reduce_scatter_byte = reduce_scatter.own_per_byte;
    probe.allgather_stretch = allgather.stretch;
    probe.compute_s_per_reduce_scatter_byte = reduce_scatter.per_byte;
    probe.reduce_scatter_stretch = reduce_scatter.stretch;
  }
  {
    ASSIGN_OR_RETURN(std::unique_ptr<HostTier> tier,
                     HostTier::Create(device, options.offload_dir));
    constexpr int64_t kCopyNumel = (int64_t{8} << 20) / sizeof(float);
    constexpr int kCopiesPerTransfer = 4;
    const at::Tensor src =
        at::zeros({kCopyNumel}, at::TensorOptions().device(device));
    ASSIGN_OR_RETURN(at::Tensor dst, tier->Allocate(kCopyNumel));
    const int64_t bytes =
        kCopyNumel * static_cast<int64_t>(sizeof(float)) * kCopiesPerTransfer;
    ASSIGN_OR_RETURN(const KindInterference copy,
                     MeasureKind(
                         loop, bytes, options,
                         [&] {
                           return tier->Submit([&] {
                             for (int i = 0; i < kCopiesPerTransfer; ++i) {
                               tier->Copy(src, dst);
                             }
                           });
                         },
                         // Each rank's copies are its own: nothing to meet.
                         [] { return absl::OkStatus(); }, nullptr));
    probe.compute_s_per_copy_byte = copy.per_byte;
    probe.copy_stretch = copy.stretch;
    probe.host_copy_s = copy.alone_s;
    probe.host_copy_bytes = bytes;
  }
  // Every rank reports the mean over ranks: they share the machine's cores.
  constexpr int kFigures = 6;
  ASSIGN_OR_RETURN(std::vector<double> all,
                   comm.AllGatherScalars(
                       {probe.compute_s_per_allgather_byte,
                        probe.compute_s_per_reduce_scatter_byte,
                        probe.compute_s_per_copy_byte, probe.allgather_stretch,
                        probe.reduce_scatter_stretch, probe.copy_stretch}));
  double sums[kFigures] = {0, 0, 0, 0, 0, 0};
  for (size_t i = 0; i < all.size(); ++i) sums[i % kFigures] += all[i];
  probe.compute_s_per_allgather_byte = sums[0] / world;
  probe.compute_s_per_reduce_scatter_byte = sums[1] / world;
  probe.compute_s_per_copy_byte = sums[2] / world;
  probe.allgather_stretch = sums[3] / world;
  probe.reduce_scatter_stretch = sums[4] / world;
  probe.copy_stretch = sums[5] / world;
  probe.probe_s = SecondsSince(begin);
  return probe;
}

}  // namespace tandem
