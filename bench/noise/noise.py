#!/usr/bin/python3
"""bench/noise: do the loop's decisions hold under noise? (issue 34)

Run by `bench/e2e/run.sh --noise` inside the first namespace (ns0), whose
veth pair to ns1 tc shapes: the coordinator listens on ns0's address, rank 0
runs here and rank 1 in ns1, both over the shaped link, one thread each.

For each model (the demo job, deploy/local/demo.yaml, and the exported GPT
of deploy/local/exported.yaml) and each condition, --jobs jobs run as a user
runs them (a coordinator, the job submitted with the Python client, two
agent-mode workers), --steps steps each:
  quiet    nothing else runs;
  cpu-hog  a process takes a varying share of one core (0-90%, a new share
           every 2-8 s at random, in 10 ms slices), for the job's life and
           never longer than --job-timeout-s: it stops by itself;
  flaps    the link's rate flips between --rate-mbit and a quarter of it at
           random times (every 3-12 s), restored when the job ends.
After each job, with nothing else running, the plan it ended on is
re-measured standalone on the same link against every other distinct plan
it ran (the baseline v0 included): the quiet truth the job's decisions are
held against. --remeasure-mode blocks (the default) does it as the
coordinator's comparisons do, in one two-rank run per other plan: the
other plan and the ended-on plan take turns in blocks of
--remeasure-block-steps steps (`tandem-worker --standalone --alternate`)
for --remeasure-pairs block pairs, each block's first step left out, so
that a change in the host's speed lands on both sides of a pair within
seconds. --remeasure-mode rounds (runs before 2026-12) runs each plan
alone, interleaved (--remeasure-rounds rounds of --remeasure-steps steps,
the first --discard of each run left out; each round starts one plan
later, A B C, B C A, C A B, ...). Either way plans are compared as the
coordinator compares them: each pair's (or round's) ratio of medians,
their geometric mean, and a 95% bootstrap interval (pairs, then steps
within them, seeded) widened to Student's t over the pairs' log ratios
where that is wider (steady.paired_ratio). Per job it reports
  - versions published per 100 steps once settled: versions first run after
    the settle step (the end of the first --settle-steps steps in a row that
    ran one plan version alone: no new version, no comparison's blocks), per
    100 steps after it;
  - the first step that ran the plan the job ended on (under any of its
    version numbers);
  - whether the kept (final) plan is wrong: a plan the job also ran
    re-measures faster than it by more than optimize.min_gain (3%), its
    interval clear of 1 (the re-measure tells them apart); a gap beyond
    min_gain whose interval holds 1 is "the re-measure could not tell", a
    count of its own, neither wrong nor right;
  - the final plan's re-measured time against the best plan's (the paired
    ratio against the plan it trails most, 1 when it trails none);
  - whether the interval the user was shown contains the quiet re-measured
    speedup: the figure's, or the too-wide one a "not measured yet" status
    quotes (every interval the coordinator showed, not only those narrow
    enough for a figure);
  - the speedup the coordinator reported (its interval) and the quiet
    re-measured speedup (v0 over the final plan, paired, with its interval),
    whether the reported interval contains the re-measured figure, and
    (the weaker check, for a host whose speed jumps inside the re-measure's
    rounds, which makes the figure itself uncertain) whether the two
    intervals meet.
`--reanalyse FILE` recomputes these verdicts from the rounds a results file
stored (runs before 2026-12 kept one median per round: their intervals are
over rounds alone).
One JSON line per job and a summary line per model and condition go to
--out; the summary is printed at the end (bench/README.md, "noise").
"""

import argparse
import json
import os
import random
import re
import shutil
import statistics
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "bench", "drift"))
import steady  # noqa: E402  (bench/drift/steady.py: coordinator, step lines)
from steady import block_pairs, paired_ratio  # noqa: E402  (as the coordinator compares)

MIN_GAIN = 0.03  # optimize.min_gain's default (coordinator/README.md)


