// main() of worker_runtime_test: the counting allocator must be libtorch's
// CPU allocator before any tensor exists, and ranks run as threads, so
// libtorch's own intra-op pool is kept to one thread.
#include "ATen/Parallel.h"
#include "gtest/gtest.h"
#include "worker/runtime/memory_meter.h"

int main(int argc, char** argv) {
  tandem::CountingCpuAllocator::Install();
  at::set_num_threads(1);
  testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
