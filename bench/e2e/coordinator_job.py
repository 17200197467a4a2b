#!/usr/bin/python3
"""bench/e2e: Tandem's own loop on the shaped link, run as a user runs it.

driver.py runs this inside the first namespace (ns0) once per model, rate
and budget: a tandem-coordinator on ns0's address, the job submitted with
the Python client (what `tandem submit SPEC` does), rank 0 here and rank 1
in ns1 as agent-mode workers (`tandem-worker --coordinator ADDR --job ID`),
both over the shaped link, as bench/drift/throttle.py does. The job runs
with its spec's `optimize` defaults (profile, plan, trials, rollbacks, drift
re-plans) until its loop settles: the schedule version the steps run under
has not changed for --settle-steps steps and is the coordinator's active
one (or the job ended, or --max-steps / --timeout-s passed: not settled).
Then the active schedule is fetched (GetSchedule, `tandem schedule JOB`),
written to --schedule-out for the bench's rounds, and described:

  final_version, final_reason, final_source  which version the loop settled
      on, why it was published, and whose plan it is: "tandem" (Tandem's own
      pipeline), a reference policy's name (the planner chose it over
      Tandem's own, or a trial of it was kept), or "baseline" (rolled back
      to the starting schedule), from the schedules' provenance;
  first_version, first_predicted_s, first_measured_s  the first plan, its
      prediction and the median of the job's own steps under it (the step
      that switched left out, as the coordinator counts them);
  first_window_measured_s  the median of the first plan's first 5 steps
      after the switch (its first window, as the coordinator first measures
      it): against first_measured_s, how far the host drifted over the job;
  final_predicted_s  the prediction made before the final plan first ran: a
      rollback version is predicted at what its plan measured, so the
      prediction of the version it reran is reported instead;
  versions   every published version: reason, passes, prediction, the
      job's median step under it and how many steps ran it.

Prints one JSON object on stdout; logs go to stderr and --workdir.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "drift"))
import steady  # noqa: E402  (bench/drift/steady.py: coordinator, step lines)


def log(msg):
    print(f"[e2e-job {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# -- pure pieces (tests/unit/bench/test_e2e_driver.py) -------------------------

# The first plan's own first window: the e2e specs' optimize.warmup_steps
# (the profile window the coordinator measures a plan by first).
FIRST_WINDOW_STEPS = 5

def settle_point(per_step, settle_steps):
    """Whether a job's loop has settled, from its steps [(step, version)] in
    step order: the version of the newest step has run at least
    `settle_steps` steps since it last changed, and it is a planned one
    (> 0; -1 is the memory guard's fallback, 0 the baseline before any
    plan). Returns (settled, version, steps under it since the change)."""
    if not per_step:
        return False, None, 0
    version = per_step[-1][1]
    since = 0
    for _, v in reversed(per_step):
        if v != version:
            break
        since += 1
    return version > 0 and since >= settle_steps, version, since


def version_of(passes, marker):
    """The K of the newest `<marker>K` pass (e.g. "rollback-to-v3" -> 3)."""
    for p in reversed(passes):
        if p.startswith(marker):
            try:
                return int(p[len(marker):])
            except ValueError:
                return None
    return None


def plan_source(passes):
    """Whose plan a schedule is, from its provenance passes: a kept trial's
    source ("trial:<source>"), else the reference policy the planner chose
    over Tandem's own ("chosen-over-tandem:<policy>"), else "baseline" for a
    rollback to the starting schedule (v0), else "least-memory" for the
    memory fallback, else "tandem" (Tandem's own pipeline). A rollback
    version carries the passes of the version it reran, so its source is
    that version's."""
    for p in reversed(passes):
        if p.startswith("trial:"):
            return p[len("trial:"):]
    for p in reversed(passes):
        if p.startswith("chosen-over-tandem:"):
            return p[len("chosen-over-tandem:"):]
    if version_of(passes, "rollback-to-v") == 0:
        return "baseline"
    if "least-memory" in passes:
        return "least-memory"
    return "tandem"


# Versions that publish an earlier version's plan again, and the pass that
# names it: a rollback, a trial kept after its comparison, and a settled
# plan alternated with the baseline to measure its speedup.
RERUN_MARKERS = {"rollback": "rollback-to-v", "kept": "kept-v",
                 "baseline-check": "baseline-check-of-v"}


def planned_version(versions, version):
    """The version whose plan `version` runs: a "rollback" version reruns
    the one its `rollback-to-vK` pass names, a "kept" version the trial its
    `kept-vK` pass names (followed to the first that was planned).
    `versions` maps version -> {"reason", "passes", ...}."""
    seen = set()
    while version in versions and version not in seen:
        seen.add(version)
        rec = versions[version]
        marker = RERUN_MARKERS.get(rec.get("reason"))
        if marker is None:
            return version
        to = version_of(rec.get("passes", []), marker)
        if to is None:
            return version
        version = to
    return version


def prediction_before_run(versions, version):
    """The prediction made before `version`'s plan first ran. A rollback
    publishes the plan it reruns predicted at what that plan measured (the
    coordinator's evidence): echoing it would report the row's own
    measurement as its prediction. So a rollback's prediction is the one of
    the version it reran; None for a rollback to the baseline (v0, never
    predicted by a plan) or an unknown version."""
    v = planned_version(versions, version)
    if v == 0 or v not in versions:
        return None
    if versions[v].get("reason") in RERUN_MARKERS:
        return None
    return versions[v].get("predicted_s")


def stretches(per_step_times):
    """[(version, [seconds])] over [(step, version, seconds)] in step order:
    the runs of consecutive steps under one version. A stretch's first step
    is the one that switched to it, which the coordinator's
    ScheduleMeasurements leave out (the callers below do too)."""
    out = []
    for _, v, t in per_step_times:
        if out and out[-1][0] == v:
            out[-1][1].append(t)
        else:
            out.append((v, [t]))
    return out


def version_medians(per_step_times):
    """{version: (median step s, steps measured)} over [(step, version,
    seconds)] in step order, every stretch's switching step left out,
    unless the version ran no other."""
    measured, every = {}, {}
    for v, ts in stretches(per_step_times):
        every.setdefault(v, []).extend(ts)
        measured.setdefault(v, []).extend(ts[1:])
    return {v: (statistics.median(measured[v] or ts), len(measured[v] or ts))
            for v, ts in every.items()}


def first_stretch_median(per_step_times, version, steps):
    """(median, steps) of the first `steps` steps of `version`'s first
    stretch, its switching step left out: what the coordinator measures of a
    plan first ("v1 measured ... (median of 5 steps)"), seconds after the
    window its prediction was made from. Set beside the median over the
    plan's whole life, it tells the cost model's error from the host's drift
    over the job. (None, 0) when the stretch ran no step but the switch."""
    first = next((ts for v, ts in stretches(per_step_times) if v == version),
                 [])
    window = first[1:1 + steps]
    return (statistics.median(window), len(window)) if window else (None, 0)


def first_plan_version(versions):
    """The first version planned from the job's own profile ("initial"), or
    the first published when none says so."""
    planned = sorted(v for v, r in versions.items() if v > 0)
    for v in planned:
        if versions[v].get("reason") == "initial":
            return v
    return planned[0] if planned else None


def summarize(versions, per_step_times, final_version):
    """The JSON fields this script reports, from the published versions
    ({version: {"reason", "passes", "predicted_s"}}), the job's steps
    [(step, version, slowest rank's seconds)] and the version it settled on."""
    med = version_medians(per_step_times)
    first = first_plan_version(versions)
    out = dict(final_version=final_version)
    if final_version in versions:
        rec = versions[final_version]
        out.update(final_reason=rec.get("reason"), final_passes=rec.get("passes"),
                   final_source=plan_source(rec.get("passes", [])),
                   final_planned_version=planned_version(versions, final_version))
    elif final_version == 0:
        out.update(final_reason="baseline", final_source="baseline", final_passes=[])
    out["final_predicted_s"] = prediction_before_run(versions, final_version)
    if final_version in med:
        out["final_job_measured_s"], out["final_job_steps"] = med[final_version]
    if first is not None:
        out.update(first_version=first, first_predicted_s=versions[first].get("predicted_s"),
                   first_source=plan_source(versions[first].get("passes", [])))
        if first in med:
            out["first_measured_s"], out["first_steps"] = med[first]
            if out["first_predicted_s"]:
                out["first_prediction_error"] = (out["first_predicted_s"]
                                                 / out["first_measured_s"] - 1)
        window_s, window_steps = first_stretch_median(per_step_times, first,
                                                      FIRST_WINDOW_STEPS)
        if window_s:
            out["first_window_measured_s"] = window_s
            out["first_window_steps"] = window_steps
    out["versions"] = [dict(versions[v], version=v,
                            job_measured_s=med.get(v, (None, 0))[0],
                            job_steps=med.get(v, (None, 0))[1])
                       for v in sorted(versions)]
    return out


# -- the job -------------------------------------------------------------------

def read_steps(path):
    """A rank's step lines so far; a line still being written is skipped."""
    out = []
    with open(path) as f:
        for line in f:
            if line.startswith('{"step"') and line.endswith("\n"):
                try:
                    out.append(json.loads(line))
                except ValueError:
                    pass
    return out


def job_steps(paths):
    """[(step, version, slowest rank's iteration_s)] for the steps every rank
    has reported, in step order."""
    per_rank = [{s["step"]: s for s in read_steps(p)} for p in paths]
    common = set(per_rank[0]).intersection(*per_rank[1:])
    return [(step, per_rank[0][step]["schedule_version"],
             max(r[step]["iteration_s"] for r in per_rank)) for step in sorted(common)]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", required=True)
    ap.add_argument("--workdir", required=True)
    ap.add_argument("--spec", required=True, help="the job spec (YAML), as a user submits it")
    ap.add_argument("--schedule-out", required=True)
    ap.add_argument("--ns1", required=True)
    ap.add_argument("--if0", required=True)
    ap.add_argument("--if1", required=True)
    ap.add_argument("--ip0", required=True)
    ap.add_argument("--ip1", required=True)
    ap.add_argument("--settle-steps", type=int, default=15)
    ap.add_argument("--max-steps", type=int, default=200)
    ap.add_argument("--timeout-s", type=float, default=900)
    a = ap.parse_args()
    import tandem  # the Python client (client/python, via steady.py)

    os.makedirs(a.workdir, exist_ok=True)
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
    # ns0's veth address: reachable only from the bench's two namespaces.
    coord, address = steady.start_coordinator(a.build, a.workdir, listen=f"{a.ip0}:0",
                                              insecure=True)
    workers = []
    result = dict(workdir=a.workdir, settle_steps=a.settle_steps)
    paths = [os.path.join(a.workdir, f"worker{r}.jsonl") for r in range(2)]
    try:
        with tandem.Client(address, timeout=30) as client:
            job = client.submit(a.spec)
            result["job_id"] = job.id
            log(f"job {job.id} on {address}; logs in {a.workdir}")
            worker = os.path.join(a.build, "worker", "tandem-worker")
            for r in range(2):
                cmd = [worker, "--coordinator", address, "--job", job.id, "--rank", str(r),
                       "--threads", "1", "--bind-host", a.ip0 if r == 0 else a.ip1]
                wenv = dict(env, GLOO_SOCKET_IFNAME=a.if0 if r == 0 else a.if1)
                if r == 1:
                    cmd = ["ip", "netns", "exec", a.ns1] + cmd
                workers.append(subprocess.Popen(
                    cmd, env=wenv, stdout=open(paths[r], "w"),
                    stderr=open(os.path.join(a.workdir, f"worker{r}.log"), "w")))

            deadline = time.time() + a.timeout_s
            settled, why = False, ""
            last_check = 0.0
            while True:
                series = job_steps(paths)
                ok, version, since = settle_point([(s, v) for s, v, _ in series],
                                                  a.settle_steps)
                if ok and time.time() - last_check > 1.0:
                    last_check = time.time()
                    active = client.schedule(job.id).schedule.version
                    if active == version:
                        settled, why = True, (f"v{version} ran {since} steps unchanged and "
                                              "is the active schedule")
                        break
                if any(w.poll() is not None for w in workers):
                    state = tandem.state_name(client.get(job.id).job.state)
                    why = f"the job ended ({state}) before settling"
                    settled = state == "SUCCEEDED"
                    break
                if len(series) >= a.max_steps:
                    why = f"not settled after {len(series)} steps (--max-steps)"
                    break
                if time.time() > deadline:
                    why = f"not settled after {a.timeout_s:.0f} s (--timeout-s)"
                    break
                time.sleep(0.5)
            log(why)
            status = client.get(job.id)
            active = client.schedule(job.id)
            versions = {}
            for v in range(1, active.schedule.version + 1):
                try:
                    s = client.schedule(job.id, v).schedule
                except tandem.TandemError:
                    continue
                versions[v] = dict(reason=s.provenance.reason, passes=list(s.provenance.passes),
                                   predicted_s=s.prediction.iteration_s or None,
                                   predicted_peak_bytes=s.prediction.peak_bytes or None,
                                   budget_bytes=s.budget_bytes)
            with open(a.schedule_out, "w") as f:
                f.write(active.text)
            result.update(settled=settled, settle_note=why,
                          state=tandem.state_name(status.job.state),
                          events=[f"{e.kind}: {e.message[:240]}"
                                  for e in status.events][-40:])
            if not tandem.is_terminal(status.job.state):
                client.cancel(job.id, reason="bench/e2e: the loop settled")
    finally:
        steady.stop_processes(workers, coord)

    series = job_steps(paths)
    result.update(summarize(versions, series, active.schedule.version),
                  job_steps=len(series))
    # The version the steps ran under at the end: the one measured.
    if series and series[-1][1] != active.schedule.version:
        result["note"] = (f"the steps ended on v{series[-1][1]}, the active schedule "
                          f"is v{active.schedule.version}")
    print(json.dumps(result, sort_keys=True))


if __name__ == "__main__":
    main()
