#include "worker/runtime/cpu_wait.h"

#include <pthread.h>
#include <sched.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace tandem {
namespace {

TEST(CpuWaitTest, ParsesTheKernelsLine) {
  EXPECT_EQ(ParseRunDelayNs("2263187 96943 12\n"), 96943);
  EXPECT_EQ(ParseRunDelayNs("0 0 0"), 0);
  EXPECT_FALSE(ParseRunDelayNs("").has_value());
  EXPECT_FALSE(ParseRunDelayNs("1 2").has_value());
  EXPECT_FALSE(ParseRunDelayNs("1 2 3 4").has_value());
  EXPECT_FALSE(ParseRunDelayNs("1 x 3").has_value());
  EXPECT_FALSE(ParseRunDelayNs("1 -2 3").has_value());
}

TEST(CpuWaitTest, ShareOfTheStep) {
  EXPECT_DOUBLE_EQ(CpuWaitShare(1'000'000, 31'000'000, 0.3), 0.1);
  EXPECT_EQ(CpuWaitShare(0, 0, 0.3), 0);
  // Not measured: a missing end, a count that went backwards, no wall time.
  EXPECT_EQ(CpuWaitShare(std::nullopt, 5, 0.3), -1);
  EXPECT_EQ(CpuWaitShare(5, std::nullopt, 0.3), -1);
  EXPECT_EQ(CpuWaitShare(10, 5, 0.3), -1);
  EXPECT_EQ(CpuWaitShare(0, 5, 0), -1);
  // At most the whole step (the two clocks are read apart).
  EXPECT_EQ(CpuWaitShare(0, 2'000'000'000, 1.0), 1.0);
}

TEST(CpuWaitTest, ThisThreadsCountOnLinux) {
  const std::optional<int64_t> first = ThreadRunDelayNs();
  if (!first.has_value()) {
    GTEST_SKIP() << "this kernel keeps no /proc/thread-self/schedstat";
  }
  const std::optional<int64_t> second = ThreadRunDelayNs();
  ASSERT_TRUE(second.has_value());
  EXPECT_GE(*second, *first);
}

// Pins the calling thread to `cpu`; false where it cannot.
bool PinTo(int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  return pthread_setaffinity_np(pthread_self(), sizeof(set), &set) == 0;
}

// Two spinning threads pinned to the measured thread's one CPU: it runs
// about a third of the time and waits for the CPU the rest, whatever the
// machine's size or quota; alone it waits a few percent at most.
TEST(CpuWaitTest, CrowdedThreadWaitsForItsCpu) {
  if (!ThreadRunDelayNs().has_value()) {
    GTEST_SKIP() << "this kernel keeps no /proc/thread-self/schedstat";
  }
  cpu_set_t allowed;
  ASSERT_EQ(pthread_getaffinity_np(pthread_self(), sizeof(allowed), &allowed),
            0);
  int cpu = 0;
  while (cpu < CPU_SETSIZE && !CPU_ISSET(cpu, &allowed)) ++cpu;
  ASSERT_LT(cpu, CPU_SETSIZE);
  ASSERT_TRUE(PinTo(cpu));
  std::atomic<bool> stop{false};
  std::atomic<int> pinned{0};
  std::vector<std::thread> hogs;
  for (int i = 0; i < 2; ++i) {
    hogs.emplace_back([&stop, &pinned, cpu] {
      pinned += PinTo(cpu) ? 1 : 0;
      while (!stop.load(std::memory_order_relaxed)) {
      }
    });
  }
  while (pinned.load() < 2) std::this_thread::yield();
  CpuWaitMeter meter;
  const auto start = std::chrono::steady_clock::now();
  meter.Begin();
  volatile double sink = 0;
  while (std::chrono::steady_clock::now() - start <
         std::chrono::milliseconds(300)) {
    for (int i = 0; i < 1000; ++i) sink = sink + i;
  }
  const double wall =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
          .count();
  const double share = meter.EndShare(wall);
  stop = true;
  for (std::thread& t : hogs) t.join();
  pthread_setaffinity_np(pthread_self(), sizeof(allowed), &allowed);
  EXPECT_GT(share, 0.3);
  EXPECT_LE(share, 1.0);
  // Ended: a second end without a begin is not measured.
  EXPECT_EQ(meter.EndShare(wall), -1);
}

}  // namespace
}  // namespace tandem