def log(msg):
    print(f"[noise {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


class CpuHog:
    """A process taking a varying share of one core until stop() or its own
    deadline, whichever comes first."""

    SCRIPT = r"""
import random, sys, time
deadline = time.time() + float(sys.argv[1])
rng = random.Random(int(sys.argv[2]))
while time.time() < deadline:
    share = rng.uniform(0.0, 0.9)
    phase_end = min(deadline, time.time() + rng.uniform(2, 8))
    while time.time() < phase_end:
        start = time.time()
        while time.time() - start < 0.010 * share:
            pass
        time.sleep(0.010 * (1 - share))
"""

    def __init__(self, limit_s, seed):
        self.proc = subprocess.Popen(["/usr/bin/python3", "-c", self.SCRIPT, str(limit_s),
                                      str(seed)])

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
        self.proc.wait(timeout=10)


class LinkFlaps:
    """Flips the link between its rate and a quarter of it at random times
    until stop() or its deadline; always leaves it at its rate."""

    def __init__(self, a, limit_s, seed):
        self.a = a
        self.stopped = threading.Event()
        self.flips = 0
        self.rng = random.Random(seed)
        self.deadline = time.time() + limit_s
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def set(self, mbit):
        steady.tc_rate("", self.a.if0, mbit, self.a.burst)
        steady.tc_rate(self.a.ns1, self.a.if1, mbit, self.a.burst)

    def run(self):
        low = False
        try:
            while not self.stopped.wait(self.rng.uniform(3, 12)):
                if time.time() > self.deadline:
                    break
                low = not low
                self.set(max(1, self.a.rate_mbit // 4) if low else self.a.rate_mbit)
                self.flips += 1
        finally:
            self.set(self.a.rate_mbit)

    def stop(self):
        self.stopped.set()
        self.thread.join(timeout=30)


def model_specs(a):
    """name -> (job spec dict, note)."""
    import yaml
    out = {}
    for name in a.models.split(","):
        if name == "demo":
            spec = yaml.safe_load(open(os.path.join(ROOT, "deploy", "local", "demo.yaml")))
        elif name == "exported-gpt":
            spec = yaml.safe_load(open(os.path.join(ROOT, "deploy", "local", "exported.yaml")))
            archive = os.path.join(a.workdir, "gpt.tandem")
            if not os.path.exists(archive):
                env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "client", "python"))
                subprocess.run(["/usr/bin/python3", "-m", "tandem", "export",
                                "tests/models/gpt.py:build_demo", "-o", archive],
                               cwd=ROOT, env=env, check=True, stdout=subprocess.DEVNULL)
            spec["model"]["path"] = archive
        else:
            sys.exit(f"--models: unknown model '{name}' (demo, exported-gpt)")
        spec["name"] = f"noise-{name}"
        spec["train"]["steps"] = a.steps
        out[name] = spec
    return out


def write_spec(path, spec):
    with open(path, "w") as f:
        json.dump(spec, f)  # JSON is YAML
    return path


def worker_cmd(a, r, extra):
    cmd = [os.path.join(a.build, "worker", "tandem-worker"), "--threads", "1"] + extra
    if r == 1:
        cmd = ["ip", "netns", "exec", a.ns1] + cmd
    return cmd


def worker_env(a, r):
    return dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1",
                GLOO_SOCKET_IFNAME=a.if0 if r == 0 else a.if1)


def fresh_workdir(workdir):
    """An empty `workdir` for one job. Each job gets a coordinator of its own
    on a new database: one left there by an earlier run holds that run's
    jobs, and the plan cache would start this job on their plan (the
    2026-11-30c run did, and measured no decision at all)."""
    shutil.rmtree(workdir, ignore_errors=True)
    os.makedirs(workdir)
    return workdir


