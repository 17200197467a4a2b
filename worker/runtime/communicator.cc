#include "worker/runtime/communicator.h"

#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <deque>
#include <thread>
#include <utility>
#include <vector>

#include "ATen/ATen.h"
#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/status_macros.h"
#include "worker/runtime/torch_status.h"

#ifdef TANDEM_WITH_CUDA
#include "c10/cuda/CUDAFunctions.h"
#endif

namespace tandem {
namespace {

// The calling thread's CUDA device when collectives run on NCCL, else -1.
int CallerCudaDevice(bool native_collectives) {
#ifdef TANDEM_WITH_CUDA
  if (native_collectives) return c10::cuda::current_device();
#endif
  (void)native_collectives;
  return -1;
}

void SetCudaDevice(int device) {
#ifdef TANDEM_WITH_CUDA
  c10::cuda::set_device(static_cast<c10::DeviceIndex>(device));
#else
  (void)device;
#endif
}

double Seconds(SteadyTime from, SteadyTime to) {
  return std::chrono::duration<double>(to - from).count();
}

// Waits for `work`, then until the backend has let go of it. Gloo's
// collectives complete a work's future on Gloo's own thread before that
// thread drops its references to the work, which hold the collective's
// tensors (the pieces' inputs and outputs: views of our packed buffers);
// sends and receives complete on the waiting thread, so for them this is
// the wait alone. When that thread is descheduled
// for a few milliseconds, as on a busy 2-core host, the buffers outlive the
// collective and meet the next node's allocations: a peak the simulator
// does not predict, up to a gathered group's size (worker/README.md,
// "Memory hold"). Bounded: a backend that keeps its works longer than
// kMaxWait (another libtorch's Gloo) costs memory, not time: after the
// first such wait the process stops waiting for releases.
void WaitReleased(const c10::intrusive_ptr<c10d::Work>& work) {
  static std::atomic<bool> backend_releases{true};
  work->wait();
  if (!backend_releases.load(std::memory_order_relaxed)) return;
  constexpr auto kMaxWait = std::chrono::milliseconds(100);
  const auto start = std::chrono::steady_clock::now();
  while (work.use_count() > 1) {
    if (std::chrono::steady_clock::now() - start > kMaxWait) {
      backend_releases.store(false, std::memory_order_relaxed);
      return;
    }
    std::this_thread::yield();
  }
}

// Runs a collective over elements [0, n) in pieces of at most `piece`:
// issue(offset, length) starts one and returns its works; at most
// `max_in_flight` pieces are outstanding; done(offset, length) runs for each
// after all its works completed, in issue order. Every rank cuts the same n
// the same way, so the pieces match across ranks.
template <typename IssueFn, typename DoneFn>
void InPieces(int64_t n, int64_t piece, int max_in_flight, IssueFn issue,
              DoneFn done) {
  struct Piece {
    std::vector<c10::intrusive_ptr<c10d::Work>> works;
    int64_t offset;
    int64_t length;
  };
  std::deque<Piece> in_flight;
  auto retire = [&] {
    Piece p = std::move(in_flight.front());
    in_flight.pop_front();
    for (const auto& work : p.works) WaitReleased(work);
    done(p.offset, p.length);
  };
  for (int64_t offset = 0; offset < n; offset += piece) {
    const int64_t length = std::min(piece, n - offset);
    in_flight.push_back({issue(offset, length), offset, length});
    if (static_cast<int>(in_flight.size()) >= max_in_flight) retire();
  }
  while (!in_flight.empty()) retire();
}

}  // namespace

absl::Status Communicator::failure() const {
  absl::MutexLock lock(&mu_);
  return failure_;
}

Communicator::Communicator(c10::intrusive_ptr<c10d::ProcessGroup> group,
                           CommOptions options)
    : group_(std::move(group)),
      rank_(group_->getRank()),
      world_size_(group_->getSize()),
      native_collectives_(group_->getBackendName() == "nccl"),
      options_{std::max<int64_t>(options.chunk_bytes, 0),
               std::max(options.max_in_flight, 1)},
      thread_([this, cuda_device = CallerCudaDevice(native_collectives_)] {
        // The current CUDA device is per thread: stage on the caller's GPU
        // (cuda:LOCAL_RANK), not on GPU 0.
        if (cuda_device >= 0) SetCudaDevice(cuda_device);
        Loop();
      }) {}

Communicator::~Communicator() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  cv_.SignalAll();
  thread_.join();
}

