#include "worker/runtime/glue_op.h"

#include <utility>

#include "ATen/core/List.h"
#include "c10/util/Exception.h"
#include "torch/library.h"

namespace tandem {
namespace {

thread_local GlueCallScope* current_scope = nullptr;
thread_local const GlueCall* current_call = nullptr;

std::vector<at::Tensor> CallUnit(
    int64_t unit, const c10::List<c10::optional<at::Tensor>>& inputs) {
  TORCH_CHECK(current_call != nullptr, "tandem::call_unit(", unit,
              ") ran outside a glue: only the worker's executor serves it, "
              "while it runs a glue's forward");
  std::vector<at::Tensor> args;
  args.reserve(inputs.size());
  for (const c10::optional<at::Tensor>& in : inputs) {
    args.push_back(in.has_value() ? *in : at::Tensor());
  }
  return (*current_call)(unit, std::move(args));
}

}  // namespace

GlueCallScope::GlueCallScope(GlueCall call)
    : call_(std::move(call)), outer_(current_scope) {
  current_scope = this;
  current_call = &call_;
}

GlueCallScope::~GlueCallScope() {
  current_scope = outer_;
  current_call = outer_ != nullptr ? &outer_->call_ : nullptr;
}

TORCH_LIBRARY(tandem, m) {
  m.def("call_unit(int unit, Tensor?[] inputs) -> Tensor[]");
}

TORCH_LIBRARY_IMPL(tandem, CompositeImplicitAutograd, m) {
  m.impl("call_unit", TORCH_FN(CallUnit));
}

void RegisterGlueOp() {
  // Referring to this translation unit keeps its static registrations.
  static const bool registered = true;
  (void)registered;
}

}  // namespace tandem
