// The sharded parameter store (worker/README.md, "Runtime rules"): each param
// is flattened and zero-padded to a multiple of the world size; rank r owns
// slice r, with its fp32 gradient and AdamW moments. A frozen param
// (ProgramParam::trainable false) is sharded and gathered like any other,
// but has no gradient and no moments, its full tensor does not require
// grad, and the optimizer never changes it. A param's full tensor is
// an autograd leaf whose storage is allocated on gather and freed on release:
// autograd keeps references to the full tensors it saved, so releasing frees
// the storage's bytes (resize to 0) rather than dropping the tensor, and a
// gather re-allocates the same storage in place. Gathered data is written
// through an alias of the storage, which leaves the autograd version counter
// alone, so backward accepts the saved tensors.
//
// Mixed precision (Program::dtype not f32, worker/README.md "Mixed
// precision"): the shard, the gathered full tensors and their gradients are
// in the program's dtype; a trained param also keeps an fp32 master shard,
// which the optimizer updates and rounds into the shard after each step.
// Gradients are reduce-scattered in Program::reduce_dtype, and the shard
// gradient is held in it; a param reduced more than once in a step
// accumulates in fp32 from its second reduce on. These are the sizes the
// simulator counts (common/sim/simulator.h).
//
// Optimizer states (the AdamW moments, and the fp32 master of a non-fp32
// param; an fp32 shard is its own master) can move to a host tier (host_tier.h)
// and back, on its copy thread: OffloadStates frees their device memory once
// the copy is done, ReloadStates allocates it again when the copy starts (on
// CPU; on CUDA at once, on the compute stream) and fills it asynchronously,
// and the optimizer step waits, param by param, only for the states it is
// about to update. A reload queued behind other copies holds no memory until
// its turn: the simulator counts a reload from its copy's start
// (common/sim/simulator.h).
//
// Threading: Gather/Release/ReduceScatterGrads/optimizer calls come from the
// compute thread; the communication thread packs and unpacks the buffers
// captured when a collective is submitted (raw storage pointers, shard
// tensors), which the compute thread does not touch until the collective's
// handle is done. Likewise the copy thread owns the state tensors captured
// by a copy until its handle is done.
#ifndef TANDEM_WORKER_RUNTIME_SHARDED_PARAM_STORE_H_
#define TANDEM_WORKER_RUNTIME_SHARDED_PARAM_STORE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "ATen/core/Tensor.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "worker/runtime/communicator.h"
#include "worker/runtime/host_tier.h"
#include "worker/runtime/program.h"

namespace tandem {

struct AdamWOptions {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double weight_decay = 0.0;
  // Global gradient-norm clip (over all ranks' shards); 0 disables.
  double grad_clip = 1.0;
};

class ShardedParamStore {
 public:
  // Initializes every param of `program` (its init callable) and keeps this
  // rank's shard. Full tensors start released.
  static absl::StatusOr<std::unique_ptr<ShardedParamStore>> Create(
      const Program& program, int rank, int world_size,
      at::Device device = at::Device(at::kCPU));
  ShardedParamStore(const ShardedParamStore&) = delete;
  ShardedParamStore& operator=(const ShardedParamStore&) = delete;

  int rank() const { return rank_; }
  int world_size() const { return world_size_; }
  at::Device device() const { return device_; }
  int num_params() const { return static_cast<int>(params_.size()); }
  const std::string& name(int32_t id) const { return params_[id].name; }
  int64_t numel(int32_t id) const { return params_[id].numel; }
  int64_t shard_numel(int32_t id) const { return params_[id].shard_numel; }
  int64_t full_bytes(int32_t id) const {
    return params_[id].numel * static_cast<int64_t>(at::elementSize(dtype_));
  }
  // The dtype params are gathered and computed in, and gradients reduced in.
  at::ScalarType dtype() const { return dtype_; }
  at::ScalarType reduce_dtype() const { return reduce_dtype_; }
  // False for a frozen param.
  bool trainable(int32_t id) const { return params_[id].trainable; }