def run_job(a, spec, condition, workdir, seed, tandem):
    """One job under `condition`; returns what the analysis needs."""
    fresh_workdir(workdir)
    coord, address = steady.start_coordinator(a.build, workdir, listen=f"{a.ip0}:0",
                                              insecure=True)
    workers, noise = [], None
    try:
        with tandem.Client(address, timeout=30) as client:
            job = client.submit(spec)
            for r in range(2):
                workers.append(subprocess.Popen(
                    worker_cmd(a, r, ["--coordinator", address, "--job", job.id,
                                      "--rank", str(r),
                                      "--bind-host", a.ip0 if r == 0 else a.ip1]),
                    env=worker_env(a, r),
                    stdout=open(os.path.join(workdir, f"worker{r}.jsonl"), "w"),
                    stderr=open(os.path.join(workdir, f"worker{r}.log"), "w")))
            if condition == "cpu-hog":
                noise = CpuHog(a.job_timeout_s, seed)
            elif condition == "flaps":
                noise = LinkFlaps(a, a.job_timeout_s, seed)
            deadline = time.time() + a.job_timeout_s
            for r, w in enumerate(workers):
                left = max(1.0, deadline - time.time())
                if w.wait(timeout=left) != 0:
                    raise RuntimeError(f"rank {r} exited {w.returncode}: see {workdir}/worker{r}.log")
            flips = noise.flips if isinstance(noise, LinkFlaps) else None
            if noise is not None:
                noise.stop()
                noise = None
            final, events = client.get(job.id)
            cached = [e.message for e in events
                      if e.kind == "schedule" and "(cached)" in e.message]
            if cached:
                raise RuntimeError(f"the job started on a cached plan ({cached[0][:120]}): "
                                   f"{workdir} was not fresh")
            logs = [os.path.join(workdir, f"worker{r}.jsonl") for r in range(2)]
            per_step = steady.slowest_per_step(logs)
            shares = steady.wait_shares(logs)
            versions = sorted({v for _, v in per_step.values() if v >= 0})
            texts = {}
            for v in versions:
                texts[v] = client.schedule(job.id, v).text
        return dict(job=job.id, final=final, events=events, per_step=per_step,
                    texts=texts, flips=flips, wait_shares=shares)
    finally:
        if noise is not None:
            noise.stop()
        steady.stop_processes(workers, coord)


def plan_key(text):
    """A schedule's plan: its group, persistent, offload and action lines,
    without the header, predictions, provenance, explanation and comments
    (a rollback reruns an earlier version's plan under a new number)."""
    keep = []
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if line and line.split()[0] in ("group", "persistent", "offload", "before", "after"):
            keep.append(line)
    return "\n".join(keep)


def representatives(texts):
    """{version: the first version that ran the same plan} (plan_key)."""
    reps, seen = {}, {}
    for v in sorted(texts):
        key = plan_key(texts[v])
        if key not in seen:
            seen[key] = v
        reps[v] = seen[key]
    return reps


def remeasure(a, spec, texts, workdir):
    """Each distinct plan (v0 included) standalone on the quiet link,
    interleaved; returns {version: [each round's step times]} for one
    version per plan, and {version: that representative}."""
    reps = representatives(texts)
    plans = sorted(set(reps.values()))
    spec1 = dict(spec, train=dict(spec["train"], steps=a.remeasure_steps))
    spec_path = write_spec(os.path.join(workdir, "remeasure.yaml"), spec1)
    times = {v: [] for v in plans}
    port = 29900
    for rnd in range(a.remeasure_rounds):
        k = rnd % len(plans)
        for v in plans[k:] + plans[:k]:
            sched = os.path.join(workdir, f"v{v}.sched")
            with open(sched, "w") as f:
                f.write(texts[v])
            port += 1
            rv = f"{a.ip0}:{port}"
            procs = []
            for r in range(2):
                procs.append(subprocess.Popen(
                    worker_cmd(a, r, ["--standalone", "--spec", spec_path, "--rank", str(r),
                                      "--world", "2", "--rendezvous", rv, "--schedule", sched]),
                    env=worker_env(a, r), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                    text=True))
                if r == 0:
                    time.sleep(0.2)
            outs = []
            for r, p in enumerate(procs):
                out, err = p.communicate(timeout=600)
                if p.returncode != 0:
                    raise RuntimeError(f"re-measure of v{v}, rank {r}: {err.strip()[-400:]}")
                outs.append(out)
            steps = {}
            for out in outs:
                for line in out.splitlines():
                    if line.startswith('{"step"'):
                        s = json.loads(line)
                        steps[s["step"]] = max(steps.get(s["step"], 0.0), s["iteration_s"])
            times[v].append([t for s, t in sorted(steps.items()) if s >= a.discard])
    return times, reps


def run_pair(a, spec_path, first_sched, other_sched, port):
    """One two-rank standalone run alternating `other_sched` with
    `first_sched`; returns {step: (slowest rank's iteration_s, version)}."""
    rv = f"{a.ip0}:{port}"
    procs = []
    for r in range(2):
        procs.append(subprocess.Popen(
            worker_cmd(a, r, ["--standalone", "--spec", spec_path, "--rank", str(r),
                              "--world", "2", "--rendezvous", rv, "--schedule", first_sched,
                              "--alternate", other_sched,
                              "--block-steps", str(a.remeasure_block_steps)]),
            env=worker_env(a, r), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True))
        if r == 0:
            time.sleep(0.2)
    steps = {}
    for r, p in enumerate(procs):
        out, err = p.communicate(timeout=900)
        if p.returncode != 0:
            raise RuntimeError(f"re-measure of {os.path.basename(other_sched)} against "
                               f"{os.path.basename(first_sched)}, rank {r}: "
                               f"{err.strip()[-400:]}")
        for line in out.splitlines():
            if line.startswith('{"step"'):
                x = json.loads(line)
                t, v = steps.get(x["step"], (0.0, x["schedule_version"]))
                steps[x["step"]] = (max(t, x["iteration_s"]), v)
    return steps