AsyncHandle Communicator::Submit(std::function<void()> body,
                                 int64_t buffer_bytes) {
  auto handle = std::make_shared<AsyncWork>(AsyncWork::Kind::kCollective);
  {
    absl::MutexLock lock(&mu_);
    if (!failure_.ok()) {
      handle->Finish(failure_);
      return handle;
    }
    queue_.push_back({handle, std::move(body), buffer_bytes});
    last_ = handle;
  }
  cv_.SignalAll();
  return handle;
}

int64_t Communicator::QueuedBufferBytes() const {
  absl::MutexLock lock(&mu_);
  int64_t most = 0;
  for (const Task& task : queue_) most = std::max(most, task.buffer_bytes);
  return most;
}

void Communicator::Loop() {
  pthread_setname_np(pthread_self(), "tandem-comm");
  for (;;) {
    Task task;
    {
      absl::MutexLock lock(&mu_);
      while (!stopping_ && queue_.empty()) cv_.Wait(&mu_);
      if (queue_.empty()) return;  // stopping and drained
      task = std::move(queue_.front());
      queue_.pop_front();
    }
    absl::Status status;
    {
      absl::MutexLock lock(&mu_);
      status = failure_;
    }
    task.handle->MarkStarted();
    if (status.ok()) {
      status = TorchCall(absl::StrCat("collective on rank ", rank_),
                         [&] { task.body(); });
      if (!status.ok()) {
        absl::MutexLock lock(&mu_);
        failure_ = status;
      }
    }
    // What the body captured (gradients, packed buffers, a shard's copy)
    // is freed before waiters wake: a node that starts once its wait
    // returns must not find the collective's buffers still held, or its
    // peak depends on which thread runs first (worker/README.md, "Memory
    // hold").
    task.body = nullptr;
    task.handle->Finish(std::move(status));
  }
}

CommOptions CommOptionsFromSpec(const v1::JobSpec& spec) {
  CommOptions options;
  options.chunk_bytes = std::max<int64_t>(spec.comm().chunk_bytes(), 0);
  // Zero: a spec stored before the field existed, or defaults not applied.
  if (spec.comm().max_in_flight() > 0) {
    options.max_in_flight = spec.comm().max_in_flight();
  }
  return options;
}

int64_t Communicator::ChunkBytes() const {
  // 0 (automatic, before or without tuning): the default pieces.
  return options_.chunk_bytes > 0 ? options_.chunk_bytes
                                  : kDefaultCommChunkBytes;
}

int64_t Communicator::PieceElements(const at::Tensor& t) const {
  return std::max<int64_t>(1, ChunkBytes() / t.element_size());
}

absl::StatusOr<ChunkTuning> Communicator::TuneChunkBytes() {
  ChunkTuning tuning;
  // options_ changes only below, through the communication thread and
  // waited for, so reading it here is safe.
  if (options_.chunk_bytes > 0 || world_size_ == 1 || native_collectives_) {
    tuning.chunk_bytes = ChunkBytes();
    return tuning;
  }
  constexpr int64_t kProbeBytes = int64_t{8} << 20;
  const int64_t n = std::max<int64_t>(
      1, kProbeBytes / static_cast<int64_t>(sizeof(float)) / (world_size_ - 1));
  double seconds = 1e30;
  AsyncHandle probe = Submit([&] {
    const at::Tensor in = at::zeros({n}, at::kFloat);
    const at::Tensor out = at::empty({n * world_size_}, at::kFloat);
    // chunk_bytes is still 0 here: default pieces.
    for (int rep = 0; rep < 2; ++rep) {
      const SteadyTime start = std::chrono::steady_clock::now();
      AllGather(in, out);
      seconds =
          std::min(seconds, Seconds(start, std::chrono::steady_clock::now()));
    }
  });
  RETURN_IF_ERROR(probe->Wait());
  if (probe_seconds_for_testing_ > 0) seconds = probe_seconds_for_testing_;
  ASSIGN_OR_RETURN(std::vector<double> all, AllGatherScalars({seconds}));
  tuning.probe_s = *std::max_element(all.begin(), all.end());
  tuning.probe_bytes =
      n * static_cast<int64_t>(sizeof(float)) * (world_size_ - 1);
  const int64_t chosen = tuning.rate() < kPiecesBelowBytesPerS
                             ? kDefaultCommChunkBytes
                             : kWholeMessages;
  tuning.chunk_bytes = chosen;
  AsyncHandle set = Submit([this, chosen] { options_.chunk_bytes = chosen; });
  RETURN_IF_ERROR(set->Wait());
  return tuning;
}