  // The full-shape leaf (requires grad unless frozen). Its storage is empty
  // unless materialized(id).
  const at::Tensor& full(int32_t id) const { return params_[id].full; }
  // Gathered, and its gather (if any) completed.
  bool materialized(int32_t id) const;
  // Storage allocated (gathered or being gathered).
  bool allocated(int32_t id) const;
  // This rank's slice of the param (in dtype()), and its gradient (undefined
  // when frozen).
  const at::Tensor& shard(int32_t id) const { return params_[id].shard; }
  // This rank's slice in fp32: the master copy (a new tensor for a frozen
  // non-fp32 param, which has none, or for a master on the host tier: call
  // WaitStates first). What checkpoints store.
  at::Tensor MasterShard(int32_t id) const;
  // Sets this rank's slice from fp32 `values` (shard_numel elements): the
  // master, and the shard rounded from it.
  void SetMasterShard(int32_t id, const at::Tensor& values);
  const at::Tensor& shard_grad(int32_t id) const {
    return params_[id].shard_grad;
  }

  // Allocates the full storage of `ids` now and fills it from every rank's
  // shard with one all-gather on the communication thread. The params are
  // usable once the handle is done. `ids` must be released, unless
  // `refresh`: then gathered params are overwritten in place (ZeRO-1's
  // replicated params after the optimizer updated the shards).
  AsyncHandle Gather(absl::Span<const int32_t> ids, Communicator& comm,
                     bool refresh = false);
  // Frees the full storage of `ids` (waiting first for a gather still in
  // flight). Releasing a released param does nothing.
  void Release(absl::Span<const int32_t> ids);

  // Takes the full gradients of `ids` (a param without one counts as zero)
  // and reduce-scatters them: once done, this rank's shard gradients hold
  // their previous value plus the mean over ranks. The full gradients are
  // dropped at once. Every id must be trainable (the schedule semantics
  // refuse a frozen param reduced).
  AsyncHandle ReduceScatterGrads(absl::Span<const int32_t> ids,
                                 Communicator& comm);

  // Bytes of optimizer state this rank holds for `id` (AdamW moments and a
  // non-fp32 param's master; none for a frozen param).
  int64_t state_bytes(int32_t id) const {
    if (!params_[id].trainable) return 0;
    return StateCount(params_[id]) * params_[id].shard_numel *
           static_cast<int64_t>(sizeof(float));
  }
  // The states of `id` are on the host tier, or on their way there.
  bool states_on_host(int32_t id) const { return params_[id].states_on_host; }
  // Copies the states of `ids` that are on the device to `tier` on its copy
  // thread; their device memory is freed when the copy is done. States
  // already on the host, and frozen params (no states), are left alone. The
  // handle is null when nothing moves. Errors: the tier cannot allocate host
  // memory.
  absl::StatusOr<AsyncHandle> OffloadStates(absl::Span<const int32_t> ids,
                                            HostTier& tier);
  // Allocates now, on `tier`, the host memory that OffloadStates would at
  // the first offload of each trainable param of `ids` (once per param; it
  // is kept). A schedule that offloads reserves its states when it becomes
  // active, so that its first offloads copy at the speed of the later ones
  // and free the device memory when its plan expects. Errors: as
  // OffloadStates.
  absl::Status ReserveHostStates(absl::Span<const int32_t> ids, HostTier& tier);
  // Copies the states of `ids` that are on the host now back to device
  // memory on `tier`'s copy thread, which allocates it when the copy starts
  // (on CUDA it is allocated now). Null handle when nothing moves.
  AsyncHandle ReloadStates(absl::Span<const int32_t> ids, HostTier& tier);
  // Blocks until no copy of any state is in flight (checkpoints read them).
  void WaitStates();
  // The AdamW moments of `id`: on the device unless states_on_host(id); a
  // copy may still be filling them (WaitStates first). Undefined for a
  // frozen param.
  const at::Tensor& exp_avg(int32_t id) const { return params_[id].exp_avg; }
  const at::Tensor& exp_avg_sq(int32_t id) const {
    return params_[id].exp_avg_sq;
  }

