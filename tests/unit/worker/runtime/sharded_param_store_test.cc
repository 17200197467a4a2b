#include "worker/runtime/sharded_param_store.h"

#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include "ATen/ATen.h"
#include "gtest/gtest.h"
#include "tests/unit/worker/loopback_world.h"
#include "tests/unit/worker/unsharded_reference.h"
#include "worker/runtime/host_tier.h"
#include "worker/runtime/memory_meter.h"
#include "worker/runtime/program.h"

namespace tandem {
namespace {

// Two params whose sizes do not divide by 3: values 0, 1, 2, ... and 1000+.
Program TwoParams() {
  Program p;
  p.name = "two";
  auto iota = [](float base) {
    return [base](float* data, int64_t n) {
      for (int64_t i = 0; i < n; ++i) data[i] = base + static_cast<float>(i);
    };
  };
  p.params.push_back({"a", {7, 3}, "u", iota(0)});
  p.params.push_back({"b", {5}, "u", iota(1000)});
  return p;
}

TEST(ShardedParamStoreTest, Shards_PaddedToWorldMultiple_RankOwnsSlice) {
  absl::StatusOr<std::unique_ptr<ShardedParamStore>> store =
      ShardedParamStore::Create(TwoParams(), /*rank=*/2, /*world_size=*/3);
  ASSERT_TRUE(store.ok());
  EXPECT_EQ((*store)->shard_numel(0), 7);  // 21 / 3
  EXPECT_EQ((*store)->shard_numel(1), 2);  // 5 padded to 6
  // Rank 2 owns elements 4, 5 of b: 1004 and padding 0.
  EXPECT_EQ((*store)->shard(1)[0].item<float>(), 1004.0f);
  EXPECT_EQ((*store)->shard(1)[1].item<float>(), 0.0f);
  EXPECT_FALSE((*store)->allocated(0));
}

// The ranks' digest shares add up to the full param's digest, and a value
// moved to another place changes it (a plain sum would not see it).
TEST(ShardedParamStoreTest, ShardDigests_SumToTheFullDigest_SeePlaces) {
  const Program program = TwoParams();
  std::vector<double> summed(2, 0.0);
  for (int rank = 0; rank < 3; ++rank) {
    auto store = ShardedParamStore::Create(program, rank, 3);
    ASSERT_TRUE(store.ok());
    const std::vector<double> shares = (*store)->ShardDigests();
    ASSERT_EQ(shares.size(), 2u);
    for (size_t i = 0; i < 2; ++i) summed[i] += shares[i];
  }
  const at::Tensor a = at::arange(21, at::kDouble);
  const at::Tensor b = at::arange(5, at::kDouble) + 1000;
  EXPECT_NEAR(summed[0], FullParamDigest(a), 1e-9);
  EXPECT_NEAR(summed[1], FullParamDigest(b), 1e-9);
  // b with its first two values swapped: same sum, another digest.
  const at::Tensor swapped =
      at::tensor({1001.0, 1000.0, 1002.0, 1003.0, 1004.0}, at::kDouble);
  EXPECT_EQ(swapped.sum().item<double>(), b.sum().item<double>());
  EXPECT_GT(std::abs(FullParamDigest(swapped) - summed[1]), 0.1);
}

TEST(ShardedParamStoreTest, GatherRelease_World3_ValuesAndCountedMemory) {
  const Program program = TwoParams();
  RunLoopbackWorld(3, [&](int rank, Communicator& comm) {
    auto store = ShardedParamStore::Create(program, rank, 3);
    ASSERT_TRUE(store.ok());
    ShardedParamStore& s = **store;
    const std::vector<int32_t> both{0, 1};
    AsyncHandle h = s.Gather(both, comm);
    ASSERT_TRUE(h->Wait().ok());
    ASSERT_TRUE(s.materialized(0) && s.materialized(1));
    EXPECT_TRUE(at::equal(s.full(0), at::arange(21, at::kFloat).view({7, 3})));
    EXPECT_TRUE(at::equal(s.full(1), at::arange(5, at::kFloat) + 1000));
    s.Release(both);
    EXPECT_FALSE(s.allocated(0));
    EXPECT_EQ(s.full(0).storage().nbytes(), 0u);
  });
}

// Alone, a param's full tensor aliases its shard: gathers and releases move
// and free nothing, the optimizer's update is the param's new value, the
// "reduce-scatter" is the rank's own gradient, and a param with no gradient
// in a step steps on zero, not on the last step's.
TEST(ShardedParamStoreTest, World1_FullAliasesShard_NothingMovesOrFrees) {
  const Program program = TwoParams();
  RunLoopbackWorld(1, [&](int rank, Communicator& comm) {
    auto store = ShardedParamStore::Create(program, rank, 1);
    ASSERT_TRUE(store.ok());
    ShardedParamStore& s = **store;
    EXPECT_TRUE(s.materialized(0) && s.materialized(1));
    EXPECT_EQ(s.full(0).data_ptr(), s.shard(0).data_ptr());
    CountingCpuAllocator* meter = CountingCpuAllocator::Get();
    const int64_t before = meter != nullptr ? meter->current_bytes() : 0;
    AsyncHandle h = s.Gather({0, 1}, comm);
    EXPECT_TRUE(h->done());
    ASSERT_TRUE(h->Wait().ok());
    EXPECT_TRUE(at::equal(s.full(0), at::arange(21, at::kFloat).view({7, 3})));
    if (meter != nullptr) EXPECT_EQ(meter->current_bytes(), before);

    (s.full(0) * 3.0f).sum().backward();
    AsyncHandle r = s.ReduceScatterGrads({0, 1}, comm);
    EXPECT_TRUE(r->done());
    EXPECT_FALSE(s.full(0).grad().defined());
    EXPECT_TRUE(at::equal(s.shard_grad(0), at::full({21}, 3.0f)));
    EXPECT_TRUE(at::equal(s.shard_grad(1), at::zeros({5})));
    EXPECT_NEAR(s.ShardGradSquaredNorm(), 21 * 9.0, 1e-5);
    s.Release({0, 1});
    EXPECT_TRUE(s.materialized(0));
    AdamWOptions o;
    o.lr = 0.5;
    o.weight_decay = 0;
    o.grad_clip = 0;
    s.AdamWStep(o, 1.0f, 1);
    // AdamW's first step moves each element by lr against its gradient's
    // sign; the full tensor sees it, as the next forward must.
    EXPECT_TRUE(at::allclose(
        s.full(0), at::arange(21, at::kFloat).view({7, 3}) - 0.5f, 0, 1e-5));
    EXPECT_TRUE(at::equal(s.full(1), at::arange(5, at::kFloat) + 1000));

    // Step 2 reduces b only: a's gradient counts as zero (its moments
    // decay), never as step 1's value left in the shard gradient.
    (s.full(1) * 2.0f).sum().backward();
    ASSERT_TRUE(s.ReduceScatterGrads({1}, comm)->Wait().ok());
    EXPECT_NEAR(s.ShardGradSquaredNorm(), 5 * 4.0, 1e-5);
    const at::Tensor a_before = s.shard(0).clone();
    const at::Tensor avg_before = s.exp_avg(0).clone();
    s.AdamWStep(o, 1.0f, 2);
    EXPECT_TRUE(at::allclose(s.exp_avg(0), avg_before * o.beta1, 0, 1e-7));
    EXPECT_TRUE(at::equal(s.shard_grad(0), at::zeros({21})));
    EXPECT_FALSE(at::equal(s.shard(0), a_before));  // momentum still moves it
  });
}

// Two ranks in one process share the meter: each phase starts after a
// barrier (a scalar all-gather) and rank 0 reads the process's bytes, which
// move by both ranks' full tensors. (Alone, nothing moves: World1 above.)
TEST(ShardedParamStoreTest, Release_LowersCountedMemoryByParamBytes) {
  Program program;
  program.params.push_back({"big", {1024, 256}, "u", [](float* d, int64_t n) {
                              for (int64_t i = 0; i < n; ++i) d[i] = 1.0f;
                            }});
  CountingCpuAllocator* meter = CountingCpuAllocator::Get();
  ASSERT_NE(meter, nullptr);
  // To a few bytes: the barriers' scalar tensors (16 bytes each) can still
  // be held by Gloo's thread when the meter is read; no buffer is that small.
  constexpr int64_t kSlack = 1024;
  int64_t released = 0, gathered = 0, after = 0, full_bytes = 0;
  RunLoopbackWorld(2, [&](int rank, Communicator& comm) {
    auto store = ShardedParamStore::Create(program, rank, 2);
    ASSERT_TRUE(store.ok());
    ShardedParamStore& s = **store;
    auto barrier = [&] { ASSERT_TRUE(comm.AllGatherScalars({0}).ok()); };
    barrier();
    if (rank == 0) released = meter->current_bytes();
    barrier();
    ASSERT_TRUE(s.Gather({0}, comm)->Wait().ok());
    barrier();
    if (rank == 0) gathered = meter->current_bytes();
    barrier();
    s.Release({0});
    barrier();
    if (rank == 0) {
      after = meter->current_bytes();
      full_bytes = s.full_bytes(0);
      // Gloo's worker thread drops its finished work (and the collective's
      // staging buffers) shortly after wait() returns: everything else is
      // back where it was.
      int64_t settled = meter->current_bytes();
      for (int i = 0; i < 200 && std::abs(settled - released) > kSlack; ++i) {
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
        settled = meter->current_bytes();
      }
      EXPECT_NEAR(settled, released, kSlack);
    }
    barrier();
  });
  EXPECT_GE(gathered - released, 2 * full_bytes - kSlack);  // 1 MiB a rank
  EXPECT_GE(gathered - after, 2 * full_bytes - kSlack);
}

TEST(ShardedParamStoreTest, ReduceScatterGrads_World3_MeanOverRanksInShards) {
  const Program program = TwoParams();
  RunLoopbackWorld(3, [&](int rank, Communicator& comm) {
    auto store = ShardedParamStore::Create(program, rank, 3);
    ASSERT_TRUE(store.ok());
    ShardedParamStore& s = **store;
    ASSERT_TRUE(s.Gather({0, 1}, comm)->Wait().ok());
    // grad of a on rank r: (r + 1) everywhere; b: no grad (counts as 0).
    (s.full(0) * static_cast<float>(rank + 1)).sum().backward();
    ASSERT_TRUE(s.ReduceScatterGrads({0, 1}, comm)->Wait().ok());
    EXPECT_FALSE(s.full(0).grad().defined());
    // Mean of 1, 2, 3 = 2.
    EXPECT_TRUE(at::equal(s.shard_grad(0), at::full({7}, 2.0f)));
    EXPECT_TRUE(at::equal(s.shard_grad(1), at::zeros({2})));
    s.Release({0, 1});
  });
}

// What a gather and a reduce-scatter tell the communicator they allocate
// as they start (Communicator::QueuedBufferBytes, the memory hold's
// estimate): a gather its packed shards and packed output; a reduce its
// packed input on top of the gradients, then the output once they are
// freed. a: 21 elements, b: 5; shards of 7 and 2 at world 3: 9 packed.
TEST(ShardedParamStoreTest, QueuedBufferBytes_GatherAndReduce) {
  const Program program = TwoParams();
  constexpr int kWorld = 3;
  RunLoopbackWorld(kWorld, [&](int rank, Communicator& comm) {
    auto store = ShardedParamStore::Create(program, rank, kWorld);
    ASSERT_TRUE(store.ok());
    ShardedParamStore& s = **store;
    std::atomic<bool> started{false};
    std::atomic<bool> go{false};
    auto hold_thread = [&] {
      started = false;
      go = false;
      comm.Submit([&] {
        started = true;
        while (!go) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      });
      while (!started) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
    };
    hold_thread();
    AsyncHandle gather = s.Gather({0, 1}, comm);
    EXPECT_EQ(comm.QueuedBufferBytes(), 9 * (kWorld + 1) * 4);
    go = true;
    ASSERT_TRUE(gather->Wait().ok());
    // Only a has a gradient: 84 bytes freed after the 108-byte input.
    s.full(0).sum().backward();
    hold_thread();
    AsyncHandle reduce = s.ReduceScatterGrads({0, 1}, comm);
    EXPECT_EQ(comm.QueuedBufferBytes(), 9 * kWorld * 4);
    go = true;
    ASSERT_TRUE(reduce->Wait().ok());
    // No gradient left to free: the 36-byte output comes on top.
    hold_thread();
    AsyncHandle empty = s.ReduceScatterGrads({0, 1}, comm);
    EXPECT_EQ(comm.QueuedBufferBytes(), 9 * (kWorld + 1) * 4);
    go = true;
    ASSERT_TRUE(empty->Wait().ok());
    s.Release({0, 1});
  });
}

TEST(ShardedParamStoreTest, FrozenParam_GatheredButNoGradStatesOrStep) {
  Program program = TwoParams();
  program.params[1].trainable = false;  // b frozen
  RunLoopbackWorld(2, [&](int rank, Communicator& comm) {
    auto store = ShardedParamStore::Create(program, rank, 2);
    ASSERT_TRUE(store.ok());
    ShardedParamStore& s = **store;
    EXPECT_TRUE(s.trainable(0));
    EXPECT_FALSE(s.trainable(1));
    EXPECT_FALSE(s.shard_grad(1).defined());
    EXPECT_FALSE(s.exp_avg(1).defined());
    EXPECT_FALSE(s.exp_avg_sq(1).defined());
    EXPECT_EQ(s.state_bytes(1), 0);
    EXPECT_GT(s.state_bytes(0), 0);
    const at::Tensor b_shard = s.shard(1).clone();

    ASSERT_TRUE(s.Gather({0, 1}, comm)->Wait().ok());
    EXPECT_TRUE(s.full(0).requires_grad());
    EXPECT_FALSE(s.full(1).requires_grad());
    EXPECT_TRUE(at::equal(s.full(1), at::arange(5, at::kFloat) + 1000));
    // The frozen value takes part in the forward; only a gets a gradient.
    (s.full(0).sum() * s.full(1).sum()).backward();
    EXPECT_FALSE(s.full(1).grad().defined());
    ASSERT_TRUE(s.ReduceScatterGrads({0}, comm)->Wait().ok());
    s.Release({0, 1});
    // a's gradient is sum(b) = 5010 in all 21 elements, on every rank.
    const double expected = 21.0 * 5010.0 * 5010.0;
    absl::StatusOr<std::vector<double>> all =
        comm.AllGatherScalars({s.ShardGradSquaredNorm()});
    ASSERT_TRUE(all.ok());
    // Each shard's norm in fp32, as clip_grad_norm_ takes each gradient's.
    EXPECT_NEAR((*all)[0] + (*all)[1], expected, 1e-6 * expected);

    AdamWOptions o;
    o.weight_decay = 0.1;
    const at::Tensor a_shard = s.shard(0).clone();
    s.AdamWStep(o, 1.0f, 1);
    EXPECT_FALSE(at::equal(s.shard(0), a_shard));
    EXPECT_TRUE(at::equal(s.shard(1), b_shard));  // not even weight decay
  });
}

}  // namespace
}  // namespace tandem

