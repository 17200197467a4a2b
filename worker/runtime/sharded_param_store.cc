#include "worker/runtime/sharded_param_store.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <utility>
#include <vector>

#include "ATen/ATen.h"
#include "ATen/native/Resize.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "worker/runtime/torch_status.h"

#ifdef TANDEM_WITH_CUDA
#include "ATen/native/cuda/Resize.h"
#endif

namespace tandem {
namespace {

// Resizes the bytes of `t`'s storage in place: views autograd saved keep
// pointing at the same StorageImpl.
void ResizeStorage(const at::Tensor& t, size_t bytes) {
  c10::StorageImpl* storage = t.storage().unsafeGetStorageImpl();
  if (storage->device_type() == at::kCPU) {
    at::native::resize_bytes_cpu(storage, bytes);
    return;
  }
#ifdef TANDEM_WITH_CUDA
  at::native::resize_bytes_cuda(storage, bytes);
#else
  TORCH_CHECK(false, "this build has no CUDA support");
#endif
}

// A plain tensor over `count` elements of `dtype` at `data`: no autograd, no
// version counter shared with the full tensor it aliases.
at::Tensor Alias(void* data, int64_t count, at::ScalarType dtype,
                 at::Device device) {
  return at::from_blob(data, {count},
                       at::TensorOptions().dtype(dtype).device(device));
}

at::ScalarType ScalarTypeOf(DType dtype) {
  switch (dtype) {
    case DType::kBF16:
      return at::kBFloat16;
    case DType::kF16:
      return at::kHalf;
    case DType::kF32:
      break;
  }
  return at::kFloat;
}

}  // namespace

absl::StatusOr<std::unique_ptr<ShardedParamStore>> ShardedParamStore::Create(
    const Program& program, int rank, int world_size, at::Device device) {
  if (world_size < 1 || rank < 0 || rank >= world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", rank, " outside world size ", world_size));
  }
  const at::ScalarType dtype = ScalarTypeOf(program.dtype);
  const at::ScalarType reduce_dtype = ScalarTypeOf(program.reduce_dtype);
  if (reduce_dtype != at::kFloat && reduce_dtype != dtype) {
    return absl::InvalidArgumentError(
        absl::StrCat("program '", program.name, "' reduces gradients in ",
                     DTypeName(program.reduce_dtype),
                     "; use f32 or its own dtype ", DTypeName(program.dtype)));
  }
  std::unique_ptr<ShardedParamStore> store(
      new ShardedParamStore(rank, world_size, device, dtype, reduce_dtype));
  absl::Status status = TorchCall("initializing params", [&] {
    const auto f32 = at::TensorOptions().dtype(at::kFloat);
    for (const ProgramParam& p : program.params) {
      Entry e;
      e.name = p.name;
      e.numel = 1;
      for (int64_t d : p.shape) e.numel *= d;
      e.shard_numel = (e.numel + world_size - 1) / world_size;
      e.trainable = p.trainable;
      // Whole padded value, then this rank's slice.
      at::Tensor padded = at::zeros({e.shard_numel * world_size}, f32);
      p.init(padded.data_ptr<float>(), e.numel);
      at::Tensor master = padded.narrow(0, rank * e.shard_numel, e.shard_numel)
                              .clone()
                              .to(device);
      e.shard = master.to(dtype);
      e.has_master = e.trainable && dtype != at::kFloat;
      if (e.has_master) e.master = master;
      if (e.trainable) {
        e.shard_grad = at::zeros_like(master, reduce_dtype);
        e.exp_avg = at::zeros_like(master);
        e.exp_avg_sq = at::zeros_like(master);
      }
      if (world_size == 1) {
        // Alone, the shard is the whole param: the full tensor is a
        // permanent alias of its bytes (its own leaf and version counter),
        // so a gather moves nothing and the optimizer's in-place update of
        // the shard is the param's new value.
        e.full = at::from_blob(e.shard.data_ptr(), p.shape,
                               f32.dtype(dtype).device(device));
      } else {
        e.full = at::empty(p.shape, f32.dtype(dtype).device(device));
        ResizeStorage(e.full, 0);
      }
      // A frozen param's uses carry no gradient to it.
      e.full.set_requires_grad(e.trainable);
      store->params_.push_back(std::move(e));
    }
  });
  if (!status.ok()) return status;
  return store;
}

bool ShardedParamStore::allocated(int32_t id) const {
  return params_[id].full.storage().nbytes() > 0;
}

bool ShardedParamStore::materialized(int32_t id) const {
  const Entry& e = params_[id];
  return allocated(id) &&
         (e.pending_gather == nullptr || e.pending_gather->done());
}

AsyncHandle ShardedParamStore::Gather(absl::Span<const int32_t> ids,
                                      Communicator& comm, bool refresh) {
  // Alone: the full tensors alias the shards (Create), always gathered.
  if (world_size_ == 1)
    return AsyncWork::RunInline(AsyncWork::Kind::kCollective, [] {});
  struct Piece {
    at::Tensor shard;  // this rank's shard, read on the comm thread
    void* dest;        // the full storage
    int64_t numel;
    int64_t shard_numel;
    int64_t offset;  // in the packed buffer
  };
  std::vector<Piece> pieces;
  int64_t packed = 0;
  for (int32_t id : ids) {
    Entry& e = params_[id];
    if (refresh && allocated(id)) {
      if (e.pending_gather != nullptr) {
        e.pending_gather->Wait().IgnoreError();  // in order anyway
      }
    } else {
      TORCH_CHECK(!allocated(id), "gather of '", e.name,
                  "' while it is still gathered");
      ResizeStorage(e.full, static_cast<size_t>(full_bytes(id)));
    }
    pieces.push_back({e.shard, e.full.storage().data_ptr().get(), e.numel,
                      e.shard_numel, packed});
    packed += e.shard_numel;
  }
  const int world = world_size_;
  const at::Device device = device_;
  const at::ScalarType dtype = dtype_;
  AsyncHandle handle = comm.Submit(
      [pieces = std::move(pieces), packed, world, device, dtype, &comm] {
        const auto options = at::TensorOptions().dtype(dtype).device(device);
        at::Tensor in = at::empty({packed}, options);
        for (const Piece& p : pieces) {
          in.narrow(0, p.offset, p.shard_numel).copy_(p.shard);
        }
        at::Tensor out = at::empty({packed * world}, options);
        comm.AllGather(in, out);
        for (const Piece& p : pieces) {
          const at::Tensor dest = Alias(p.dest, p.numel, dtype, device);
          for (int j = 0; j < world; ++j) {
            const int64_t begin = j * p.shard_numel;
            const int64_t count =
                std::min(p.shard_numel, p.numel - begin);  // drop padding
            if (count <= 0) break;
            dest.narrow(0, begin, count)
                .copy_(out.narrow(0, j * packed + p.offset, count));
          }
        }
      },
      // Its packed input and output, allocated as it starts.
      packed * (world + 1) * static_cast<int64_t>(at::elementSize(dtype)));
  for (int32_t id : ids) params_[id].pending_gather = handle;
  return handle;
}

void ShardedParamStore::Release(absl::Span<const int32_t> ids) {
  if (world_size_ == 1) return;  // the aliases stay: nothing was gathered
  for (int32_t id : ids) {
    Entry& e = params_[id];
    if (e.pending_gather != nullptr) {
      e.pending_gather->Wait().IgnoreError();  // its status goes to the waiter
      e.pending_gather = nullptr;
    }
    if (allocated(id)) ResizeStorage(e.full, 0);
  }
}

AsyncHandle ShardedParamStore::ReduceScatterGrads(absl::Span<const int32_t> ids,
                                                  Communicator& comm) {
  struct Piece {
    at::Tensor grad;        // full gradient, or undefined for zero
    at::Tensor shard_grad;  // accumulated on the comm thread
    // Set when this reduce starts accumulating in fp32: shard_grad's value
    // so far (in the reduce dtype), copied into shard_grad first.
    at::Tensor promoted_from;
    // The param's first reduce this step: it overwrites shard_grad (which
    // holds the last step's value, never zeroed) instead of adding.
    bool first;
    int64_t numel;
    int64_t shard_numel;
    int64_t offset;
  };
  std::vector<Piece> pieces;
  int64_t packed = 0;
  for (int32_t id : ids) {
    Entry& e = params_[id];
    TORCH_CHECK(e.trainable, "reduce-scatter of frozen param '", e.name,
                "', which has no gradient");
    at::Tensor grad = e.full.grad();
    e.full.mutable_grad() = at::Tensor();
    // A second reduce in one step accumulates in fp32 (the comm thread runs
    // reduces in order: the first has finished writing the old tensor when
    // this one copies it).
    at::Tensor promoted_from;
    const bool first = ++e.reduces == 1;
    if (!first && e.shard_grad.scalar_type() != at::kFloat) {
      promoted_from = e.shard_grad;
      e.shard_grad = at::empty_like(promoted_from, at::kFloat);
    }
    pieces.push_back({std::move(grad), e.shard_grad, std::move(promoted_from),
                      first, e.numel, e.shard_numel, packed});
    packed += e.shard_numel;
  }
  if (world_size_ == 1) {
    // Alone, the mean over ranks is this rank's gradient: accumulate it
    // here, on the compute thread, with no packing and no collective.
    return AsyncWork::RunInline(AsyncWork::Kind::kCollective, [&pieces] {
      for (Piece& p : pieces) {
        if (p.promoted_from.defined()) p.shard_grad.copy_(p.promoted_from);
        if (!p.grad.defined()) {
          if (p.first) p.shard_grad.zero_();
        } else if (p.first) {
          p.shard_grad.copy_(p.grad.reshape({-1}));
        } else {
          p.shard_grad.add_(p.grad.reshape({-1}));
        }
        p.grad = at::Tensor();
      }
    });
  }
  const int world = world_size_;
  const at::Device device = device_;
  const at::ScalarType reduce_dtype = reduce_dtype_;
  const auto elem = static_cast<int64_t>(at::elementSize(reduce_dtype));
  const int64_t in_bytes = packed * world * elem;
  const int64_t out_bytes = packed * elem;
  int64_t freed_bytes = 0;
  for (const Piece& p : pieces) {
    if (p.grad.defined()) freed_bytes += static_cast<int64_t>(p.grad.nbytes());
  }
  return comm.Submit(
      [pieces = std::move(pieces), packed, world, device, reduce_dtype,
       &comm]() mutable {
        const auto options =
            at::TensorOptions().dtype(reduce_dtype).device(device);
        // Chunk j (for rank j) holds every param's slice j, in order: the
        // gradient's elements, zeros where it has none (padding, no gradient).
        // Each byte is written once.
        at::Tensor in = at::empty({packed * world}, options);
        for (const Piece& p : pieces) {
          const at::Tensor flat =
              p.grad.defined() ? p.grad.reshape({-1}) : at::Tensor();
          for (int j = 0; j < world; ++j) {
            const int64_t begin = j * p.shard_numel;
            const int64_t count =
                flat.defined()
                    ? std::clamp<int64_t>(p.numel - begin, 0, p.shard_numel)
                    : 0;
            at::Tensor slot =
                in.narrow(0, j * packed + p.offset, p.shard_numel);
            if (count > 0)
              slot.narrow(0, 0, count).copy_(flat.narrow(0, begin, count));
            if (count < p.shard_numel) {
              slot.narrow(0, count, p.shard_numel - count).zero_();
            }
          }
        }
        for (Piece& p : pieces) p.grad = at::Tensor();  // free early
        at::Tensor out = at::empty({packed}, options);
        comm.ReduceScatterSum(in, out);
        // Each rank's loss is the mean over its own tokens: the global mean's
        // gradient is the mean of the ranks' gradients. A first reduce divides
        // straight into the shard gradient (one pass).
        const double ranks = static_cast<double>(world);
        for (Piece& p : pieces) {
          if (p.promoted_from.defined()) {
            p.shard_grad.copy_(p.promoted_from);
            p.promoted_from = at::Tensor();
          }
          const at::Tensor mine = out.narrow(0, p.offset, p.shard_numel);
          if (p.first && p.shard_grad.scalar_type() == mine.scalar_type()) {
            at::div_out(p.shard_grad, mine, ranks);
          } else if (p.first) {
            p.shard_grad.copy_(mine.div(ranks));
          } else {
            p.shard_grad.add_(mine.div(ranks));
          }
        }
      },
      // Its packed input rises on top of the gradients before it frees them;
      // the output comes after.
      std::max(in_bytes, in_bytes - freed_bytes + out_bytes));
}

absl::Status ShardedParamStore::ReserveHostStates(absl::Span<const int32_t> ids,
                                                  HostTier& tier) {
  for (int32_t id : ids) {
    Entry& e = params_[id];
    if (!e.trainable || e.host_states.defined()) continue;
    ASSIGN_OR_RETURN(e.host_states,
                     tier.Allocate(StateCount(e) * e.shard_numel));
  }
  return absl::OkStatus();
}

absl::StatusOr<AsyncHandle> ShardedParamStore::OffloadStates(
    absl::Span<const int32_t> ids, HostTier& tier) {
  struct Piece {
    // The device copies die with the copy; master undefined for fp32. While
    // a reload of them is in flight, they are in `reloaded` instead (the
    // copy thread filled them before this copy runs: copies run in order).
    ReloadedStates states;
    std::shared_ptr<ReloadedStates> reloaded;
    at::Tensor host;
  };
  std::vector<Piece> pieces;
  std::vector<int32_t> moved;
  for (int32_t id : ids) {
    Entry& e = params_[id];
    if (e.states_on_host || !e.trainable) continue;
    if (!e.host_states.defined()) {
      RETURN_IF_ERROR(ReserveHostStates({id}, tier));
    }
    pieces.push_back(
        {{std::move(e.exp_avg), std::move(e.exp_avg_sq), std::move(e.master)},
         std::move(e.reloading),
         e.host_states});
    e.exp_avg = at::Tensor();
    e.exp_avg_sq = at::Tensor();
    e.master = at::Tensor();
    e.reloading = nullptr;
    e.states_on_host = true;
    moved.push_back(id);
  }
  if (pieces.empty()) return AsyncHandle();
  AsyncHandle handle =
      tier.Submit([pieces = std::move(pieces), &tier]() mutable {
        for (Piece& p : pieces) {
          ReloadedStates& s = p.reloaded != nullptr ? *p.reloaded : p.states;
          const int64_t n = s.avg.numel();
          tier.Copy(s.avg, p.host.narrow(0, 0, n));
          tier.Copy(s.avg_sq, p.host.narrow(0, n, n));
          if (s.master.defined()) {
            tier.Copy(s.master, p.host.narrow(0, 2 * n, n));
          }
          s = ReloadedStates();  // free the device memory now
        }
      });
  for (int32_t id : moved) params_[id].pending_copy = handle;
  return handle;
}

AsyncHandle ShardedParamStore::ReloadStates(absl::Span<const int32_t> ids,
                                            HostTier& tier) {
  struct Piece {
    at::Tensor host;
    std::shared_ptr<ReloadedStates> into;
    int64_t numel = 0;
    bool master = false;
  };
  // On CPU the copy thread allocates the states when the copy starts, all of
  // this reload's at once, as the simulator counts them. On CUDA they are
  // allocated here, on the compute stream the copy stream is ordered after
  // (memory the copy thread allocated would belong to the copy stream's
  // pool, and be reused there while compute still reads it).
  const bool at_start = device_.is_cpu();
  const at::TensorOptions f32 =
      at::TensorOptions().dtype(at::kFloat).device(device_);
  auto allocate = [f32](const Piece& p) {
    p.into->avg = at::empty({p.numel}, f32);
    p.into->avg_sq = at::empty({p.numel}, f32);
    if (p.master) p.into->master = at::empty({p.numel}, f32);
  };
  std::vector<Piece> pieces;
  std::vector<int32_t> moved;
  for (int32_t id : ids) {
    Entry& e = params_[id];
    if (!e.states_on_host) continue;
    e.reloading = std::make_shared<ReloadedStates>();
    e.states_on_host = false;
    pieces.push_back({e.host_states, e.reloading, e.shard_numel, e.has_master});
    if (!at_start) allocate(pieces.back());
    moved.push_back(id);
  }
  if (pieces.empty()) return nullptr;
  AsyncHandle handle =
      tier.Submit([pieces = std::move(pieces), &tier, at_start, allocate] {
        if (at_start) {
          for (const Piece& p : pieces) allocate(p);
        }
        for (const Piece& p : pieces) {
          const int64_t n = p.numel;
          tier.Copy(p.host.narrow(0, 0, n), p.into->avg);
          tier.Copy(p.host.narrow(0, n, n), p.into->avg_sq);
          if (p.master) tier.Copy(p.host.narrow(0, 2 * n, n), p.into->master);
        }
      });
  for (int32_t id : moved) params_[id].pending_copy = handle;
  return handle;
}

void ShardedParamStore::SettleReload(Entry& e) {
  if (e.reloading == nullptr) return;
  const absl::Status s = e.pending_copy->Wait();
  TORCH_CHECK(s.ok(), "reloading the optimizer states of '", e.name,
              "' failed: ", std::string(s.message()));
  e.exp_avg = std::move(e.reloading->avg);
  e.exp_avg_sq = std::move(e.reloading->avg_sq);
  e.master = std::move(e.reloading->master);
  e.reloading = nullptr;
}

void ShardedParamStore::WaitStates() {
  for (Entry& e : params_) {
    if (e.pending_copy == nullptr) continue;
    SettleReload(e);
    const absl::Status s = e.pending_copy->Wait();
    TORCH_CHECK(s.ok(), "moving the optimizer states of '", e.name,
                "' failed: ", std::string(s.message()));
    e.pending_copy = nullptr;
  }
}

at::Tensor ShardedParamStore::MasterShard(int32_t id) const {
  const Entry& e = params_[id];
  if (!e.has_master) return e.shard.to(at::kFloat);
  if (e.reloading != nullptr) {
    // Filled once the reload is done (the entry takes it at SettleReload).
    const absl::Status s = e.pending_copy->Wait();
    TORCH_CHECK(s.ok(), "reloading the optimizer states of '", e.name,
                "' failed: ", std::string(s.message()));
    return e.reloading->master;
  }
  if (!e.states_on_host) return e.master;
  return e.host_states.narrow(0, 2 * e.shard_numel, e.shard_numel)
      .to(e.shard.device());
}

void ShardedParamStore::SetMasterShard(int32_t id, const at::Tensor& values) {
  Entry& e = params_[id];
  TORCH_CHECK(values.numel() == e.shard_numel, "'", e.name, "' has ",
              e.shard_numel, " values in a shard, got ", values.numel());
  TORCH_CHECK(!e.states_on_host || !e.has_master, "the master of '", e.name,
              "' is on the host tier");
  SettleReload(e);
  if (e.has_master) e.master.copy_(values.reshape({-1}));
  e.shard.copy_(values.reshape({-1}));
}

double ShardedParamStore::ShardGradSquaredNorm() const {
  // As clip_grad_norm_: each gradient's 2-norm in its own precision, then
  // their squares summed (in double here, over the shards of every rank).
  // The norms come to the host in one copy: on a GPU, one wait for the
  // device rather than one per param.
  std::vector<at::Tensor> norms;
  for (const Entry& e : params_) {
    if (!e.trainable || e.reduces == 0) continue;  // no gradient: zero
    // A 16-bit gradient's norm in fp32: a loss-scaled f16 gradient's norm
    // passes f16's largest value long before any element does.
    norms.push_back((e.shard_grad.scalar_type() == at::kHalf
                         ? at::linalg_vector_norm(e.shard_grad, 2, c10::nullopt,
                                                  false, at::kFloat)
                         : at::linalg_vector_norm(e.shard_grad, 2))
                        .to(at::kDouble));
  }
  if (norms.empty()) return 0;
  const at::Tensor host = at::stack(norms).to(at::kCPU).contiguous();
  const double* norm = host.data_ptr<double>();
  double sum = 0;
  for (int64_t i = 0; i < host.numel(); ++i) sum += norm[i] * norm[i];
  return sum;
}

double ShardedParamStore::AdamWStep(const AdamWOptions& o, float factor,
                                    int64_t step) {
  // torch.optim.AdamW (1.13), operation for operation, on each shard; each
  // operation one _foreach call over a group of shards (on a GPU one launch
  // per group, not per param: a small model's step is launch-bound there).
  // A group holds at most the largest shard's elements, so its temporaries
  // never outgrow the one-param-at-a-time peak.
  int64_t largest = 0;
  for (const Entry& e : params_) {
    if (e.trainable) largest = std::max(largest, e.shard_numel);
  }
  double waited_s = 0;
  std::vector<Entry*> group;
  int64_t group_numel = 0;
  for (Entry& e : params_) {
    if (!e.trainable) continue;
    if (!group.empty() && group_numel + e.shard_numel > largest) {
      waited_s += AdamWGroup(o, factor, step, group);
      group.clear();
      group_numel = 0;
    }
    group.push_back(&e);
    group_numel += e.shard_numel;
  }
  if (!group.empty()) waited_s += AdamWGroup(o, factor, step, group);
  return waited_s;
}

double ShardedParamStore::AdamWGroup(const AdamWOptions& o, float factor,
                                     int64_t step,
                                     const std::vector<Entry*>& group) {
  const double bias_correction1 = 1 - std::pow(o.beta1, step);
  const double bias_correction2 = 1 - std::pow(o.beta2, step);
  const double step_size = o.lr / bias_correction1;
  const double bias_correction2_sqrt = std::sqrt(bias_correction2);
  double waited_s = 0;
  std::vector<at::Tensor> grads;
  std::vector<at::Tensor> masters;
  std::vector<at::Tensor> exp_avgs;
  std::vector<at::Tensor> exp_avg_sqs;
  for (Entry* e : group) {
    TORCH_CHECK(!e->states_on_host, "the optimizer states of '", e->name,
                "' are on the host tier; reload them before the step");
    waited_s += WaitStateCopy(*e);
    // No reduce this step (a param no node used): its gradient is zero,
    // and the shard gradient still holds the last step's.
    if (e->reduces == 0) e->shard_grad.zero_();
    // fp32 gradient and master (an fp32 shard is its own).
    grads.push_back(e->shard_grad.to(at::kFloat));
    masters.push_back(e->has_master ? e->master : e->shard);
    exp_avgs.push_back(e->exp_avg);
    exp_avg_sqs.push_back(e->exp_avg_sq);
  }
  if (factor != 1.0f) at::_foreach_mul_(grads, factor);
  at::_foreach_mul_(masters, 1 - o.lr * o.weight_decay);
  at::_foreach_mul_(exp_avgs, o.beta1);
  at::_foreach_add_(exp_avgs, grads, 1 - o.beta1);
  at::_foreach_mul_(exp_avg_sqs, o.beta2);
  at::_foreach_addcmul_(exp_avg_sqs, grads, grads, 1 - o.beta2);
  // One temporary per shard (torch's (sqrt / c).add_(eps) holds two at
  // once); the same values.
  std::vector<at::Tensor> denoms = at::_foreach_sqrt(exp_avg_sqs);
  at::_foreach_div_(denoms, bias_correction2_sqrt);
  at::_foreach_add_(denoms, o.eps);
  at::_foreach_addcdiv_(masters, exp_avgs, denoms, -step_size);
  denoms.clear();
  grads.clear();
  for (size_t i = 0; i < group.size(); ++i) {
    Entry& e = *group[i];
    if (e.has_master) e.shard.copy_(masters[i]);
    EndStep(e);
  }
  return waited_s;
}

double ShardedParamStore::WaitStateCopy(Entry& e) {
  if (e.pending_copy == nullptr) return 0;
  const double before = e.pending_copy->waited_s();
  const absl::Status s = e.pending_copy->Wait();
  TORCH_CHECK(s.ok(), "reloading the optimizer states of '", e.name,
              "' failed: ", std::string(s.message()));
  const double waited_s = e.pending_copy->waited_s() - before;
  SettleReload(e);
  e.pending_copy = nullptr;
  return waited_s;
}

void ShardedParamStore::EndStep(Entry& e) const {
  // Reduced once this step: the gradient goes back to the reduce dtype (a
  // schedule that now reduces once needs no fp32 accumulator). It is not
  // zeroed: the next step's first reduce overwrites it.
  if (e.reduces <= 1 && e.shard_grad.scalar_type() != reduce_dtype_) {
    e.shard_grad = at::zeros_like(e.shard_grad, reduce_dtype_);
  }
  e.reduces = 0;
}

double ShardedParamStore::SkipStep() {
  double waited_s = 0;
  for (Entry& e : params_) {
    if (!e.trainable) continue;
    TORCH_CHECK(!e.states_on_host, "the optimizer states of '", e.name,
                "' are on the host tier; reload them before the step");
    waited_s += WaitStateCopy(e);
    EndStep(e);
  }
  return waited_s;
}

std::vector<double> ShardedParamStore::ShardDigests() const {
  // The golden ratio's fraction: positions i and j get far-apart weights
  // for any i != j, so a value in the wrong place changes the digest.
  constexpr double kStride = 0.6180339887498949;
  std::vector<double> out;
  out.reserve(params_.size());
  for (int32_t id = 0; id < num_params(); ++id) {
    const Entry& e = params_[id];
    const at::Tensor shard = MasterShard(id).to(at::kCPU).to(at::kDouble);
    const double first = static_cast<double>(rank_ * e.shard_numel);
    const at::Tensor w =
        at::frac(at::arange(first, first + static_cast<double>(e.shard_numel),
                            at::kDouble) *
                 kStride) *
            2 -
        1;
    out.push_back((shard * w).sum().item<double>());
  }
  return out;
}

absl::StatusOr<at::Tensor> ShardedParamStore::GatherValue(int32_t id,
                                                          Communicator& comm) {
  const Entry& e = params_[id];
  at::Tensor out;
  AsyncHandle h = comm.Submit([&] {
    const at::Tensor master = MasterShard(id);
    at::Tensor all = at::empty({e.shard_numel * world_size_}, master.options());
    comm.AllGather(master, all);
    out = all.narrow(0, 0, e.numel).view(e.full.sizes()).clone();
  });
  absl::Status status = h->Wait();
  if (!status.ok()) return status;
  return out;
}

}  // namespace tandem
