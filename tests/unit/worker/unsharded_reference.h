// The reference the worker's numerics tests compare against
// (executor_test.cc, archive_program_test.cc): a program's forward run in
// one process on full params, and what such a training run leaves.
#ifndef TANDEM_TESTS_UNIT_WORKER_UNSHARDED_REFERENCE_H_
#define TANDEM_TESTS_UNIT_WORKER_UNSHARDED_REFERENCE_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "ATen/core/Tensor.h"
#include "worker/runtime/program.h"

namespace tandem {

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

}  // namespace tandem

#endif  // TANDEM_TESTS_UNIT_WORKER_UNSHARDED_REFERENCE_H_
