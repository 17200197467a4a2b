#!/usr/bin/python3
"""bench/drift: false drift re-plans on a long steady job (issue 15).

Starts a real coordinator and two local CPU workers (agent mode, one thread
each) on a tiny Llama that takes ~10-30 ms a step, runs it for --steps steps
with nothing changing, and counts the re-plans the coordinator made and why
(its "schedule" events carry the reason). Every drift re-plan on a steady
job is a false one; the target is under 1 per 1000 steps.

It also writes the per-step series (the slower rank's iteration time and the
schedule version, with each version's prediction) to --series, which
`drift_replay` feeds through the DriftDetector offline (bench/README.md,
"drift: re-plans that are not noise").

  bench/drift/steady.py [--steps 4000] [--threshold 0.1] [--window 5]
                        [--build build] [--workdir DIR] [--series FILE]

Prints one JSON object (and appends it to --out when given).
"""

import argparse
import json
import math
import os
import random
import re
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "client", "python"))

# ~18 ms a step on one core per rank (2-core machine, 2 ranks).
MODEL = {"preset": "llama", "layers": 2, "d_model": 64, "heads": 4, "kv_heads": 4,
         "ffn": 176, "vocab": 512}


def log(msg):
    print(f"[drift {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def start_coordinator(build, workdir, listen="127.0.0.1:0", prefix=(), insecure=False):
    """Starts tandem-coordinator on a new database in `workdir` (one an
    earlier run left there is removed first: its jobs would hand this run's
    job their plan from the plan cache); returns (process, "host:port").
    `insecure`: serve a non-loopback `listen` without TLS and tokens (the
    coordinator refuses it otherwise), for a private network such as
    bench/e2e's namespaces."""
    for suffix in ("", "-wal", "-shm"):
        try:
            os.remove(os.path.join(workdir, "tandem.db" + suffix))
        except FileNotFoundError:
            pass
    out = open(os.path.join(workdir, "coordinator.out"), "w")
    err = open(os.path.join(workdir, "coordinator.log"), "w")
    proc = subprocess.Popen(list(prefix) + [
        os.path.join(build, "coordinator", "tandem-coordinator"), "--listen", listen,
        "--db", os.path.join(workdir, "tandem.db")] + (["--insecure"] if insecure else []),
        stdout=out, stderr=err)
    host = listen.rsplit(":", 1)[0]
    for _ in range(200):
        text = open(os.path.join(workdir, "coordinator.out")).read()
        m = re.search(r"listening on port (\d+)", text)
        if m:
            return proc, f"{host}:{m.group(1)}"
        if proc.poll() is not None:
            break
        time.sleep(0.05)
    proc.kill()
    raise RuntimeError("coordinator did not start: " +
                       open(os.path.join(workdir, "coordinator.log")).read()[-600:])


def add_link_args(ap):
    """The options bench/e2e/run.sh passes a driver it runs inside ns0 on
    its shaped link (--drift-check, --noise)."""
    for name in ("--build", "--workdir", "--ns1", "--if0", "--if1", "--ip0", "--ip1"):
        ap.add_argument(name, required=True)
    ap.add_argument("--rate-mbit", type=int, required=True, help="the link's rate")
    ap.add_argument("--burst", default="256kb",
                    help="the tbf bucket the link was set up with (bench/e2e/run.sh)")


def tc_rate(ns, ifname, mbit, burst):
    """Sets one end of the shaped link (in namespace `ns`, or this one) to
    `mbit` Mbit/s."""
    cmd = ["tc", "qdisc", "change", "dev", ifname, "root", "tbf", "rate", f"{mbit}mbit",
           "burst", burst, "latency", "50ms"]
    if ns:
        cmd = ["ip", "netns", "exec", ns] + cmd
    subprocess.run(cmd, check=True)


def stop_processes(workers, coord):
    """Stops the workers (SIGTERM, then SIGKILL after 20 s) and then the
    coordinator (likewise after 10 s), waiting for each."""
    for w in workers:
        if w.poll() is None:
            w.terminate()
    for proc, grace in [(w, 20) for w in workers] + [(coord, 10)]:
        if proc is coord and proc.poll() is None:
            proc.terminate()  # once the workers are gone
        try:
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def job_spec(name, steps, threshold, window, model=None, batch=None):
    return {"name": name, "model": dict(model or MODEL),
            "data": {"kind": "synthetic", "seed": 1},
            "batch": dict(batch or {"micro_batch": 2, "seq_len": 32}),
            "train": {"steps": steps, "lr": 1.0e-3, "seed": 1},
            "parallel": {"world_size": 2, "zero_stage": 3},
            "optimize": {"warmup_steps": 3, "drift_threshold": threshold,
                         "drift_window": window}}


def step_lines(path):
    steps = []
    for line in open(path):
        if line.startswith('{"step"'):
            steps.append(json.loads(line))
    return steps


def slowest_per_step(paths):
    """step -> (slowest iteration_s, schedule_version) over every rank."""
    per_step = {}
    for p in paths:
        for s in step_lines(p):
            t, v = per_step.get(s["step"], (0.0, s["schedule_version"]))
            per_step[s["step"]] = (max(t, s["iteration_s"]), s["schedule_version"])
    return per_step


# Student's t, 0.975 quantile, by degrees of freedom (a 95% interval).
T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306,
        9: 2.262, 10: 2.228, 11: 2.201, 12: 2.179, 13: 2.160, 14: 2.145, 15: 2.131,
        16: 2.120, 17: 2.110, 18: 2.101, 19: 2.093, 20: 2.086, 25: 2.060, 30: 2.042}
