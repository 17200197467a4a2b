// The host tier for optimizer-state offload (worker/README.md,
// "Runtime rules"): the memory offloaded states live in, and the copy thread
// that moves them.
//   - CPU: memory mapped from a file under a directory (unlinked as soon as
//     it is created, so nothing outlives the process). It is not allocated
//     by libtorch's allocator, so bytes moved here leave the counted memory,
//     as states moved to NVMe leave device memory.
//   - CUDA (built with TANDEM_WITH_CUDA): pinned host memory; copies run on
//     their own CUDA stream, ordered after the compute stream's work at the
//     time they were submitted.
//
// Contract: Allocate and Submit are called from the compute thread. Copies
// run one at a time in submission order on the copy thread, so a reload
// submitted after an offload of the same state sees the offloaded bytes.
// A copy's handle is done once its bytes have arrived (on CUDA, once the copy
// stream has finished it).
#ifndef TANDEM_WORKER_RUNTIME_HOST_TIER_H_
#define TANDEM_WORKER_RUNTIME_HOST_TIER_H_

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "ATen/core/Tensor.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "worker/runtime/async_work.h"

namespace tandem {

class HostTier {
 public:
  // A tier for states of tensors on `device`. On CPU the memory is mapped
  // from files under `dir` (empty: $TANDEM_OFFLOAD_DIR, else $TMPDIR, else
  // /tmp); errors if it is not a writable directory. On CUDA `dir` is
  // unused.
  static absl::StatusOr<std::unique_ptr<HostTier>> Create(at::Device device,
                                                          std::string dir);
  // Finishes the submitted copies, then joins the copy thread.
  ~HostTier();
  HostTier(const HostTier&) = delete;
  HostTier& operator=(const HostTier&) = delete;

  // Host memory for `numel` floats: a 1-D float tensor on the CPU whose
  // memory is released with the tensor (it may outlive the tier).
  absl::StatusOr<at::Tensor> Allocate(int64_t numel);

  // Runs `copy` on the copy thread after every earlier submission; `copy`
  // calls Copy() (and may drop tensors it captured). An exception becomes
  // the handle's status.
  AsyncHandle Submit(std::function<void()> copy);
  // From a Submit body only: copies `src` into `dst` (same numel, either
  // side on the host tier or the device).
  void Copy(const at::Tensor& src, const at::Tensor& dst);

  // Blocks until every copy submitted so far is done.
  void Drain();

  // Bytes of host memory allocated so far.
  int64_t held_bytes() const { return held_bytes_; }
  const std::string& dir() const { return dir_; }
  at::Device device() const { return device_; }

 private:
  struct Task;
  struct CudaState;
  HostTier(at::Device device, std::string dir);
  void Loop();

  const at::Device device_;
  const std::string dir_;
  int64_t held_bytes_ = 0;
  std::unique_ptr<CudaState> cuda_;  // copy stream; null on CPU

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::unique_ptr<Task>> queue_;
  AsyncHandle last_;
  bool stopping_ = false;
  // The copy thread: runs copies in submission order, each to completion,
  // so that compute never waits for a copy it does not need yet. Declared
  // last: it starts after the state above.
  std::thread thread_;
};

}  // namespace tandem

#endif  // TANDEM_WORKER_RUNTIME_HOST_TIER_H_