CollectiveScratch Communicator::AllGatherScratch() const {
  // Gloo: each peer's piece is received straight into the output and ours
  // is sent from the input; NCCL's own buffers are not counted.
  return {};
}

CollectiveScratch Communicator::ReduceScatterScratch() const {
  // The first peer's contribution (in rank order) is received straight into
  // the output; the other world - 2 peers' into one buffer each, per piece
  // in flight. At world 2 that is nothing. The rule is per collective of
  // `padded` input bytes, and (world - 2) / world of them is at most one
  // copy.
  if (native_collectives_ || world_size_ <= 2) return {};
  const int64_t chunk = ChunkBytes();
  if (chunk >= kWholeMessages) return {1, 0};
  return {1, options_.max_in_flight * (world_size_ - 2) * chunk};
}

int Communicator::NextTag() {
  // Every rank issues the same collectives in the same order (the class's
  // contract), so every rank draws the same tags.
  next_tag_ = (next_tag_ + 1) & kTagMask;
  return next_tag_;
}

void Communicator::AllGather(const at::Tensor& input,
                             const at::Tensor& output) {
  TORCH_CHECK(output.numel() == input.numel() * world_size_,
              "all-gather output must hold world * input elements");
  at::Tensor in = input;
  if (native_collectives_) {
    at::Tensor out = output;
    group_->_allgather_base(out, in)->wait();
    return;
  }
  // Gloo: point to point, each piece received straight into its place in
  // the output (rank j's elements [offset, offset + length) land at
  // j * n + offset), our piece copied into ours. Each rank posts its
  // receives before its sends: Gloo sends a message only once the peer's
  // receive is posted, and a receive posted late waits a round trip behind
  // the data queued on the link (a whole alltoall or allgather ran at half
  // the rate of these sends on a shaped link; bench/README).
  const int64_t n = input.numel();
  auto issue = [&](int64_t offset, int64_t length) {
    const int tag = NextTag();
    std::vector<c10::intrusive_ptr<c10d::Work>> works;
    for (int j = 0; j < world_size_; ++j) {
      if (j == rank_) continue;
      std::vector<at::Tensor> to{output.narrow(0, j * n + offset, length)};
      works.push_back(group_->recv(to, j, tag));
    }
    std::vector<at::Tensor> mine{in.narrow(0, offset, length)};
    for (int j = 0; j < world_size_; ++j) {
      if (j == rank_) continue;
      works.push_back(group_->send(mine, j, tag));
    }
    output.narrow(0, rank_ * n + offset, length).copy_(mine[0]);
    return works;
  };
  InPieces(n, PieceElements(input), options_.max_in_flight, issue,
           [](int64_t, int64_t) {});
}

