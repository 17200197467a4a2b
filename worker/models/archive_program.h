// Exported model archives (proto/tandem/v1/archive.proto, written by `tandem
// export`) as programs the executor runs (worker/README.md, "Exported
// models"). The archive is checked first (common/archive/model_archive.h:
// checksums, structure, weights header); then each unit's TorchScript module
// is loaded from its entry and becomes one program node:
//
// - a unit's params are the program's (the sharded store's full tensors),
//   initialized from the archive's weights.safetensors; a param several
//   units use (tied weights) is one program param named by each of their
//   nodes;
// - an ordinary unit takes its params, buffers and input values as
//   positional tensors; a leaf unit (kept whole by the exporter) gets its
//   params and buffers bound as the module's attributes (setattr) before
//   each call and takes the input values only;
// - buffers are replicated: each unit's are read from the weights once and
//   moved to the device of the first call's tensors;
// - inputs keep their roles, so the token data sources feed "tokens" and
//   "targets" under the names the model takes;
// - a frozen param (requires_grad false) is a program param that does not
//   train (ProgramParam::trainable): gathered for its uses, no gradient, no
//   reduce-scatter, no optimizer state.
//
// - mixed precision (ArchiveProgramOptions::dtype bf16): the params are
//   gathered in bf16 (Program::dtype; the shards keep f32 masters), and the
//   units' float buffers and float batch inputs are cast to bf16 before the
//   units see them: the module runs as `module.to(torch.bfloat16)` would,
//   its own code deciding what else to compute in which dtype (FSDP's
//   MixedPrecision(param_dtype=bf16) policy). Values passed between units
//   keep the dtype their unit gave them.
//
// Not supported yet, refused at load with what to change: params that are
// not float32 in the archive.
#ifndef TANDEM_WORKER_MODELS_ARCHIVE_PROGRAM_H_
#define TANDEM_WORKER_MODELS_ARCHIVE_PROGRAM_H_

#include <string>

#include "absl/status/statusor.h"
#include "common/ir/graph.h"
#include "worker/runtime/program.h"

namespace tandem {

// How a job runs the archive (its model.* and train.* keys).
struct ArchiveProgramOptions {
  // Every unit but the last (the one that returns the loss, whose
  // activations its own backward frees at once) is marked
  // ProgramNode::recompute: it keeps only its inputs in forward and runs
  // again in backward (worker/README.md, "Activation checkpointing").
  bool activation_checkpointing = false;
  // model.dtype: f32 or bf16 (above). The job spec refuses bf16 for an
  // archive whose exporter did not run it in bf16 (its
  // ArchiveManifest.precision_checks).
  DType dtype = DType::kF32;
  // train.reduce_dtype: f32 or `dtype`.
  DType reduce_dtype = DType::kF32;
};

// Loads the archive at `path` as a program. Errors: the archive's own
// (NotFound, InvalidArgument: see OpenModelArchive), InvalidArgument for a
// unit TorchScript cannot load or whose signature does not match the
// manifest, Unimplemented for what the worker cannot train yet (above).
absl::StatusOr<Program> LoadArchiveProgram(
    const std::string& path, const ArchiveProgramOptions& options);

}  // namespace tandem

#endif  // TANDEM_WORKER_MODELS_ARCHIVE_PROGRAM_H_
