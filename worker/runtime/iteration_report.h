// What one rank reports after each training iteration, and the interface it
// reports through. The runtime knows nothing of Prometheus: the training job
// fills an IterationReport and hands it to whatever IterationObserver the
// process wired in (worker/metrics/worker_metrics.h exports them; tests pass
// a fake). No libtorch.
#ifndef TANDEM_WORKER_RUNTIME_ITERATION_REPORT_H_
#define TANDEM_WORKER_RUNTIME_ITERATION_REPORT_H_

#include <array>
#include <cstdint>
#include <string>

#include "common/ir/graph.h"
#include "common/ir/schedule.h"

namespace tandem {

struct IterationReport {
  int64_t step = 0;
  double loss = 0;
  double iteration_s = 0;
  // Node time (forward, backward, optimizer), less communication waited for
  // inside it.
  double compute_s = 0;
  // Time collectives ran on the communication stream, plus the end-of-step
  // exchange.
  double communication_s = 0;
  // Time compute was blocked on communication.
  double exposed_communication_s = 0;
  // Tokens this rank trained on in the iteration (data.kind tensors: the
  // items its loss counted, worker/data/tensor_source.h).
  int64_t tokens = 0;
  // Memory: allocated at the end of the iteration, the iteration's peak, the
  // job's budget (0: none), and the most optimizer-state bytes on the host
  // tier during the iteration.
  int64_t allocated_bytes = 0;
  int64_t peak_bytes = 0;
  int64_t budget_bytes = 0;
  int64_t offloaded_bytes = 0;
  // Full params: gathered at once at most (persistent included), kept
  // gathered across iterations (persistent), and this rank's shards.
  int64_t gathered_param_bytes = 0;
  int64_t persistent_param_bytes = 0;
  int64_t sharded_param_bytes = 0;
  int64_t schedule_version = 0;
  // Loss scaling (loss_scaler.h): the scale the iteration's loss was
  // multiplied by (0: the job does not scale its loss), and whether the
  // step was skipped (its gradients overflowed on some rank).
  double loss_scale = 0;
  bool skipped = false;
  // Full bytes moved in the iteration, by CollectiveKind.
  std::array<int64_t, 3> collective_bytes{};

  // Fraction of communication hidden behind compute: 1 - exposed /
  // communication, in [0, 1] (1 when nothing was communicated).
  double overlap_ratio() const;
};

// Receives every iteration's report. Called on the training thread, so it
// must be quick; implementations are thread-safe towards their readers.
class IterationObserver {
 public:
  virtual ~IterationObserver() = default;
  // Once, before the first iteration: the job (the coordinator's id, or the
  // spec's name in standalone mode) and this process's rank.
  virtual void OnStart(const std::string& job, int rank, int world_size) = 0;
  virtual void OnIteration(const IterationReport& report) = 0;
};

// What a schedule keeps in memory, from its actions in graph order.
struct ScheduleFootprint {
  // Most full param bytes gathered at once, persistent params included.
  int64_t peak_gathered_bytes = 0;
  int64_t persistent_bytes = 0;
  // Most optimizer-state bytes offloaded at once.
  int64_t peak_offloaded_bytes = 0;
};
ScheduleFootprint ComputeScheduleFootprint(const Graph& graph,
                                           const Schedule& schedule);

}  // namespace tandem

#endif  // TANDEM_WORKER_RUNTIME_ITERATION_REPORT_H_
