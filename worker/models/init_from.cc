#include "worker/models/init_from.h"

#include <cstdint>
#include <cstring>
#include <memory>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "c10/util/BFloat16.h"
#include "c10/util/Exception.h"
#include "c10/util/Half.h"
#include "common/status_macros.h"

namespace tandem {
namespace {

// Reads `piece` of `file` into `out` as fp32 values.
absl::Status ReadPiece(const SafetensorsFile& file, const WeightPiece& piece,
                       float* out) {
  const uint64_t bytes = piece.end - piece.begin;
  if (piece.dtype == "float32") {
    return ReadFileBytes(file.fd.get(), file.path, piece.begin, bytes,
                         reinterpret_cast<char*>(out));
  }
  std::vector<uint16_t> raw(bytes / sizeof(uint16_t));
  RETURN_IF_ERROR(ReadFileBytes(file.fd.get(), file.path, piece.begin, bytes,
                                reinterpret_cast<char*>(raw.data())));
  if (piece.dtype == "bfloat16") {
    for (size_t i = 0; i < raw.size(); ++i) {
      out[i] =
          static_cast<float>(c10::BFloat16(raw[i], c10::BFloat16::from_bits()));
    }
  } else {
    for (size_t i = 0; i < raw.size(); ++i) {
      out[i] = static_cast<float>(c10::Half(raw[i], c10::Half::from_bits()));
    }
  }
  return absl::OkStatus();
}

int64_t PieceNumel(const WeightPiece& piece) {
  return static_cast<int64_t>((piece.end - piece.begin) /
                              DTypeElementBytes(piece.dtype));
}

}  // namespace

std::vector<WeightTensor> ProgramWeightTensors(const Program& program) {
  std::vector<WeightTensor> out;
  out.reserve(program.params.size());
  for (const ProgramParam& p : program.params) {
    out.push_back({p.name, p.shape, p.export_name});
  }
  return out;
}

absl::Status InitFromWeightsFile(const std::string& path, Program& program) {
  ASSIGN_OR_RETURN(SafetensorsFile opened,
                   OpenSafetensorsFile(
                       path, "point model.init_from at a weights file",
                       "write it with safetensors or tandem export-weights"));
  auto file = std::make_shared<const SafetensorsFile>(std::move(opened));
  ASSIGN_OR_RETURN(std::vector<std::vector<WeightPiece>> pieces,
                   MatchWeights(file->header, ProgramWeightTensors(program),
                                absl::StrCat("model.init_from '", path, "'")));
  for (size_t i = 0; i < program.params.size(); ++i) {
    program.params[i].init = [file, mine = std::move(pieces[i])](
                                 float* data, int64_t numel) {
      int64_t at = 0;
      for (const WeightPiece& piece : mine) {
        const int64_t n = PieceNumel(piece);
        TORCH_CHECK(at + n <= numel, "weights of '", file->path,
                    "' overrun the param");
        const absl::Status read = ReadPiece(*file, piece, data + at);
        TORCH_CHECK(read.ok(), std::string(read.message()));
        at += n;
      }
      TORCH_CHECK(at == numel, "weights of '", file->path, "' fill ", at,
                  " of ", numel, " values");
    };
  }
  return absl::OkStatus();
}

}  // namespace tandem
