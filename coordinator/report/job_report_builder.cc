#include "coordinator/report/job_report_builder.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "common/ir/proto_convert.h"
#include "common/ir/validate.h"
#include "common/lowering/least_memory.h"
#include "common/lowering/lowering.h"
#include "common/sim/simulator.h"
#include "common/status_macros.h"
#include "coordinator/planner/job_plan.h"
#include "coordinator/planner/planner.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"

namespace tandem {
namespace {

using report::Lane;
using report::Span;

double Median(std::vector<double> xs) {
  if (xs.empty()) return 0;
  std::sort(xs.begin(), xs.end());
  const size_t n = xs.size();
  return n % 2 == 1 ? xs[n / 2] : (xs[n / 2 - 1] + xs[n / 2]) / 2;
}

// Baseline first, plans in order, the least-memory schedule last.
bool VersionOrder(int64_t a, int64_t b) {
  if ((a < 0) != (b < 0)) return b < 0;
  return a < b;
}

std::vector<ReportVersion> Versions(
    const std::vector<StoredSchedule>& schedules,
    const std::vector<StoredStep>& steps) {
  std::map<int64_t, ReportVersion> by_version;
  ReportVersion& baseline = by_version[0];
  baseline.reason = "baseline";
  for (const StoredSchedule& stored : schedules) {
    const v1::Schedule& s = stored.schedule;
    if (baseline.predicted_s <= 0 &&
        s.explanation().baseline_iteration_s() > 0) {
      baseline.predicted_s = s.explanation().baseline_iteration_s();
      baseline.predicted_exposed_comm_s =
          s.explanation().baseline_exposed_comm_s();
      baseline.predicted_peak_bytes = s.explanation().baseline_peak_bytes();
    }
    ReportVersion& v = by_version[s.version()];
    v.version = s.version();
    v.reason = s.provenance().reason();
    v.passes = absl::StrJoin(s.provenance().passes(), ", ");
    v.effective_step = stored.effective_step;
    v.predicted_s = s.prediction().iteration_s();
    v.predicted_exposed_comm_s = s.prediction().exposed_comm_s();
    v.predicted_peak_bytes = s.prediction().peak_bytes();
  }
  std::map<int64_t, std::vector<double>> settled;
  for (size_t i = 0; i < steps.size(); ++i) {
    const StoredStep& s = steps[i];
    ReportVersion& v = by_version[s.schedule_version];
    v.version = s.schedule_version;
    if (v.reason.empty()) {
      v.reason = s.schedule_version < 0 ? "least-memory" : "unknown";
    }
    if (v.first_step < 0) v.first_step = s.step;
    v.last_step = s.step;
    v.measured_peak_bytes = std::max(v.measured_peak_bytes, s.peak_bytes);
    if (i > 0 && steps[i - 1].schedule_version == s.schedule_version) {
      settled[s.schedule_version].push_back(s.iteration_s);
    }
  }
  for (auto& [version, times] : settled) {
    ReportVersion& v = by_version[version];
    v.measured_s = Median(times);
    std::vector<double> deviations;
    for (double t : times) deviations.push_back(std::abs(t - v.measured_s));
    v.measured_relative_mad =
        v.measured_s > 0 ? Median(deviations) / v.measured_s : 0;
    v.measured_steps = static_cast<int>(times.size());
  }
  std::vector<ReportVersion> out;
  for (auto& [_, v] : by_version) out.push_back(std::move(v));
  std::sort(out.begin(), out.end(),
            [](const ReportVersion& a, const ReportVersion& b) {
              return VersionOrder(a.version, b.version);
            });
  return out;
}

std::vector<ReportRankVersion> RankVersions(
    const std::vector<StoredRankWindow>& windows) {
  std::map<std::pair<int32_t, int64_t>, ReportRankVersion> sums;
  for (const StoredRankWindow& w : windows) {
    ReportRankVersion& r = sums[{w.rank, w.schedule_version}];
    r.rank = w.rank;
    r.version = w.schedule_version;
    ++r.windows;
    r.iteration_s += w.iteration_s;
    r.comm_s += w.comm_s;
    r.exposed_comm_s += w.exposed_comm_s;
    r.peak_bytes = std::max(r.peak_bytes, w.peak_bytes);
  }
  std::vector<ReportRankVersion> out;
  for (auto& [_, r] : sums) {
    r.iteration_s /= r.windows;
    r.comm_s /= r.windows;
    r.exposed_comm_s /= r.windows;
    out.push_back(r);
  }
  std::sort(out.begin(), out.end(),
            [](const ReportRankVersion& a, const ReportRankVersion& b) {
              if (a.rank != b.rank) return a.rank < b.rank;
              return VersionOrder(a.version, b.version);
            });
  return out;
}

// The graph and hardware model the report simulates with: the planner's
// calibration to the job's newest profile.
struct SimContext {
  Graph graph;
  HardwareModel hw;
  ShardingMode mode = ShardingMode::kZero3;
  std::vector<StoredSchedule> schedules;
  // How it was calibrated, for the reader.
  std::string note;
};

absl::StatusOr<SimContext> Calibrate(JobStore& store, const v1::Job& job,
                                     const v1::Graph& graph_proto,
                                     std::vector<StoredSchedule> schedules) {
  SimContext ctx;
  ctx.mode = job.spec().parallel().zero_stage() == 1 ? ShardingMode::kZero1
                                                     : ShardingMode::kZero3;
  ctx.schedules = std::move(schedules);
  absl::StatusOr<Graph> graph = FromProto(graph_proto);
  if (!graph.ok()) return graph.status();
  absl::StatusOr<std::vector<StoredWorker>> workers =
      store.LoadWorkers(job.id());
  if (!workers.ok()) return workers.status();
  std::vector<RankDevice> devices;
  for (const StoredWorker& w : *workers) {
    if (w.rank < 0 || w.rank >= job.spec().parallel().world_size()) continue;
    if (devices.size() <= static_cast<size_t>(w.rank)) {
      devices.resize(w.rank + 1);
    }
    devices[w.rank] = {w.hostname, w.device, w.device_memory_bytes};
  }
  const JobHardware hardware = HardwareForJob(job.spec(), devices);
  absl::StatusOr<std::vector<v1::Profile>> profiles =
      store.LoadProfiles(job.id());
  if (!profiles.ok()) return profiles.status();
  if (profiles->empty()) {
    ctx.graph = *std::move(graph);
    ctx.hw = hardware.hw;
    ctx.note =
        "Simulated on the model's estimates: no profile window has "
        "completed yet.";
    return ctx;
  }
  absl::StatusOr<Profile> profile = FromProto(profiles->back());
  if (!profile.ok()) return profile.status();
  // A stored window may be an older coordinator's: checked against the graph
  // here, as the planner does not.
  RETURN_IF_ERROR(ValidateProfile(*profile, *graph));
  std::optional<Schedule> profiled;
  if (profile->schedule_version == kLeastMemoryVersion) {
    absl::StatusOr<Schedule> s = LeastMemorySchedule(*graph, ctx.mode);
    if (!s.ok()) return s.status();
    profiled = *std::move(s);
  } else if (profile->schedule_version > 0) {
    for (const StoredSchedule& s : ctx.schedules) {
      if (s.schedule.version() != profile->schedule_version) continue;
      absl::StatusOr<Schedule> ir = FromProto(s.schedule);
      if (!ir.ok()) return ir.status();
      profiled = *std::move(ir);
    }
  }
  absl::StatusOr<Calibrated> calibrated = CalibrateToMeasurements(
      *graph, hardware.hw, &*profile,
      profiled.has_value() ? &*profiled : nullptr, ctx.mode);
  if (!calibrated.ok()) return calibrated.status();
  ctx.graph = std::move(calibrated->graph);
  ctx.hw = std::move(calibrated->hw);
  ctx.note = absl::StrCat(
      "Simulated as the planner does, with the model fitted to the job's "
      "newest profile (steps ",
      profile->first_iteration, "-", profile->last_iteration, " under ",
      profile->schedule_version < 0
          ? std::string("the least-memory schedule")
          : absl::StrCat("v", profile->schedule_version),
      calibrated->memory_calibrated
          ? ", memory calibrated to what the runtime held)."
          : "; memory not calibrated: the profiled schedule is unknown).");
  return ctx;
}

absl::StatusOr<Schedule> ScheduleOf(const SimContext& ctx, int64_t version) {
  if (version == 0) return StartingSchedule(ctx.graph, ctx.mode);
  if (version == kLeastMemoryVersion) {
    return LeastMemorySchedule(ctx.graph, ctx.mode);
  }
  for (const StoredSchedule& s : ctx.schedules) {
    if (s.schedule.version() == version) return FromProto(s.schedule);
  }
  return absl::NotFoundError(absl::StrCat("no schedule v", version));
}

absl::string_view ActionSpanKind(ActionKind kind) {
  switch (kind) {
    case ActionKind::kAllGather:
      return "allgather";
    case ActionKind::kReduceScatter:
      return "reduce_scatter";
    default:
      return "copy";
  }
}

// The simulator's three streams as lanes.
std::vector<Lane> SimulatedLanes(const SimContext& ctx,
                                 const Schedule& schedule,
                                 const SimResult& sim) {
  const std::string prefix =
      absl::StrCat(schedule.version < 0 ? std::string("least-memory")
                                        : absl::StrCat("v", schedule.version),
                   " predicted · ");
  Lane compute{prefix + "compute", {}, true};
  Lane comm{prefix + "communication", {}, false};
  Lane copy{prefix + "copy", {}, false};
  for (const NodeTimelineEntry& n : sim.nodes) {
    const bool known =
        n.node_id >= 0 && n.node_id < static_cast<int>(ctx.graph.nodes.size());
    const std::string name = known ? ctx.graph.nodes[n.node_id].name
                                   : absl::StrCat("node ", n.node_id);
    if (n.stall_s > 0) {
      compute.spans.push_back({n.start_s - n.stall_s, n.start_s,
                               absl::StrCat("waiting before ", name), "wait"});
    }
    compute.spans.push_back(
        {n.start_s, n.end_s, name,
         std::string(known ? PhaseName(ctx.graph.nodes[n.node_id].phase)
                           : "fwd")});
  }
  auto label = [&](const CollectiveTimelineEntry& c) {
    std::string what(ActionKindName(c.kind));
    if (c.action_index >= 0 &&
        c.action_index < static_cast<int>(schedule.actions.size())) {
      const Action& a = schedule.actions[c.action_index];
      if (c.kind == ActionKind::kAllGather) {
        absl::StrAppend(&what, " g", a.group_id);
      } else if (c.kind == ActionKind::kOffload ||
                 c.kind == ActionKind::kReload) {
        absl::StrAppend(&what, " entry ", a.offload_id);
      }
    }
    return absl::StrCat(what, ", ",
                        report::FormatValue(c.bytes, report::Unit::kBytes));
  };
  for (const CollectiveTimelineEntry& c : sim.collectives) {
    comm.spans.push_back(
        {c.start_s, c.end_s, label(c), std::string(ActionSpanKind(c.kind))});
  }
  for (const CollectiveTimelineEntry& c : sim.copies) {
    copy.spans.push_back({c.start_s, c.end_s, label(c), "copy"});
  }
  return {std::move(compute), std::move(comm), std::move(copy)};
}

const google::protobuf::Value* Field(const google::protobuf::Struct& s,
                                     const std::string& key) {
  auto it = s.fields().find(key);
  return it == s.fields().end() ? nullptr : &it->second;
}

double NumberField(const google::protobuf::Struct& s, const std::string& key) {
  const google::protobuf::Value* v = Field(s, key);
  return v != nullptr && v->has_number_value() ? v->number_value() : 0;
}

std::string StringField(const google::protobuf::Struct& s,
                        const std::string& key) {
  const google::protobuf::Value* v = Field(s, key);
  return v != nullptr && v->has_string_value() ? v->string_value() : "";
}

// A rank's Chrome trace (worker/runtime/iteration_timeline.h): its three
// streams as lanes, its memory counter as a curve, its iteration time.
struct ParsedTrace {
  std::vector<Lane> lanes;
  std::vector<std::pair<double, double>> memory;
  double iteration_s = 0;
};

absl::StatusOr<ParsedTrace> ParseTrace(const v1::RankTimeline& t) {
  google::protobuf::Struct trace;
  google::protobuf::util::JsonParseOptions options;
  options.ignore_unknown_fields = true;
  const auto parsed = google::protobuf::util::JsonStringToMessage(
      t.trace_json(), &trace, options);
  if (!parsed.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", t.rank(), "'s timeline is not JSON (",
                     parsed.message().as_string(), "): it is left out."));
  }
  ParsedTrace out;
  const std::string rank = absl::StrCat("rank ", t.rank(), " · ");
  out.lanes = {{rank + "compute", {}, true},
               {rank + "communication", {}, false},
               {rank + "copy", {}, false}};
  if (const google::protobuf::Value* other = Field(trace, "otherData");
      other != nullptr && other->has_struct_value()) {
    out.iteration_s = NumberField(other->struct_value(), "iteration_s");
  }
  const google::protobuf::Value* events = Field(trace, "traceEvents");
  if (events == nullptr || !events->has_list_value()) return out;
  for (const google::protobuf::Value& v : events->list_value().values()) {
    if (!v.has_struct_value()) continue;
    const google::protobuf::Struct& e = v.struct_value();
    const std::string ph = StringField(e, "ph");
    const double ts = NumberField(e, "ts") * 1e-6;
    google::protobuf::Struct args;
    if (const google::protobuf::Value* a = Field(e, "args");
        a != nullptr && a->has_struct_value()) {
      args = a->struct_value();
    }
    if (ph == "C") {
      out.memory.emplace_back(ts, NumberField(args, "allocated_bytes"));
      continue;
    }
    if (ph != "X") continue;
    const int tid = static_cast<int>(NumberField(e, "tid"));
    if (tid < 1 || tid > 3) continue;
    const std::string cat = StringField(e, "cat");
    std::string kind = cat;
    if (cat == "node") {
      kind = StringField(args, "phase");
      if (kind.empty()) kind = "fwd";
    } else if (cat == "collective") {
      kind = StringField(args, "collective");
    }
    out.lanes[tid - 1].spans.push_back(
        {ts, ts + NumberField(e, "dur") * 1e-6, StringField(e, "name"), kind});
  }
  std::sort(out.memory.begin(), out.memory.end());
  return out;
}

