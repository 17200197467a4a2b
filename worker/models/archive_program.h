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
// Not supported yet, refused at load with what to change: params that are
// not float32.
#ifndef TANDEM_WORKER_MODELS_ARCHIVE_PROGRAM_H_
#define TANDEM_WORKER_MODELS_ARCHIVE_PROGRAM_H_

#include <string>

#include "absl/status/statusor.h"
#include "worker/runtime/program.h"

namespace tandem {

// Loads the archive at `path` as a program. Errors: the archive's own
// (NotFound, InvalidArgument: see OpenModelArchive), InvalidArgument for a
// unit TorchScript cannot load or whose signature does not match the
// manifest, Unimplemented for what the worker cannot train yet (above).
//
// With `activation_checkpointing`, every unit but the last (the one that
// returns the loss, whose activations its own backward frees at once) is
// marked ProgramNode::recompute: it keeps only its inputs in forward and
// runs again in backward (worker/README.md, "Activation checkpointing").
absl::StatusOr<Program> LoadArchiveProgram(const std::string& path,
                                           bool activation_checkpointing);

}  // namespace tandem

#endif  // TANDEM_WORKER_MODELS_ARCHIVE_PROGRAM_H_
