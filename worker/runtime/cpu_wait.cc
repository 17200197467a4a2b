#include "worker/runtime/cpu_wait.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace tandem {

std::optional<int64_t> ParseRunDelayNs(absl::string_view schedstat) {
  std::vector<absl::string_view> fields = absl::StrSplit(
      absl::StripTrailingAsciiWhitespace(schedstat), ' ', absl::SkipEmpty());
  if (fields.size() != 3) return std::nullopt;
  int64_t values[3];
  for (int i = 0; i < 3; ++i) {
    if (!absl::SimpleAtoi(fields[i], &values[i]) || values[i] < 0) {
      return std::nullopt;
    }
  }
  return values[1];
}

std::optional<int64_t> ThreadRunDelayNs() {
  // A read of one small file: about 10 us, once at each end of a step.
  const int fd = ::open("/proc/thread-self/schedstat", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return std::nullopt;
  char buf[128];
  const ssize_t n = ::read(fd, buf, sizeof(buf) - 1);
  ::close(fd);
  if (n <= 0) return std::nullopt;
  return ParseRunDelayNs(absl::string_view(buf, static_cast<size_t>(n)));
}

double CpuWaitShare(std::optional<int64_t> begin_ns,
                    std::optional<int64_t> end_ns, double wall_s) {
  if (!begin_ns.has_value() || !end_ns.has_value() || *end_ns < *begin_ns ||
      !(wall_s > 0) || !std::isfinite(wall_s)) {
    return -1;
  }
  return std::min(1.0,
                  static_cast<double>(*end_ns - *begin_ns) * 1e-9 / wall_s);
}

double CpuWaitMeter::EndShare(double wall_s) {
  const double share = CpuWaitShare(begin_ns_, ThreadRunDelayNs(), wall_s);
  begin_ns_.reset();
  return share;
}

}  // namespace tandem
