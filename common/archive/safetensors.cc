#include "common/archive/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"

namespace tandem {
namespace {

constexpr uint64_t kMaxHeaderBytes = uint64_t{100} << 20;

struct DTypeName {
  const char* safetensors;
  const char* archive;
  int64_t bytes;
};
constexpr DTypeName kDTypes[] = {
    {"F64", "float64", 8},   {"F32", "float32", 4}, {"F16", "float16", 2},
    {"BF16", "bfloat16", 2}, {"I64", "int64", 8},   {"I32", "int32", 4},
    {"I16", "int16", 2},     {"I8", "int8", 1},     {"U8", "uint8", 1},
    {"BOOL", "bool", 1},
};

// A JSON number that is a non-negative integer below 2^53.
bool AsIndex(const google::protobuf::Value& v, uint64_t* out) {
  if (v.kind_case() != google::protobuf::Value::kNumberValue) return false;
  const double d = v.number_value();
  if (!(d >= 0) || d > 9007199254740992.0 || std::floor(d) != d) return false;
  *out = static_cast<uint64_t>(d);
  return true;
}

}  // namespace

int64_t DTypeElementBytes(absl::string_view dtype) {
  for (const DTypeName& d : kDTypes) {
    if (dtype == d.archive) return d.bytes;
  }
  return 0;
}

const SafetensorsTensor* SafetensorsHeader::Find(absl::string_view name) const {
  for (const SafetensorsTensor& t : tensors) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

absl::StatusOr<SafetensorsHeader> ParseSafetensorsHeader(
    absl::string_view file, uint64_t file_size, absl::string_view what,
    absl::string_view fix) {
  auto bad = [&](absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, " is not a valid safetensors file: ", why, "; ", fix));
  };
  if (file.size() < 8 || file_size < 8) return bad("it has no header length");
  uint64_t header_size = 0;
  for (int i = 7; i >= 0; --i) {
    header_size = (header_size << 8) | static_cast<uint8_t>(file[i]);
  }
  if (header_size > file_size - 8 || header_size > file.size() - 8) {
    return bad(absl::StrCat("its header length ", header_size,
                            " runs past the end of the file (", file_size,
                            " bytes)"));
  }
  const uint64_t data_start = 8 + header_size;
  const uint64_t data_size = file_size - data_start;
  google::protobuf::Struct json;
  const auto parsed = google::protobuf::util::JsonStringToMessage(
      std::string(file.substr(8, header_size)), &json);
  if (!parsed.ok()) {
    // Not the parser's message: it quotes the bytes it stopped at, and
    // the file may be anyone's (a path pointed at a secret).
    return bad(
        absl::StrCat("its ", header_size, "-byte header is not a JSON object"));
  }
  SafetensorsHeader header;
  for (const auto& [name, value] : json.fields()) {
    if (name == "__metadata__") continue;
    const std::string at = absl::StrCat("tensor '", name, "'");
    if (value.kind_case() != google::protobuf::Value::kStructValue) {
      return bad(absl::StrCat(at, " is not an object"));
    }
    const auto& fields = value.struct_value().fields();
    SafetensorsTensor t;
    t.name = name;
    auto dtype = fields.find("dtype");
    if (dtype == fields.end() ||
        dtype->second.kind_case() != google::protobuf::Value::kStringValue) {
      return bad(absl::StrCat(at, " has no dtype"));
    }
    int64_t element_bytes = 0;
    for (const DTypeName& d : kDTypes) {
      if (dtype->second.string_value() == d.safetensors) {
        t.dtype = d.archive;
        element_bytes = d.bytes;
      }
    }
    if (element_bytes == 0) {
      return bad(absl::StrCat(at, " has dtype '", dtype->second.string_value(),
                              "', which Tandem does not read"));
    }
    auto shape = fields.find("shape");
    if (shape == fields.end() ||
        shape->second.kind_case() != google::protobuf::Value::kListValue) {
      return bad(absl::StrCat(at, " has no shape list"));
    }
    uint64_t numel = 1;
    for (const google::protobuf::Value& dim :
         shape->second.list_value().values()) {
      uint64_t d = 0;
      if (!AsIndex(dim, &d) || d > (uint64_t{1} << 40)) {
        return bad(absl::StrCat(at,
                                " has a shape entry that is not a "
                                "non-negative integer"));
      }
      t.shape.push_back(static_cast<int64_t>(d));
      numel *= d;
    }
    auto offsets = fields.find("data_offsets");
    uint64_t begin = 0, end = 0;
    if (offsets == fields.end() ||
        offsets->second.kind_case() != google::protobuf::Value::kListValue ||
        offsets->second.list_value().values_size() != 2 ||
        !AsIndex(offsets->second.list_value().values(0), &begin) ||
        !AsIndex(offsets->second.list_value().values(1), &end) || end < begin) {
      return bad(absl::StrCat(at, " has no valid data_offsets [begin, end]"));
    }
    if (end > data_size) {
      return bad(absl::StrCat(at, "'s data ends at byte ", end,
                              " of a data section of ", data_size,
                              " bytes (truncated?)"));
    }
    if (end - begin != numel * static_cast<uint64_t>(element_bytes)) {
      return bad(absl::StrCat(at, " holds ", end - begin,
                              " bytes, but its dtype and shape need ",
                              numel * static_cast<uint64_t>(element_bytes)));
    }
    t.begin = data_start + begin;
    t.end = data_start + end;
    header.tensors.push_back(std::move(t));
  }
  std::sort(header.tensors.begin(), header.tensors.end(),
            [](const SafetensorsTensor& a, const SafetensorsTensor& b) {
              return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
            });
  for (size_t i = 1; i < header.tensors.size(); ++i) {
    if (header.tensors[i].begin < header.tensors[i - 1].end) {
      return bad(absl::StrCat("tensors '", header.tensors[i - 1].name,
                              "' and '", header.tensors[i].name, "' overlap"));
    }
  }
  return header;
}

}  // namespace tandem