BOOTSTRAP_RESAMPLES = 2000


def t975(df):
    """Student's t 0.975 quantile with `df` degrees of freedom: the table,
    then (beyond it, within 0.002) the Cornish-Fisher expansion about the
    normal's 1.96."""
    if df in T975:
        return T975[df]
    if df < 30:
        lo = max(k for k in T975 if k < df)
        hi = min(k for k in T975 if k > df)
        return T975[lo] + (T975[hi] - T975[lo]) * (df - lo) / (hi - lo)
    z = 1.959964
    return z + (z ** 3 + z) / (4 * df) + (5 * z ** 5 + 16 * z ** 3 + 3 * z) / (96 * df ** 2)


def block_pairs(steps, block_steps):
    """The block pairs of a run alternating two schedules (`tandem-worker
    --standalone --schedule A --alternate B --block-steps N`): step 0 runs
    A, then B and A take turns in blocks of N steps, B first. `steps`:
    {step: (the slower rank's iteration_s, schedule_version)}. Returns (A's
    blocks, B's blocks): each complete pair's step times, each block's
    first step left out (it paid for the switch), as the coordinator
    compares (coordinator/README.md, "Decisions under noise"). The pairs
    end at the first block that did not run its plan throughout: the memory
    guard's least-memory schedule (version -1), or a run that did not
    alternate."""
    if block_steps < 2:
        raise ValueError("block_steps must be at least 2 (a block's first step is left out)")
    if 0 not in steps:
        return [], []
    a_version = steps[0][1]
    firsts, others = [], []
    k = 0
    while True:
        b = [steps.get(1 + 2 * k * block_steps + i) for i in range(block_steps)]
        a = [steps.get(1 + (2 * k + 1) * block_steps + i) for i in range(block_steps)]
        if any(v is None for v in a + b):
            break
        if {v for _, v in a} != {a_version} or len({v for _, v in b}) != 1 or \
                b[0][1] in (a_version, -1):
            break
        firsts.append([t for t, _ in a[1:]])
        others.append([t for t, _ in b[1:]])
        k += 1
    return firsts, others


def paired_ratio(num, den, seed=0):
    """num over den, measured together: num[i] and den[i] are the step
    times of pair i (a block pair of an alternating run, or one interleaved
    round). Returns (ratio, low, high), or None without a pair: the
    geometric mean of the pairs' ratios of medians, and its 95% interval as
    the coordinator computes it (coordinator/service/plan_decision.cc,
    InterleavedRatio): a seeded bootstrap (pairs with replacement, then
    each pair's steps), widened where Student's t over the pairs' log ratios
    is wider (few pairs make the bootstrap read their spread too small)."""
    pairs = [(n, d) for n, d in zip(num, den) if n and d]
    if not pairs:
        return None

    def ratio(ps):
        logs = [math.log(statistics.median(n) / statistics.median(d)) for n, d in ps]
        return math.exp(sum(logs) / len(logs))

    rng = random.Random(seed)
    draws = []
    for _ in range(BOOTSTRAP_RESAMPLES):
        resampled = []
        for _ in pairs:
            n, d = pairs[rng.randrange(len(pairs))]
            resampled.append(([n[rng.randrange(len(n))] for _ in n],
                              [d[rng.randrange(len(d))] for _ in d]))
        draws.append(ratio(resampled))
    draws.sort()
    mid = ratio(pairs)
    low = min(draws[int(0.025 * (len(draws) - 1))], mid)
    high = max(draws[int(math.ceil(0.975 * (len(draws) - 1)))], mid)
    if len(pairs) >= 2:
        logs = [math.log(statistics.median(n) / statistics.median(d)) for n, d in pairs]
        half = t975(len(logs) - 1) * statistics.stdev(logs) / math.sqrt(len(logs))
        mean = statistics.mean(logs)
        low, high = min(low, math.exp(mean - half)), max(high, math.exp(mean + half))
    return mid, low, high


