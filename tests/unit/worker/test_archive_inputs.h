// An archive's input description, for the data source tests.
#ifndef TANDEM_TESTS_UNIT_WORKER_TEST_ARCHIVE_INPUTS_H_
#define TANDEM_TESTS_UNIT_WORKER_TEST_ARCHIVE_INPUTS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "tandem/v1/archive.pb.h"

namespace tandem {

inline v1::ArchiveInput Input(const std::string& name, const std::string& dtype,
                              std::vector<int64_t> shape,
                              std::vector<int32_t> dynamic_dims,
                              const std::string& role = "") {
  v1::ArchiveInput in;
  in.set_name(name);
  in.set_dtype(dtype);
  for (int64_t d : shape) in.add_shape(d);
  for (int32_t d : dynamic_dims) in.add_dynamic_dims(d);
  in.set_role(role);
  return in;
}

}  // namespace tandem

#endif  // TANDEM_TESTS_UNIT_WORKER_TEST_ARCHIVE_INPUTS_H_
