#include "worker/models/archive_program.h"

#include <cstring>
#include <memory>
#include <optional>
#include <sstream>
#include <utility>
#include <vector>

#include "ATen/ATen.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/archive/model_archive.h"
#include "common/status_macros.h"
#include "torch/csrc/jit/api/module.h"
#include "torch/csrc/jit/runtime/graph_executor.h"
#include "torch/csrc/jit/serialization/import.h"
#include "worker/runtime/glue_op.h"
#include "worker/runtime/torch_status.h"

namespace tandem {
namespace {

absl::StatusOr<at::ScalarType> ScalarTypeOf(const std::string& dtype) {
  static const auto* types =
      new absl::flat_hash_map<std::string, at::ScalarType>{
          {"float64", at::kDouble}, {"float32", at::kFloat},
          {"float16", at::kHalf},   {"bfloat16", at::kBFloat16},
          {"int64", at::kLong},     {"int32", at::kInt},
          {"int16", at::kShort},    {"int8", at::kChar},
          {"uint8", at::kByte},     {"bool", at::kBool}};
  auto it = types->find(dtype);
  if (it == types->end()) {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown dtype '", dtype, "'"));
  }
  return it->second;
}

// A unit's module and its replicated buffers, shared by the node's
// callable (and every copy of it).
struct LoadedUnit {
  std::string name;
  bool leaf = false;
  torch::jit::Module module;
  // Leaf units: attribute paths relative to the unit, in the order of the
  // node's params, then of its buffers.
  std::vector<std::vector<std::string>> param_paths;
  std::vector<std::vector<std::string>> buffer_paths;
  std::vector<at::Tensor> buffers;
  // Per input value: a floating batch input to cast to `compute_dtype`
  // (mixed precision).
  std::vector<bool> cast_inputs;
  at::ScalarType compute_dtype = at::kFloat;
  size_t num_outputs = 0;
  // The device buffers and the module live on; they follow the first call's
  // tensors.
  std::optional<at::Device> device;
};

// The module holding attribute `path` (all but its last part).
torch::jit::Module Owner(const torch::jit::Module& root,
                         const std::vector<std::string>& path) {
  torch::jit::Module m = root;
  for (size_t i = 0; i + 1 < path.size(); ++i) {
    m = m.attr(path[i]).toModule();
  }
  return m;
}

// What a unit's or glue's forward returned, as the manifest's `expected`
// tensors.
std::vector<at::Tensor> Tensors(const c10::IValue& result,
                                const std::string& what, size_t expected) {
  std::vector<at::Tensor> out;
  if (result.isTuple()) {
    for (const c10::IValue& v : result.toTupleRef().elements()) {
      TORCH_CHECK(v.isTensor(), what, " returned a tuple holding a ",
                  v.tagKind(), "; it must return tensors only");
      out.push_back(v.toTensor());
    }
  } else {
    TORCH_CHECK(result.isTensor(), what, " returned a ", result.tagKind(),
                "; it must return a tuple of tensors");
    out.push_back(result.toTensor());
  }
  TORCH_CHECK(out.size() == expected, what, " returned ", out.size(),
              " tensors, but the manifest lists ", expected, " outputs");
  return out;
}

std::vector<at::Tensor> RunUnit(LoadedUnit& unit,
                                absl::Span<const at::Tensor> inputs,
                                absl::Span<const at::Tensor> params) {
  const at::Device device = !inputs.empty()   ? inputs[0].device()
                            : !params.empty() ? params[0].device()
                                              : at::Device(at::kCPU);
  if (!unit.device.has_value() || *unit.device != device) {
    for (at::Tensor& b : unit.buffers) b = b.to(device);
    unit.module.to(device);
    unit.device = device;
  }
  std::vector<c10::IValue> args;
  if (unit.leaf) {
    for (size_t i = 0; i < params.size(); ++i) {
      Owner(unit.module, unit.param_paths[i])
          .setattr(unit.param_paths[i].back(), params[i]);
    }
    for (size_t i = 0; i < unit.buffers.size(); ++i) {
      Owner(unit.module, unit.buffer_paths[i])
          .setattr(unit.buffer_paths[i].back(), unit.buffers[i]);
    }
  } else {
    args.reserve(params.size() + unit.buffers.size() + inputs.size());
    for (const at::Tensor& p : params) args.emplace_back(p);
    for (const at::Tensor& b : unit.buffers) args.emplace_back(b);
  }
  for (size_t i = 0; i < inputs.size(); ++i) {
    args.emplace_back(unit.cast_inputs[i] ? inputs[i].to(unit.compute_dtype)
                                          : inputs[i]);
  }
  // TorchScript's profiling executor would time its first runs as profiling
  // and compiling, and compile again for every new input shape (a
  // variable-length batch); its CPU graphs fuse nothing. Units run their
  // graphs as written instead: every step, shape and rank costs what the
  // ops cost, as in eager mode (worker/README.md, "Exported models").
  torch::jit::GraphOptimizerEnabledGuard interpreted(false);
  return Tensors(unit.module.forward(std::move(args)),
                 absl::StrCat("unit '", unit.name, "'"), unit.num_outputs);
}

// A glue's module (ArchiveGlue): its forward takes the glue's input values
// and calls the units it covers through tandem::call_unit.
struct LoadedGlue {
  std::string name;
  torch::jit::Module module;
  std::vector<bool> cast_inputs;
  at::ScalarType compute_dtype = at::kFloat;
  size_t num_outputs = 0;
  std::optional<at::Device> device;
};

std::vector<at::Tensor> RunGlue(LoadedGlue& glue,
                                absl::Span<const at::Tensor> inputs) {
  const at::Device device =
      !inputs.empty() ? inputs[0].device() : at::Device(at::kCPU);
  if (!glue.device.has_value() || *glue.device != device) {
    glue.module.to(device);
    glue.device = device;
  }
  std::vector<c10::IValue> args;
  args.reserve(inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) {
    args.emplace_back(glue.cast_inputs[i] ? inputs[i].to(glue.compute_dtype)
                                          : inputs[i]);
  }
  torch::jit::GraphOptimizerEnabledGuard interpreted(false);
  return Tensors(glue.module.forward(std::move(args)),
                 absl::StrCat("glue '", glue.name, "'"), glue.num_outputs);
}

}  // namespace

absl::StatusOr<Program> LoadArchiveProgram(
    const std::string& path, const ArchiveProgramOptions& options) {
  if (options.dtype != DType::kF32 && options.dtype != DType::kBF16) {
    return absl::UnimplementedError(
        absl::StrCat("'", path, "': model.dtype ", DTypeName(options.dtype),
                     " is not supported for exported models: use f32 or "
                     "bf16"));
  }
  const at::ScalarType compute_dtype =
      options.dtype == DType::kBF16 ? at::kBFloat16 : at::kFloat;
  ASSIGN_OR_RETURN(ModelArchive archive, OpenModelArchive(path));
  const v1::ArchiveManifest& m = archive.manifest;
  const std::string root = kArchiveRoot;
  for (const v1::ArchiveParam& p : m.params()) {
    if (p.dtype() != "float32") {
      return absl::UnimplementedError(absl::StrCat(
          "'", path, "': param '", p.name(), "' is ", p.dtype(),
          "; the worker trains float32 params only (mixed precision comes "
          "from the job spec): export the model in float32"));
    }
  }
  for (const v1::ArchiveInput& in : m.inputs()) {
    if (!in.role().empty() && in.dtype() != "int64") {
      return absl::InvalidArgumentError(
          absl::StrCat("'", path, "': input '", in.name(), "' has role ",
                       in.role(), " but dtype ", in.dtype(),
                       "; token data sources feed int64: export it as int64"));
    }
  }
  ASSIGN_OR_RETURN(std::string weight_bytes,
                   archive.zip.Read(root + kArchiveWeights));
  auto weights = std::make_shared<const std::string>(std::move(weight_bytes));

  Program program;
  program.name = m.name();
  program.loss = m.loss();
  program.dtype = options.dtype;
  program.reduce_dtype = options.reduce_dtype;
  // The batch inputs the units see in the compute dtype.
  absl::flat_hash_set<std::string> cast_inputs;
  for (const v1::ArchiveInput& in : m.inputs()) {
    absl::StatusOr<at::ScalarType> type = ScalarTypeOf(in.dtype());
    if (!type.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "'", path, "': input '", in.name(), "': ", type.status().message()));
    }
    if (compute_dtype != at::kFloat && at::isFloatingType(*type) &&
        *type != compute_dtype) {
      cast_inputs.insert(in.name());
    }
    ProgramInput& input = program.inputs.emplace_back();
    input.name = in.name();
    input.role = in.role();
    input.dtype = in.dtype();
    input.shape.assign(in.shape().begin(), in.shape().end());
    input.dynamic_dims.assign(in.dynamic_dims().begin(),
                              in.dynamic_dims().end());
    if (in.has_synthetic()) input.synthetic = in.synthetic();
  }
  absl::flat_hash_map<std::string, int32_t> param_ids;
  for (const v1::ArchiveParam& p : m.params()) {
    const SafetensorsTensor* t = archive.weights.Find(p.name());
    ProgramParam param;
    param.name = p.name();
    param.export_name = p.name();
    param.shape.assign(p.shape().begin(), p.shape().end());
    param.unit = p.units(0);
    param.trainable = p.requires_grad();
    const uint64_t begin = t->begin;
    const uint64_t bytes = t->end - t->begin;
    param.init = [weights, begin, bytes](float* data, int64_t numel) {
      TORCH_CHECK(static_cast<uint64_t>(numel) * sizeof(float) == bytes,
                  "initial value size mismatch");
      std::memcpy(data, weights->data() + begin, bytes);
    };
    param_ids[p.name()] = static_cast<int32_t>(program.params.size());
    program.params.push_back(std::move(param));
  }
  absl::flat_hash_map<std::string, at::Tensor> buffers;
  for (const v1::ArchiveBuffer& b : m.buffers()) {
    const SafetensorsTensor* t = archive.weights.Find(b.name());
    ASSIGN_OR_RETURN(const at::ScalarType type, ScalarTypeOf(b.dtype()));
    at::Tensor value =
        at::empty(std::vector<int64_t>(b.shape().begin(), b.shape().end()),
                  at::TensorOptions().dtype(type));
    std::memcpy(value.data_ptr(), weights->data() + t->begin,
                t->end - t->begin);
    if (at::isFloatingType(type) && compute_dtype != at::kFloat) {
      value = value.to(compute_dtype);
    }
    buffers[b.name()] = value;
  }

  for (const v1::ArchiveUnit& u : m.units()) {
    auto unit = std::make_shared<LoadedUnit>();
    unit->name = u.name();
    unit->leaf = u.leaf();
    unit->num_outputs = static_cast<size_t>(u.outputs_size());
    ASSIGN_OR_RETURN(std::string bytes, archive.zip.Read(root + u.file()));
    RETURN_IF_ERROR(TorchCall(
        absl::StrCat("'", path, "': loading unit '", u.name(), "' (model/",
                     u.file(), ") with TorchScript"),
        [&] {
          std::istringstream stream(bytes);
          unit->module = torch::jit::load(stream, at::Device(at::kCPU));
        }));
    const std::string prefix = u.name() + ".";
    auto relative = [&](const std::string& name)
        -> absl::StatusOr<std::vector<std::string>> {
      if (name.rfind(prefix, 0) != 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            "'", path, "': leaf unit '", u.name(), "' uses '", name,
            "', which is not under the unit's own module path; leaf units "
            "bind only their own params and buffers"));
      }
      std::vector<std::string> parts =
          absl::StrSplit(name.substr(prefix.size()), '.');
      absl::Status found = TorchCall("", [&] {
        TORCH_CHECK(Owner(unit->module, parts).hasattr(parts.back()), "");
      });
      if (!found.ok()) {
        return absl::InvalidArgumentError(
            absl::StrCat("'", path, "': leaf unit '", u.name(),
                         "' has no attribute '", name.substr(prefix.size()),
                         "' to bind '", name, "' to; export the model again"));
      }
      return parts;
    };
    ProgramNode node;
    node.name = u.name();
    node.inputs.assign(u.inputs().begin(), u.inputs().end());
    unit->compute_dtype = compute_dtype;
    for (const std::string& in : u.inputs()) {
      unit->cast_inputs.push_back(cast_inputs.contains(in));
    }
    node.outputs.assign(u.outputs().begin(), u.outputs().end());
    for (const std::string& p : u.params()) {
      node.param_ids.push_back(param_ids.at(p));
      if (unit->leaf) {
        ASSIGN_OR_RETURN(std::vector<std::string> parts, relative(p));
        unit->param_paths.push_back(std::move(parts));
      }
    }
    for (const std::string& b : u.buffers()) {
      unit->buffers.push_back(buffers.at(b));
      if (unit->leaf) {
        ASSIGN_OR_RETURN(std::vector<std::string> parts, relative(b));
        unit->buffer_paths.push_back(std::move(parts));
      }
    }
    node.forward = [unit](absl::Span<const at::Tensor> inputs,
                          absl::Span<const at::Tensor> params) {
      return RunUnit(*unit, inputs, params);
    };
    program.nodes.push_back(std::move(node));
  }
  if (m.glues_size() > 0) RegisterGlueOp();
  for (const v1::ArchiveGlue& g : m.glues()) {
    auto glue = std::make_shared<LoadedGlue>();
    glue->name = g.name();
    glue->compute_dtype = compute_dtype;
    glue->num_outputs = static_cast<size_t>(g.outputs_size());
    for (const std::string& in : g.inputs()) {
      glue->cast_inputs.push_back(cast_inputs.contains(in));
    }
    ASSIGN_OR_RETURN(std::string bytes, archive.zip.Read(root + g.file()));
    RETURN_IF_ERROR(TorchCall(
        absl::StrCat("'", path, "': loading glue '", g.name(), "' (model/",
                     g.file(), ") with TorchScript"),
        [&] {
          std::istringstream stream(bytes);
          glue->module = torch::jit::load(stream, at::Device(at::kCPU));
        }));
    ProgramGlue& pg = program.glues.emplace_back();
    pg.name = g.name();
    pg.first = g.first_unit();
    pg.count = g.unit_count();
    pg.inputs.assign(g.inputs().begin(), g.inputs().end());
    pg.outputs.assign(g.outputs().begin(), g.outputs().end());
    pg.forward = [glue](absl::Span<const at::Tensor> inputs) {
      return RunGlue(*glue, inputs);
    };
  }
  if (options.activation_checkpointing) {
    for (size_t i = 0; i + 1 < program.nodes.size(); ++i) {
      program.nodes[i].recompute = true;
    }
  }
  RETURN_IF_ERROR(AnalyzeProgramFlow(program).status());
  return program;
}

}  // namespace tandem