void Communicator::ReduceScatterSum(const at::Tensor& input,
                                    const at::Tensor& output) {
  const int64_t n = output.numel();
  TORCH_CHECK(input.numel() == n * world_size_,
              "reduce-scatter input must hold world * output elements");
  at::Tensor in = input;
  at::Tensor out = output;
  if (native_collectives_) {
    group_->_reduce_scatter_base(out, in)->wait();
    return;
  }
  // Gloo: point to point, per piece [offset, offset + length) of each rank's
  // chunk: row j of the input goes to rank j as it lies (no copy), and each
  // peer's contribution to our chunk comes back. The first peer in rank
  // order writes straight into the output, the others into `extra`; the sum
  // then runs in rank order (c0 + c1 is c1 + c0 to the bit, so receiving c1
  // or c0 first changes nothing). Receives are posted before sends, as for
  // the all-gather. Gloo moves no bf16: the pieces travel as f16 bits
  // (never computed on) and are summed as bf16.
  const bool bits = in.scalar_type() == at::kBFloat16;
  const at::Tensor rows = in.reshape({world_size_, n});
  const at::Tensor wire_rows = bits ? rows.view(at::kHalf) : rows;
  const at::Tensor wire_out = bits ? out.view(at::kHalf) : out;
  const int first_peer = rank_ == 0 ? 1 : 0;
  std::deque<at::Tensor> extras;  // per piece: [world - 2, length] or none
  auto issue = [&](int64_t offset, int64_t length) {
    const int tag = NextTag();
    std::vector<c10::intrusive_ptr<c10d::Work>> works;
    at::Tensor extra;
    if (world_size_ > 2) {
      extra = at::empty({world_size_ - 2, length}, wire_rows.options());
    }
    int next_extra = 0;
    for (int j = 0; j < world_size_; ++j) {
      if (j == rank_) continue;
      std::vector<at::Tensor> to{j == first_peer
                                     ? wire_out.narrow(0, offset, length)
                                     : extra.select(0, next_extra++)};
      works.push_back(group_->recv(to, j, tag));
    }
    for (int j = 0; j < world_size_; ++j) {
      if (j == rank_) continue;
      std::vector<at::Tensor> row{
          wire_rows.select(0, j).narrow(0, offset, length)};
      works.push_back(group_->send(row, j, tag));
    }
    extras.push_back(std::move(extra));
    return works;
  };
  auto sum = [&](int64_t offset, int64_t length) {
    const at::Tensor extra = bits && extras.front().defined()
                                 ? extras.front().view(at::kBFloat16)
                                 : extras.front();
    extras.pop_front();
    at::Tensor o = out.narrow(0, offset, length);  // holds first_peer's
    int next_extra = 0;
    for (int j = 0; j < world_size_; ++j) {
      if (j == first_peer) continue;
      o.add_(j == rank_ ? rows.select(0, j).narrow(0, offset, length)
                        : extra.select(0, next_extra++));
    }
  };
  InPieces(n, PieceElements(output), options_.max_in_flight, issue, sum);
}

absl::StatusOr<std::vector<double>> Communicator::AllGatherScalars(
    const std::vector<double>& values) {
  // Alone, every rank's values are ours: no trip through the thread.
  if (world_size_ == 1) return values;
  const int64_t n = static_cast<int64_t>(values.size());
  std::vector<double> result(static_cast<size_t>(n * world_size_));
  AsyncHandle handle = Submit([&] {
    at::Tensor in = at::empty({n}, at::kDouble);
    std::copy(values.begin(), values.end(), in.data_ptr<double>());
    at::Tensor out = at::empty({n * world_size_}, at::kDouble);
    if (native_collectives_) {  // NCCL moves device memory only
      in = in.to(at::kCUDA);
      out = out.to(at::kCUDA);
    }
    AllGather(in, out);
    at::Tensor cpu = out.cpu();
    std::copy(cpu.data_ptr<double>(), cpu.data_ptr<double>() + out.numel(),
              result.begin());
  });
  absl::Status status = handle->Wait();
  if (!status.ok()) return status;
  return result;
}

absl::Status Communicator::Drain() {
  AsyncHandle last;
  {
    absl::MutexLock lock(&mu_);
    last = last_;
  }
  if (last != nullptr) last->Wait().IgnoreError();
  absl::MutexLock lock(&mu_);
  return failure_;
}

namespace {
constexpr absl::string_view kCollectiveFailureUrl =
    "tandem.dev/worker/collective-failure";
}  // namespace

absl::Status MarkCollectiveFailure(absl::Status status) {
  if (!status.ok()) status.SetPayload(kCollectiveFailureUrl, absl::Cord("1"));
  return status;
}

bool IsCollectiveFailure(const absl::Status& status) {
  return status.GetPayload(kCollectiveFailureUrl).has_value();
}

}  // namespace tandem
