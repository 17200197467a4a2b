// The op a glue calls its child nodes through (program.h, ProgramGlue;
// worker/README.md, "Glue"):
//
//   tandem::call_unit(int unit, Tensor?[] inputs) -> Tensor[]
//
// `unit` is the node's index in the program (an archive's unit index); a
// None input arrives as an undefined tensor. The op is registered for every
// backend as a composite: what the node computes is recorded by autograd
// as the node's own ops, so backward runs through it like through any node.
// It works only while a GlueCallScope is open on the calling thread (the
// executor opens one around each glue's forward); elsewhere it fails saying
// so. `tandem export` defines the same schema in Python (client/python/
// tandem/export/glue.py) to script and check the glue.
#ifndef TANDEM_WORKER_RUNTIME_GLUE_OP_H_
#define TANDEM_WORKER_RUNTIME_GLUE_OP_H_

#include <cstdint>
#include <functional>
#include <vector>

#include "ATen/core/Tensor.h"

namespace tandem {

// Runs node `unit` on `inputs` and returns its outputs.
using GlueCall = std::function<std::vector<at::Tensor>(
    int64_t unit, std::vector<at::Tensor> inputs)>;

// While alive, tandem::call_unit on this thread calls `call`. Scopes nest
// (the innermost serves); not copyable.
class GlueCallScope {
 public:
  explicit GlueCallScope(GlueCall call);
  ~GlueCallScope();
  GlueCallScope(const GlueCallScope&) = delete;
  GlueCallScope& operator=(const GlueCallScope&) = delete;

 private:
  GlueCall call_;
  GlueCallScope* outer_;
};

// Makes sure the op is registered before a TorchScript module that calls it
// is loaded (the registration lives in glue_op.cc, which a static link
// would otherwise drop when nothing else refers to it). Cheap; call it
// anywhere before torch::jit::load of a glue.
void RegisterGlueOp();

}  // namespace tandem

#endif  // TANDEM_WORKER_RUNTIME_GLUE_OP_H_