std::string VersionText(int64_t version) {
  return version < 0 ? std::string("the least-memory schedule")
                     : absl::StrCat("v", version);
}

}  // namespace

JobReportBuilder::JobReportBuilder(const JobManager* jobs, JobStore* store,
                                   JobHistory* history,
                                   const TimelineStore* timelines,
                                   std::function<double()> now_unix_s)
    : jobs_(jobs),
      store_(store),
      history_(history),
      timelines_(timelines),
      now_unix_s_(now_unix_s ? std::move(now_unix_s) : [] {
        return absl::ToDoubleSeconds(absl::Now() - absl::UnixEpoch());
      }) {}

absl::StatusOr<JobReport> JobReportBuilder::Build(
    const std::string& job_id) const {
  JobReport r;
  absl::StatusOr<v1::Job> job = jobs_->Get(job_id);
  if (!job.ok()) return job.status();
  r.job = *std::move(job);
  r.generated_unix_s = now_unix_s_();
  absl::StatusOr<std::vector<v1::JobEvent>> events = jobs_->Events(job_id, 0);
  if (!events.ok()) return events.status();
  r.events = *std::move(events);
  absl::StatusOr<std::vector<StoredSchedule>> schedules =
      store_->LoadSchedules(job_id);
  if (!schedules.ok()) return schedules.status();
  absl::StatusOr<std::vector<StoredStep>> steps = history_->Steps(job_id);
  if (!steps.ok()) return steps.status();
  r.steps = *std::move(steps);
  absl::StatusOr<std::vector<StoredRankWindow>> windows =
      history_->RankWindows(job_id);
  if (!windows.ok()) return windows.status();
  r.versions = Versions(*schedules, r.steps);
  r.ranks = RankVersions(*windows);
  for (const StoredSchedule& s : *schedules) {
    absl::StatusOr<Schedule> ir = FromProto(s.schedule);
    if (ir.ok()) r.plans.push_back(*std::move(ir));
  }

  // The version the memory section shows: the one rank 0 runs (ran last).
  const int64_t shown = r.job.schedule_version();
  absl::StatusOr<std::optional<v1::Graph>> graph = store_->LoadGraph(job_id);
  if (!graph.ok()) return graph.status();
  std::optional<SimContext> ctx;
  std::string sim_note;
  if (!graph->has_value()) {
    sim_note =
        "no graph yet: rank 0 sends the model's graph when it starts, and "
        "nothing can be simulated before";
  } else {
    absl::StatusOr<SimContext> calibrated =
        Calibrate(*store_, r.job, **graph, *schedules);
    if (calibrated.ok()) {
      ctx = *std::move(calibrated);
    } else {
      sim_note = absl::StrCat("the simulation could not be set up: ",
                              calibrated.status().message());
    }
  }
  std::map<int64_t, std::pair<Schedule, SimResult>> simulated;
  auto simulate = [&](int64_t version) -> absl::Status {
    if (!ctx.has_value()) return absl::FailedPreconditionError(sim_note);
    if (simulated.count(version)) return absl::OkStatus();
    absl::StatusOr<Schedule> s = ScheduleOf(*ctx, version);
    if (!s.ok()) return s.status();
    absl::StatusOr<SimResult> sim = Simulate(ctx->graph, *s, ctx->hw);
    if (!sim.ok()) return sim.status();
    simulated.emplace(version, std::make_pair(*std::move(s), *std::move(sim)));
    return absl::OkStatus();
  };

  absl::StatusOr<std::vector<v1::RankTimeline>> traces =
      timelines_->Get(job_id, {});
  std::vector<std::pair<v1::RankTimeline, ParsedTrace>> parsed;
  std::vector<std::string> trace_errors;
  if (traces.ok()) {
    for (const v1::RankTimeline& t : *traces) {
      absl::StatusOr<ParsedTrace> p = ParseTrace(t);
      if (p.ok()) {
        parsed.emplace_back(t, *std::move(p));
      } else {
        trace_errors.emplace_back(p.status().message());
      }
    }
  }

  // Memory.
  if (!ctx.has_value() && parsed.empty() && r.ranks.empty()) {
    r.memory_missing = absl::StrCat("No memory to show: ", sim_note,
                                    "; no rank has sent a profile window.");
  } else {
    ReportMemory m;
    m.version = shown;
    if (absl::Status s = simulate(shown); s.ok()) {
      const auto& [schedule, sim] = simulated.at(shown);
      std::vector<NodeTimelineEntry> nodes = sim.nodes;
      std::sort(nodes.begin(), nodes.end(),
                [](const NodeTimelineEntry& a, const NodeTimelineEntry& b) {
                  return a.end_s < b.end_s;
                });
      for (const NodeTimelineEntry& n : nodes) {
        m.simulated.emplace_back(n.end_s,
                                 static_cast<double>(n.memory_after_bytes));
        if (n.node_id == sim.peak_node_id) {
          m.simulated_peak_s = (n.start_s + n.end_s) / 2;
        }
      }
      m.simulated_peak_bytes = sim.peak_bytes;
      m.simulated_note = ctx->note;
      m.budget_bytes =
          schedule.budget_bytes > 0 ? schedule.budget_bytes : ctx->hw.budget();
    } else {
      m.simulated_note = absl::StrCat("no simulated curve: ", s.message());
    }
    if (m.budget_bytes <= 0) {
      m.budget_bytes = r.job.spec().memory().budget_bytes();
    }
    for (const ReportVersion& v : r.versions) {
      if (v.version == shown) m.predicted_peak_bytes = v.predicted_peak_bytes;
    }
    // Peaks under the version shown, else under the newest version the
    // ranks profiled.
    m.peaks_version = shown;
    bool any = false;
    for (const ReportRankVersion& rv : r.ranks) any |= rv.version == shown;
    if (!any && !r.ranks.empty()) {
      m.peaks_version = r.ranks.front().version;
      for (const ReportRankVersion& rv : r.ranks) {
        if (VersionOrder(m.peaks_version, rv.version)) {
          m.peaks_version = rv.version;
        }
      }
    }
    for (const ReportRankVersion& rv : r.ranks) {
      if (rv.version == m.peaks_version && rv.peak_bytes > 0) {
        m.measured_peaks.emplace_back(rv.rank, rv.peak_bytes);
      }
    }
    for (const auto& [t, p] : parsed) {
      if (p.memory.empty()) continue;
      m.measured.push_back(
          {t.rank(), t.step(), t.schedule_version(), p.memory});
    }
    r.memory = std::move(m);
  }

  // Timeline: the prediction of the version the ranks' traces ran (else the
  // version shown), then each rank's measured streams.
  const int64_t traced =
      parsed.empty() ? shown : parsed.front().first.schedule_version();
  if (absl::Status s = simulate(traced); s.ok()) {
    const auto& [schedule, sim] = simulated.at(traced);
    for (Lane& lane : SimulatedLanes(*ctx, schedule, sim)) {
      r.timeline.lanes.push_back(std::move(lane));
    }
    r.timeline.captions.push_back(absl::StrCat(
        VersionText(traced), " as the simulator predicts it: ",
        report::FormatValue(sim.iteration_s, report::Unit::kSeconds),
        " per iteration, ",
        report::FormatValue(sim.exposed_comm_s, report::Unit::kSeconds),
        " of it exposed communication."));
  }
  for (auto& [t, p] : parsed) {
    for (Lane& lane : p.lanes) r.timeline.lanes.push_back(std::move(lane));
    r.timeline.captions.push_back(
        absl::StrCat("rank ", t.rank(), ": step ", t.step(), " under ",
                     VersionText(t.schedule_version()), ", measured ",
                     report::FormatValue(p.iteration_s, report::Unit::kSeconds),
                     " per iteration."));
  }
  std::vector<std::string> missing;
  if (!traces.ok()) {
    missing.push_back(
        "No measured timeline yet: ranks send their latest iteration's "
        "trace with each profile window (after optimize.warmup_steps) and "
        "at their last step, and the coordinator keeps them in memory only "
        "(a restarted coordinator has none until the ranks send one).");
  }
  for (const std::string& e : trace_errors) missing.push_back(e);
  if (r.timeline.lanes.empty() && !sim_note.empty()) {
    missing.push_back(absl::StrCat("No prediction: ", sim_note, "."));
  }
  r.timeline_missing = absl::StrJoin(missing, " ");
  return r;
}