def remeasure_blocks(a, spec, texts, workdir, end_v):
    """The plan version `end_v` ran against each other distinct plan, in
    alternating blocks; returns ({plan: (end plan's pairs, plan's pairs)},
    {version: its plan's representative})."""
    reps = representatives(texts)
    end = reps[end_v]
    steps = 1 + 2 * a.remeasure_block_steps * a.remeasure_pairs
    spec1 = dict(spec, train=dict(spec["train"], steps=steps))
    spec_path = write_spec(os.path.join(workdir, "remeasure.yaml"), spec1)
    for v in sorted(set(reps.values())):
        with open(os.path.join(workdir, f"v{v}.sched"), "w") as f:
            f.write(texts[v])
    pairs = {}
    port = 29900
    for v in sorted(set(reps.values()) - {end}):
        port += 1
        got = run_pair(a, spec_path, os.path.join(workdir, f"v{end}.sched"),
                       os.path.join(workdir, f"v{v}.sched"), port)
        pairs[v] = block_pairs(got, a.remeasure_block_steps)
        if not pairs[v][0]:
            raise RuntimeError(f"re-measure of v{v} against v{end}: the run did not "
                               "alternate (no complete block pair)")
    return pairs, reps


def settle_step(per_step, settle_steps):
    """The step after the first stretch of settle_steps steps, after the first
    plan, that ran one plan version alone: no new version and no comparison
    in flight (the coordinator's interleaved blocks, a baseline check's v0
    or a trial's incumbent, are 4 steps long, so a comparison never leaves
    one version alone that long). A trial's verdict or a baseline check
    therefore falls before the settle point, never after it. Returns
    (that step or None when never, {version: step first run})."""
    first_seen = {}
    for s in sorted(per_step):
        first_seen.setdefault(per_step[s][1], s)
    run_v, run_len = None, 0
    for s in sorted(per_step):
        v = per_step[s][1]
        if v <= 0:
            run_v, run_len = None, 0
            continue
        run_len = run_len + 1 if v == run_v else 1
        run_v = v
        if run_len >= settle_steps:
            return s + 1, first_seen
    return None, first_seen


def pairs_of_rounds(rounds, end_plan):
    """Plans run alone in interleaved rounds ({plan: [each round's steps]},
    --remeasure-mode rounds), as the pairs judge() takes: {plan: (the
    ended-on plan's rounds, the plan's)}."""
    return {v: (rounds[end_plan], rs) for v, rs in rounds.items() if v != end_plan}


def verdicts(rounds, end_plan, reported=None):
    """judge() on rounds of plans run alone (--remeasure-mode rounds)."""
    out = judge(pairs_of_rounds(rounds, end_plan), end_plan, reported)
    out["quiet_s"] = {f"v{v}": round(statistics.median(statistics.median(r) for r in rs if r), 5)
                      for v, rs in sorted(rounds.items()) if any(rs)}
    return out


