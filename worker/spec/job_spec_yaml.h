// Reading the YAML job spec (deploy/local/tiny-llama.yaml is an example) into
// tandem.v1.JobSpec, whose fields mirror the YAML keys one for one: a
// top-level mapping of sections (model, data, batch, train, parallel, memory,
// optimize, checkpoint) plus `name`. Parsing checks the shape and the types
// and reports the first problem by its path, e.g.
//   "model.layers: expected an integer, got 'four' (line 4)"
//   "model.layer: unknown key (expected one of preset, layers, ...)".
// Defaults and value checks are common/job/job_spec.h's
// (ApplyJobSpecDefaults, ValidateJobSpec), which LoadJobSpec also runs.
// Byte counts (memory.budget_bytes) also accept KiB, MiB, GiB and TiB
// suffixes; dtypes (model.dtype, train.master_dtype, train.reduce_dtype) are
// f32, bf16 or f16, or the proto names (DTYPE_BF16). No libtorch.
#ifndef TANDEM_WORKER_SPEC_JOB_SPEC_YAML_H_
#define TANDEM_WORKER_SPEC_JOB_SPEC_YAML_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "tandem/v1/job.pb.h"

namespace tandem {

// Syntax and types only. Errors: InvalidArgument naming the field.
absl::StatusOr<v1::JobSpec> ParseJobSpecYaml(absl::string_view yaml);

// Reads `path`, parses it, applies the defaults and validates it. A
// relative model.path, data.path or checkpoint.dir is taken relative to the
// directory of `path` (as the Python client does). Errors: NotFound for a
// missing file; InvalidArgument naming the field.
absl::StatusOr<v1::JobSpec> LoadJobSpec(const std::string& path);

}  // namespace tandem

#endif  // TANDEM_WORKER_SPEC_JOB_SPEC_YAML_H_
