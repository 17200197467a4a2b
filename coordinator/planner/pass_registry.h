// The one registry of planning passes: name → factory, with each pass's
// parameters. Job specs (optimize.passes, optimize.policy), the coordinator,
// `tandem-plan` and `plan_bench` all build pipelines from it, so a name means
// the same pass everywhere and the policies are nothing but lists of names.
//
// A pass is named in a spec as "name" or "name:key=value,key=value", e.g.
// "zero1:bucket_bytes=16MiB" or "zero3-insert:grouping=unit". Parameters not
// given keep their defaults.
#ifndef TANDEM_COORDINATOR_PLANNER_PASS_REGISTRY_H_
#define TANDEM_COORDINATOR_PLANNER_PASS_REGISTRY_H_

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "coordinator/passes/pass_interface.h"
#include "coordinator/passes/pass_pipeline.h"

namespace tandem {

struct PassParam {
  enum class Kind {
    kCount,   // an integer >= 1
    kBytes,   // a byte count, suffixes allowed (70GiB, 64MB)
    kChoice,  // one of `choices`
  };
  std::string key;
  Kind kind = Kind::kCount;
  std::string default_value;
  std::vector<std::string> choices;
  std::string help;
};

// A pass's parameters, parsed and checked against its PassParam list; every
// declared key has a value (given or default).
class PassArgs {
 public:
  int64_t Int(absl::string_view key) const;
  const std::string& Text(absl::string_view key) const;

 private:
  friend class PassRegistry;
  std::map<std::string, std::string, std::less<>> text_;
  std::map<std::string, int64_t, std::less<>> ints_;
};

struct RegisteredPass {
  std::string name;
  // One line: what it does.
  std::string summary;
  std::vector<PassParam> params;
  std::function<std::unique_ptr<PlanningPass>(const PassArgs&)> make;
};

class PassRegistry {
 public:
  // Every pass of the project: Tandem's passes and the reference policies'.
  static const PassRegistry& Default();

  const std::vector<RegisteredPass>& passes() const { return passes_; }
  const RegisteredPass* Find(absl::string_view name) const;
  std::vector<std::string> Names() const;

  // Parses "name[:key=value,...]" into a pass. InvalidArgument names the
  // unknown pass (listing the known ones), the unknown key (listing the
  // pass's keys) or the bad value (saying what it takes).
  absl::StatusOr<std::unique_ptr<PlanningPass>> Make(
      absl::string_view spec) const;
  // Only the checks of Make, for spec validation.
  absl::Status Check(absl::string_view spec) const;
  // Adds each pass in order.
  absl::Status AddTo(absl::Span<const std::string> specs,
                     PassPipeline& pipeline) const;

  // A help text: each pass, its summary and parameters.
  std::string Describe() const;

 private:
  PassRegistry();
  absl::StatusOr<std::pair<const RegisteredPass*, PassArgs>> Parse(
      absl::string_view spec) const;

  std::vector<RegisteredPass> passes_;
};

}  // namespace tandem

#endif  // TANDEM_COORDINATOR_PLANNER_PASS_REGISTRY_H_
