// The learning-rate schedule of a job (train.lr_schedule, warmup_steps,
// min_lr): a linear warm-up, then constant, cosine or linear decay towards a
// floor. No libtorch: the worker's optimizer reads it at every step.
//
// With N = train.steps, W = train.warmup_steps, L = train.lr, m =
// train.min_lr and D = N - W, optimizer step s (0-based, counted over the
// whole job, so a job resumed from the checkpoint taken after step k runs
// step k at LearningRate(k)) trains at
//
//   s < W:             L * (s + 1) / (W + 1)
//   otherwise, with e = min(s - W, D):
//     constant:        L
//     cosine:          m + (L - m) * (1 + cos(pi * e / D)) / 2
//     linear:          L - (L - m) * e / D
//
// The warm-up climbs to L at step W, where the decay starts; the decay
// reaches m at step N, one past the last step, so a floor of 0 wastes no
// step (it is also where torch's schedulers below put it). Steps beyond N
// stay at the floor.
//
// These are torch.optim.lr_scheduler's curves, stepped once after every
// optimizer step (the worker matches them to fp64 rounding; a test trains
// both, tests/export/test_lr_schedule.py):
//
//   from torch.optim.lr_scheduler import (CosineAnnealingLR, LinearLR,
//                                         SequentialLR)
//   opt = torch.optim.AdamW(params, lr=L, ...)
//   warmup = LinearLR(opt, start_factor=1 / (W + 1), end_factor=1.0,
//                     total_iters=W)
//   decay = CosineAnnealingLR(opt, T_max=N - W, eta_min=m)  # cosine
//   decay = LinearLR(opt, start_factor=1.0, end_factor=m / L,
//                    total_iters=N - W)                     # linear
//   sched = SequentialLR(opt, [warmup, decay], milestones=[W])
//   for step in range(N):
//       ...; opt.step(); sched.step()
//
// With W = 0 use `decay` alone (SequentialLR with milestones=[0] starts the
// second scheduler one step late); "constant" is `warmup` alone (LinearLR
// holds end_factor 1 after total_iters), or no scheduler when W = 0.
// Beyond N, CosineAnnealingLR would climb back up; the worker never runs
// those steps. client/README.md ("Learning-rate schedule") has this as a
// function of a spec's train section, which the test runs.
#ifndef TANDEM_COMMON_JOB_LR_SCHEDULE_H_
#define TANDEM_COMMON_JOB_LR_SCHEDULE_H_

#include <array>
#include <cstdint>

#include "absl/strings/string_view.h"
#include "tandem/v1/job.pb.h"

namespace tandem {

// The values train.lr_schedule accepts ("" is "constant" before defaults).
inline constexpr std::array<absl::string_view, 3> kLrScheduleNames = {
    "constant", "cosine", "linear"};

// The learning rate of optimizer step `step` (0-based) under `train`, by the
// formula above. Expects a spec ValidateJobSpec accepts (common/job/
// job_spec.h); a negative step is step 0, and with warmup_steps >= steps
// the decay never starts.
double LearningRate(const v1::TrainSpec& train, int64_t step);

}  // namespace tandem

#endif  // TANDEM_COMMON_JOB_LR_SCHEDULE_H_
