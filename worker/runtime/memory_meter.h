// Memory accounting for the worker: on CPU a counting allocator registered
// as libtorch's CPU allocator; on CUDA the caching allocator's statistics.
// The executor samples a MemoryMeter at node boundaries and checks the job's
// budget against its peak.
#ifndef TANDEM_WORKER_RUNTIME_MEMORY_METER_H_
#define TANDEM_WORKER_RUNTIME_MEMORY_METER_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>

#include "c10/core/Allocator.h"
#include "c10/core/Device.h"
#include "torch/version.h"
#include "worker/runtime/own_memory.h"

#if TORCH_VERSION_MAJOR > 2 || \
    (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 3)
#define TANDEM_ALLOCATOR_API_2_3 1
#else
#define TANDEM_ALLOCATOR_API_2_3 0
#endif

namespace tandem {

class MemoryMeter {
 public:
  virtual ~MemoryMeter() = default;
  // Bytes allocated now, and the most since the last ResetPeak().
  virtual int64_t current_bytes() const = 0;
  virtual int64_t peak_bytes() const = 0;
  // Sets the peak to the current value.
  virtual void ResetPeak() = 0;

  // A node's own memory (the profile's MemorySample rise and net): what the
  // compute thread's allocations and frees did while the node ran.
  // MarkComputeThread() names the calling thread the compute thread. Its
  // own level counts the blocks it allocates and drops those it frees;
  // blocks other threads allocate (collective buffers, host copies,
  // checkpoint snapshots) and frees on other threads (a gradient freed as
  // its reduce-scatter starts) run on timings of their own and are left
  // out. BeginNodeWindow() starts a window at the current own level;
  // NodeWindow() reports the most the level rose above it since and where
  // it stands now. Each thread keeps its own level and window, so ranks
  // sharing a process (the tests' loopback worlds) do not mix; call them
  // from the compute thread. A meter that cannot tell threads apart
  // reports nothing (not measured).
  virtual void MarkComputeThread() {}
  virtual void BeginNodeWindow() {}
  virtual OwnMemory NodeWindow() const { return {}; }
};

// Counts every byte libtorch allocates on the CPU. A storage keeps the
// allocator it was created with, so Install() must run before any tensor
// exists (first thing in main); tensors created earlier are not counted.
// Thread-safe: counters are atomics, so the communication thread and Gloo's
// threads may allocate concurrently with compute.
//
// It also keeps large blocks for reuse, as CUDA's caching allocator does:
// a freed block of at least kCachedMinBytes goes to a cache instead of back
// to the C library, and the next allocation of about its size takes it.
// An iteration allocates the same sizes every time; without the cache
// glibc returned those blocks to the kernel and faulted them in again,
// which on a VM slowed a node sevenfold at times (worker/README.md,
// "Runtime rules", Memory). The counters count what tensors hold, not the
// cache. The cache never holds more than the most tensors ever held at once
// (the live high-water mark) plus kCacheSlackBytes, so the process's memory
// stays under about twice its counted peak. TANDEM_CPU_BLOCK_CACHE=0 in the
// environment turns it off.
class CountingCpuAllocator final : public c10::Allocator, public MemoryMeter {
 public:
  // Registers the process-wide instance as libtorch's CPU allocator (once;
  // later calls return the same instance).
  static CountingCpuAllocator* Install();
  // The installed instance, or nullptr.
  static CountingCpuAllocator* Get();

#if TANDEM_ALLOCATOR_API_2_3
  // libtorch 2.3 made allocate non-const and added copy_data.
  c10::DataPtr allocate(size_t bytes) override;
  void copy_data(void* dest, const void* src, size_t count) const override {
    if (count > 0) std::memcpy(dest, src, count);
  }
#else
  c10::DataPtr allocate(size_t bytes) const override;
#endif
  // Data and context are the same pointer, so raw_allocate and
  // raw_deallocate work (TorchScript's fused kernels use them).
  c10::DeleterFnPtr raw_deleter() const override {
    return &CountingCpuAllocator::Delete;
  }

  int64_t current_bytes() const override {
    return current_.load(std::memory_order_relaxed);
  }
  int64_t peak_bytes() const override {
    return peak_.load(std::memory_order_relaxed);
  }
  void ResetPeak() override;
  void MarkComputeThread() override;
  void BeginNodeWindow() override;
  OwnMemory NodeWindow() const override;
  // Allocations made so far (for tests).
  int64_t allocations() const {
    return allocations_.load(std::memory_order_relaxed);
  }

  // Blocks of this size or more (header included) are cached when freed.
  static constexpr size_t kCachedMinBytes = size_t{256} << 10;
  // What the cache may hold beyond the live high-water mark.
  static constexpr int64_t kCacheSlackBytes = int64_t{16} << 20;
  // Bytes of freed blocks the cache holds now, and whether it is on.
  int64_t cached_bytes() const;
  // The most bytes tensors ever held at once (never reset).
  int64_t high_water_bytes() const {
    return high_water_.load(std::memory_order_relaxed);
  }
  bool caching() const { return caching_; }
  // Returns every cached block to the C library (for tests, and for a
  // process about to hold much less than before).
  void ReleaseCache();

 private:
  CountingCpuAllocator();
  static void Delete(void* context);
  // A raw block of at least `capacity` bytes from the cache or the C
  // library; `capacity` becomes the block's real size.
  char* TakeBlock(size_t& capacity) const;
  // Keeps the block for reuse, or frees it when the cache is full.
  void GiveBlock(char* base, size_t capacity);

  mutable std::atomic<int64_t> current_{0};
  mutable std::atomic<int64_t> peak_{0};
  mutable std::atomic<int64_t> allocations_{0};
  mutable std::atomic<int64_t> high_water_{0};
  const bool caching_;
  struct Cache;
  const std::unique_ptr<Cache> cache_;
};

// The meter for `device`: the counting allocator on CPU (installing it when
// needed); on CUDA (built with TANDEM_WITH_CUDA) the caching allocator's
// statistics of that GPU (cuda without an index: the calling thread's current
// GPU). nullptr for devices this build cannot measure. Meters live for the
// process.
MemoryMeter* MemoryMeterFor(const c10::Device& device);

}  // namespace tandem

#endif  // TANDEM_WORKER_RUNTIME_MEMORY_METER_H_