def judge(pairs, end_plan, reported=None):
    """The quiet re-measure's verdicts on a job that ended on `end_plan`:
    pairs is {plan version: (the ended-on plan's step times, the plan's)},
    each a list of rounds or block pairs measured together (v0, the
    baseline, among the plans), reported the coordinator's speedup interval
    (low, high) or None."""
    versus = {}  # plan -> the ended-on plan over it, paired
    for v in sorted(pairs):
        got = paired_ratio(pairs[v][0], pairs[v][1], seed=v)
        if got is not None:
            versus[v] = got
    wrong = [v for v, (r, low, _) in versus.items() if r > 1 + MIN_GAIN and low > 1]
    untold = [v for v, (r, low, _) in versus.items() if r > 1 + MIN_GAIN and low <= 1]
    best_v, final_over_best = end_plan, 1.0
    for v, (r, _, _) in versus.items():
        if r > final_over_best:
            best_v, final_over_best = v, r
    speedup = (1.0, 1.0, 1.0) if end_plan == 0 else None
    if speedup is None and 0 in pairs:
        speedup = paired_ratio(pairs[0][1], pairs[0][0], seed=end_plan)
    contains = overlaps = None
    if reported is not None and speedup is not None:
        contains = reported[0] <= speedup[0] <= reported[1]
        overlaps = reported[0] <= speedup[2] and speedup[1] <= reported[1]
    by_plan = {}
    for v, (end_rs, rs) in pairs.items():
        by_plan.setdefault(end_plan, []).extend(end_rs)
        by_plan.setdefault(v, []).extend(rs)
    return {
        "quiet_s": {f"v{v}": round(statistics.median(statistics.median(r) for r in rs if r), 5)
                    for v, rs in sorted(by_plan.items()) if any(rs)},
        "end_over_plan": {f"v{v}": [round(x, 4) for x in got] for v, got in versus.items()},
        "wrong_plan_kept": bool(wrong),
        "wrong_plans": [f"v{v}" for v in wrong],
        "remeasure_could_not_tell": [f"v{v}" for v in untold],
        "final_over_best": round(final_over_best, 4), "best_plan": f"v{best_v}",
        "quiet_speedup": round(speedup[0], 4) if speedup else None,
        "quiet_speedup_interval": [round(x, 4) for x in speedup[1:]] if speedup else None,
        "interval_contains_quiet": contains,
        "interval_overlaps_quiet": overlaps,
    }


def shown_interval(reported, text):
    """The interval the user was shown: the figure's (`reported`), or the
    one a "not measured yet" status quotes as too wide ("... in 7 block
    pairs: 0.86\u20131.42\u00d7, wider than 20%"); None when it quotes
    none (no pair measured yet)."""
    if reported is not None:
        return list(reported)
    m = re.search(r"(\d+(?:\.\d+)?)\u2013(\d+(?:\.\d+)?)\u00d7, wider than",
                  text or "")
    return [float(m.group(1)), float(m.group(2))] if m else None


def shown_verdicts(row):
    """Whether the interval the user was shown (shown_interval) contains
    the quiet re-measured speedup: a row's fields for it."""
    shown = shown_interval(row.get("reported_interval"), row.get("speedup_text"))
    quiet = row.get("quiet_speedup")
    return {"shown_interval": shown,
            "shown_contains_quiet": (shown[0] <= quiet <= shown[1]
                                     if shown is not None and quiet is not None
                                     else None)}


def end_version(per_step):
    """The version the job ended on: its last step's, not a baseline
    block's (0 when it never left the baseline)."""
    ran = [per_step[s][1] for s in sorted(per_step) if per_step[s][1] > 0]
    return ran[-1] if ran else 0


def first_step_on_plan(per_step, reps, end_v):
    """The first step that ran the plan the job ended on, under any of its
    version numbers (a rollback or a baseline check reruns it): from there
    the job runs at that plan's speed, save the blocks a comparison runs
    of another plan. Issue 34 asks the demo to get there within 30 steps."""
    on = [s for s in sorted(per_step) if reps.get(per_step[s][1]) == reps[end_v]]
    return on[0] if on else None


