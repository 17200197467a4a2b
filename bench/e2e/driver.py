#!/usr/bin/python3
"""bench/e2e's driver for one link rate: every contender on every model, side
by side, over the namespaces and the shaped link that run.sh set up.

Called by run.sh (which owns the namespaces, the veth pair and tc); appends
JSON lines to --out. Per model:
  1. setup: Tandem at world 1 and PyTorch at world 1, a few steps, for the
     sizes alone (Tandem's counted world-1 peak gives DDP's footprint and so
     the two budgets; PyTorch's the params and DDP's buckets);
  2. warm-up: Tandem under the on-demand baseline on the link, with
     --profile-out (8 steps: the profile is the medians of the last 7);
  3. each contender's schedule, per budget: the reference policies
     (on-demand, deepspeed-zero3, fsdp, deepcompile) and Tandem's own
     pipeline alone ("tandem-passes": its passes, without the choice among
     the references' plans) planned by tandem-plan from the warm-up profile
     (the budget-aware ones re-planned after a probe run that exceeded the
     budget or tripped the memory guard); Tandem's ("tandem") from a real
     job: a coordinator on the link, the job submitted as a user submits it,
     two agent-mode workers, run until its loop (profile, plan, trials,
     rollbacks) settles, the schedule it settled on fetched from the
     coordinator (bench/e2e/coordinator_job.py);
  4. the rounds: --rounds times, every contender once (compute alone at
     world 1 for Tandem and PyTorch, PyTorch DDP on the link, each schedule
     on the link), the order rotated by one each round; a contender's row
     is the median over rounds of its per-round median step, with the
     min-max over rounds and every round's value;
  4b. where Tandem's best reference at a budget is a plan on Tandem's
     runtime (not DDP) and not Tandem's own plan: the two plans alternate in
     one run on the link (--paired-pairs block pairs of
     --paired-block-steps steps, each block's first step left out), and
     Tandem over the reference is their geometric mean with a 95% interval
     as the coordinator computes it (steady.paired_ratio: a bootstrap
     widened to Student's t where that is wider; the row's "paired"), and
     the row's never-behind verdict rests on it: three short rounds a side resolve
     about 5% on a 2-core host, block pairs seconds apart resolve 1-2%;
  4c. Tandem's plan against PyTorch DDP at the large budget (DDP's
     footprint), pair by pair: each round's two runs are a pair, and
     --ddp-pairs more pairs run back to back (DDP first, then Tandem first,
     in turn). Tandem/DDP is the geometric mean of the pairs' ratios of
     medians with its 95% interval (steady.paired_ratio; the row's
     "ddp_paired"), which decides the row's Tandem/DDP target: the two
     programs cannot alternate in one run, and three rounds a side do not
     resolve the 5% that separates them on wide-short (12-03f read 1.02
     where three runs before it read 0.94-0.96);
  5. communication alone, once per schedule (tandem-comm-replay) and for
     DDP's all-reduces: the rows' lower bounds.
"""

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(HERE)), "bench", "drift"))
import report  # noqa: E402  (bench/e2e/report.py: the best reference, the targets)
import steady  # noqa: E402  (bench/drift/steady.py: block pairs, paired ratios)

# The reference policies, planned by tandem-plan and run on Tandem's
# runtime (report.POLICIES); the best reference is chosen among them and
# PyTorch DDP (report.REFERENCES).
POLICIES = report.POLICIES
# Tandem's own pipeline for ZeRO-3 jobs (PolicyPasses(kTandem) in
# coordinator/planner/planner.cc; coordinator/README.md, "Policies and
# pipelines"). tandem-plan has no flag for "the tandem policy without the
# choice among the references' plans"; --passes with this list plans it
# (Plan() compares the references only for --policy tandem without passes).
TANDEM_PASSES = ["zero3-insert", "micro-batch-reduce", "offload", "prefetch",
                 "offload-unshard-search"]
# The contenders on Tandem's runtime at each budget, in round order.
RUNTIME_CONTENDERS = POLICIES + ["tandem-passes", "tandem"]
# Re-planned when a run exceeds the budget or trips the memory guard (what
# the coordinator does for Tandem's pipeline; DeepCompile's greedy rules are
# budget-aware too). The others run as planned.
BUDGET_AWARE = ("deepcompile", "tandem-passes")

# name -> architecture and per-rank batch. tiny: compute ~ communication at
# 2 Gbit/s; short: a similar param count with 1/8 of the tokens and half the
# layers, so communication dominates at every rate.
MODELS = {
    "tiny-llama": dict(layers=4, d_model=256, heads=8, kv_heads=8, ffn=704,
                       vocab=4096, seq_len=128, micro_batch=4),
    "wide-short": dict(layers=2, d_model=320, heads=5, kv_heads=5, ffn=896,
                       vocab=4096, seq_len=64, micro_batch=2),
    # A user's nn.Module, exported with `tandem export` (issue 12): the GPT
    # of tests/models/gpt.py at the demo's size (4 blocks of width 256,
    # tied embeddings, 4096 tokens); DDP trains the same module.
    "exported-gpt": dict(export="tests/models/gpt.py:build_demo", vocab=4096,
                         seq_len=128, micro_batch=4),
}


