// Readable text forms of the IR, used by test fixtures, `tandem schedule` and
// the planner CLI. Print then Parse gives back an equal value (round-trip),
// including every double bit for bit (doubles print in their shortest
// round-trip form, bytes as plain integers, times as plain seconds).
//
// Line-oriented: one statement per line, `#` starts a comment (outside
// quotes), blank lines are ignored, tokens are separated by spaces or tabs,
// attributes are `key=value` and come after the positional tokens, in any
// order, each at most once. Ids are written with a one-letter prefix: params
// `p3`, nodes `n7`, groups `g2`, offload entries `o1`, schedule versions `v3`;
// lists are comma-separated (`p1,p2,p3`) and may be empty (`params=`). Times
// accept the suffixes s, ms, us and ns; byte counts accept B, KiB, MiB and
// GiB, with a fraction when the result is whole (`1.5GiB`). Negative numbers
// and ids parse; rejecting them is validation's job.
//
// Names and other strings print bare when they are non-empty and hold no
// space, control byte, `"`, `#`, `=`, `,` or `\`; otherwise they print as a
// double-quoted string with the escapes \" \\ \n \t \r \xHH, so every string
// round-trips (`param p0 "odd name" f32[2]`, `graph=""`).
//
// Graph:
//   graph tiny world=2 micro_batches=1 tokens=512
//   param p0 embed.weight f32[1000,64] unit=embed
//   node n0 embed fwd params=p0 flops=1e6 time=1ms act=4KiB ws=0
//   node n5 embed.bwd bwd of=n0 params=p0 time=2ms
//   node n9 optimizer opt
// The header's first token is the graph name; world (default 1),
// micro_batches (1) and tokens (0) are optional. `param ID NAME DTYPE[SHAPE]`
// (f32[] is the empty shape) takes unit= and the flag frozen (no gradient, no
// optimizer state; Param::trainable false). Node attributes: mb= (micro-batch),
// of= (forward twin), recompute (flag), params=, flops=, time=, act=, ws=;
// omitted ones are 0 / empty / no twin, and Print omits them in that case.
//
// Schedule:
//   schedule v3 graph=0123456789abcdef mode=zero3 budget=80GiB
//   group g0 p1,p2
//   persistent p0
//   offload o0 p3,p4 bytes=1MiB
//   before n1 allgather g0
//   before n1 wait g0
//   after n1 release g0
//   after n5 reduce_scatter p1,p2
//   before n9 reload o0
//   predict iteration=0.1 compute=0.08 comm=0.05 exposed=0.02 copy=0 peak=1GiB
//   provenance passes=zero3-insert,prefetch window=10..20 wall=0.003
//   reason=drift
//   explain baseline=0.14 baseline_exposed=0.06 baseline_peak=1GiB
//   decision prefetch pass=prefetch gain=0.002 exposed_gain=0.002 held=4MiB
//   peak_delta=4MiB at=n1 groups=g0 bind=link what="g0 ... before n1"
// graph= is required; mode (zero3) and budget (0) are optional. Several
// `persistent` lines append to one set; `predict`, `provenance` and
// `explain` appear at most once; `decision` lines (the explanation,
// explanation.h) append in order: `decision KIND` with pass=, gain=,
// exposed_gain=, held=, peak_delta=, at= (a node), groups=, params=,
// offloads=, bind= (none, memory, link, host-link), bind_at=, bind_bytes=,
// bind_limit= and what=. An action is `before|after NODE KIND ARG`, where ARG
// is a group (allgather, wait, release), a param list that may be left out
// (reduce_scatter) or an offload entry (offload, reload). The Action fields a
// kind does not use print as group=, params= or offload= when set, so that
// any Action round-trips.
//
// Profile:
//   profile graph=0123456789abcdef rank=0 version=3 window=10..20
//     iteration=0.1 peak=1GiB peak_min=900MiB work=512 copied=64MiB
//     copy_time=20ms ag_cpu_per_byte=1e-9 rs_cpu_per_byte=1.2e-9
//     copy_cpu_per_byte=3e-10 ag_stretch=1.14 rs_stretch=1.15
//     copy_stretch=1.6 ag_scratch=1 ag_scratch_cap=1MiB rs_scratch=2
//     rs_scratch_cap=1MiB
//   time n0 1ms samples=10 ag_overlap=4MiB rs_overlap=0 copy_overlap=0
//   collective allgather g0 at=n1 bytes=4MiB issue_to_done=2ms run=1ms
//     exposed=0.5ms computing=0.8ms params=p1,p2
//   collective reduce_scatter p1,p2 at=n5 bytes=4MiB issue_to_done=2ms
//     exposed=0 group=g0
//   memory n0 before=1MiB after=2MiB rise=1.5MiB net=1MiB
// (Each statement is one line; the indented lines above continue the one
// before.) The header: graph= is required; rank=-1 is the aggregate over
// ranks. Optional, and printed only when measured (not 0): peak_min= (the
// window's smallest step peak), work= (elements of the rank's batch inputs
// in the median iteration, what the times were measured at), copied= and
// copy_time= (the host-tier copies' bytes and seconds), the interference
// probe's figures (ag_, rs_ and copy_cpu_per_byte: seconds of compute a byte
// moved takes; ag_, rs_ and copy_stretch: how many times longer a transfer
// takes while compute runs) and the communicator's scratch rule (ag_ and
// rs_scratch: copies of the padded buffer a collective holds beyond it,
// at most _cap bytes in all). `time`: a node's median and its sample count, and
// the bytes each kind of transfer moved while it ran (the _overlap= fields, 0
// omitted). `collective`: ARG is a group (allgather) or a param list
// (reduce_scatter, allreduce); the other field prints as params= or group= when
// set; run= (its time on the stream, issue_to_done less queueing) and
// computing= (the part of run this rank's compute thread was computing) are
// omitted when 0. `memory`: the counted bytes before and after a node, and,
// when the meter tells the compute thread's own allocations apart, the most
// they rose above `before` (rise=) and where they ended (net=).

// Parse errors are InvalidArgument and name the line and the token, e.g.
//   "line 4: node n3: unknown attribute 'tim' (expected one of mb, of, ...)".
// Parsing checks syntax only; run validate.h on the result for semantics.
#ifndef TANDEM_COMMON_IR_TEXT_FORMAT_H_
#define TANDEM_COMMON_IR_TEXT_FORMAT_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/ir/graph.h"
#include "common/ir/profile.h"
#include "common/ir/schedule.h"

namespace tandem {

std::string PrintGraph(const Graph& graph);
absl::StatusOr<Graph> ParseGraph(absl::string_view text);

std::string PrintSchedule(const Schedule& schedule);
// The same text, and with `names` (the schedule's graph; may be null) each
// line that names params or nodes ends in a comment with their model
// names ("group g1 p1,p2  # layers.0.attn: wq.weight, wk.weight"), the
// budget and peak lines with their sizes in KiB/MiB/GiB. Comments do not
// parse, so ParseSchedule gives back the same schedule either way.
std::string PrintSchedule(const Schedule& schedule, const Graph* names);
absl::StatusOr<Schedule> ParseSchedule(absl::string_view text);

std::string PrintProfile(const Profile& profile);
absl::StatusOr<Profile> ParseProfile(absl::string_view text);

}  // namespace tandem

#endif  // TANDEM_COMMON_IR_TEXT_FORMAT_H_
