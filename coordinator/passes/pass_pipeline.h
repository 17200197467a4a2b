// Runs passes in order. After each pass that changed the plan it re-simulates
// the schedule; after every pass it runs the invariant checkers, and it
// records each pass's wall time and predicted effect into an injected sink.
// When the context is explaining, it names the running pass in the decision
// log and records what a pass changed beyond the decisions it listed
// (DecisionLog::RecordRest), so the explanation chains from the baseline to
// the plan.
// The pipeline is itself a pass, so pipelines nest.
#ifndef TANDEM_COORDINATOR_PASSES_PASS_PIPELINE_H_
#define TANDEM_COORDINATOR_PASSES_PASS_PIPELINE_H_

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "coordinator/passes/pass_interface.h"

namespace tandem {

// One pass's run, as the pipeline saw it.
struct PassRecord {
  std::string pass;
  bool changed = false;
  double wall_s = 0;
  // Simulated iteration time and peak before and after the pass.
  double iteration_before_s = 0;
  double iteration_after_s = 0;
  int64_t peak_before_bytes = 0;
  int64_t peak_after_bytes = 0;
};

// Where pass records go (the coordinator's metrics, a bench's table, a test).
class PassRecordSink {
 public:
  virtual ~PassRecordSink() = default;
  virtual void Record(const PassRecord& record) = 0;
};

class PassPipeline : public PlanningPass {
 public:
  explicit PassPipeline(std::string name, PassRecordSink* sink = nullptr)
      : name_(std::move(name)), sink_(sink) {}

  template <typename T, typename... Args>
  T& AddPass(Args&&... args) {
    auto pass = std::make_unique<T>(std::forward<Args>(args)...);
    T& ref = *pass;
    passes_.push_back(std::move(pass));
    return ref;
  }
  void AddPass(std::unique_ptr<PlanningPass> pass) {
    passes_.push_back(std::move(pass));
  }
  template <typename T, typename... Args>
  void AddInvariantChecker(Args&&... args) {
    checkers_.push_back(std::make_unique<T>(std::forward<Args>(args)...));
  }

  absl::string_view name() const override { return name_; }
  // Names of the passes, in order.
  std::vector<std::string> PassNames() const;

 protected:
  // Stops at the first pass or checker that fails. Appends each pass's name
  // to the schedule's provenance.
  absl::StatusOr<bool> RunImpl(PlanningContext& context) override;

 private:
  std::string name_;
  PassRecordSink* sink_;
  std::vector<std::unique_ptr<PlanningPass>> passes_;
  std::vector<std::unique_ptr<InvariantChecker>> checkers_;
};

}  // namespace tandem

#endif  // TANDEM_COORDINATOR_PASSES_PASS_PIPELINE_H_
