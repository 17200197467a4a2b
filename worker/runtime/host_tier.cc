#include "worker/runtime/host_tier.h"

#include <fcntl.h>
#include <pthread.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <utility>
#include <vector>

#include "ATen/ATen.h"
#include "absl/strings/str_cat.h"
#include "worker/runtime/torch_status.h"

#ifdef TANDEM_WITH_CUDA
#include "ATen/cuda/CUDAContext.h"
#include "ATen/cuda/CUDAEvent.h"
#include "c10/cuda/CUDAGuard.h"
#include "c10/cuda/CUDAStream.h"
#endif

namespace tandem {
namespace {

std::string DefaultDir() {
  for (const char* name : {"TANDEM_OFFLOAD_DIR", "TMPDIR"}) {
    const char* value = std::getenv(name);
    if (value != nullptr && value[0] != '\0') return value;
  }
  return "/tmp";
}

// Writes every page of a fresh mapping once, now, so that the first copy
// into it runs as fast as later ones: on this project's VM (ext4 /tmp) a
// 5 MiB copy into a fresh mapping took 17 ms, into one written once 0.4
// ms; MADV_POPULATE_WRITE left it at 5 ms (2026-12-02, worker/README.md,
// "Offload"). The mapping reads as zeros already.
void PrefaultPages(void* data, size_t bytes) { std::memset(data, 0, bytes); }

}  // namespace

struct HostTier::Task {
  AsyncHandle handle;
  std::function<void()> body;
#ifdef TANDEM_WITH_CUDA
  // Recorded on the compute stream at submission: the copy stream waits for
  // it, so a copy sees everything compute wrote before it was submitted.
  std::unique_ptr<at::cuda::CUDAEvent> ready;
#endif
};

struct HostTier::CudaState {
#ifdef TANDEM_WITH_CUDA
  explicit CudaState(at::Device device)
      : stream(c10::cuda::getStreamFromPool(/*isHighPriority=*/false,
                                            device.index())) {}
  c10::cuda::CUDAStream stream;
#endif
};

HostTier::HostTier(at::Device device, std::string dir)
    : device_(device), dir_(std::move(dir)), thread_([this] { Loop(); }) {}

absl::StatusOr<std::unique_ptr<HostTier>> HostTier::Create(at::Device device,
                                                           std::string dir) {
  if (device.is_cpu()) {
    if (dir.empty()) dir = DefaultDir();
    struct stat st;
    if (stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode) ||
        access(dir.c_str(), W_OK) != 0) {
      return absl::FailedPreconditionError(absl::StrCat(
          "offload directory '", dir,
          "' is not a writable directory; pass --offload-dir (or set "
          "TANDEM_OFFLOAD_DIR) to a directory on a local disk"));
    }
    return std::unique_ptr<HostTier>(new HostTier(device, std::move(dir)));
  }
#ifdef TANDEM_WITH_CUDA
  if (device.is_cuda()) {
    std::unique_ptr<HostTier> tier(new HostTier(device, ""));
    absl::Status s = TorchCall("creating the copy stream", [&] {
      tier->cuda_ = std::make_unique<CudaState>(device);
    });
    if (!s.ok()) return s;
    return tier;
  }
#endif
  return absl::UnimplementedError(
      absl::StrCat("no host tier for device ", device.str(), " in this build"));
}

HostTier::~HostTier() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

absl::StatusOr<at::Tensor> HostTier::Allocate(int64_t numel) {
  const auto f32 = at::TensorOptions().dtype(at::kFloat);
  if (numel <= 0) return at::empty({0}, f32);
  const size_t bytes = static_cast<size_t>(numel) * sizeof(float);
#ifdef TANDEM_WITH_CUDA
  if (device_.is_cuda()) {
    return TorchCallOr<at::Tensor>("allocating pinned host memory", [&] {
      at::Tensor t = at::empty({numel}, f32.pinned_memory(true));
      held_bytes_ += static_cast<int64_t>(bytes);
      return t;
    });
  }
#endif
  // One unlinked file per allocation: its pages belong to the mapping only,
  // and the kernel writes them back to the disk under memory pressure.
  std::string path = absl::StrCat(dir_, "/tandem-offload-XXXXXX");
  std::vector<char> name(path.begin(), path.end());
  name.push_back('\0');
  const int fd = mkstemp(name.data());
  if (fd < 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot create a host-tier file in '", dir_,
                     "': ", std::strerror(errno), "; check --offload-dir"));
  }
  unlink(name.data());
  if (ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    const int err = errno;
    close(fd);
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot size a ", bytes, "-byte host-tier file in '", dir_,
                     "': ", std::strerror(err), "; free space there"));
  }
  void* data = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  const int err = errno;
  close(fd);  // the mapping keeps the file
  if (data == MAP_FAILED) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "cannot map ", bytes, " bytes of host tier: ", std::strerror(err)));
  }
  PrefaultPages(data, bytes);
  held_bytes_ += static_cast<int64_t>(bytes);
  return at::from_blob(
      data, {numel}, [bytes](void* p) { munmap(p, bytes); }, f32);
}

AsyncHandle HostTier::Submit(std::function<void()> copy) {
  auto task = std::make_unique<Task>();
  task->handle = std::make_shared<AsyncWork>(AsyncWork::Kind::kHostCopy);
  task->body = std::move(copy);
#ifdef TANDEM_WITH_CUDA
  if (cuda_ != nullptr) {
    task->ready = std::make_unique<at::cuda::CUDAEvent>();
    task->ready->record(at::cuda::getCurrentCUDAStream(device_.index()));
  }
#endif
  AsyncHandle handle = task->handle;
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(std::move(task));
    last_ = handle;
  }
  cv_.notify_all();
  return handle;
}

void HostTier::Copy(const at::Tensor& src, const at::Tensor& dst) {
  TORCH_CHECK(src.numel() == dst.numel(), "host-tier copy of ", src.numel(),
              " elements into ", dst.numel());
  if (src.numel() == 0) return;
#ifdef TANDEM_WITH_CUDA
  if (cuda_ != nullptr) {
    // On the copy stream (the body runs under its guard); pinned memory
    // makes it asynchronous to the host.
    at::Tensor out = dst;
    out.copy_(src, /*non_blocking=*/true);
    return;
  }
#endif
  TORCH_CHECK(src.is_contiguous() && dst.is_contiguous() &&
                  src.scalar_type() == dst.scalar_type(),
              "host-tier copies move contiguous tensors of one dtype");
  std::memcpy(dst.data_ptr(), src.data_ptr(), src.nbytes());
}

void HostTier::Drain() {
  AsyncHandle last;
  {
    std::lock_guard<std::mutex> lock(mu_);
    last = last_;
  }
  if (last != nullptr) last->Wait().IgnoreError();
}

void HostTier::Loop() {
  pthread_setname_np(pthread_self(), "tandem-copy");
  for (;;) {
    std::unique_ptr<Task> task;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping and drained
      task = std::move(queue_.front());
      queue_.pop_front();
    }
    task->handle->MarkStarted();
    absl::Status status = TorchCall("host-tier copy", [&] {
#ifdef TANDEM_WITH_CUDA
      if (cuda_ != nullptr) {
        task->ready->block(cuda_->stream);
        c10::cuda::CUDAStreamGuard guard(cuda_->stream);
        task->body();
        cuda_->stream.synchronize();
        return;
      }
#endif
      task->body();
    });
    // Tensors the body captured (an offloaded state's device copy) are freed
    // here, when the copy is done.
    task->body = nullptr;
    task->handle->Finish(std::move(status));
  }
}

}  // namespace tandem
