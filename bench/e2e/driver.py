#!/usr/bin/python3
"""bench/e2e's driver for one link rate: every contender on every model, side
by side, over the namespaces and the shaped link that run.sh set up.

Called by run.sh (which owns the namespaces, the veth pair and tc); appends
JSON lines to --out. Per model, in this order:
  1. compute alone: Tandem at world 1 (the per-rank batch, no communication,
     one thread) and PyTorch at world 1 (DDP's compute alone); Tandem's
     counted world-1 peak gives DDP's footprint and so the two budgets;
  2. warm-up: Tandem under the on-demand baseline on the link, with
     --profile-out (8 steps: the profile is the medians of the last 7, so
     up to 3 steps disturbed by something else on the machine do not move
     the plans made from it);
  3. PyTorch DDP on the link, and DDP's all-reduces alone;
  4. for each budget and each policy: tandem-plan from the warm-up profile
     (hardware model fitted to it), the worker on the link with that
     schedule and memory.budget_bytes, and the schedule's collectives
     replayed alone (tandem-comm-replay).
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

POLICIES = ["on-demand", "deepspeed-zero3", "fsdp", "deepcompile", "tandem"]

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

    def spec(self, name, m, world, steps, budget):
        path = os.path.join(self.a.workdir, f"{name}-w{world}-s{steps}-b{budget}.yaml")
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
        return dict(step_s=med, step_min_s=min(it), step_max_s=max(it),
                    step_rel_mad=statistics.median(abs(t - med) for t in it) / med,
                    exposed_comm_s=statistics.median(ex), peak_bytes=peak, steps=n,
                    memory_hold_s=statistics.median(hold),
                    fallback_steps=fallback, planned_peaks=planned_peaks,
                    guard_tripped=len(planned_peaks) < min(len(s) for s in every))

    def plan(self, m, profile, policy, budget, schedule_out, measured=None, headroom=0,
             trial_out=None):
        model = (["--graph", self.graph_file(m["name"])] if "export" in m
                 else ["--model", self.model_text(m)])
        cmd = [self.plan_bin] + model + ["--profile", profile,
                                         "--hw", "memory=64GiB", "--policy", policy]
        if budget > 0:
            cmd += ["--budget", str(budget)]
        if headroom > 0:
            cmd += ["--headroom", str(headroom)]
        if measured:
            cmd += ["--measured", ",".join(f"{f}={s:.6f}" for f, s in measured)]
        if trial_out:
            cmd += ["--trial-out", trial_out]
        out = self.run_local(cmd, 120)
        sched, _, pred = out.partition("# predictions")
        with open(schedule_out, "w") as f:
            f.write(sched)
        vals = dict(re.findall(r"^(\w+)\s+([-0-9.e]+)\s*$", pred, re.M))
        peak = re.search(r"^peak .*?\((\d+) B\)", pred, re.M)
        trial = re.search(r"^trial\s+(\S+) ([-0-9.e]+) .*?peak (\d+) B", pred, re.M)
        extra = {}
        if trial_out:
            extra = dict(trial_file=trial_out if os.path.exists(trial_out) else None,
                         trial_source=trial.group(1) if trial else None,
                         trial_predicted_s=float(trial.group(2)) if trial else None,
                         trial_predicted_peak_bytes=int(trial.group(3)) if trial else None)
        return dict(extra, predicted_s=float(vals["iteration_s"]),
                    unmodeled_bytes=int(float(vals.get("unmodeled_bytes", 0))),
                    predicted_exposed_comm_s=float(vals["exposed_comm_s"]),
                    predicted_comm_s=float(vals["comm_s"]),
                    predicted_peak_bytes=int(peak.group(1)) if peak else None,
                    plan_over_budget="OVER BUDGET" in pred)

    # -- one model -----------------------------------------------------------

    def model(self, name, m):
        a = self.a
        wd = a.workdir
        tag = f"{name}-{a.rate}"
        discard, steps = a.discard, a.steps

        # 1. compute alone (world 1, per-rank batch, no communication).
        log(f"{tag}: compute alone")
        spec1 = self.spec(name, m, 1, discard + steps, 0)
        out = self.run_local([self.worker, "--standalone", "--spec", spec1, "--rank", "0",
                              "--world", "1", "--rendezvous", f"127.0.0.1:{self.next_port()}",
                              "--threads", "1"], 600)
        c1 = self.worker_stats([out], discard)
        compute_s = c1["step_s"]
        out = self.run_local(["/usr/bin/python3", self.ddp, "--world", "1", "--steps", str(steps),
                              "--warmup", str(discard)] + self.ddp_args(m), 600)
        ddp1 = json.loads(out.strip().splitlines()[-1])
        ddp_compute_s = ddp1["median_step_s"]
        params = ddp1["params"]
        # DDP's per-rank footprint, counted like Tandem's: the unsharded
        # world-1 run (full params, grads, both AdamW moments, activations)
        # plus DDP's gradient buckets (a copy of the grads in 1.13's default).
        budgets_file = os.path.join(wd, f"{name}.budgets.json")
        if os.path.exists(budgets_file):  # fixed by the first rate's run
            budgets = json.load(open(budgets_file))
        else:
            large = c1["peak_bytes"] + ddp1["bucket_bytes"]
            budgets = dict(large=large, small=int(0.6 * large),
                           world1_peak_bytes=c1["peak_bytes"])
            json.dump(budgets, open(budgets_file, "w"))
        common = dict(model=name, params=params, compute_alone_s=compute_s,
                      ddp_compute_alone_s=ddp_compute_s)
        self.emit(dict(common, contender="compute-alone", budget="-", step_s=compute_s,
                       step_min_s=c1["step_min_s"], step_max_s=c1["step_max_s"],
                       peak_bytes=c1["peak_bytes"], lower_bound_s=None))

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
        # tandem-plan calibrates its memory model from this (version-0)
        # profile: what the counting allocator saw beyond the simulator's
        # estimates under the starting schedule (autograd temporaries, loss
        # buffers, Gloo staging) is counted in every plan (CalibrateMemory).
        od_sched = os.path.join(wd, f"{tag}-od.sched")
        od = self.plan(m, profile, "on-demand", 0, od_sched)
        # The baseline counts as measured (the coordinator's v0): the
        # warm-up's schedule and its median step, evidence for the re-fit.
        baseline = (od_sched, warm["step_s"]) if warm.get("step_s") else None
        log(f"{tag}: on-demand measured peak {warm['peak_bytes']} B; the planner counts "
            f"{od.get('unmodeled_bytes', 0)} B beyond its model")

        # 3. DDP on the link, and its all-reduces alone.
        log(f"{tag}: DDP")
        ddp_row = dict(common, contender="ddp", budget="large", budget_bytes=budgets["large"])
        ddp_step = None
        try:
            outs = self.run_pair(lambda r, rv: ["/usr/bin/python3", self.ddp, "--rank", str(r),
                                                "--world", "2", "--master", rv, "--steps", str(steps),
                                                "--warmup", str(discard)] + self.ddp_args(m), 900)
            per_rank = [[json.loads(l) for l in o.splitlines() if l.startswith("{\"step\"")]
                        for o in outs]
            n = min(len(s) for s in per_rank)
            st = [max(s[i]["step_s"] for s in per_rank) for i in range(n)]
            outs = self.run_pair(lambda r, rv: ["/usr/bin/python3", self.ddp, "--rank", str(r),
                                                "--world", "2", "--master", rv, "--mode", "comm",
                                                "--steps", str(a.replay_steps), "--warmup", "1"]
                                 + self.ddp_args(m), 900)
            comm_s = max(json.loads(o.strip().splitlines()[-1])["median_comm_s"] for o in outs)
            ddp_step = statistics.median(st)
            ddp_row.update(step_s=ddp_step, step_min_s=min(st), step_max_s=max(st),
                           comm_alone_s=comm_s,
                           lower_bound_s=max(ddp_compute_s, comm_s),
                           exposed_comm_s=max(0.0, ddp_step - ddp_compute_s),
                           exposed_comm_note="step_s - PyTorch compute alone",
                           peak_bytes=ddp1["model_state_bytes"],
                           footprint_bytes=budgets["large"])
        except RuntimeError as e:
            ddp_row.update(error=str(e))
        self.emit(ddp_row)
        self.emit(dict(common, contender="ddp", budget="small", budget_bytes=budgets["small"],
                       step_s=None, lower_bound_s=None, peak_bytes=ddp1["model_state_bytes"],
                       footprint_bytes=budgets["large"],
                       error=f"cannot run: DDP's footprint {budgets['large']} B exceeds the "
                             f"budget {budgets['small']} B (DDP has no sharding or offload)"))

        # 4. every policy at both budgets.
        for bname in ["large", "small"]:
            bbytes = budgets[bname]
            for policy in POLICIES:
                plan_budget = bbytes
                log(f"{tag}: {policy} at the {bname} budget ({bbytes} B)")
                row = dict(common, contender=policy, budget=bname, budget_bytes=bbytes)
                sched = os.path.join(wd, f"{tag}-{bname}-{policy}.sched")
                spec = self.spec(name, m, 2, discard + steps, bbytes)
                # The budget-aware policies re-plan when the run exceeds the
                # budget, with the planner's budget lowered by the overshoot
                # (what the coordinator does on a memory drift), and when the
                # memory guard tripped, keeping free what the plan's peaks
                # went over its prediction by plus their spread (the
                # coordinator's memory-guard re-plan, GuardHeadroom in
                # coordinator/planner/planner.h); the others plan the same
                # schedule whatever the budget.
                budget_aware = policy in ("tandem", "deepcompile")
                attempts = 4 if budget_aware else 1
                headroom = 0
                for attempt in range(attempts):
                    try:
                        trial_out = (sched[:-len(".sched")] + "-trial.sched"
                                     if policy == "tandem" else None)
                        row.update(self.plan(m, profile, policy, plan_budget, sched,
                                             headroom=headroom, trial_out=trial_out),
                                   planner_budget_bytes=plan_budget, replans=attempt,
                                   headroom_bytes=headroom)
                    except RuntimeError as e:
                        row.update(error=f"planning failed: {e}", step_s=None, peak_bytes=None,
                                   predicted_s=None)
                        # Lowered below what any plan needs: plan the
                        # least-memory one instead (every state offloaded).
                        least = re.search(r"smallest feasible budget is [^(]*\((\d+) B\)", str(e))
                        if least and int(least.group(1)) > plan_budget and attempt + 1 < attempts:
                            plan_budget = int(least.group(1))
                            continue
                        break
                    try:
                        stats = self.run_schedule(spec, sched, discard)
                        row.update(stats)
                        row.pop("error", None)
                        peaks = stats["planned_peaks"]
                        grown = headroom
                        if peaks:
                            over = max(0, max(peaks) - (row["predicted_peak_bytes"] or 0))
                            grown = max(headroom, over + max(peaks) - min(peaks))
                        # A plan over the budget by its own prediction (a
                        # policy that cannot fit it) gains nothing from more.
                        if (budget_aware and stats["guard_tripped"] and grown > headroom
                                and attempt + 1 < attempts):
                            headroom = grown
                            log(f"{tag}: {policy} tripped the memory guard (peaks "
                                f"{min(peaks)}-{max(peaks)} B, predicted "
                                f"{row['predicted_peak_bytes']} B); re-planning with "
                                f"{headroom} B more headroom")
                            continue
                        break
                    except RuntimeError as e:
                        row.update(error=str(e), step_s=None, peak_bytes=None)
                        over = re.search(r"peak memory (\d+) B exceeds memory.budget_bytes (\d+)",
                                         str(e))
                        if not over or attempt + 1 == attempts:
                            break
                        plan_budget -= int(over.group(1)) - int(over.group(2)) + (1 << 20)
                        log(f"{tag}: {policy} over budget by {int(over.group(1)) - bbytes} B; "
                            f"re-planning at {plan_budget} B")
                if policy == "tandem" and row.get("step_s") and row.get("predicted_s"):
                    self.refit_round(m, profile, plan_budget, sched, spec, discard, row,
                                     headroom, baseline)
                    self.trial_round(sched, spec, discard, row)
                if row.get("predicted_s") is not None:
                    try:
                        outs = self.run_pair(
                            lambda r, rv: [self.replay, "--spec", specw, "--rank", str(r),
                                           "--world", "2", "--rendezvous", rv, "--schedule", sched,
                                           "--steps", str(a.replay_steps), "--warmup", "1"], 900)
                        comm_s = max(json.loads(o.strip().splitlines()[-1])["median_comm_s"]
                                     for o in outs)
                        row.update(comm_alone_s=comm_s, lower_bound_s=max(compute_s, comm_s))
                    except RuntimeError as e:
                        row.update(comm_alone_error=str(e), lower_bound_s=None)
                if row.get("step_s") and ddp_step:
                    row["ratio_ddp"] = row["step_s"] / ddp_step
                if row.get("step_s") and row.get("lower_bound_s"):
                    row["ratio_lb"] = row["step_s"] / row["lower_bound_s"]
                if row.get("step_s") and row.get("predicted_s"):
                    row["prediction_error"] = row["predicted_s"] / row["step_s"] - 1
                self.emit(row)


    def refit_round(self, m, profile, plan_budget, sched, spec, discard, row, headroom,
                    baseline=None):
        """Tandem's closed loop, offline: what the coordinator does once the
        first plan has run on a live job. The first plan's measured time and
        the baseline's (`baseline`: the warm-up's schedule and median step,
        the coordinator's v0) re-fit the contention between transfers and
        compute (tandem-plan --measured, the coordinator's
        CalibrateWithEvidence), the job is re-planned and
        the new plan runs. The row reports the plan the coordinator would
        keep: the re-planned one unless it measured slower than the first
        beyond the noise (ScheduleMeasurements' rule, so a re-plan slower
        within the noise is kept), with the prediction made before that plan
        ran, and keeps the first one's figures under first_* and the
        second's under refit_*."""
        first = {k: row.get(k) for k in ("step_s", "step_min_s", "step_max_s",
                                         "predicted_s", "exposed_comm_s", "peak_bytes")}
        row.update({f"first_{k}": v for k, v in first.items()})
        second_sched = sched[:-len(".sched")] + "-refit.sched"
        try:
            planned = self.plan(m, profile, "tandem", plan_budget, second_sched,
                                measured=([baseline] if baseline else [])
                                + [(sched, first["step_s"])], headroom=headroom,
                                trial_out=second_sched[:-len(".sched")] + "-trial.sched")
            stats = self.run_schedule(spec, second_sched, discard)
        except RuntimeError as e:
            row["refit_error"] = str(e)
            return
        row.update(refit_predicted_s=planned["predicted_s"], refit_step_s=stats["step_s"])
        if same_actions(sched, second_sched):
            # The same schedule again: its re-fitted prediction was fitted to
            # its own measurement, so the first prediction stands.
            row["refit"] = "re-planned to the same schedule"
            return
        # Rolled back only when the re-planned schedule measured slower than
        # the first beyond the noise, as the coordinator judges it
        # (ScheduleMeasurements: 3 relative MADs of either, at least 5%).
        noise = max(0.05, 3 * max(row.get("step_rel_mad", 0), stats["step_rel_mad"]))
        row["refit_noise"] = noise
        if stats["step_s"] <= first["step_s"] * (1 + noise):
            row.update(planned, **stats)  # its runner-up, too
            row["refit"] = "re-planned schedule kept"
            shutil.copyfile(second_sched, sched)  # the comm replay runs it
        else:
            # The first schedule stays, with the prediction made before it
            # ran (the re-fitted model was fitted to its very measurement).
            row["refit"] = "rolled back to the first schedule (the re-planned one measured slower)"


    def trial_round(self, sched, spec, discard, row):
        """The coordinator's trial, offline: the runner-up of the plan the
        row keeps (the fastest other plan that fits), when the model predicted
        it within the job's optimize.trial_margin (10%) of that plan, runs
        too, and the faster by median is kept (PlanningManager's "trial",
        coordinator/README.md). The row keeps the runner-up's figures under
        trial_*, and takes them when it was faster, with the prediction the
        model made for it."""
        trial = row.pop("trial_file", None)
        if not trial:
            row["trial"] = ("no runner-up within the trial margin"
                            + (f" ({row.get('trial_source')} predicted "
                               f"{row.get('trial_predicted_s'):.4f})"
                               if row.get("trial_predicted_s") else ""))
            return
        try:
            stats = self.run_schedule(spec, trial, discard)
        except RuntimeError as e:
            row["trial_error"] = str(e)
            return
        row.update(trial_step_s=stats["step_s"], trial_step_min_s=stats["step_min_s"],
                   trial_step_max_s=stats["step_max_s"])
        if stats["step_s"] < row["step_s"]:
            row.update(stats, predicted_s=row["trial_predicted_s"],
                       predicted_peak_bytes=row["trial_predicted_peak_bytes"])
            for k in ("predicted_exposed_comm_s", "predicted_comm_s"):
                row.pop(k, None)  # the kept plan's; the runner-up's are not printed
            row["trial"] = f"runner-up ({row['trial_source']}) measured faster: kept"
            shutil.copyfile(trial, sched)  # the comm replay runs it
        else:
            row["trial"] = (f"runner-up ({row['trial_source']}) measured "
                            f"{stats['step_s']:.4f} s: back to the plan")


def same_actions(a, b):
    """Whether two schedule files hold the same schedule, apart from what
    describes it (comments, predictions, provenance, decisions)."""
    def body(path):
        skip = ("#", "predict ", "provenance ", "decision ")
        with open(path) as f:
            return [l for l in f if not l.startswith(skip)]
    return body(a) == body(b)


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
    ap.add_argument("--comm", default="",
                    help="the job spec's comm section, e.g. 'chunk_bytes: 64KiB'")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--discard", type=int, default=2)
    ap.add_argument("--profile-steps", type=int, default=8)
    ap.add_argument("--replay-steps", type=int, default=4)
    a = ap.parse_args()
    b = Bench(a)
    for name in a.models.split(","):
        if name not in MODELS:
            sys.exit(f"unknown model '{name}' (expected one of {', '.join(MODELS)})")
        b.model(name, dict(MODELS[name], name=name))


if __name__ == "__main__":
    main()