def analyse(a, run, remeasured, reps):
    """One job's row. `remeasured` is ("rounds", {plan: rounds}) or
    ("blocks", {plan: (end plan's pairs, plan's pairs)})."""
    per_step, final = run["per_step"], run["final"]
    settled, first_seen = settle_step(per_step, a.settle_steps)
    last = max(per_step)
    after = [v for v, s in first_seen.items() if settled is not None and s >= settled and v > 0]
    span = (last + 1 - settled) if settled is not None else 0
    final_v = max(v for v in run["texts"])
    end_v = end_version(per_step)
    reported = final.measured_speedup if final.measured_speedup > 0 else None
    interval = [final.speedup_low, final.speedup_high] if reported is not None else None
    row = {
        "job": run["job"], "steps": last + 1, "versions": final_v,
        "settled_at_step": settled,
        "versions_per_100_settled": (round(100.0 * len(after) / span, 2) if span > 0 else None),
        "end_version": end_v, "end_plan_of": reps[end_v],
        "first_step_on_end_plan": first_step_on_plan(per_step, reps, end_v),
        "reported_speedup": reported,
        "reported_interval": interval,
        "speedup_text": final.speedup_text,
        "link_flips": run["flips"],
        "state": final.state,
    }
    # How busy the host was (the steps' cpu_wait_share, p10/median/p90),
    # and the coordinator's verdicts that left block pairs out for it
    # (coordinator/README.md, "A busy host").
    shares = sorted(run.get("wait_shares", {}).values())
    if shares:
        row["cpu_wait_share"] = [round(shares[int(q * (len(shares) - 1))], 4)
                                 for q in (0.1, 0.5, 0.9)]
    row["busy_verdicts"] = [e.message for e in run.get("events", [])
                            if "the host's CPUs were busy" in e.message]
    mode, got = remeasured
    if mode == "rounds":
        row["quiet_round_steps_s"] = {f"v{v}": [[round(t, 5) for t in r] for r in rs]
                                      for v, rs in sorted(got.items())}
        row.update(verdicts(got, reps[end_v], interval))
    else:
        row["quiet_pair_steps_s"] = {
            f"v{v}": {"end": [[round(t, 5) for t in r] for r in e],
                      "plan": [[round(t, 5) for t in r] for r in o]}
            for v, (e, o) in sorted(got.items())}
        row.update(judge(got, reps[end_v], interval))
    row.update(shown_verdicts(row))
    return row


def stored_verdicts(row):
    """judge() on what a results row stored: block pairs (--remeasure-mode
    blocks) or rounds."""
    if "quiet_pair_steps_s" in row:
        pairs = {int(v[1:]): (p["end"], p["plan"])
                 for v, p in row["quiet_pair_steps_s"].items()}
        return judge(pairs, row["end_plan_of"], row.get("reported_interval"))
    return verdicts(stored_rounds(row), row["end_plan_of"], row.get("reported_interval"))


def stored_rounds(row):
    """A results row's re-measured rounds: each round's steps, or (runs
    before 2026-12) each round's median as a round of one step."""
    if "quiet_round_steps_s" in row:
        got = row["quiet_round_steps_s"]
    else:
        got = {v: [[m] for m in ms] for v, ms in row["quiet_rounds_s"].items()}
    return {int(v[1:]): rs for v, rs in got.items()}


def reanalyse(path):
    """Each job of a results file under today's verdicts; prints the rows
    and the summaries (nothing is written)."""
    try:
        with open(path) as f:
            lines = f.readlines()
    except OSError as e:
        raise SystemExit(f"noise.py --reanalyse: cannot read {path}: {e.strerror}; "
                         "give a results file this bench wrote (bench/noise/results-*.jsonl)")
    rows = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError as e:
            raise SystemExit(f"noise.py --reanalyse: {path} line {n} is not JSON ({e.msg}); "
                             "a results file holds one JSON object per line")
    groups = {}
    for row in rows:
        if row.get("summary") or "end_plan_of" not in row:
            continue  # a summary, or run.sh's machine lines
        row.update(stored_verdicts(row))
        row.update(shown_verdicts(row))
        print(json.dumps({k: row[k] for k in ("model", "condition", "job", "end_plan_of",
                                              "end_over_plan", "wrong_plans",
                                              "remeasure_could_not_tell", "final_over_best",
                                              "quiet_speedup", "quiet_speedup_interval",
                                              "interval_contains_quiet",
                                              "interval_overlaps_quiet", "shown_interval",
                                              "shown_contains_quiet")}, sort_keys=True))
        groups.setdefault((row["model"], row["condition"]), []).append(row)
    for (model, condition), got in groups.items():
        print(json.dumps(summarize(model, condition, got), sort_keys=True))


