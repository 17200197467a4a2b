// Where a rank trains and how its collectives travel: the device (CPU, or
// the GPU cuda:LOCAL_RANK) and the c10d backend that goes with it (Gloo on
// CPU, NCCL on CUDA). Both trainers take a RuntimeOptions; the worker's
// `--device auto|cpu|cuda` flag is resolved into one here, against what this
// build and this machine have:
//
//   --device cpu   ──>  {cpu, gloo}
//   --device cuda  ──>  {cuda:LOCAL_RANK, nccl}   error on a CPU-only build
//                                                 or when no GPU is visible
//   --device auto  ──>  cuda as above when this build has CUDA and a GPU is
//                       visible, else cpu
//
// LOCAL_RANK is what torchrun and deploy/slurm/tandem-rank.sh export; a bare
// Slurm task has SLURM_LOCALID instead. A process that sees exactly one GPU
// uses cuda:0 whatever its local rank: its launcher gave it that GPU
// (Slurm's --gpus-per-task, one GPU per pod).
#ifndef TANDEM_WORKER_TRAINER_RUNTIME_OPTIONS_H_
#define TANDEM_WORKER_TRAINER_RUNTIME_OPTIONS_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "c10/core/Device.h"
#include "worker/runtime/memory_meter.h"
#include "worker/runtime/process_group.h"
#include "worker/trainer/training_job.h"

namespace tandem {

struct RuntimeOptions {
  // Where params, activations and optimizer states live: cpu or cuda:N.
  c10::Device device = c10::Device(c10::DeviceType::CPU);
  // The collectives' backend: kGloo with cpu, kNccl with cuda.
  CollectiveBackend backend = CollectiveBackend::kGloo;
};

// For logs: "cpu with gloo", "cuda:1 with nccl".
std::string DescribeRuntime(const RuntimeOptions& options);

// The value of `--device`.
enum class DeviceChoice { kAuto, kCpu, kCuda };

// Parses "auto", "cpu" or "cuda". InvalidArgument otherwise (naming the
// flag and the accepted values).
absl::StatusOr<DeviceChoice> ParseDeviceChoice(absl::string_view value);

// This process's index among the ranks on its machine: LOCAL_RANK, else
// SLURM_LOCALID, else 0. InvalidArgument when the variable in use is not a
// non-negative integer. ParseLocalRank takes the two values (null: unset).
absl::StatusOr<int> ParseLocalRank(const char* local_rank,
                                   const char* slurm_localid);
absl::StatusOr<int> LocalRankFromEnvironment();

// What the machine and the build offer, as ResolveRuntimeOptions sees it.
struct CudaAvailability {
  // Built against a CUDA libtorch (TANDEM_WITH_CUDA) and with NCCL
  // (TANDEM_WITH_NCCL).
  bool built = false;
  bool nccl = false;
  // GPUs this process sees (after CUDA_VISIBLE_DEVICES).
  int visible_devices = 0;
};
// This build's, and this machine's GPUs (0 on a CPU-only build; never
// initializes a CUDA context beyond what counting devices needs).
CudaAvailability ThisBuildsCuda();

// The runtime for `choice` at local rank `local_rank`. Errors
// (InvalidArgument / FailedPrecondition) say what to do: cuda on a CPU-only
// build, cuda without NCCL, no GPU visible, LOCAL_RANK beyond the GPUs.
absl::StatusOr<RuntimeOptions> ResolveRuntimeOptions(
    DeviceChoice choice, int local_rank, const CudaAvailability& cuda);

// Caps the threads this process computes with at `threads` (0: leaves
// libtorch's default): libtorch's intra-op pool and, where libtorch's BLAS
// is OpenBLAS and OPENBLAS_NUM_THREADS is not set, OpenBLAS's own pool,
// which at::set_num_threads does not reach. Left at one thread per core,
// OpenBLAS's idle threads spin in sched_yield between calls, taking the
// cores that the collectives, the host tier and the checkpoint writer need.
// Returns OpenBLAS's thread count after (0: no OpenBLAS in this process).
int SetComputeThreads(int threads);

// Checks that this build can run `options` (the pair is gloo/cpu or
// nccl/cuda, and the build has it), makes the device current on the calling
// thread (CUDA) and returns its memory meter. The trainers call it before
// creating anything on the device.
absl::StatusOr<MemoryMeter*> ActivateRuntime(const RuntimeOptions& options);

// The memory the device offers, as the coordinator plans with it when the
// job's budget is 0: a GPU's total memory (after ActivateRuntime), or on CPU
// the host's MemAvailable from /proc/meminfo, which every rank on the host
// shares (the coordinator divides it among them). 0 when it cannot be read.
int64_t DeviceMemoryBytes(const RuntimeOptions& options);

// The TrainingJob settings for `options` with the host tier in
// `offload_dir`.
absl::StatusOr<TrainingJobOptions> TrainingJobOptionsFor(
    const RuntimeOptions& options, const std::string& offload_dir);

}  // namespace tandem

#endif  // TANDEM_WORKER_TRAINER_RUNTIME_OPTIONS_H_
