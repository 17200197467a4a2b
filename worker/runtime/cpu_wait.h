// How long the compute thread waited for a CPU in a step: the kernel's
// run_delay for the calling thread (/proc/thread-self/schedstat: time on a
// CPU, time runnable but waiting on a run queue, timeslices; nanoseconds),
// as a share of the step's wall time. The ranks' own threads cost each
// other some (about 0.06 of a step on a 2-core host); another process
// taking CPU time from the ranks (a neighbouring job, a CPU hog) raises it
// (0.16 at half a core, 0.23 at 0.9: bench/README.md, "A signal for the
// CPU hog"). Each step reports it (IterationProgress.cpu_wait_share), and
// the coordinator leaves blocks measured on a busy host out of its
// comparisons (coordinator/README.md, "A busy host").
//
// No libtorch: tested in isolation.
#ifndef TANDEM_WORKER_RUNTIME_CPU_WAIT_H_
#define TANDEM_WORKER_RUNTIME_CPU_WAIT_H_

#include <cstdint>
#include <optional>

#include "absl/strings/string_view.h"

namespace tandem {

// The run_delay field (the second) of a schedstat line; nullopt when the
// line is not three non-negative integers.
std::optional<int64_t> ParseRunDelayNs(absl::string_view schedstat);

// The calling thread's run_delay so far; nullopt where the kernel keeps no
// schedstat (not Linux, or a kernel built without CONFIG_SCHED_INFO).
std::optional<int64_t> ThreadRunDelayNs();

// One step's share, begun and ended on the thread it measures.
class CpuWaitMeter {
 public:
  // At the step's start.
  void Begin() { begin_ns_ = ThreadRunDelayNs(); }
  // At its end, `wall_s` after Begin: the share of it the thread waited for
  // a CPU, in [0, 1]; -1 when not measured.
  double EndShare(double wall_s);

 private:
  std::optional<int64_t> begin_ns_;
};

// The share for a step of `wall_s` whose run_delay went from `begin_ns` to
// `end_ns`: -1 when either is missing, the wall time is not positive or the
// count went backwards; at most 1.
double CpuWaitShare(std::optional<int64_t> begin_ns,
                    std::optional<int64_t> end_ns, double wall_s);

}  // namespace tandem

#endif  // TANDEM_WORKER_RUNTIME_CPU_WAIT_H_
