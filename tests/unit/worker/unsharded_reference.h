// The reference the worker's numerics tests compare against
// (executor_test.cc, archive_program_test.cc): a program's forward run in
// one process on full params, and what such a training run leaves.
#ifndef TANDEM_TESTS_UNIT_WORKER_UNSHARDED_REFERENCE_H_
#define TANDEM_TESTS_UNIT_WORKER_UNSHARDED_REFERENCE_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "ATen/ATen.h"
#include "ATen/core/Tensor.h"
#include "torch/optim/adamw.h"
#include "worker/runtime/program.h"
#include "worker/runtime/sharded_param_store.h"

namespace tandem {

// The program's full params at their initial values; the trained ones
// require grad. Appends the trained ones to `trained` when given.
inline std::vector<at::Tensor> InitialParams(
    const Program& program, std::vector<at::Tensor>* trained = nullptr) {
  std::vector<at::Tensor> params;
  for (const ProgramParam& p : program.params) {
    at::Tensor t = at::empty(p.shape, at::kFloat);
    p.init(t.data_ptr<float>(), t.numel());
    params.push_back(t.requires_grad_(p.trainable));
    if (p.trainable && trained != nullptr) trained->push_back(t);
  }
  return params;
}

// torch's AdamW over `params` with the worker's options (its own
// implementation, for the reference).
inline std::unique_ptr<torch::optim::AdamW> TorchAdamW(
    const std::vector<at::Tensor>& params, const AdamWOptions& o) {
  return std::make_unique<torch::optim::AdamW>(
      params, torch::optim::AdamWOptions(o.lr)
                  .betas({o.beta1, o.beta2})
                  .eps(o.eps)
                  .weight_decay(o.weight_decay));
}

// The program's forward in one process on full params: values by name.
inline at::Tensor RunUnsharded(const Program& program,
                               const std::vector<at::Tensor>& params,
                               const MicroBatch& batch) {
  std::map<std::string, at::Tensor> values = batch.tensors;
  for (const ProgramNode& node : program.nodes) {
    std::vector<at::Tensor> used;
    for (int32_t id : node.param_ids) used.push_back(params[id]);
    std::vector<at::Tensor> in;
    for (const std::string& name : node.inputs) in.push_back(values.at(name));
    std::vector<at::Tensor> out = node.forward(in, used);
    for (size_t o = 0; o < out.size(); ++o) values[node.outputs[o]] = out[o];
  }
  return values.at(program.loss);
}

// A single-process training run: its losses, and the params before and
// after.
struct Trajectory {
  std::vector<double> losses;
  std::vector<at::Tensor> initial;
  std::vector<at::Tensor> params;
};

// The digest Executor::ParamDigests reports for a param, computed from its
// full value rather than from shards: the float64 sum of x_i * (2 *
// frac(i * 0.618...) - 1) over its elements in row-major order.
inline double FullParamDigest(const at::Tensor& full) {
  const at::Tensor x = full.reshape({-1}).to(at::kDouble);
  const at::Tensor i = at::arange(x.numel(), x.options());
  return (x * ((i * 0.6180339887498949).frac() * 2 - 1)).sum().item<double>();
}

}  // namespace tandem

#endif  // TANDEM_TESTS_UNIT_WORKER_UNSHARDED_REFERENCE_H_
