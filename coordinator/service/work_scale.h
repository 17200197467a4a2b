// Step times of variable-length batches, put on one scale (coordinator/
// README.md, "Variable work"). A step's time grows with its work (the
// elements of its batch inputs, the largest rank's, which the workers
// report), so a step of short sequences measured against a prediction made
// from long ones says nothing about the schedule. WorkScale fits how a
// step's time grows with its work and moves each time to a reference work:
//
//   t' = t + slope x (reference - work)
//
// slope: the median of the pairwise slopes (Theil-Sen) over the job's newest
// kHistorySteps steps, pairing only steps of one schedule version whose works
// differ by at least kMinWorkSpread; 0 (times as measured) with fewer than
// kMinPairs such pairs, so a job of fixed shapes is never scaled, and a
// negative median (noise) counts as 0. t' stays between t and
// t x reference / work: a step's time has no part that shrinks as its work
// grows, and none that grows faster than its work.
//
// The reference is the work of the profile window the job's first plan was
// made from, so that plan's prediction needs no scaling; later plans'
// predictions are scaled from their own window's work.
//
// Pure logic with no lock: the owner (PlanningManager) serializes calls.
#ifndef TANDEM_COORDINATOR_SERVICE_WORK_SCALE_H_
#define TANDEM_COORDINATOR_SERVICE_WORK_SCALE_H_

#include <cstdint>
#include <deque>
#include <optional>

namespace tandem {

class WorkScale {
 public:
  static constexpr int kHistorySteps = 128;
  static constexpr int kMinPairs = 6;
  // Relative difference of two steps' works below which their pair says
  // nothing about the slope.
  static constexpr double kMinWorkSpread = 0.01;

  // A complete step: the schedule it ran under, the slowest rank's time and
  // the largest work a rank reported (<= 0: not reported, ignored).
  void Record(int64_t version, double iteration_s, double work);
  // The first work > 0 set stays (later calls are ignored).
  void SetReference(double work);
  // 0 until set.
  double reference() const { return reference_; }
  // Seconds per element of work (0 without enough evidence).
  double slope() const;
  // `iteration_s`, measured at `work`, moved to `to_work`; as it is when
  // either work is unknown (<= 0) or the slope is 0.
  double Scale(double iteration_s, double work, double to_work) const;
  // Scale(iteration_s, work, reference()).
  double ToReference(double iteration_s, double work) const {
    return Scale(iteration_s, work, reference_);
  }
  // Whether the steps recorded so far had different works (the job's
  // batches vary).
  bool varies() const { return varies_; }

 private:
  struct Step {
    int64_t version = 0;
    double seconds = 0;
    double work = 0;
  };
  std::deque<Step> steps_;
  double reference_ = 0;
  bool varies_ = false;
  mutable std::optional<double> slope_;
};

}  // namespace tandem

#endif  // TANDEM_COORDINATOR_SERVICE_WORK_SCALE_H_
