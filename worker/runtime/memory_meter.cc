#include "worker/runtime/memory_meter.h"

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <string_view>

#include "c10/core/CPUAllocator.h"
#include "c10/core/alignment.h"
#include "c10/core/impl/alloc_cpu.h"

#ifdef TANDEM_WITH_CUDA
#include "c10/cuda/CUDACachingAllocator.h"
#include "c10/cuda/CUDAFunctions.h"
#endif

namespace tandem {
namespace {

// Each block carries its size, which compute thread allocated it (0:
// none) and its raw size when it came from the block cache (0: a small
// block straight from the C library), in a header one alignment unit long,
// so the deleter needs no side table.
constexpr size_t kHeader = c10::gAlignment;
static_assert(kHeader >= 3 * sizeof(size_t), "the header holds three words");

// Cached blocks' sizes are multiples of this; a request takes a cached block
// at most 1/8 larger than it needs.
constexpr size_t kCacheGranule = size_t{64} << 10;

std::atomic<CountingCpuAllocator*> g_instance{nullptr};

// This thread's own level, when it is a compute thread (MarkComputeThread):
// its blocks less those it freed, and its node window. A block it allocates
// carries the address of this record, which a free on the same thread
// recognizes.
struct OwnLevel {
  bool compute = false;
  int64_t level = 0;
  int64_t window_start = 0;
  int64_t window_peak = 0;
};
thread_local OwnLevel t_own;

void RaiseTo(std::atomic<int64_t>& peak, int64_t now) {
  int64_t seen = peak.load(std::memory_order_relaxed);
  while (now > seen &&
         !peak.compare_exchange_weak(seen, now, std::memory_order_relaxed)) {
  }
}

// TANDEM_CPU_BLOCK_CACHE=0 turns the block cache off.
bool CachingFromEnvironment() {
  const char* env = std::getenv("TANDEM_CPU_BLOCK_CACHE");
  return env == nullptr || std::string_view(env) != "0";
}

}  // namespace

struct CountingCpuAllocator::Cache {
  std::mutex mu;
  std::multimap<size_t, char*> free;  // raw size -> block
  int64_t bytes = 0;
};

CountingCpuAllocator::CountingCpuAllocator()
    : caching_(CachingFromEnvironment()), cache_(new Cache) {}

char* CountingCpuAllocator::TakeBlock(size_t& capacity) const {
  capacity = (capacity + kCacheGranule - 1) / kCacheGranule * kCacheGranule;
  {
    std::lock_guard<std::mutex> lock(cache_->mu);
    auto it = cache_->free.lower_bound(capacity);
    if (it != cache_->free.end() && it->first <= capacity + capacity / 8) {
      capacity = it->first;
      char* base = it->second;
      cache_->free.erase(it);
      cache_->bytes -= static_cast<int64_t>(capacity);
      return base;
    }
  }
  return static_cast<char*>(c10::alloc_cpu(capacity));
}

void CountingCpuAllocator::GiveBlock(char* base, size_t capacity) {
  {
    std::lock_guard<std::mutex> lock(cache_->mu);
    const auto size = static_cast<int64_t>(capacity);
    if (cache_->bytes + size <=
        high_water_.load(std::memory_order_relaxed) + kCacheSlackBytes) {
      cache_->free.emplace(capacity, base);
      cache_->bytes += size;
      return;
    }
  }
  c10::free_cpu(base);
}

int64_t CountingCpuAllocator::cached_bytes() const {
  std::lock_guard<std::mutex> lock(cache_->mu);
  return cache_->bytes;
}

void CountingCpuAllocator::ReleaseCache() {
  std::multimap<size_t, char*> blocks;
  {
    std::lock_guard<std::mutex> lock(cache_->mu);
    blocks.swap(cache_->free);
    cache_->bytes = 0;
  }
  for (const auto& [size, base] : blocks) c10::free_cpu(base);
}

CountingCpuAllocator* CountingCpuAllocator::Install() {
  static CountingCpuAllocator* const instance = [] {
    auto* a = new CountingCpuAllocator();  // lives for the process
    // Priority above the default (0) so a later default registration cannot
    // replace it.
    c10::SetCPUAllocator(a, /*priority=*/100);
    g_instance.store(a);
    return a;
  }();
  return instance;
}

CountingCpuAllocator* CountingCpuAllocator::Get() { return g_instance.load(); }

c10::DataPtr CountingCpuAllocator::allocate(size_t bytes)
#if !TANDEM_ALLOCATOR_API_2_3
    const
#endif
{
  size_t capacity = bytes + kHeader;
  char* base;
  if (caching_ && capacity >= kCachedMinBytes) {
    base = TakeBlock(capacity);
  } else {
    base = static_cast<char*>(c10::alloc_cpu(capacity));
    capacity = 0;
  }
  auto* header = reinterpret_cast<size_t*>(base);
  header[0] = bytes;
  header[1] = t_own.compute ? reinterpret_cast<size_t>(&t_own) : 0;
  header[2] = capacity;
  const auto signed_bytes = static_cast<int64_t>(bytes);
  const int64_t now =
      current_.fetch_add(signed_bytes, std::memory_order_relaxed) +
      signed_bytes;
  RaiseTo(peak_, now);
  RaiseTo(high_water_, now);
  if (t_own.compute) {
    t_own.level += signed_bytes;
    t_own.window_peak = std::max(t_own.window_peak, t_own.level);
  }
  allocations_.fetch_add(1, std::memory_order_relaxed);
  // The context is the data pointer itself (the size sits in the header
  // before it), so raw_allocate works too: TorchScript's fused kernels
  // allocate their buffers through it.
  return {base + kHeader, base + kHeader, &CountingCpuAllocator::Delete,
          c10::Device(c10::DeviceType::CPU)};
}

void CountingCpuAllocator::Delete(void* context) {
  auto* base = static_cast<char*>(context) - kHeader;
  const auto* header = reinterpret_cast<const size_t*>(base);
  const auto bytes = static_cast<int64_t>(header[0]);
  CountingCpuAllocator* a = g_instance.load();
  if (a != nullptr) a->current_.fetch_sub(bytes, std::memory_order_relaxed);
  // A free on the thread that allocated the block, when that is a compute
  // thread (its own level; other threads' frees are left out).
  if (header[1] != 0 && header[1] == reinterpret_cast<size_t>(&t_own)) {
    t_own.level -= bytes;
  }
  if (header[2] != 0 && a != nullptr) {
    a->GiveBlock(base, header[2]);
  } else {
    c10::free_cpu(base);
  }
}

void CountingCpuAllocator::ResetPeak() {
  peak_.store(current_.load(std::memory_order_relaxed),
              std::memory_order_relaxed);
}

void CountingCpuAllocator::MarkComputeThread() { t_own.compute = true; }

void CountingCpuAllocator::BeginNodeWindow() {
  t_own.window_start = t_own.level;
  t_own.window_peak = t_own.level;
}

OwnMemory CountingCpuAllocator::NodeWindow() const {
  OwnMemory w;
  w.rise_bytes = std::max<int64_t>(0, t_own.window_peak - t_own.window_start);
  w.net_bytes = t_own.level - t_own.window_start;
  w.measured = t_own.compute;
  return w;
}

#ifdef TANDEM_WITH_CUDA
namespace {

// One GPU's caching-allocator statistics. Bound to a device index rather
// than to the current device, which is per thread: the communication and
// copy threads must not measure another GPU.
class CudaMemoryMeter final : public MemoryMeter {
 public:
  explicit CudaMemoryMeter(c10::DeviceIndex device) : device_(device) {}

