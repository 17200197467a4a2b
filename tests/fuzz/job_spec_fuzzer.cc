// Job spec YAML (worker/spec/job_spec_yaml.h) and the checks every spec
// goes through at submit (common/job/job_spec.h): arbitrary bytes give a
// spec or a field-level error, never a crash.
#include <cstddef>
#include <cstdint>

#include "absl/strings/string_view.h"
#include "common/job/job_spec.h"
#include "worker/spec/job_spec_yaml.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  absl::StatusOr<tandem::v1::JobSpec> spec = tandem::ParseJobSpecYaml(
      absl::string_view(reinterpret_cast<const char*>(data), size));
  if (!spec.ok()) return 0;
  tandem::ApplyJobSpecDefaults(*spec);
  (void)tandem::ValidateJobSpec(*spec);
  return 0;
}