namespace tandem {

ScopedFd::~ScopedFd() {
  if (fd_ >= 0) close(fd_);
}

ScopedFd& ScopedFd::operator=(ScopedFd&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) close(fd_);
    fd_ = other.fd_;
    other.fd_ = -1;
  }
  return *this;
}

absl::Status ReadFileBytes(int fd, const std::string& path, uint64_t offset,
                           uint64_t size, char* out) {
  while (size > 0) {
    const ssize_t got = pread(fd, out, size, static_cast<off_t>(offset));
    if (got <= 0) {
      if (got < 0 && errno == EINTR) continue;
      return absl::DataLossError(absl::StrCat(
          "'", path, "': short read at byte ", offset, " (",
          got < 0 ? std::strerror(errno) : "file changed while training?",
          ")"));
    }
    out += got;
    offset += static_cast<uint64_t>(got);
    size -= static_cast<uint64_t>(got);
  }
  return absl::OkStatus();
}

absl::StatusOr<SafetensorsFile> OpenSafetensorsFile(
    const std::string& path, absl::string_view not_found_fix,
    absl::string_view fix) {
  SafetensorsFile file;
  file.path = path;
  file.fd = ScopedFd(open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (file.fd.get() < 0) {
    return absl::NotFoundError(absl::StrCat(
        "'", path, "': ", std::strerror(errno), "; ", not_found_fix));
  }
  struct stat st {};
  if (fstat(file.fd.get(), &st) != 0 || !S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", path, "' is not a regular file"));
  }
  file.size = static_cast<uint64_t>(st.st_size);
  std::string head(std::min<uint64_t>(file.size, 8), '\0');
  RETURN_IF_ERROR(
      ReadFileBytes(file.fd.get(), path, 0, head.size(), head.data()));
  if (head.size() == 8) {
    uint64_t header_size = 0;
    for (int i = 7; i >= 0; --i) {
      header_size = (header_size << 8) | static_cast<uint8_t>(head[i]);
    }
    // A larger length is the parser's to refuse ("runs past the end").
    const uint64_t n = std::min({header_size, file.size - 8, kMaxHeaderBytes});
    head.resize(8 + n);
    RETURN_IF_ERROR(ReadFileBytes(file.fd.get(), path, 8, n, head.data() + 8));
  }
  ASSIGN_OR_RETURN(file.header,
                   ParseSafetensorsHeader(head, file.size,
                                          absl::StrCat("'", path, "'"), fix));
  return file;
}

}  // namespace tandem