  // Sum of squares of this rank's shard gradients (frozen params have none:
  // they count in no norm, as in clip_grad_norm_ over the trained params).
  double ShardGradSquaredNorm() const;
  // Multiplies every shard gradient (in fp32) by `factor` (clipping) and
  // steps AdamW on the trained params' masters, torch.optim.AdamW's update
  // with `step` 1-based, rounding non-fp32 shards from them; then zeroes the
  // shard gradients. Frozen shards stay as they
  // are. Before each group of params it waits for a reload of
  // their states still in flight (none may be left on the host).
  // Returns the seconds spent waiting for reloads.
  double AdamWStep(const AdamWOptions& options, float factor, int64_t step);
  // Ends a step the loss scaler skipped: no param, master or moment
  // changes; the reloads in flight are waited for as AdamWStep would, and
  // the gradients are left for the next step's first reduce to overwrite.
  // Returns the seconds spent waiting for reloads.
  double SkipStep();
  // Per param, this rank's share of its digest (Executor::ParamDigests):
  // the float64 sum over the master shard's values x of x * w(position in
  // the full param), w(i) = 2 * frac(i * 0.618...) - 1 (padding is zero).
  std::vector<double> ShardDigests() const;
  // The full fp32 (master) value of `id` as a new tensor (blocking
  // all-gather).
  absl::StatusOr<at::Tensor> GatherValue(int32_t id, Communicator& comm);

 private:
  // What a reload fills, written by the copy thread until its handle is
  // done.
  struct ReloadedStates {
    at::Tensor avg, avg_sq, master;
  };
  struct Entry {
    std::string name;
    int64_t numel = 0;
    int64_t shard_numel = 0;
    bool trainable = true;
    at::Tensor full;
    at::Tensor shard;
    // fp32 master of a trained non-fp32 param (a state: it moves to the host
    // tier with the moments).
    at::Tensor master;
    bool has_master = false;
    at::Tensor shard_grad;
    // Reduce-scatters into shard_grad since the last optimizer step.
    int reduces = 0;
    at::Tensor exp_avg;
    at::Tensor exp_avg_sq;
    AsyncHandle pending_gather;
    // Host-tier copy of the states: [exp_avg | exp_avg_sq | master],
    // allocated at the first offload and kept.
    at::Tensor host_states;
    bool states_on_host = false;
    // The latest offload or reload of the states.
    AsyncHandle pending_copy;
    // A reload in flight: the device states its copy allocates and fills,
    // moved into the entry (SettleReload) once pending_copy is done; an
    // offload submitted meanwhile takes them from here.
    std::shared_ptr<ReloadedStates> reloading;
  };
  ShardedParamStore(int rank, int world_size, at::Device device,
                    at::ScalarType dtype, at::ScalarType reduce_dtype)
      : rank_(rank),
        world_size_(world_size),
        device_(device),
        dtype_(dtype),
        reduce_dtype_(reduce_dtype) {}
  // fp32 state tensors of `e`: the two moments, and its master.
  static int64_t StateCount(const Entry& e) { return e.has_master ? 3 : 2; }
  // Waits for the reload in flight into `e`, if any, and moves its states
  // into the entry.
  static void SettleReload(Entry& e);
  // Waits for the offload or reload of `e`'s states in flight, if any (it
  // must succeed), and settles a reload. Returns the seconds waited.
  static double WaitStateCopy(Entry& e);
  // After the optimizer (or a skipped step): the gradient's reduce count is
  // reset, and a gradient reduced once goes back to the reduce dtype.
  void EndStep(Entry& e) const;
  // AdamWStep on `group` (trained entries, at most the largest shard's
  // elements in all): each operation one _foreach call. Returns the seconds
  // spent waiting for reloads.
  double AdamWGroup(const AdamWOptions& options, float factor, int64_t step,
                    const std::vector<Entry*>& group);

  const int rank_;
  const int world_size_;
  const at::Device device_;
  const at::ScalarType dtype_;
  const at::ScalarType reduce_dtype_;
  std::vector<Entry> params_;
};

}  // namespace tandem

#endif  // TANDEM_WORKER_RUNTIME_SHARDED_PARAM_STORE_H_