def summarize(model, condition, rows):
    per100 = [r["versions_per_100_settled"] for r in rows
              if r["versions_per_100_settled"] is not None]
    judged = [r for r in rows if r["interval_contains_quiet"] is not None]
    return {
        "summary": True, "model": model, "condition": condition, "jobs": len(rows),
        "wrong_plans_kept": sum(r["wrong_plan_kept"] for r in rows),
        "remeasure_could_not_tell": sum(bool(r.get("remeasure_could_not_tell"))
                                        and not r["wrong_plan_kept"] for r in rows),
        "versions_per_100_settled_max": max(per100) if per100 else None,
        "first_step_on_end_plan_max": max(
            (r["first_step_on_end_plan"] for r in rows
             if r.get("first_step_on_end_plan") is not None), default=None),
        "never_settled": sum(r["settled_at_step"] is None for r in rows),
        "final_over_best_median": (round(statistics.median(r["final_over_best"] for r in rows), 4)
                                   if rows else None),
        "interval_contains_quiet": f"{sum(r['interval_contains_quiet'] for r in judged)} of {len(judged)}",
        "interval_overlaps_quiet": f"{sum(bool(r.get('interval_overlaps_quiet')) for r in judged)} of {len(judged)}",
        "speedup_not_reported": len(rows) - len(judged),
        "shown_interval_contains_quiet": "%d of %d" % (
            sum(bool(r.get("shown_contains_quiet")) for r in rows),
            sum(r.get("shown_contains_quiet") is not None for r in rows)),
        # How busy the host was across the jobs (the median of their p10,
        # median and p90 wait shares) and how many verdicts left block
        # pairs out for it, in how many jobs.
        "cpu_wait_share_median": (
            [round(statistics.median(r["cpu_wait_share"][i] for r in shared), 4)
             for i in range(3)] if (shared := [r for r in rows if r.get("cpu_wait_share")])
            else None),
        "busy_verdicts": sum(len(r.get("busy_verdicts") or []) for r in rows),
        "jobs_with_busy_verdicts": sum(bool(r.get("busy_verdicts")) for r in rows),
    }


def main():
    if sys.argv[1:2] == ["--reanalyse"]:
        ap = argparse.ArgumentParser(description="recompute the verdicts of a results "
                                     "file's jobs and print them")
        ap.add_argument("--reanalyse", metavar="FILE", required=True)
        reanalyse(ap.parse_args().reanalyse)
        return
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    steady.add_link_args(ap)
    ap.add_argument("--models", default="demo,exported-gpt")
    ap.add_argument("--conditions", default="quiet,cpu-hog,flaps")
    ap.add_argument("--jobs", type=int, default=5, help="jobs per model and condition")
    ap.add_argument("--steps", type=int, default=160)
    ap.add_argument("--settle-steps", type=int, default=15)
    ap.add_argument("--remeasure-mode", choices=("blocks", "rounds"), default="blocks")
    ap.add_argument("--remeasure-block-steps", type=int, default=4)
    ap.add_argument("--remeasure-pairs", type=int, default=8)
    ap.add_argument("--remeasure-rounds", type=int, default=4)
    ap.add_argument("--remeasure-steps", type=int, default=10)
    ap.add_argument("--discard", type=int, default=3)
    ap.add_argument("--job-timeout-s", type=float, default=900)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    for c in a.conditions.split(","):
        if c not in ("quiet", "cpu-hog", "flaps"):
            sys.exit(f"--conditions: unknown condition '{c}' (quiet, cpu-hog, flaps)")
    sys.path.insert(0, os.path.join(ROOT, "client", "python"))
    import tandem  # the Python client

    os.makedirs(a.workdir, exist_ok=True)
    specs = model_specs(a)
    summaries = []
    n = 0
    for model, spec in specs.items():
        for condition in a.conditions.split(","):
            rows = []
            for j in range(a.jobs):
                n += 1
                workdir = os.path.join(a.workdir, f"{model}-{condition}-{j}")
                log(f"{model}, {condition}, job {j + 1} of {a.jobs}")
                run = run_job(a, spec, condition, workdir, a.seed * 1000 + n, tandem)
                if a.remeasure_mode == "blocks":
                    pairs, reps = remeasure_blocks(a, spec, run["texts"], workdir,
                                                   end_version(run["per_step"]))
                    remeasured = ("blocks", pairs)
                else:
                    rounds, reps = remeasure(a, spec, run["texts"], workdir)
                    remeasured = ("rounds", rounds)
                row = analyse(a, run, remeasured, reps)
                row.update(model=model, condition=condition, rate_mbit=a.rate_mbit)
                rows.append(row)
                with open(a.out, "a") as f:
                    f.write(json.dumps(row, sort_keys=True) + "\n")
                log(json.dumps(row, sort_keys=True))
            s = summarize(model, condition, rows)
            s["rate_mbit"] = a.rate_mbit
            summaries.append(s)
            with open(a.out, "a") as f:
                f.write(json.dumps(s, sort_keys=True) + "\n")
    for s in summaries:
        print(json.dumps(s, sort_keys=True))


if __name__ == "__main__":
    main()