def log(msg):
    print(f"[e2e {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# -- selection: pure functions (tests/unit/bench/test_e2e_driver.py) ---------

def round_order(names, rounds, rotate=True):
    """The run order of each round: every contender once per round, rounds
    interleaved (A B C, B C A, C A B, ...: rotated by one each round so no
    contender always runs first or right after the same one), or the same
    order every round (rotate=False)."""
    n = len(names)
    return [[names[(r + i) % n] for i in range(n)] if rotate and n else list(names)
            for r in range(rounds)]


def over_rounds(per_round):
    """A contender's figures over its rounds. `per_round`: one entry per
    round, the run's statistics ({"step_s": the run's median step, ...}) or
    {"error": ...} when it failed. step_s is the median over rounds of the
    per-round medians (every round counts alike: never the best of them),
    step_min_s/step_max_s the min-max over rounds, round_step_s each
    round's value (None where it failed)."""
    ok = [s for s in per_round if s.get("step_s") is not None]
    out = dict(rounds=len(per_round), rounds_ok=len(ok),
               round_step_s=[s.get("step_s") for s in per_round])
    errors = [f"round {i + 1}: {s['error']}" for i, s in enumerate(per_round) if s.get("error")]
    if errors:
        out["round_errors"] = errors
    if not ok:
        out.update(step_s=None, error=errors[0] if errors else "not run")
        return out
    meds = [s["step_s"] for s in ok]
    out.update(step_s=statistics.median(meds), step_min_s=min(meds), step_max_s=max(meds))
    for key in ("exposed_comm_s", "memory_hold_s", "step_rel_mad"):
        vals = [s[key] for s in ok if s.get(key) is not None]
        if vals:
            out[key] = statistics.median(vals)
    if any("steps_min_s" in s for s in ok):
        out["steps_min_s"] = min(s["steps_min_s"] for s in ok if "steps_min_s" in s)
        out["steps_max_s"] = max(s["steps_max_s"] for s in ok if "steps_max_s" in s)
    peaks = [s["peak_bytes"] for s in ok if s.get("peak_bytes") is not None]
    if peaks:
        out["peak_bytes"] = max(peaks)
    out["steps"] = sum(s.get("steps", 0) for s in ok)
    out["fallback_steps"] = sum(s.get("fallback_steps", 0) for s in ok)
    return out


def prediction_error(predicted, measured):
    """predicted / measured - 1; None without both."""
    if not predicted or not measured:
        return None
    return predicted / measured - 1


def tandem_fields(job, step_s):
    """The Tandem row's plan fields, from the coordinator job's summary
    (coordinator_job.py) and the row's median over rounds `step_s`: which
    plan the loop settled on (version, reason, source: Tandem's own pipeline
    or which reference's), the first plan's prediction next to its own first
    measurement (the job's steps under it), and the final plan's prediction
    made before it ran, against the rounds. Never a prediction fitted to the
    measurement it is compared with: a rollback's published prediction is
    what it measured, and coordinator_job.py reports the prediction of the
    version it reran instead."""
    out = {k: job.get(k) for k in (
        "job_id", "settled", "settle_note", "job_steps", "final_version", "final_reason",
        "final_passes", "final_planned_version", "final_job_measured_s", "first_version",
        "first_source", "first_predicted_s", "first_measured_s",
        "first_window_measured_s", "versions")}
    out["plan_source"] = job.get("final_source")
    out["predicted_s"] = job.get("final_predicted_s")
    out["prediction_error"] = prediction_error(out["predicted_s"], step_s)
    out["first_prediction_error"] = prediction_error(job.get("first_predicted_s"),
                                                     job.get("first_measured_s"))
    out["first_window_prediction_error"] = prediction_error(
        job.get("first_predicted_s"), job.get("first_window_measured_s"))
    out["first_is_final"] = (job.get("first_version") is not None and
                             job.get("first_version") == job.get("final_planned_version"))
    return out


def schedule_body(text):
    """What a schedule does, without what only describes it: comments, the
    predictions, the provenance, the explanation and its decisions, and the
    header's version and budget (a schedule fetched from a job is v3 where
    the same plan from tandem-plan is v0)."""
    body = []
    for line in text.splitlines():
        s = line.strip()
        if not s or s.startswith("#"):
            continue
        word = s.split(None, 1)[0]
        if word in ("predict", "provenance", "explain", "decision", "trial"):
            continue
        if word == "schedule":
            s = " ".join(t for t in s.split()[2:] if not t.startswith("budget="))
            s = "schedule " + s
        body.append(s)
    return body


def same_actions(a, b):
    """Whether two schedule files hold the same schedule, apart from what
    describes it (schedule_body)."""
    with open(a) as fa, open(b) as fb:
        return schedule_body(fa.read()) == schedule_body(fb.read())


def paired_reference(rows):
    """The reference a Tandem row is checked against in alternating blocks:
    `rows` {contender: row} at one budget, after the rounds. The best
    reference as report.py picks it (report.best_reference), when it is a
    policy (a plan on Tandem's runtime, so the two can alternate in one
    run; DDP cannot), has a schedule and is not Tandem's own plan. None
    otherwise: the rounds alone decide that row."""
    t = rows.get("tandem", {})
    if not t.get("step_s") or not t.get("sched"):
        return None
    best = report.best_reference(rows)
    if best is None:
        return None
    name, ref = best
    if name not in POLICIES or not ref.get("sched") or name in t.get("same_plan_as", []):
        return None
    return name


def ddp_paired(tandem_runs, ddp_runs, rounds):
    """Tandem against DDP over pairs of runs: `tandem_runs[i]` and
    `ddp_runs[i]` are pair i's step times (the slower rank's per measured
    step; None or empty where the run failed), the first `rounds` pairs
    from the interleaved rounds, the rest run back to back. Returns the row's
    "ddp_paired": the geometric mean of the pairs' ratios of medians with
    its 95% interval (steady.paired_ratio), and how many pairs of each kind
    counted, with each pair's medians (tandem_s, ddp_s); or {"error": ...}
    with fewer than two complete pairs."""
    pairs = [(i, t, d) for i, (t, d) in enumerate(zip(tandem_runs, ddp_runs)) if t and d]
    if len(pairs) < 2:
        return dict(error=f"{len(pairs)} complete pair(s) of runs of "
                          f"{len(tandem_runs)}: too few for an interval")
    ratio, low, high = steady.paired_ratio([t for _, t, _ in pairs], [d for _, _, d in pairs])
    return dict(ratio=ratio, low=low, high=high, pairs=len(pairs),
                round_pairs=sum(1 for i, _, _ in pairs if i < rounds),
                extra_pairs=sum(1 for i, _, _ in pairs if i >= rounds),
                tandem_s=[statistics.median(t) if t else None for t in tandem_runs],
                ddp_s=[statistics.median(d) if d else None for d in ddp_runs])


class Bench:
    def __init__(self, a):
        self.a = a
        self.root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        b = a.build
        self.worker = os.path.join(b, "worker", "tandem-worker")
        self.plan_bin = os.path.join(b, "coordinator", "tandem-plan")
        self.replay = os.path.join(b, "bench", "tandem-comm-replay")
        self.ddp = os.path.join(self.root, "bench", "e2e", "ddp_reference.py")
        self.port = 30000 + (a.rate % 1000) * 20
        self.runs = 0  # raw outputs: workdir/run<rate>-<n>.log
        self.env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
        os.makedirs(a.workdir, exist_ok=True)

    def next_port(self):
        self.port += 1
        return self.port

    def emit(self, row):
        row = dict(row, rate_mbit=self.a.rate)
        with open(self.a.out, "a") as f:
            f.write(json.dumps(row, sort_keys=True) + "\n")
        log("row " + json.dumps(row, sort_keys=True))

    # -- process helpers ---------------------------------------------------

    def run_local(self, cmd, timeout):
        p = subprocess.run(cmd, env=self.env, capture_output=True, text=True, timeout=timeout)
        if p.returncode != 0:
            raise RuntimeError(f"{cmd[0]} failed ({p.returncode}): {p.stderr.strip()[-600:]}")
        return p.stdout

    def run_schedule(self, spec, sched, discard):
        """Both ranks train `spec` under the schedule file `sched` on the
        link; the steps' statistics (worker_stats)."""
        outs = self.run_pair(
            lambda r, rv: [self.worker, "--standalone", "--spec", spec, "--rank",
                           str(r), "--world", "2", "--rendezvous", rv,
                           "--threads", "1", "--schedule", sched], 900)
        return self.worker_stats(outs, discard)

    def run_alternating(self, name, m, budget_bytes, first, other):
        """Both ranks on the link, `other`'s schedule and `first`'s taking
        turns in blocks (steady.block_pairs); {step: (the slower rank's
        iteration_s, the schedule version it ran)}."""
        a = self.a
        steps = 1 + 2 * a.paired_block_steps * a.paired_pairs
        spec = self.spec(name, m, 2, steps, budget_bytes)
        outs = self.run_pair(
            lambda r, rv: [self.worker, "--standalone", "--spec", spec, "--rank", str(r),
                           "--world", "2", "--rendezvous", rv, "--threads", "1",
                           "--schedule", first, "--alternate", other,
                           f"--block-steps={a.paired_block_steps}"], 1800)
        got = {}
        for o in outs:
            for s in self.steps_of(o):
                t, _ = got.get(s["step"], (0.0, None))
                got[s["step"]] = (max(t, s["iteration_s"]), s["schedule_version"])
        return got

    def run_pair(self, make_cmd, timeout):
        """Rank 0 in ns0, rank 1 in ns1; returns both stdouts. make_cmd(rank,
        rendezvous) -> argv. On any failure both are killed (by pid)."""
        a = self.a
        rv = f"{a.ip0}:{self.next_port()}"
        procs = []
        for r, (ns, ifname) in enumerate([(a.ns0, a.if0), (a.ns1, a.if1)]):
            env = dict(self.env, GLOO_SOCKET_IFNAME=ifname)
            cmd = ["ip", "netns", "exec", ns] + make_cmd(r, rv)
            procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE,
                                          stderr=subprocess.PIPE, text=True))
            if r == 0:
                time.sleep(0.2)  # let rank 0 listen first
        deadline = time.time() + timeout
        outs, errs, failed = [None, None], [None, None], None
        try:
            for r, p in enumerate(procs):
                left = max(1.0, deadline - time.time())
                outs[r], errs[r] = p.communicate(timeout=left)
                if p.returncode != 0 and failed is None:
                    failed = f"rank {r} exit {p.returncode}: {errs[r].strip()[-600:]}"
                    for q in procs:
                        if q.poll() is None:
                            q.kill()
        except subprocess.TimeoutExpired:
            failed = f"timed out after {timeout} s"
        finally:
            for q in procs:
                if q.poll() is None:
                    q.kill()
                    q.wait()
        self.runs += 1
        with open(os.path.join(a.workdir, f"run{a.rate}-{self.runs:03d}.log"), "w") as f:
            f.write(" ".join(make_cmd(0, rv)) + "\n")
            for r in range(2):
                f.write(f"--- rank {r} stdout\n{outs[r] or ''}--- rank {r} stderr\n{errs[r] or ''}")
        if failed:
            # The rank that broke the budget says so; its peer only sees the
            # connection close.
            for r in range(2):
                if errs[r] and "exceeds memory.budget_bytes" in errs[r]:
                    line = next(l for l in reversed(errs[r].splitlines())
                                if "exceeds memory.budget_bytes" in l)
                    failed = f"rank {r}: {line.strip()[-600:]}"
            raise RuntimeError(failed)
        return outs

    # -- pieces --------------------------------------------------------------

    def archive(self, name, m):
        """The model archive of an exported model, written once per run."""
        path = os.path.join(self.a.workdir, f"{name}.tandem")
        if not os.path.exists(path):
            log(f"{name}: tandem export {m['export']}")
            env = dict(self.env, PYTHONPATH=os.path.join(self.root, "client", "python"))
            subprocess.run(["/usr/bin/python3", "-m", "tandem", "export", m["export"],
                            "-o", path], cwd=self.root, env=env, check=True,
                           stdout=subprocess.DEVNULL)
        return path

    def graph_file(self, name):
        """An exported model's iteration graph at world 2, as its rank 0
        derived it (--graph-out of the warm-up run): tandem-plan's input."""
        return os.path.join(self.a.workdir, f"{name}.graph")

    def spec(self, name, m, world, steps, budget, tag=""):
        path = os.path.join(self.a.workdir, f"{name}{tag}-w{world}-s{steps}-b{budget}.yaml")
        if "export" in m:
            model = (f"{{kind: torchscript, path: {self.archive(name, m)}, "
                     f"vocab: {m['vocab']}}}")
        else:
            model = (f"{{preset: llama, layers: {m['layers']}, d_model: {m['d_model']}, "
                     f"heads: {m['heads']}, kv_heads: {m['kv_heads']}, ffn: {m['ffn']}, "
                     f"vocab: {m['vocab']}}}")
        with open(path, "w") as f:
            f.write(f"""name: {name}
model: {model}
data: {{kind: synthetic, seed: 1}}
batch: {{micro_batch: {m['micro_batch']}, seq_len: {m['seq_len']}}}
train: {{steps: {steps}, lr: 1.0e-3, seed: 1, grad_clip: 1.0}}
parallel: {{world_size: {world}, zero_stage: 3}}
memory: {{budget_bytes: {budget}}}
""")
            if self.a.comm:
                f.write(f"comm: {{{self.a.comm}}}\n")
        return path

    def model_text(self, m, world=2):
        return (f"arch=llama layers={m['layers']} d_model={m['d_model']} heads={m['heads']} "
                f"kv_heads={m['kv_heads']} ffn={m['ffn']} vocab={m['vocab']} world={world} "
                f"micro_batch={m['micro_batch']} seq_len={m['seq_len']}")

    def ddp_args(self, m):
        if "export" in m:
            return ["--module", os.path.join(self.root, m["export"]),
                    "--vocab", str(m["vocab"]), "--seq-len", str(m["seq_len"]),
                    "--micro-batch", str(m["micro_batch"])]
        return ["--layers", str(m["layers"]), "--d-model", str(m["d_model"]),
                "--heads", str(m["heads"]), "--kv-heads", str(m["kv_heads"]),
                "--ffn", str(m["ffn"]), "--vocab", str(m["vocab"]),
                "--seq-len", str(m["seq_len"]), "--micro-batch", str(m["micro_batch"])]

    @staticmethod
    def steps_of(text):
        return [json.loads(l) for l in text.splitlines() if l.startswith("{\"step\"")]

    def worker_stats(self, outs, discard):
        """Per step the slower rank's iteration; medians over measured steps."""
        per_rank = [self.steps_of(o)[discard:] for o in outs]
        n = min(len(s) for s in per_rank)
        if n == 0:
            raise RuntimeError("no measured steps")
        it = [max(s[i]["iteration_s"] for s in per_rank) for i in range(n)]
        ex = [max(s[i]["exposed_comm_s"] for s in per_rank) for i in range(n)]
        # The memory hold's waits (worker/README.md, "Memory guard"), part
        # of exposed_comm_s.
        hold = [max(s[i].get("memory_hold_s", 0) for s in per_rank) for i in range(n)]
        peak = max(s[i]["peak_bytes"] for s in per_rank for i in range(n))
        # Steps the memory guard ran on the least-memory schedule (version
        # -1) instead of the planned one: the plan came within the guard
        # band of the budget, so such steps measure the fallback.
        fallback = sum(1 for i in range(n)
                       if any(s[i].get("schedule_version") == -1 for s in per_rank))
        # Every step's peak (the larger rank's) under the planned schedule,
        # warm-up included: what the coordinator sees before a guard trip.
        every = [self.steps_of(o) for o in outs]
        planned_peaks = [max(s[i]["peak_bytes"] for s in every)
                         for i in range(min(len(s) for s in every))
                         if all(s[i].get("schedule_version") != -1 for s in every)]
        med = statistics.median(it)
        return dict(step_s=med, steps_min_s=min(it), steps_max_s=max(it),
                    step_rel_mad=statistics.median(abs(t - med) for t in it) / med,
                    exposed_comm_s=statistics.median(ex), peak_bytes=peak, steps=n,
                    step_times=it,
                    memory_hold_s=statistics.median(hold),
                    fallback_steps=fallback, planned_peaks=planned_peaks,
                    guard_tripped=len(planned_peaks) < min(len(s) for s in every))

    def plan(self, m, profile, policy, budget, schedule_out, headroom=0, passes=None):
        """tandem-plan from the warm-up profile: `policy`'s plan, or with
        `passes` that pipeline's (planned like Tandem's, without the choice
        among the references' plans). Writes the schedule; returns its
        predictions."""
        model = (["--graph", self.graph_file(m["name"])] if "export" in m
                 else ["--model", self.model_text(m)])
        cmd = [self.plan_bin] + model + ["--profile", profile, "--hw", "memory=64GiB"]
        cmd += ["--passes", ",".join(passes)] if passes else ["--policy", policy]
        if budget > 0:
            cmd += ["--budget", str(budget)]
        if headroom > 0:
            cmd += ["--headroom", str(headroom)]
        out = self.run_local(cmd, 120)
        sched, _, pred = out.partition("# predictions")
        with open(schedule_out, "w") as f:
            f.write(sched)
        vals = dict(re.findall(r"^(\w+)\s+([-0-9.e]+)\s*$", pred, re.M))
        peak = re.search(r"^peak .*?\((\d+) B\)", pred, re.M)
        return dict(predicted_s=float(vals["iteration_s"]),
                    unmodeled_bytes=int(float(vals.get("unmodeled_bytes", 0))),
                    predicted_exposed_comm_s=float(vals["exposed_comm_s"]),
                    predicted_comm_s=float(vals["comm_s"]),
                    predicted_peak_bytes=int(peak.group(1)) if peak else None,
                    plan_over_budget="OVER BUDGET" in pred)

    # -- one run of each kind (a round's entries) ------------------------------

    def run_compute_alone(self, spec1, discard):
        """Tandem at world 1: the per-rank batch, no communication."""
        out = self.run_local([self.worker, "--standalone", "--spec", spec1, "--rank", "0",
                              "--world", "1", "--rendezvous", f"127.0.0.1:{self.next_port()}",
                              "--threads", "1"], 600)
        return self.worker_stats([out], discard)

    def run_ddp_compute_alone(self, m, steps, discard):
        """PyTorch at world 1 (no DDP): PyTorch's compute alone."""
        out = self.run_local(["/usr/bin/python3", self.ddp, "--world", "1", "--steps", str(steps),
                              "--warmup", str(discard)] + self.ddp_args(m), 600)
        st = [json.loads(l)["step_s"] for l in out.splitlines() if l.startswith("{\"step\"")]
        if not st:
            raise RuntimeError("no measured steps")
        return dict(step_s=statistics.median(st), steps_min_s=min(st), steps_max_s=max(st),
                    steps=len(st))

    def run_ddp(self, m, steps, discard):
        """PyTorch DDP on the link: per step the slower rank's time."""
        outs = self.run_pair(lambda r, rv: ["/usr/bin/python3", self.ddp, "--rank", str(r),
                                            "--world", "2", "--master", rv, "--steps", str(steps),
                                            "--warmup", str(discard)] + self.ddp_args(m), 900)
        per_rank = [[json.loads(l) for l in o.splitlines() if l.startswith("{\"step\"")]
                    for o in outs]
        n = min(len(s) for s in per_rank)
        if n == 0:
            raise RuntimeError("no measured steps")
        st = [max(s[i]["step_s"] for s in per_rank) for i in range(n)]
        return dict(step_s=statistics.median(st), steps_min_s=min(st), steps_max_s=max(st),
                    steps=n, step_times=st)

    # -- obtaining each contender's schedule -----------------------------------

    def setup(self, name, m):
        """The budgets (fixed by the first rate's run) and the model's sizes,
        from a few steps at world 1: Tandem's counted peak with full params,
        grads, both AdamW moments and activations, plus DDP's gradient
        buckets (a copy of the grads in torch 1.13's default) is DDP's
        per-rank footprint, the large budget; 60% of it the small one."""
        budgets_file = os.path.join(self.a.workdir, f"{name}.budgets.json")
        if os.path.exists(budgets_file):
            return json.load(open(budgets_file))
        log(f"{name}: sizes at world 1")
        c1 = self.run_compute_alone(self.spec(name, m, 1, self.a.discard + 1, 0), self.a.discard)
        out = self.run_local(["/usr/bin/python3", self.ddp, "--world", "1", "--steps", "1",
                              "--warmup", "1"] + self.ddp_args(m), 600)
        ddp1 = json.loads(out.strip().splitlines()[-1])
        large = c1["peak_bytes"] + ddp1["bucket_bytes"]
        budgets = dict(large=large, small=int(0.6 * large), world1_peak_bytes=c1["peak_bytes"],
                       params=ddp1["params"], model_state_bytes=ddp1["model_state_bytes"],
                       bucket_bytes=ddp1["bucket_bytes"])
        json.dump(budgets, open(budgets_file, "w"))
        return budgets

    def plan_contender(self, m, profile, contender, spec_probe, bbytes, sched, tag):
        """A reference policy's or Tandem's pipeline's schedule at budget
        `bbytes`, written to `sched`; returns the plan's fields. The
        budget-aware ones (BUDGET_AWARE) run a probe on the link and
        re-plan when it exceeded the budget (the planner's budget lowered by
        the overshoot, as the coordinator does on a memory drift) or
        tripped the memory guard (keeping free what the plan's peaks went
        over its prediction plus their spread: the coordinator's
        GuardHeadroom, coordinator/planner/planner.h), up to 3 times, and
        fall back to the least-memory plan when the planner says nothing
        smaller fits. The probe's steps are not measurements: every
        contender is measured in the rounds alike."""
        passes = TANDEM_PASSES if contender == "tandem-passes" else None
        budget_aware = contender in BUDGET_AWARE
        attempts = 4 if budget_aware else 1
        plan_budget, headroom = bbytes, 0
        row = {}
        for attempt in range(attempts):
            try:
                row.update(self.plan(m, profile, contender, plan_budget, sched,
                                     headroom=headroom, passes=passes),
                           planner_budget_bytes=plan_budget, replans=attempt,
                           headroom_bytes=headroom)
                row.pop("error", None)
            except RuntimeError as e:
                row.update(error=f"planning failed: {e}", predicted_s=None)
                # Lowered below what any plan needs: plan the least-memory
                # one instead (every state offloaded).
                least = re.search(r"smallest feasible budget is [^(]*\((\d+) B\)", str(e))
                if least and int(least.group(1)) > plan_budget and attempt + 1 < attempts:
                    plan_budget = int(least.group(1))
                    continue
                break
            if not budget_aware:
                break
            try:
                stats = self.run_schedule(spec_probe, sched, self.a.discard)
            except RuntimeError as e:
                over = re.search(r"peak memory (\d+) B exceeds memory.budget_bytes (\d+)", str(e))
                if not over or attempt + 1 == attempts:
                    row["probe_error"] = str(e)
                    break
                plan_budget -= int(over.group(1)) - int(over.group(2)) + (1 << 20)
                log(f"{tag}: {contender} over budget by {int(over.group(1)) - bbytes} B; "
                    f"re-planning at {plan_budget} B")
                continue
            peaks = stats["planned_peaks"]
            grown = headroom
            if peaks:
                over = max(0, max(peaks) - (row["predicted_peak_bytes"] or 0))
                grown = max(headroom, over + max(peaks) - min(peaks))
            # A plan over the budget by its own prediction gains nothing
            # from more headroom.
            if stats["guard_tripped"] and grown > headroom and attempt + 1 < attempts:
                headroom = grown
                log(f"{tag}: {contender} tripped the memory guard (peaks {min(peaks)}-"
                    f"{max(peaks)} B, predicted {row['predicted_peak_bytes']} B); "
                    f"re-planning with {headroom} B more headroom")
                continue
            break
        return row

    def coordinator_job(self, name, m, bname, bbytes, sched):
        """Tandem's loop on the link as a user runs it (coordinator_job.py,
        in ns0): the schedule it settled on is written to `sched`; returns
        the job's summary."""
        a = self.a
        spec = self.spec(name, m, 2, a.job_max_steps + 50, bbytes, tag="-job")
        jobdir = os.path.join(a.workdir, f"job-{name}-{a.rate}-{bname}")
        shutil.rmtree(jobdir, ignore_errors=True)
        cmd = ["ip", "netns", "exec", a.ns0, "/usr/bin/python3",
               os.path.join(self.root, "bench", "e2e", "coordinator_job.py"),
               "--build", a.build, "--workdir", jobdir, "--spec", spec, "--schedule-out", sched,
               "--ns1", a.ns1, "--if0", a.if0, "--if1", a.if1, "--ip0", a.ip0, "--ip1", a.ip1,
               "--settle-steps", str(a.settle_steps), "--max-steps", str(a.job_max_steps),
               "--timeout-s", str(a.job_timeout_s)]
        p = subprocess.run(cmd, env=self.env, capture_output=True, text=True,
                           timeout=a.job_timeout_s + 120)
        with open(os.path.join(jobdir, "coordinator_job.log"), "w") as f:
            f.write(" ".join(cmd) + "\n" + p.stderr)
        if p.returncode != 0 or not p.stdout.strip():
            raise RuntimeError(f"coordinator job failed ({p.returncode}): "
                               f"{p.stderr.strip()[-600:]}")
        return json.loads(p.stdout.strip().splitlines()[-1])

    # -- the job against the same plan run alone, over time -----------------

    def long_run(self, name, m):
        """Tells the link and a long-running worker from the loop (issue 33:
        the job ran its plans slower than the rounds' short runs, by more as
        the job went on, at 200 Mbit/s only): Tandem's job at the large
        budget, then the plan it settled on run alone, as the rounds run it
        but for --long-run steps in one pair of processes. Emits one row:
        both runs' step time and exposed communication by thirds of the
        steps (the slower rank per step; the job's steps of its final
        version only)."""
        a = self.a
        tag = f"{name}-{a.rate}"
        budgets = self.setup(name, m)
        bbytes = budgets["large"]
        sched = os.path.join(a.workdir, f"{tag}-large-long.sched")
        log(f"{tag}: tandem's job at the large budget ({bbytes} B)")
        job = self.coordinator_job(name, m, "large", bbytes, sched)
        final = job.get("final_version")
        jobdir = os.path.join(a.workdir, f"job-{name}-{a.rate}-large")
        per_rank = []
        for r in range(2):
            with open(os.path.join(jobdir, f"worker{r}.jsonl")) as f:
                per_rank.append({s["step"]: s for s in self.steps_of(f.read())})
        job_steps = [(max(pr[k]["iteration_s"] for pr in per_rank),
                      max(pr[k]["exposed_comm_s"] for pr in per_rank))
                     for k in sorted(set(per_rank[0]) & set(per_rank[1]))
                     if all(pr[k].get("schedule_version") == final for pr in per_rank)]
        log(f"{tag}: v{final}'s plan alone for {a.long_run} steps")
        spec = self.spec(name, m, 2, a.discard + a.long_run, bbytes)
        outs = self.run_pair(
            lambda r, rv: [self.worker, "--standalone", "--spec", spec, "--rank", str(r),
                           "--world", "2", "--rendezvous", rv, "--threads", "1",
                           "--schedule", sched], 1800)
        alone = [self.steps_of(o)[a.discard:] for o in outs]
        n = min(len(x) for x in alone)
        alone_steps = [(max(x[i]["iteration_s"] for x in alone),
                        max(x[i]["exposed_comm_s"] for x in alone)) for i in range(n)]

        def thirds(series):
            k = len(series) // 3
            parts = [series[:k], series[k:2 * k], series[2 * k:]] if k else []
            return [dict(steps=len(p), step_s=statistics.median(t for t, _ in p),
                         exposed_comm_s=statistics.median(e for _, e in p)) for p in parts]

        self.emit(dict(model=name, contender="long-run", budget="large", budget_bytes=bbytes,
                       final_version=final, job_thirds=thirds(job_steps),
                       alone_thirds=thirds(alone_steps), job_steps=len(job_steps),
                       alone_steps=len(alone_steps)))

    # -- one model -----------------------------------------------------------

    def model(self, name, m):
        a = self.a
        wd = a.workdir
        tag = f"{name}-{a.rate}"
        discard, steps = a.discard, a.steps

        # 1. sizes and budgets.
        budgets = self.setup(name, m)
        common = dict(model=name, params=budgets["params"], rounds_planned=a.rounds)

        # 2. warm-up profile under on-demand, on the link.
        log(f"{tag}: warm-up profile (on-demand)")
        specw = self.spec(name, m, 2, a.profile_steps, 0)
        prof = os.path.join(wd, f"{tag}.profile")
        outs = self.run_pair(lambda r, rv: [self.worker, "--standalone", "--spec", specw,
                                            "--rank", str(r), "--world", "2", "--rendezvous", rv,
                                            "--threads", "1", "--profile-out", f"{prof}.rank{r}",
                                            "--graph-out", self.graph_file(name) + f".rank{r}"],
                             900)
        shutil.copyfile(self.graph_file(name) + ".rank0", self.graph_file(name))
        warm = self.worker_stats(outs, 1)
        profile = f"{prof}.rank0"
        od = self.plan(m, profile, "on-demand", 0, os.path.join(wd, f"{tag}-od.sched"))
        log(f"{tag}: on-demand measured peak {warm['peak_bytes']} B; the planner counts "
            f"{od.get('unmodeled_bytes', 0)} B beyond its model")

        # 3. each contender's schedule.
        spec1 = self.spec(name, m, 1, discard + steps, 0)
        contenders = {}  # key -> dict(row=..., run=callable or None)
        contenders["compute-alone"] = dict(
            row=dict(common, contender="compute-alone", budget="-"),
            run=lambda: self.run_compute_alone(spec1, discard))
        contenders["compute-alone-ddp"] = dict(
            row=dict(common, contender="compute-alone-ddp", budget="-"),
            run=lambda: self.run_ddp_compute_alone(m, steps, discard))
        contenders["ddp"] = dict(
            row=dict(common, contender="ddp", budget="large", budget_bytes=budgets["large"],
                     peak_bytes=budgets["model_state_bytes"], footprint_bytes=budgets["large"]),
            run=lambda: self.run_ddp(m, steps, discard))
        for bname in ["large", "small"]:
            bbytes = budgets[bname]
            spec = self.spec(name, m, 2, discard + steps, bbytes)
            spec_probe = self.spec(name, m, 2, discard + min(steps, a.probe_steps), bbytes)
            for contender in RUNTIME_CONTENDERS:
                sched = os.path.join(wd, f"{tag}-{bname}-{contender}.sched")
                if os.path.exists(sched):
                    os.remove(sched)  # an earlier run's
                row = dict(common, contender=contender, budget=bname, budget_bytes=bbytes)
                if contender == "tandem":
                    log(f"{tag}: tandem at the {bname} budget ({bbytes} B): a coordinator job")
                    try:
                        job = self.coordinator_job(name, m, bname, bbytes, sched)
                        row["job"] = job
                        log(f"{tag}: tandem's loop: {job.get('settle_note')}; final "
                            f"v{job.get('final_version')} ({job.get('final_reason')}, "
                            f"{job.get('final_source')}'s plan)")
                    except (RuntimeError, subprocess.TimeoutExpired) as e:
                        row["error"] = f"coordinator job: {e}"
                else:
                    log(f"{tag}: planning {contender} at the {bname} budget ({bbytes} B)")
                    row.update(self.plan_contender(m, profile, contender, spec_probe, bbytes,
                                                   sched, tag))
                runnable = "error" not in row and os.path.exists(sched)
                contenders[f"{bname}/{contender}"] = dict(
                    row=row, sched=sched if runnable else None,
                    run=(lambda spec=spec, sched=sched: self.run_schedule(spec, sched, discard))
                    if runnable else None)
            # Which schedules are the same plan (tandem's against the others).
            tsched = contenders[f"{bname}/tandem"]["sched"]
            if tsched:
                contenders[f"{bname}/tandem"]["row"]["same_plan_as"] = [
                    c for c in RUNTIME_CONTENDERS[:-1]
                    if contenders[f"{bname}/{c}"]["sched"]
                    and same_actions(tsched, contenders[f"{bname}/{c}"]["sched"])]

        # 4. the rounds.
        keys = [k for k, c in contenders.items() if c["run"] is not None]
        order = round_order(keys, a.rounds)
        per_round = {k: [] for k in keys}
        for r, names in enumerate(order):
            log(f"{tag}: round {r + 1} of {a.rounds}: {', '.join(names)}")
            for pos, k in enumerate(names):
                try:
                    st = contenders[k]["run"]()
                except RuntimeError as e:
                    st = dict(error=str(e))
                st["position"] = pos
                per_round[k].append(st)
        for k in keys:
            contenders[k]["row"].update(over_rounds(per_round[k]),
                                        round_positions=[s["position"] for s in per_round[k]])

        # 4b. Tandem's plan alternating with its best reference's in one run
        # (paired_reference).
        if a.paired_pairs > 0:
            for bname in ["large", "small"]:
                rows = {"ddp": contenders["ddp"]["row"]} if bname == "large" else {}
                for c in RUNTIME_CONTENDERS:
                    rows[c] = dict(contenders[f"{bname}/{c}"]["row"],
                                   sched=contenders[f"{bname}/{c}"]["sched"])
                ref = paired_reference(rows)
                if ref is None:
                    continue
                log(f"{tag}: tandem against {ref} at the {bname} budget, alternating "
                    f"({a.paired_pairs} block pairs of {a.paired_block_steps} steps)")
                try:
                    got = self.run_alternating(
                        name, m, budgets[bname], rows["tandem"]["sched"], rows[ref]["sched"])
                    firsts, others = steady.block_pairs(got, a.paired_block_steps)
                    if len(firsts) < 2:
                        raise RuntimeError("fewer than two complete block pairs")
                    ratio, low, high = steady.paired_ratio(firsts, others)
                    check = dict(ratio=ratio, low=low, high=high, pairs=len(firsts),
                                 reference=ref, block_steps=a.paired_block_steps)
                except (RuntimeError, subprocess.TimeoutExpired) as e:
                    check = dict(reference=ref, error=str(e))
                contenders[f"{bname}/tandem"]["row"]["paired"] = check

        # 4c. Tandem against DDP at the large budget, pair by pair (ddp_paired).
        tkey = "large/tandem"
        if a.ddp_pairs >= 0 and contenders["ddp"]["run"] and contenders[tkey]["run"]:
            t_runs = [s.get("step_times") for s in per_round[tkey]]
            d_runs = [s.get("step_times") for s in per_round["ddp"]]
            if a.ddp_pairs:
                log(f"{tag}: tandem against DDP at the large budget, {a.ddp_pairs} more "
                    "pairs of runs back to back")
            for i in range(a.ddp_pairs):
                got = {}
                for k in (["ddp", tkey] if i % 2 == 0 else [tkey, "ddp"]):
                    try:
                        got[k] = contenders[k]["run"]().get("step_times")
                    except RuntimeError as e:
                        log(f"{tag}: {k} failed in pair {i + 1}: {str(e)[:200]}")
                        got[k] = None
                t_runs.append(got[tkey])
                d_runs.append(got["ddp"])
            contenders[tkey]["row"]["ddp_paired"] = ddp_paired(t_runs, d_runs, len(per_round[tkey]))

        # 5. communication alone (once each) and the rows.
        compute_s = contenders["compute-alone"]["row"].get("step_s")
        ddp_compute_s = contenders["compute-alone-ddp"]["row"].get("step_s")
        ddp_row = contenders["ddp"]["row"]
        ddp_step = ddp_row.get("step_s")
        for k in ("compute-alone", "compute-alone-ddp"):
            self.emit(dict(contenders[k]["row"], compute_alone_s=compute_s,
                           ddp_compute_alone_s=ddp_compute_s, lower_bound_s=None))
        if ddp_step:
            try:
                outs = self.run_pair(lambda r, rv: ["/usr/bin/python3", self.ddp, "--rank", str(r),
                                                    "--world", "2", "--master", rv, "--mode",
                                                    "comm", "--steps", str(a.replay_steps),
                                                    "--warmup", "1"] + self.ddp_args(m), 900)
                comm_s = max(json.loads(o.strip().splitlines()[-1])["median_comm_s"] for o in outs)
                ddp_row.update(comm_alone_s=comm_s,
                               lower_bound_s=max(ddp_compute_s or 0, comm_s))
            except RuntimeError as e:
                ddp_row.update(comm_alone_error=str(e), lower_bound_s=None)
            if ddp_compute_s:
                ddp_row.update(exposed_comm_s=max(0.0, ddp_step - ddp_compute_s),
                               exposed_comm_note="step_s - PyTorch compute alone")
            ddp_row.update(ratio_ddp=1.0)
            if ddp_row.get("lower_bound_s"):
                ddp_row["ratio_lb"] = ddp_step / ddp_row["lower_bound_s"]
        self.emit(dict(ddp_row, compute_alone_s=compute_s, ddp_compute_alone_s=ddp_compute_s))
        self.emit(dict(common, contender="ddp", budget="small", budget_bytes=budgets["small"],
                       step_s=None, lower_bound_s=None, peak_bytes=budgets["model_state_bytes"],
                       footprint_bytes=budgets["large"],
                       error=f"cannot run: DDP's footprint {budgets['large']} B exceeds the "
                             f"budget {budgets['small']} B (DDP has no sharding or offload)"))
        for bname in ["large", "small"]:
            for contender in RUNTIME_CONTENDERS:
                c = contenders[f"{bname}/{contender}"]
                row = dict(c["row"], compute_alone_s=compute_s, ddp_compute_alone_s=ddp_compute_s)
                if c["sched"]:
                    try:
                        outs = self.run_pair(
                            lambda r, rv: [self.replay, "--spec", specw, "--rank", str(r),
                                           "--world", "2", "--rendezvous", rv, "--schedule",
                                           c["sched"], "--steps", str(a.replay_steps),
                                           "--warmup", "1"], 900)
                        comm_s = max(json.loads(o.strip().splitlines()[-1])["median_comm_s"]
                                     for o in outs)
                        row.update(comm_alone_s=comm_s,
                                   lower_bound_s=max(compute_s, comm_s) if compute_s else None)
                    except RuntimeError as e:
                        row.update(comm_alone_error=str(e), lower_bound_s=None)
                job = row.pop("job", None)
                if contender == "tandem" and job:
                    row.update(tandem_fields(job, row.get("step_s")))
                else:
                    row["prediction_error"] = prediction_error(row.get("predicted_s"),
                                                               row.get("step_s"))
                if row.get("step_s") and ddp_step:
                    row["ratio_ddp"] = row["step_s"] / ddp_step
                if row.get("step_s") and row.get("lower_bound_s"):
                    row["ratio_lb"] = row["step_s"] / row["lower_bound_s"]
                self.emit(row)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rate", type=int, required=True)
    ap.add_argument("--models", default="tiny-llama,wide-short")
    ap.add_argument("--build", required=True)
    ap.add_argument("--workdir", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--ns0", required=True)
    ap.add_argument("--ns1", required=True)
    ap.add_argument("--if0", required=True)
    ap.add_argument("--if1", required=True)
    ap.add_argument("--ip0", required=True)
    ap.add_argument("--ip1", required=True)
    ap.add_argument("--comm", default="",
                    help="the job spec's comm section, e.g. 'chunk_bytes: 64KiB'")
    ap.add_argument("--steps", type=int, default=8, help="measured steps per run")
    ap.add_argument("--discard", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3,
                    help="interleaved rounds: every contender once per round")
    ap.add_argument("--profile-steps", type=int, default=8)
    ap.add_argument("--probe-steps", type=int, default=3,
                    help="measured steps of a budget-aware plan's probe run")
    ap.add_argument("--replay-steps", type=int, default=4)
    ap.add_argument("--paired-pairs", type=int, default=10,
                    help="block pairs of the alternating check of Tandem's plan against "
                         "its best reference's (0: none)")
    ap.add_argument("--paired-block-steps", type=int, default=5,
                    help="steps per block of the alternating check (at least 2)")
    ap.add_argument("--ddp-pairs", type=int, default=4,
                    help="pairs of runs of DDP and Tandem's plan at the large budget, back "
                         "to back, beyond the rounds' (0: the rounds' pairs only)")
    ap.add_argument("--settle-steps", type=int, default=15,
                    help="Tandem's job: steps without a new schedule version that count "
                         "as settled")
    ap.add_argument("--job-max-steps", type=int, default=200)
    ap.add_argument("--job-timeout-s", type=int, default=900)
    ap.add_argument("--long-run", type=int, default=0, metavar="STEPS",
                    help="instead of the bench: Tandem's job at the large budget, then "
                         "its plan alone for STEPS steps; both by thirds (Bench.long_run)")
    a = ap.parse_args()
    if a.rounds < 1:
        sys.exit("--rounds must be at least 1")
    if a.ddp_pairs < 0:
        sys.exit("--ddp-pairs must be 0 (the rounds' pairs only) or more")
    if a.paired_pairs < 0:
        sys.exit("--paired-pairs must be 0 (no alternating check) or more")
    if a.paired_pairs > 0 and a.paired_block_steps < 2:
        sys.exit("--paired-block-steps must be at least 2 (each block's first step, "
                 "the switch, is left out)")
    b = Bench(a)
    for name in a.models.split(","):
        if name not in MODELS:
            sys.exit(f"unknown model '{name}' (expected one of {', '.join(MODELS)})")
        if a.long_run > 0:
            b.long_run(name, dict(MODELS[name], name=name))
        else:
            b.model(name, dict(MODELS[name], name=name))


if __name__ == "__main__":
    main()