def wait_shares(paths):
    """step -> the largest cpu_wait_share over the ranks that measured it
    (the step lines' share of the step the compute thread waited for a CPU;
    worker/runtime/cpu_wait.h); steps no rank measured are left out."""
    out = {}
    for p in paths:
        for s in step_lines(p):
            w = s.get("cpu_wait_share")
            if w is not None:
                out[s["step"]] = max(out.get(s["step"], 0.0), w)
    return out


def replans(events):
    """The coordinator's re-plans, [(reason, version, message)], and its drift
    detections [message]."""
    plans, drifts = [], []
    for e in events:
        if e.kind == "schedule":
            m = re.match(r"v(\d+) \((\w+)\)", e.message)
            if m:
                plans.append((m.group(2), int(m.group(1)), e.message))
        elif e.kind == "drift":
            drifts.append(e.message)
    return plans, drifts


def predictions(client, job_id, versions):
    out = {}
    for v in versions:
        if v > 0:
            _, schedule = client.schedule(job_id, v)
            out[v] = schedule.prediction.iteration_s
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=4000)
    ap.add_argument("--threshold", type=float, default=0.1)
    ap.add_argument("--window", type=int, default=5)
    ap.add_argument("--build", default=os.environ.get("TANDEM_BUILD_DIR",
                                                      os.path.join(ROOT, "build")))
    ap.add_argument("--workdir", default="")
    ap.add_argument("--series", default="", help="per-step series for drift_replay")
    ap.add_argument("--out", default="", help="append the JSON result here")
    a = ap.parse_args()
    if a.steps < 50:
        sys.exit("--steps must be at least 50: the warm-up and first plan take ~20")
    import tandem  # the Python client (client/python)

    workdir = a.workdir or tempfile.mkdtemp(prefix="tandem-drift.")
    os.makedirs(workdir, exist_ok=True)
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
    coord, address = start_coordinator(a.build, workdir)
    workers = []
    try:
        with tandem.Client(address, timeout=30) as client:
            job = client.submit(job_spec("drift-steady", a.steps, a.threshold, a.window))
            log(f"job {job.id}: {a.steps} steps on {address}; logs in {workdir}")
            for r in range(2):
                workers.append(subprocess.Popen(
                    [os.path.join(a.build, "worker", "tandem-worker"), "--coordinator", address,
                     "--job", job.id, "--rank", str(r), "--threads", "1"], env=env,
                    stdout=open(os.path.join(workdir, f"worker{r}.jsonl"), "w"),
                    stderr=open(os.path.join(workdir, f"worker{r}.log"), "w")))
            start = time.time()
            for r, w in enumerate(workers):
                if w.wait(timeout=3600) != 0:
                    raise RuntimeError(f"rank {r} exited {w.returncode}: see {workdir}/worker{r}.log")
            wall = time.time() - start
            final, events = client.get(job.id)
            per_step = slowest_per_step([os.path.join(workdir, f"worker{r}.jsonl")
                                         for r in range(2)])
            versions = sorted({v for _, v in per_step.values()})
            pred = predictions(client, job.id, versions)
    finally:
        for w in workers:
            if w.poll() is None:
                w.kill()
        coord.terminate()
        coord.wait(timeout=10)

    plans, drifts = replans(events)
    reasons = {}
    for reason, _, _ in plans:
        reasons[reason] = reasons.get(reason, 0) + 1
    # Steps run under a planned schedule: the ones drift is watched on.
    watched = sum(1 for _, v in per_step.values() if v > 0)
    times = sorted(t for t, v in per_step.values() if v > 0)
    result = {
        "bench": "drift-steady", "steps": len(per_step), "watched_steps": watched,
        "threshold": a.threshold, "window": a.window, "wall_s": round(wall, 1),
        "median_step_s": times[len(times) // 2] if times else None,
        "p99_step_s": times[int(0.99 * (len(times) - 1))] if times else None,
        "replans": reasons,
        "drift_replans_per_1000_steps": round(1000.0 * reasons.get("drift", 0) / max(watched, 1), 3),
        "drift_events": drifts[:10],
        "predicted_s": {str(v): p for v, p in pred.items()},
        "loadavg": open("/proc/loadavg").read().split()[:3],
        "state": final.state, "workdir": workdir,
    }
    if a.series:
        with open(a.series, "w") as f:
            f.write("# step version iteration_s predicted_s\n")
            for step in sorted(per_step):
                t, v = per_step[step]
                f.write(f"{step} {v} {t:.9f} {pred.get(v, 0.0):.9f}\n")
    line = json.dumps(result, sort_keys=True)
    print(line)
    if a.out:
        with open(a.out, "a") as f:
            f.write(line + "\n")


if __name__ == "__main__":
    main()
