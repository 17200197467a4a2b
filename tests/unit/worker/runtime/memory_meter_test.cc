#include "worker/runtime/memory_meter.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <thread>

#include "ATen/ATen.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/unit/worker/loopback_world.h"
#include "worker/runtime/communicator.h"

namespace tandem {
namespace {

// A node's own memory counts what the compute thread allocates and frees
// itself: another thread's allocation while the node runs, and its free of
// a block the compute thread allocated before, are left out.
TEST(CountingCpuAllocatorTest, NodeWindow_ComputeThreadsOwnMemoryOnly) {
  CountingCpuAllocator* meter = CountingCpuAllocator::Install();
  std::thread([meter] {
    EXPECT_FALSE(meter->NodeWindow().measured);  // not a compute thread yet
    meter->MarkComputeThread();
    at::Tensor before = at::empty({1000}, at::kFloat);  // 4000 B
    meter->BeginNodeWindow();
    at::Tensor temporary = at::empty({4096}, at::kFloat);  // 16 KiB
    at::Tensor kept = at::empty({2048}, at::kFloat);       // 8 KiB
    temporary = at::Tensor();
    at::Tensor others;
    std::thread([&] {
      others = at::empty({1 << 18}, at::kFloat);  // 1 MiB elsewhere
      before = at::Tensor();                      // freed elsewhere
    }).join();
    OwnMemory own = meter->NodeWindow();
    EXPECT_TRUE(own.measured);
    EXPECT_EQ(own.rise_bytes, (4096 + 2048) * 4);
    EXPECT_EQ(own.net_bytes, 2048 * 4);
    // A new window starts at the current level; freeing what it found
    // takes the net below zero.
    meter->BeginNodeWindow();
    kept = at::Tensor();
    own = meter->NodeWindow();
    EXPECT_EQ(own.rise_bytes, 0);
    EXPECT_EQ(own.net_bytes, -2048 * 4);
  }).join();
}

// Large blocks come back from the cache, already faulted in, while the
// counters count only what tensors hold; small blocks and a cache at its
// bound go back to the C library.
TEST(CountingCpuAllocatorTest, BlockCache_LargeBlocksReused_CountsUnchanged) {
  CountingCpuAllocator* meter = CountingCpuAllocator::Install();
  if (!meter->caching()) GTEST_SKIP() << "TANDEM_CPU_BLOCK_CACHE=0";
  meter->ReleaseCache();
  const int64_t base = meter->current_bytes();
  constexpr int64_t kElems = int64_t{1} << 20;  // 4 MiB of floats
  at::Tensor a = at::empty({kElems}, at::kFloat);
  const void* first = a.data_ptr();
  EXPECT_EQ(meter->current_bytes(), base + 4 * kElems);
  a = at::Tensor();
  EXPECT_EQ(meter->current_bytes(), base);
  EXPECT_GE(meter->cached_bytes(), 4 * kElems);
  // The same size again, and a slightly smaller one, take the cached block.
  a = at::empty({kElems}, at::kFloat);
  EXPECT_EQ(a.data_ptr(), first);
  EXPECT_EQ(meter->cached_bytes(), 0);
  a = at::Tensor();
  meter->ResetPeak();
  at::Tensor b = at::empty({kElems - 1000}, at::kFloat);
  EXPECT_EQ(b.data_ptr(), first);
  EXPECT_EQ(meter->peak_bytes(), base + 4 * (kElems - 1000));
  b = at::Tensor();
  // Half the size does not: it would waste more than an eighth.
  at::Tensor half = at::empty({kElems / 2}, at::kFloat);
  EXPECT_NE(half.data_ptr(), first);
  half = at::Tensor();
  // Small blocks are not cached.
  meter->ReleaseCache();
  at::Tensor small = at::empty({1000}, at::kFloat);
  small = at::Tensor();
  EXPECT_EQ(meter->cached_bytes(), 0);
  // Sizes that never fit each other accumulate until the bound: the cache
  // holds at most the live high-water mark plus the slack.
  at::Tensor big = at::empty({int64_t{32} << 18}, at::kFloat);  // 32 MiB
  big = at::Tensor();
  for (int mib = 16; mib >= 1; mib /= 2) {
    at::Tensor t = at::empty({int64_t{mib} << 18}, at::kFloat);
  }
  // The high-water mark is the process's: earlier tests in the same
  // process may have raised it past what this one allocates.
  const int64_t bound =
      meter->high_water_bytes() + CountingCpuAllocator::kCacheSlackBytes;
  const int64_t freed = int64_t{63} << 20;  // 32 + 16 + ... + 1 MiB
  EXPECT_LE(meter->cached_bytes(), bound);
  if (bound < freed) EXPECT_LT(meter->cached_bytes(), freed);
  EXPECT_GE(meter->cached_bytes(), std::min(int64_t{32} << 20, bound));
  meter->ReleaseCache();
  EXPECT_EQ(meter->cached_bytes(), 0);
}

// What a collective's body captured is freed before its waiters wake: the
// node that starts when Wait() returns sees the memory without it.
TEST(CommunicatorTest, CapturedTensorsFreedBeforeWaitReturns) {
  CountingCpuAllocator* meter = CountingCpuAllocator::Install();
  RunLoopbackWorld(1, [&](int rank, Communicator& comm) {
    for (int i = 0; i < 20; ++i) {
      const int64_t before = meter->current_bytes();
      at::Tensor captured = at::ones({int64_t{1} << 18}, at::kFloat);  // 1 MiB
      AsyncHandle handle = comm.Submit([captured] {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      });
      captured = at::Tensor();
      ASSERT_TRUE(handle->Wait().ok());
      EXPECT_EQ(meter->current_bytes(), before) << "round " << i;
    }
  });
}

// The scratch rule the profile reports matches what a Gloo all-gather and
// reduce-scatter hold beyond their input and output. The all-gather
// receives straight into its output: nothing. The reduce-scatter receives
// one peer's contribution into its output and the others' into scratch:
// nothing at world 2; at world 3 one shard per piece in flight (whole
// messages: one shard). The ranks share the process, so the process's peak
// counts them all.
TEST(CommunicatorTest, CollectiveScratch_MatchesWhatGlooHolds) {
  constexpr int64_t kShard = 1 << 18;  // 1 MiB of floats per rank
  constexpr int kInFlight = 2;
  CountingCpuAllocator* meter = CountingCpuAllocator::Install();
  for (const int world : {2, 3}) {
    for (const int64_t chunk : {kWholeMessages, int64_t{64} << 10}) {
      CommOptions options;
      options.chunk_bytes = chunk;
      options.max_in_flight = kInFlight;
      CollectiveScratch gather_rule;
      CollectiveScratch reduce_rule;
      int64_t gather_rise = 0;
      int64_t reduce_rise = 0;
      RunLoopbackWorld(
          world,
          [&](int rank, Communicator& comm) {
            const at::Tensor in = at::ones({kShard}, at::kFloat);
            const at::Tensor out = at::empty({kShard * world}, at::kFloat);
            const at::Tensor rs_in = at::ones({kShard * world}, at::kFloat);
            const at::Tensor rs_out = at::empty({kShard}, at::kFloat);
            auto settle = [&] {
              ASSERT_TRUE(comm.AllGatherScalars({0.0}).ok());  // all settled
              if (rank == 0) meter->ResetPeak();
              ASSERT_TRUE(comm.AllGatherScalars({0.0}).ok());
            };
            settle();
            const int64_t base = meter->current_bytes();
            ASSERT_TRUE(
                comm.Submit([&] { comm.AllGather(in, out); })->Wait().ok());
            ASSERT_TRUE(comm.AllGatherScalars({0.0}).ok());
            if (rank == 0) {
              gather_rise = meter->peak_bytes() - base;
              gather_rule = comm.AllGatherScratch();
            }
            settle();
            const int64_t base2 = meter->current_bytes();
            ASSERT_TRUE(
                comm.Submit([&] { comm.ReduceScatterSum(rs_in, rs_out); })
                    ->Wait()
                    .ok());
            ASSERT_TRUE(comm.AllGatherScalars({0.0}).ok());
            if (rank == 0) {
              reduce_rise = meter->peak_bytes() - base2;
              reduce_rule = comm.ReduceScatterScratch();
            }
          },
          options);
      const int64_t padded = kShard * world * 4;
      SCOPED_TRACE(absl::StrCat("world ", world, ", ",
                                chunk == kWholeMessages ? "whole" : "pieces"));
      EXPECT_EQ(gather_rule, CollectiveScratch{});
      // The scalar exchanges' few bytes, and the allocator's rounding.
      const int64_t slack = 4 << 10;
      EXPECT_LE(gather_rise, slack);
      if (world == 2) {
        EXPECT_EQ(reduce_rule, CollectiveScratch{});
        EXPECT_LE(reduce_rise, slack);
        continue;
      }
      const int64_t shard_bytes = kShard * 4;
      if (chunk == kWholeMessages) {
        EXPECT_EQ(reduce_rule, (CollectiveScratch{1, 0}));
      } else {
        EXPECT_EQ(reduce_rule, (CollectiveScratch{1, kInFlight * chunk}));
      }
      // Every rank's scratch, never more than the rule says; at least one
      // rank's (whole: a shard; pieces: a piece) is seen at once.
      EXPECT_LE(reduce_rise, world * reduce_rule.Bytes(padded) + slack);
      EXPECT_GE(reduce_rise, chunk == kWholeMessages ? shard_bytes : chunk);
    }
  }
}

}  // namespace
}  // namespace tandem
