// drift_replay: step times through the coordinator's DriftDetector offline,
// for a bigger sample than one run gives (bench/README.md, "drift").
//
//   drift_replay [--threshold 0.1] [--window 5] [--level median]
//                [--shift F --shift-at N] SERIES...
//
// SERIES: what bench/drift/steady.py --series writes, one step a line:
// "step version iteration_s predicted_s" ('#' lines skipped). Steps of
// version 0 feed the detector's noise (ObserveUnpredicted); each later
// version is watched against its prediction, or against the median of its
// own steps with --level median (a prediction on the measured level). After
// every fire the detector is re-armed with the same prediction, as a re-plan
// that changed nothing would. --shift F multiplies every step from the N-th
// watched step of each version on by F (a throttled link) and reports how
// many steps the detector took to fire after it (the version's later steps
// are left out: a re-plan would follow). Prints one JSON object per
// series file.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "common/flags/command_line.h"
#include "common/flags/flag_checks.h"
#include "coordinator/service/drift_detector.h"

ABSL_FLAG(double, threshold, 0.1, "the drift threshold (relative)");
ABSL_FLAG(int, window, 5, "the drift window (steps)");
ABSL_FLAG(std::string, level, "",
          "median: watch each version against the median of its own steps");
ABSL_FLAG(double, shift, 0,
          "multiply every step from --shift-at on by this (a throttled link)");
ABSL_FLAG(int64_t, shift_at, -1, "the watched step the shift starts at");

namespace {

struct Step {
  long step;
  long version;
  double seconds;
  double predicted;
};

constexpr char kUsage[] =
    "usage: drift_replay [--threshold T] [--window N] [--level median] "
    "[--shift F --shift-at N] SERIES...\n";
const tandem::CommandLineSpec kCommandLine{"drift_replay", kUsage, "SERIES...",
                                           -1};

int Usage(const std::string& why) {
  std::fprintf(stderr, "drift_replay: %s\n", why.c_str());
  return 2;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

}  // namespace

int main(int argc, char** argv) {
  const std::vector<std::string> files =
      tandem::ParseCommandLineOrExit(kCommandLine, argc, argv);
  const double threshold = absl::GetFlag(FLAGS_threshold);
  const int window = absl::GetFlag(FLAGS_window);
  const double shift = absl::GetFlag(FLAGS_shift);
  const long shift_at = absl::GetFlag(FLAGS_shift_at);
  const std::string level = absl::GetFlag(FLAGS_level);
  const bool level_median = level == "median";
  if (files.empty()) {
    tandem::ExitWithUsageError(kCommandLine, "no series file given");
  }
  tandem::ExitIfInvalid(
      kCommandLine,
      {tandem::CheckPositive("--threshold", threshold),
       tandem::CheckAtLeast("--window", window, 1),
       level.empty() ? absl::OkStatus()
                     : tandem::CheckOneOf("--level", level, {"median"}),
       (shift > 0) == (shift_at >= 0)
           ? absl::OkStatus()
           : absl::InvalidArgumentError("--shift and --shift-at go together")});

  for (const std::string& file : files) {
    std::ifstream in(file);
    if (!in) return Usage("cannot read " + file);
    std::map<long, std::vector<Step>> by_version;
    std::string line;
    while (std::getline(in, line)) {
      if (line.empty() || line[0] == '#') continue;
      std::istringstream fields(line);
      Step s{};
      if (!(fields >> s.step >> s.version >> s.seconds >> s.predicted)) {
        return Usage("malformed line in " + file + ": " + line);
      }
      by_version[s.version].push_back(s);
    }
    tandem::DriftDetector detector(threshold, window, 0);
    long watched = 0, fires = 0, fires_before_shift = 0, detected = 0;
    long delay_sum = 0, delay_max = 0, shifted_versions = 0;
    for (const auto& [version, steps] : by_version) {
      if (version == 0) {
        for (const Step& s : steps) detector.ObserveUnpredicted(s.seconds);
        continue;
      }
      std::vector<double> times;
      for (const Step& s : steps) times.push_back(s.seconds);
      const double predicted =
          level_median ? Median(times) : steps.front().predicted;
      if (predicted <= 0) continue;
      detector.SetPrediction(predicted, 0);
      bool shifted = false;
      for (size_t i = 0; i < steps.size(); ++i) {
        const bool after = shift > 0 && static_cast<long>(i) >= shift_at;
        if (after && !shifted) {
          shifted = true;
          ++shifted_versions;
        }
        ++watched;
        const double t = after ? times[i] * shift : times[i];
        if (!detector.Observe(t, 0).has_value()) continue;
        if (after) {
          ++detected;
          const long delay = static_cast<long>(i) - shift_at + 1;
          delay_sum += delay;
          delay_max = std::max(delay_max, delay);
          ++fires;
          break;  // a re-plan would follow: the rest says nothing
        }
        ++fires_before_shift;
        ++fires;
        detector.SetPrediction(predicted, 0);
      }
    }
    std::printf(
        "{\"series\": \"%s\", \"threshold\": %g, \"window\": %d, "
        "\"level\": \"%s\", \"watched_steps\": %ld, \"fires\": %ld, "
        "\"fires_per_1000_steps\": %.3f",
        file.c_str(), threshold, window, level_median ? "median" : "predicted",
        watched, fires, watched > 0 ? 1000.0 * fires / watched : 0.0);
    if (shift > 0) {
      std::printf(
          ", \"shift\": %g, \"shifted_versions\": %ld, \"detected\": %ld, "
          "\"false_fires_before_shift\": %ld, \"mean_delay_steps\": %.2f, "
          "\"max_delay_steps\": %ld",
          shift, shifted_versions, detected, fires_before_shift,
          detected > 0 ? static_cast<double>(delay_sum) / detected : 0.0,
          delay_max);
    }
    std::printf("}\n");
  }
  return 0;
}