namespace tandem {
namespace {

// Values that bf16 does not hold exactly (1/3 steps): the master keeps them,
// the shard and the gathered params are their bf16 roundings.
Program Bf16Params(DType reduce) {
  Program p;
  p.name = "bf16";
  p.dtype = DType::kBF16;
  p.reduce_dtype = reduce;
  auto thirds = [](float base) {
    return [base](float* data, int64_t n) {
      for (int64_t i = 0; i < n; ++i) {
        data[i] = base + static_cast<float>(i) / 3.0f;
      }
    };
  };
  p.params.push_back({"a", {7, 3}, "u", thirds(1)});
  p.params.push_back({"b", {5}, "u", thirds(100)});
  return p;
}

// Mixed precision at world 3: params are gathered as the bf16 rounding of
// the f32 masters (half the bytes of f32); gradients reduce in the reduce
// dtype into shards of it; a second reduce in one step accumulates in f32,
// and a step with one reduce puts the shard back in the reduce dtype; the
// optimizer steps the masters and rounds the shards from them.
TEST(ShardedParamStoreTest, Bf16_GathersRoundedMastersAndReducesInReduceDType) {
  for (DType reduce : {DType::kBF16, DType::kF32}) {
    const Program program = Bf16Params(reduce);
    const at::ScalarType reduce_type =
        reduce == DType::kF32 ? at::kFloat : at::kBFloat16;
    RunLoopbackWorld(3, [&](int rank, Communicator& comm) {
      auto store = ShardedParamStore::Create(program, rank, 3);
      ASSERT_TRUE(store.ok()) << store.status();
      ShardedParamStore& s = **store;
      EXPECT_EQ(s.full_bytes(0), 21 * 2);
      EXPECT_EQ(s.state_bytes(0), 3 * 7 * 4);  // moments and master
      const at::Tensor master_a = at::arange(21, at::kFloat) / 3.0f + 1;
      EXPECT_TRUE(at::equal(s.MasterShard(0), master_a.narrow(0, rank * 7, 7)));
      ASSERT_TRUE(s.Gather({0, 1}, comm)->Wait().ok());
      EXPECT_EQ(s.full(0).scalar_type(), at::kBFloat16);
      EXPECT_TRUE(
          at::equal(s.full(0), master_a.to(at::kBFloat16).view({7, 3})));
      EXPECT_FALSE(at::equal(s.full(0).to(at::kFloat), master_a.view({7, 3})));

      // Micro-batch 1: grad of a on rank r is r + 1; reduced in its dtype.
      (s.full(0).to(at::kFloat) * static_cast<float>(rank + 1))
          .sum()
          .backward();
      ASSERT_TRUE(s.ReduceScatterGrads({0, 1}, comm)->Wait().ok());
      EXPECT_EQ(s.shard_grad(0).scalar_type(), reduce_type);
      EXPECT_TRUE(
          at::equal(s.shard_grad(0).to(at::kFloat), at::full({7}, 2.0f)));
      // Micro-batch 2: 1/3 on every rank (not a bf16 value): accumulated in
      // f32 on top of the first.
      (s.full(0).to(at::kFloat) / 3.0f).sum().backward();
      ASSERT_TRUE(s.ReduceScatterGrads({0}, comm)->Wait().ok());
      EXPECT_EQ(s.shard_grad(0).scalar_type(), at::kFloat);
      const float third = at::scalar_tensor(1.0f / 3.0f, at::kFloat)
                              .to(at::kBFloat16)
                              .to(reduce_type)
                              .item<float>();
      EXPECT_TRUE(
          at::allclose(s.shard_grad(0), at::full({7}, 2.0f + third), 0, 1e-6));
      s.Release({0, 1});
      AdamWOptions o;
      o.lr = 0.5;
      o.weight_decay = 0;
      s.AdamWStep(o, 1.0f, 1);
      // The first AdamW step moves each element by lr (sign of its grad):
      // the master by exactly that, the shard its rounding.
      const at::Tensor expected = master_a.narrow(0, rank * 7, 7) - 0.5f;
      EXPECT_TRUE(at::allclose(s.MasterShard(0), expected, 0, 1e-5));
      EXPECT_TRUE(at::equal(s.shard(0), s.MasterShard(0).to(at::kBFloat16)));
      // Still f32: this step reduced twice. Not zeroed: the next step's
      // first reduce overwrites it.
      EXPECT_EQ(s.shard_grad(0).scalar_type(), at::kFloat);

      // A step with one reduce: its gradient alone (nothing of the last
      // step's), and back to the reduce dtype after the step.
      ASSERT_TRUE(s.Gather({0}, comm)->Wait().ok());
      s.full(0).to(at::kFloat).sum().backward();
      ASSERT_TRUE(s.ReduceScatterGrads({0}, comm)->Wait().ok());
      EXPECT_TRUE(at::equal(s.shard_grad(0).to(at::kFloat), at::ones({7})));
      s.Release({0});
      s.AdamWStep(o, 1.0f, 2);
      EXPECT_EQ(s.shard_grad(0).scalar_type(), reduce_type);
    });
  }
}

// A bf16 param's master moves to the host tier with its moments and comes
// back unchanged; the checkpoint's fp32 value (MasterShard) reads it there
// too.
// Bf16Params' store at world 1 and a CPU host tier.
struct OffloadSetup {
  std::unique_ptr<ShardedParamStore> store;
  std::unique_ptr<HostTier> tier;
};
OffloadSetup Bf16StoreAndTier() {
  OffloadSetup out;
  auto store = ShardedParamStore::Create(Bf16Params(DType::kBF16), 0, 1);
  EXPECT_TRUE(store.ok()) << store.status();
  absl::StatusOr<std::unique_ptr<HostTier>> tier =
      HostTier::Create(at::Device(at::kCPU), "");
  EXPECT_TRUE(tier.ok()) << tier.status();
  if (store.ok()) out.store = *std::move(store);
  if (tier.ok()) out.tier = *std::move(tier);
  return out;
}

TEST(ShardedParamStoreTest, Bf16_MasterOffloadedWithStates_ComesBackExact) {
  OffloadSetup setup = Bf16StoreAndTier();
  ASSERT_TRUE(setup.store && setup.tier);
  ShardedParamStore& s = *setup.store;
  HostTier& tier = *setup.tier;
  const at::Tensor before = s.MasterShard(0).clone();
  absl::StatusOr<AsyncHandle> off = s.OffloadStates({0, 1}, tier);
  ASSERT_TRUE(off.ok()) << off.status();
  ASSERT_TRUE((*off)->Wait().ok());
  s.WaitStates();
  EXPECT_TRUE(s.states_on_host(0));
  EXPECT_EQ(tier.held_bytes(), s.state_bytes(0) + s.state_bytes(1));
  EXPECT_TRUE(at::equal(s.MasterShard(0), before));
  AsyncHandle back = s.ReloadStates({0, 1}, tier);
  ASSERT_NE(back, nullptr);
  ASSERT_TRUE(back->Wait().ok());
  s.WaitStates();
  EXPECT_FALSE(s.states_on_host(0));
  EXPECT_TRUE(at::equal(s.MasterShard(0), before));
  // Set from f32 values: the master holds them, the shard their rounding.
  const at::Tensor values = at::arange(21, at::kFloat) / 7.0f;
  s.SetMasterShard(0, values);
  EXPECT_TRUE(at::equal(s.MasterShard(0), values));
  EXPECT_TRUE(at::equal(s.shard(0), values.to(at::kBFloat16)));
}

// A schedule that offloads reserves its states' host memory when it
// becomes active (Executor::Activate): once per param, the amount the first
// offload would allocate, and that offload copies into it.
TEST(ShardedParamStoreTest, ReserveHostStates_AllocatesOnceAndOffloadUsesIt) {
  OffloadSetup setup = Bf16StoreAndTier();
  ASSERT_TRUE(setup.store && setup.tier);
  ShardedParamStore& s = *setup.store;
  HostTier& tier = *setup.tier;
  const int64_t states = s.state_bytes(0) + s.state_bytes(1);
  ASSERT_GT(states, 0);
  ASSERT_TRUE(s.ReserveHostStates({0, 1}, tier).ok());
  EXPECT_EQ(tier.held_bytes(), states);
  EXPECT_FALSE(s.states_on_host(0));  // reserved, not moved
  ASSERT_TRUE(s.ReserveHostStates({0, 1}, tier).ok());
  EXPECT_EQ(tier.held_bytes(), states);
  const at::Tensor master = s.MasterShard(0).clone();
  absl::StatusOr<AsyncHandle> off = s.OffloadStates({0, 1}, tier);
  ASSERT_TRUE(off.ok()) << off.status();
  ASSERT_TRUE((*off)->Wait().ok());
  s.WaitStates();
  EXPECT_TRUE(s.states_on_host(0));
  EXPECT_EQ(tier.held_bytes(), states);
  AsyncHandle back = s.ReloadStates({0, 1}, tier);
  ASSERT_NE(back, nullptr);
  ASSERT_TRUE(back->Wait().ok());
  s.WaitStates();
  EXPECT_TRUE(at::equal(s.MasterShard(0), master));
}

// The host tier's memory on CPU is a fresh file mapping: Allocate faults
// every page in, so that the first copy into it runs as fast as later ones.
TEST(HostTierTest, Allocate_Cpu_EveryPageResident) {
  absl::StatusOr<std::unique_ptr<HostTier>> tier =
      HostTier::Create(at::Device(at::kCPU), "");
  ASSERT_TRUE(tier.ok()) << tier.status();
  constexpr int64_t kNumel = int64_t{3} << 20;  // 12 MiB
  absl::StatusOr<at::Tensor> host = (*tier)->Allocate(kNumel);
  ASSERT_TRUE(host.ok()) << host.status();
  const size_t bytes = kNumel * sizeof(float);
  const auto page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  std::vector<unsigned char> resident((bytes + page - 1) / page);
  ASSERT_EQ(mincore(host->data_ptr(), bytes, resident.data()), 0)
      << std::strerror(errno);
  int64_t missing = 0;
  for (unsigned char r : resident) missing += (r & 1) ? 0 : 1;
  EXPECT_EQ(missing, 0) << "of " << resident.size() << " pages";
  EXPECT_EQ(host->sum().item<float>(), 0.0f);  // reads as zeros
}

// A reload queued behind another copy holds no memory until its copy
// starts, then all of its states at once: what the simulator counts
// (worker/README.md, "Runtime rules"). An offload of the same states
// submitted while the reload is still queued takes them once it has run,
// and a later reload brings back the same values.
TEST(ShardedParamStoreTest, Reload_QueuedBehindACopy_AllocatesWhenItStarts) {
  CountingCpuAllocator* meter = CountingCpuAllocator::Get();
  ASSERT_NE(meter, nullptr);
  OffloadSetup setup = Bf16StoreAndTier();
  ASSERT_TRUE(setup.store && setup.tier);
  ShardedParamStore& s = *setup.store;
  HostTier& tier = *setup.tier;
  const at::Tensor master = s.MasterShard(0).clone();
  const at::Tensor avg = s.exp_avg(0).clone().fill_(0.25f);
  at::Tensor(s.exp_avg(0)).copy_(avg);
  absl::StatusOr<AsyncHandle> off = s.OffloadStates({0, 1}, tier);
  ASSERT_TRUE(off.ok()) << off.status();
  s.WaitStates();
  const int64_t states = s.state_bytes(0) + s.state_bytes(1);
  ASSERT_GT(states, 0);

  // The copy thread is busy with another copy until `release`.
  std::atomic<bool> started{false};
  std::atomic<bool> release{false};
  AsyncHandle busy = tier.Submit([&] {
    started = true;
    while (!release) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  });
  while (!started) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  const int64_t before = meter->current_bytes();
  AsyncHandle back = s.ReloadStates({0, 1}, tier);
  ASSERT_NE(back, nullptr);
  EXPECT_FALSE(s.states_on_host(0));
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_EQ(meter->current_bytes(), before);  // queued: nothing held yet
  // Param 1 goes back out before its reload has run.
  absl::StatusOr<AsyncHandle> again = s.OffloadStates({1}, tier);
  ASSERT_TRUE(again.ok()) << again.status();
  ASSERT_NE(*again, nullptr);
  EXPECT_TRUE(s.states_on_host(1));
  release = true;
  ASSERT_TRUE(busy->Wait().ok());
  ASSERT_TRUE(back->Wait().ok());
  ASSERT_TRUE((*again)->Wait().ok());
  // Param 0's states are on the device, param 1's back on the host.
  EXPECT_EQ(meter->current_bytes() - before, s.state_bytes(0));
  s.WaitStates();
  EXPECT_TRUE(at::equal(s.MasterShard(0), master));
  EXPECT_TRUE(at::equal(s.exp_avg(0), avg));
  AsyncHandle last = s.ReloadStates({1}, tier);
  ASSERT_NE(last, nullptr);
  s.WaitStates();
  EXPECT_FALSE(s.states_on_host(1));
  EXPECT_EQ(meter->current_bytes() - before, states);
}

}  // namespace
}  // namespace tandem
