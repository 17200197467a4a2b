// Safetensors files written for tests, from the format (an 8-byte
// little-endian header length, the JSON header, the data), not through the
// parser under test.
#ifndef TANDEM_TESTS_UNIT_COMMON_TEST_SAFETENSORS_H_
#define TANDEM_TESTS_UNIT_COMMON_TEST_SAFETENSORS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"

namespace tandem {

struct Tensor {
  std::string name;
  std::string dtype;  // safetensors' names
  std::vector<int64_t> shape;
  int64_t bytes;
  // The tensor's bytes; empty: `bytes` bytes of 0x01.
  std::string data;
};

inline std::string SafetensorsBytes(const std::vector<Tensor>& tensors) {
  std::string header = "{\"__metadata__\":{\"format\":\"pt\"}";
  std::string data;
  for (const Tensor& t : tensors) {
    std::string shape;
    for (int64_t d : t.shape) {
      absl::StrAppend(&shape, shape.empty() ? "" : ",", d);
    }
    absl::StrAppend(&header, ",\"", t.name, "\":{\"dtype\":\"", t.dtype,
                    "\",\"shape\":[", shape, "],\"data_offsets\":[",
                    data.size(), ",", data.size() + t.bytes, "]}");
    data += t.data.empty() ? std::string(t.bytes, '\x01') : t.data;
  }
  header += "}";
  std::string out;
  const uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) {
    out.push_back(static_cast<char>((n >> (8 * i)) & 0xff));
  }
  return out + header + data;
}

}  // namespace tandem

#endif  // TANDEM_TESTS_UNIT_COMMON_TEST_SAFETENSORS_H_
