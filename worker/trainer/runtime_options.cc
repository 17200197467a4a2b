#include "worker/trainer/runtime_options.h"

#include <dlfcn.h>

#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <string>

#include "ATen/Parallel.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "worker/runtime/torch_status.h"

#ifdef TANDEM_WITH_CUDA
#include <cuda_runtime_api.h>

#include "c10/cuda/CUDAFunctions.h"
#endif

namespace tandem {

std::string DescribeRuntime(const RuntimeOptions& options) {
  return absl::StrCat(options.device.str(), " with ",
                      CollectiveBackendName(options.backend));
}

absl::StatusOr<DeviceChoice> ParseDeviceChoice(absl::string_view value) {
  if (value == "auto") return DeviceChoice::kAuto;
  if (value == "cpu") return DeviceChoice::kCpu;
  if (value == "cuda") return DeviceChoice::kCuda;
  return absl::InvalidArgumentError(
      absl::StrCat("--device: expected auto, cpu or cuda, got '", value,
                   "' (the GPU index comes from LOCAL_RANK)"));
}

absl::StatusOr<int> ParseLocalRank(const char* local_rank,
                                   const char* slurm_localid) {
  const char* name = "LOCAL_RANK";
  const char* value = local_rank;
  if (value == nullptr || *value == '\0') {
    name = "SLURM_LOCALID";
    value = slurm_localid;
  }
  if (value == nullptr || *value == '\0') return 0;
  int parsed = -1;
  if (!absl::SimpleAtoi(value, &parsed) || parsed < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, "='", value,
                     "' is not a non-negative integer; the launcher sets it "
                     "to this process's index on its machine"));
  }
  return parsed;
}

absl::StatusOr<int> LocalRankFromEnvironment() {
  return ParseLocalRank(std::getenv("LOCAL_RANK"),
                        std::getenv("SLURM_LOCALID"));
}

CudaAvailability ThisBuildsCuda() {
  CudaAvailability cuda;
#ifdef TANDEM_WITH_CUDA
  cuda.built = true;
  // device_count() is noexcept and 0 when the driver finds no GPU.
  cuda.visible_devices = static_cast<int>(c10::cuda::device_count());
#endif
#ifdef TANDEM_WITH_NCCL
  cuda.nccl = true;
#endif
  return cuda;
}

absl::StatusOr<RuntimeOptions> ResolveRuntimeOptions(
    DeviceChoice choice, int local_rank, const CudaAvailability& cuda) {
  RuntimeOptions cpu;
  if (choice == DeviceChoice::kCpu) return cpu;
  if (choice == DeviceChoice::kAuto &&
      (!cuda.built || !cuda.nccl || cuda.visible_devices == 0)) {
    return cpu;
  }
  if (!cuda.built) {
    return absl::FailedPreconditionError(
        "--device cuda: this tandem-worker was built against a CPU-only "
        "libtorch; rebuild against PyTorch's CUDA libtorch "
        "(-DCMAKE_PREFIX_PATH=$(python3 -c 'import torch.utils; "
        "print(torch.utils.cmake_prefix_path)'), see worker/README.md) or "
        "use --device cpu");
  }
  if (!cuda.nccl) {
    return absl::FailedPreconditionError(
        "--device cuda: this build has CUDA but not the NCCL backend; "
        "rebuild with -DTANDEM_WITH_NCCL=ON or use --device cpu");
  }
  if (cuda.visible_devices == 0) {
    return absl::FailedPreconditionError(
        "--device cuda: no GPU is visible to this process (check "
        "nvidia-smi and CUDA_VISIBLE_DEVICES); use --device cpu or auto");
  }
  // One visible GPU: the launcher gave this rank its own (Slurm's
  // --gpus-per-task, one GPU per pod), whatever its local rank.
  const int index = cuda.visible_devices == 1 ? 0 : local_rank;
  if (index >= cuda.visible_devices) {
    return absl::FailedPreconditionError(absl::StrCat(
        "local rank ", local_rank, " (LOCAL_RANK) needs GPU cuda:", local_rank,
        ", but this process sees ", cuda.visible_devices,
        " GPUs; start at most one rank per GPU on each machine"));
  }
  RuntimeOptions gpu;
  gpu.device =
      c10::Device(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(index));
  gpu.backend = CollectiveBackend::kNccl;
  return gpu;
}

int SetComputeThreads(int threads) {
  if (threads > 0) at::set_num_threads(threads);
  // Looked up, not linked: libtorch's BLAS is whichever libblas.so.3 the
  // machine selects, OpenBLAS or another.
  using GetThreads = int (*)();
  using SetThreads = void (*)(int);
  const auto get = reinterpret_cast<GetThreads>(
      dlsym(RTLD_DEFAULT, "openblas_get_num_threads"));
  const auto set = reinterpret_cast<SetThreads>(
      dlsym(RTLD_DEFAULT, "openblas_set_num_threads"));
  if (get == nullptr || set == nullptr) return 0;
  if (threads > 0 && std::getenv("OPENBLAS_NUM_THREADS") == nullptr) {
    set(threads);
  }
  return get();
}

absl::StatusOr<MemoryMeter*> ActivateRuntime(const RuntimeOptions& options) {
  const c10::Device& device = options.device;
  if (options.backend != BackendForDevice(device.type())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the ", CollectiveBackendName(options.backend),
        " backend cannot carry tensors on ", device.str(), "; use ",
        CollectiveBackendName(BackendForDevice(device.type()))));
  }
  if (!BackendAvailable(options.backend)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "this build has no ", CollectiveBackendName(options.backend),
        " backend (", device.str(),
        " needs a CUDA libtorch and -DTANDEM_WITH_NCCL=ON); use the cpu "
        "device"));
  }
  if (device.is_cuda()) {
    if (!device.has_index()) {
      return absl::InvalidArgumentError(
          "a CUDA runtime needs a GPU index (cuda:N)");
    }
#ifdef TANDEM_WITH_CUDA
    // The calling thread computes: tensors it makes without a device index
    // land on its current device. (The current device is per thread.)
    RETURN_IF_ERROR(TorchCall(absl::StrCat("selecting ", device.str()),
                              [&] { c10::cuda::set_device(device.index()); }));
#endif
  }
  MemoryMeter* meter = MemoryMeterFor(device);
  if (meter == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("no memory meter for ", device.str(), " in this build"));
  }
  return meter;
}

absl::StatusOr<TrainingJobOptions> TrainingJobOptionsFor(
    const RuntimeOptions& options, const std::string& offload_dir) {
  TrainingJobOptions job;
  job.offload_dir = offload_dir;
  job.device = options.device;
  return job;
}

int64_t DeviceMemoryBytes(const RuntimeOptions& options) {
  if (options.device.is_cuda()) {
#ifdef TANDEM_WITH_CUDA
    size_t free_bytes = 0;
    size_t total_bytes = 0;
    if (cudaMemGetInfo(&free_bytes, &total_bytes) == cudaSuccess) {
      return static_cast<int64_t>(total_bytes);
    }
#endif
    return 0;
  }
  std::ifstream meminfo("/proc/meminfo");
  std::string key;
  int64_t kib = 0;
  std::string unit;
  while (meminfo >> key >> kib >> unit) {
    if (key == "MemAvailable:") return kib * 1024;
  }
  return 0;
}

}  // namespace tandem
