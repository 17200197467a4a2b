// The checkpoint reader (worker/checkpoint/checkpoint_files.h): a MANIFEST
// and a rank file made of the input's bytes are read and verified; damaged
// files give NotFound, DataLoss or FailedPrecondition, never a crash or a
// read past the data. Input: 2 bytes of manifest length, the manifest, the
// rank file.
#include <unistd.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "worker/checkpoint/checkpoint_files.h"

namespace {

const std::string& Dir() {
  static const std::string dir = [] {
    std::string d = (std::filesystem::temp_directory_path() /
                     ("tandem-checkpoint-fuzz-" + std::to_string(getpid())))
                        .string();
    std::filesystem::create_directories(d + "/step-00000001");
    return d;
  }();
  return dir;
}

void Write(const std::string& path, const uint8_t* data, size_t size) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(data),
            static_cast<std::streamsize>(size));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  const size_t manifest = std::min<size_t>(size - 2, data[0] | data[1] << 8);
  const std::string step = Dir() + "/step-00000001";
  Write(step + "/MANIFEST", data + 2, manifest);
  Write(step + "/rank-0.ckpt", data + 2 + manifest, size - 2 - manifest);
  tandem::CheckpointDirectory dir(Dir());
  (void)dir.ListWithManifest();
  absl::StatusOr<tandem::CheckpointMeta> meta = dir.ReadManifest(1);
  tandem::CheckpointMeta m;
  if (meta.ok()) {
    m = *meta;
  } else {
    m.step = 1;  // read the rank file even when the manifest is damaged
  }
  for (int32_t rank : {0, 1}) {
    absl::StatusOr<tandem::RankCheckpoint> r = dir.ReadRank(m, rank);
    if (r.ok()) (void)r->Find("shards");
  }
  return 0;
}