absl::StatusOr<std::string> JobReportBuilder::RenderHtml(
    const std::string& job_id) const {
  absl::StatusOr<JobReport> r = Build(job_id);
  if (!r.ok()) return r.status();
  return RenderJobReport(*r);
}

metrics::HttpExporter::Page JobReportBuilder::ErrorPage(
    int status, absl::string_view message) {
  return metrics::HttpExporter::Page{
      status, "text/html; charset=utf-8",
      absl::StrCat("<!DOCTYPE html>\n<html lang=\"en\"><head><meta "
                   "charset=\"utf-8\"><title>Tandem: ",
                   status, "</title></head><body><p>",
                   report::HtmlEscape(message), "</p></body></html>\n")};
}

metrics::HttpExporter::Page JobReportBuilder::ServePage(
    absl::string_view path) const {
  absl::string_view id = path;
  absl::ConsumePrefix(&id, "/");
  absl::ConsumeSuffix(&id, "/");
  if (id.empty()) {
    return ErrorPage(404,
                     "Name a job: /jobs/<job id> (`tandem list` shows the "
                     "ids).");
  }
  if (id.size() > 256) {
    return ErrorPage(400,
                     "A job id has at most 256 characters; `tandem list` "
                     "shows the ids.");
  }
  absl::StatusOr<std::string> html = RenderHtml(std::string(id));
  if (html.ok()) {
    return metrics::HttpExporter::Page{200, "text/html; charset=utf-8",
                                       *std::move(html)};
  }
  return ErrorPage(
      html.status().code() == absl::StatusCode::kNotFound ? 404 : 500,
      html.status().message());
}

}  // namespace tandem
