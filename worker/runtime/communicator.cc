#include "worker/runtime/communicator.h"

#include <pthread.h>

#include <chrono>
#include <utility>
#include <vector>

#include "ATen/ATen.h"
#include "absl/strings/str_cat.h"
#include "worker/runtime/torch_status.h"

namespace tandem {
namespace {

double Seconds(SteadyTime from, SteadyTime to) {
  return std::chrono::duration<double>(to - from).count();
}

}  // namespace

CollectiveWork::CollectiveWork() : issued_(std::chrono::steady_clock::now()) {}

absl::Status CollectiveWork::Wait() {
  std::unique_lock<std::mutex> lock(mu_);
  if (!done_) {
    const SteadyTime start = std::chrono::steady_clock::now();
    cv_.wait(lock, [this] { return done_; });
    // Until completion, not until this thread woke: the wake-up latency is
    // scheduling, not communication.
    if (finished_ > start) waited_s_ += Seconds(start, finished_);
  }
  return status_;
}

bool CollectiveWork::done() const {
  std::lock_guard<std::mutex> lock(mu_);
  return done_;
}

double CollectiveWork::issue_to_done_s() const {
  std::lock_guard<std::mutex> lock(mu_);
  return done_ ? Seconds(issued_, finished_) : 0;
}

absl::Status Communicator::failure() const {
  std::lock_guard<std::mutex> lock(mu_);
  return failure_;
}

double CollectiveWork::run_s() const {
  std::lock_guard<std::mutex> lock(mu_);
  return done_ ? Seconds(started_, finished_) : 0;
}

SteadyTime CollectiveWork::started_at() const {
  std::lock_guard<std::mutex> lock(mu_);
  return started_;
}

SteadyTime CollectiveWork::finished_at() const {
  std::lock_guard<std::mutex> lock(mu_);
  return finished_;
}

double CollectiveWork::waited_s() const {
  std::lock_guard<std::mutex> lock(mu_);
  return waited_s_;
}

void CollectiveWork::Finish(absl::Status status) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    status_ = std::move(status);
    finished_ = std::chrono::steady_clock::now();
    done_ = true;
  }
  cv_.notify_all();
}

Communicator::Communicator(c10::intrusive_ptr<c10d::ProcessGroup> group)
    : group_(std::move(group)),
      rank_(group_->getRank()),
      world_size_(group_->getSize()),
      native_collectives_(group_->getBackendName() == "nccl"),
      thread_([this] { Loop(); }) {}

Communicator::~Communicator() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

CollectiveHandle Communicator::Submit(std::function<void()> body) {
  auto handle = std::make_shared<CollectiveWork>();
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!failure_.ok()) {
      handle->Finish(failure_);
      return handle;
    }
    queue_.push_back({handle, std::move(body)});
    last_ = handle;
  }
  cv_.notify_all();
  return handle;
}

void Communicator::Loop() {
  pthread_setname_np(pthread_self(), "tandem-comm");
  for (;;) {
    Task task;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping and drained
      task = std::move(queue_.front());
      queue_.pop_front();
    }
    absl::Status status;
    {
      std::lock_guard<std::mutex> lock(mu_);
      status = failure_;
    }
    {
      std::lock_guard<std::mutex> lock(task.handle->mu_);
      task.handle->started_ = std::chrono::steady_clock::now();
    }
    if (status.ok()) {
      status = TorchCall(absl::StrCat("collective on rank ", rank_),
                         [&] { task.body(); });
      if (!status.ok()) {
        std::lock_guard<std::mutex> lock(mu_);
        failure_ = status;
      }
    }
    task.handle->Finish(std::move(status));
  }
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
  std::vector<at::Tensor> inputs{in};
  std::vector<std::vector<at::Tensor>> outputs(1);
  const int64_t n = input.numel();
  for (int j = 0; j < world_size_; ++j) {
    outputs[0].push_back(output.narrow(0, j * n, n));
  }
  group_->allgather(outputs, inputs)->wait();
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
  // Chunk j of `input` goes to rank j; chunk j of `received` is rank j's
  // contribution to this rank's chunk.
  at::Tensor received = at::empty_like(in);
  std::vector<int64_t> equal_splits;
  group_->alltoall_base(received, in, equal_splits, equal_splits)->wait();
  out.copy_(received.narrow(0, 0, n));
  for (int j = 1; j < world_size_; ++j) {
    out.add_(received.narrow(0, j * n, n));
  }
}

absl::StatusOr<std::vector<double>> Communicator::AllGatherScalars(
    const std::vector<double>& values) {
  const int64_t n = static_cast<int64_t>(values.size());
  std::vector<double> result(static_cast<size_t>(n * world_size_));
  CollectiveHandle handle = Submit([&] {
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
  CollectiveHandle last;
  {
    std::lock_guard<std::mutex> lock(mu_);
    last = last_;
  }
  if (last != nullptr) last->Wait().IgnoreError();
  std::lock_guard<std::mutex> lock(mu_);
  return failure_;
}

}  // namespace tandem
