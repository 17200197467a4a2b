// Standalone training: the engine without a coordinator. Wires a job spec to
// the runtime (model program, sharded store, the process group of the
// runtime's backend over a TCPStore, executor, data), trains
// spec.train.steps steps and writes one JSON object per line per step:
//   {"step":0,"loss":...,"iteration_s":...,"exposed_comm_s":...,
//    "peak_bytes":...,"schedule_version":...,"grad_norm":...,"rank":0}
// and a final {"param_digests":{"<param>":...,...},"steps":N,"rank":r}.
// The loss is the global-batch mean and each digest a position-weighted
// float64 sum of a full param (Executor::ParamDigests); both are identical
// on every rank. With checkpoint.dir set it
// resumes from the newest complete checkpoint and prints only the steps it
// runs. Without --schedule it runs the baseline of the spec's zero_stage.
// With --alternate it measures two schedules interleaved, as the
// coordinator's comparisons do (coordinator/README.md, "Decisions under
// noise"): after the first step, the alternate and the first schedule take
// turns in blocks of --block-steps steps, the alternate first, to the end;
// each step line's schedule_version says which ran.
#ifndef TANDEM_WORKER_STANDALONE_STANDALONE_TRAINER_H_
#define TANDEM_WORKER_STANDALONE_STANDALONE_TRAINER_H_

#include <ostream>
#include <string>

#include "absl/status/status.h"
#include "tandem/v1/job.pb.h"
#include "worker/runtime/iteration_report.h"
#include "worker/runtime/process_group.h"
#include "worker/trainer/runtime_options.h"

namespace tandem {

struct StandaloneOptions {
  // Defaults applied and validated (LoadJobSpec).
  v1::JobSpec spec;
  // Rank, world size (authoritative over parallel.world_size) and store.
  // Its backend is ignored: runtime.backend is used.
  RendezvousOptions rendezvous;
  // Where this rank trains and the backend of its collectives.
  RuntimeOptions runtime;
  // Text-form schedule to run; empty: the on-demand baseline.
  std::string schedule_path;
  // A second schedule (text form) to alternate with the first in blocks of
  // `block_steps` steps; empty: none. Its version is raised above the
  // first's when it is not newer (the step lines tell them apart by it).
  std::string alternate_path;
  int block_steps = 4;
  // Where to write this rank's profile: text form, or tandem.v1.Profile
  // binary when the name ends in ".pb". Empty: none. Like an agent's
  // windows, it leaves out the process's first step (one-time costs) unless
  // that is the only step.
  std::string profile_out;
  // Where to write the iteration graph the rank derived from its program
  // (text form, the input of `tandem-plan --graph`), before training; an
  // archive has no analytic model to build it from. Empty: none.
  std::string graph_out;
  // Intra-op threads for libtorch; 0 leaves libtorch's default.
  int threads = 0;
  // Host-tier directory for offloaded optimizer states (empty: the default,
  // TrainingJobOptions).
  std::string offload_dir;
  // Where to write the last iteration's Chrome trace (JSON trace events),
  // one file per rank: "{rank}" in it is replaced by the rank, else at
  // world > 1 ".rank<R>" is appended (ranks started with the same command
  // line never overwrite each other's). Empty: none.
  std::string trace_out;
  // Receives every iteration's report (the worker's metrics); may be null.
  // Its job label is the spec's name ("standalone" when unnamed).
  IterationObserver* observer = nullptr;
};

// Errors: the first failure, with what to do next (bad spec or schedule,
// rendezvous, a peer lost, memory budget exceeded).
absl::Status RunStandalone(const StandaloneOptions& options, std::ostream& out);

}  // namespace tandem

#endif  // TANDEM_WORKER_STANDALONE_STANDALONE_TRAINER_H_