  int64_t current_bytes() const override {
    return c10::cuda::CUDACachingAllocator::getDeviceStats(device_)
        .allocated_bytes[kAggregate]
        .current;
  }
  int64_t peak_bytes() const override {
    return c10::cuda::CUDACachingAllocator::getDeviceStats(device_)
        .allocated_bytes[kAggregate]
        .peak;
  }
  void ResetPeak() override {
    c10::cuda::CUDACachingAllocator::resetPeakStats(device_);
  }

 private:
  // StatType::AGGREGATE, by value: the enum's namespace moved between
  // libtorch releases (CUDACachingAllocator, then c10::CachingAllocator).
  static constexpr size_t kAggregate = 0;
  const c10::DeviceIndex device_;
};

}  // namespace
#endif

MemoryMeter* MemoryMeterFor(const c10::Device& device) {
  if (device.is_cpu()) return CountingCpuAllocator::Install();
#ifdef TANDEM_WITH_CUDA
  if (device.is_cuda()) {
    const c10::DeviceIndex index =
        device.has_index() ? device.index() : c10::cuda::current_device();
    static std::mutex mu;
    static auto* const meters =
        new std::map<c10::DeviceIndex, std::unique_ptr<CudaMemoryMeter>>();
    std::lock_guard<std::mutex> lock(mu);
    std::unique_ptr<CudaMemoryMeter>& meter = (*meters)[index];
    if (meter == nullptr) meter = std::make_unique<CudaMemoryMeter>(index);
    return meter.get();
  }
#endif
  return nullptr;
}

}  // namespace tandem
