// A node's own memory over its run: what the compute thread's allocations
// and frees did while it ran (MemoryMeter::NodeWindow(), recorded by the
// Profiler into the profile's MemorySample). Libtorch-free.
#ifndef TANDEM_WORKER_RUNTIME_OWN_MEMORY_H_
#define TANDEM_WORKER_RUNTIME_OWN_MEMORY_H_

#include <cstdint>

namespace tandem {

struct OwnMemory {
  // The most the compute thread's own level rose above its value at the
  // node's start, and where it stood at the node's end against that value
  // (negative: the node freed more than it kept).
  int64_t rise_bytes = 0;
  int64_t net_bytes = 0;
  // False where the meter cannot tell threads apart (CUDA).
  bool measured = false;
};

}  // namespace tandem

#endif  // TANDEM_WORKER_RUNTIME_OWN_MEMORY_H_
