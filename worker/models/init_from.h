// `model.init_from`: a job's params start from a weight file (a safetensors
// file of full params under their export names; common/archive/
// weights_file.h) instead of their seeded initialization.
#ifndef TANDEM_WORKER_MODELS_INIT_FROM_H_
#define TANDEM_WORKER_MODELS_INIT_FROM_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/archive/weights_file.h"
#include "worker/runtime/program.h"

namespace tandem {

// `program`'s params as weight files hold them: name, shape, export name.
std::vector<WeightTensor> ProgramWeightTensors(const Program& program);

// Checks the file at `path` against `program`'s params (MatchWeights) and
// makes each param's init read its values from it, converted to fp32 from
// float32, bfloat16 or float16 (the file stays open while an init may run).
// Errors: NotFound, InvalidArgument naming the file and the first tensor at
// fault.
absl::Status InitFromWeightsFile(const std::string& path, Program& program);

}  // namespace tandem

#endif  // TANDEM_WORKER_MODELS_INIT_FROM_H_
