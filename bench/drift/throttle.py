#!/usr/bin/python3
"""bench/drift's throttle check (issue 15): a real change must re-plan.

Run by `bench/e2e/run.sh --drift-check` inside the first namespace (ns0),
whose veth pair to ns1 tc shapes: the coordinator listens on ns0's address,
rank 0 runs here and rank 1 in ns1 (both over the shaped link). Once the job
has run --throttle-at steps under a plan, the link is throttled with
`tc qdisc change ... rate` to --throttled-mbit on both ends; the check
passes when the coordinator's "drift at step S" event comes within
drift_window steps of the first step that ran on the throttled link, and a
drift re-plan follows it (a published "(drift)" schedule, or the active plan
kept at what it measured). When the throttle lands in a comparison (plans
alternating in blocks), the detector watches one of the two plans (the one
the event names: a baseline check's, a trial's incumbent) and the other's
steps do not count: within drift_window steps of that plan; the comparison
goes on, and the re-plan follows once it has ended (--after steps are
waited for). Prints one JSON object; exit 1 on a miss.
"""

import argparse
import json
import os
import re
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import steady  # noqa: E402  (bench/drift/steady.py)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    steady.add_link_args(ap)
    ap.add_argument("--throttled-mbit", type=int, default=0, help="default: rate / 20")
    ap.add_argument("--throttle-at", type=int, default=120,
                    help="steps under a plan before the throttle")
    ap.add_argument("--after", type=int, default=120,
                    help="steps run after the throttle (a drift seen during a comparison "
                         "re-plans once the comparison ends: up to 12 block pairs later)")
    ap.add_argument("--threshold", type=float, default=0.1)
    ap.add_argument("--window", type=int, default=5)
    ap.add_argument("--out", default="")
    a = ap.parse_args()
    throttled = a.throttled_mbit or max(1, a.rate_mbit // 20)
    import tandem  # the Python client (client/python, via steady.py)

    os.makedirs(a.workdir, exist_ok=True)
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
    # ns0's veth address: reachable only from the two namespaces the bench
    # made, so served in the clear.
    coord, address = steady.start_coordinator(a.build, a.workdir, listen=f"{a.ip0}:0",
                                              insecure=True)
    workers = []
    result = {"bench": "drift-throttle", "rate_mbit": a.rate_mbit, "throttled_mbit": throttled,
              "window": a.window, "threshold": a.threshold, "workdir": a.workdir}
    try:
        with tandem.Client(address, timeout=30) as client:
            # Long enough to reach the throttle; the job is cancelled after.
            job = client.submit(steady.job_spec("drift-throttle", 100000, a.threshold, a.window))
            worker = os.path.join(a.build, "worker", "tandem-worker")
            for r in range(2):
                cmd = [worker, "--coordinator", address, "--job", job.id, "--rank", str(r),
                       "--threads", "1", "--bind-host", a.ip0 if r == 0 else a.ip1]
                wenv = dict(env, GLOO_SOCKET_IFNAME=a.if0 if r == 0 else a.if1)
                if r == 1:
                    cmd = ["ip", "netns", "exec", a.ns1] + cmd
                workers.append(subprocess.Popen(
                    cmd, env=wenv, stdout=open(os.path.join(a.workdir, f"worker{r}.jsonl"), "w"),
                    stderr=open(os.path.join(a.workdir, f"worker{r}.log"), "w")))
            rank0 = os.path.join(a.workdir, "worker0.jsonl")

            def planned_steps():
                return [s for s in steady.step_lines(rank0) if s["schedule_version"] > 0]

            deadline = time.time() + 600
            while len(planned_steps()) < a.throttle_at:
                if time.time() > deadline or any(w.poll() is not None for w in workers):
                    raise RuntimeError(f"the job did not reach {a.throttle_at} planned steps; "
                                       f"see {a.workdir}")
                time.sleep(0.2)
            before = steady.step_lines(rank0)[-1]["step"]
            steady.tc_rate("", a.if0, throttled, a.burst)
            steady.tc_rate(a.ns1, a.if1, throttled, a.burst)
            log_at = time.time()
            steady.log(f"link throttled to {throttled} Mbit/s after step {before}")
            while steady.step_lines(rank0)[-1]["step"] < before + a.after:
                if time.time() > log_at + 300 or any(w.poll() is not None for w in workers):
                    raise RuntimeError(f"the job did not run {a.after} steps after the throttle")
                time.sleep(0.2)
            time.sleep(1.0)  # the re-plan's events
            _, events = client.get(job.id)
            client.cancel(job.id, reason="drift check done")
    finally:
        steady.tc_rate("", a.if0, a.rate_mbit, a.burst)
        steady.tc_rate(a.ns1, a.if1, a.rate_mbit, a.burst)
        steady.stop_processes(workers, coord)

    per_step = steady.slowest_per_step([os.path.join(a.workdir, f"worker{r}.jsonl")
                                        for r in range(2)])
    # The first step run wholly on the throttled link: the one after the
    # step in flight when tc ran.
    first_slow = before + 2
    drift_steps = [int(m.group(1)) for e in events if e.kind == "drift"
                   for m in [re.match(r"drift at step (\d+)", e.message)] if m]
    after = [s for s in drift_steps if s >= before]
    # The re-plan that answers the first drift event after the throttle.
    first = next((i for i, e in enumerate(events) if e.kind == "drift" and
                  re.match(r"drift at step (\d+)", e.message) and
                  int(re.match(r"drift at step (\d+)", e.message).group(1)) >= before), None)
    followed = [] if first is None else [
        e.message for e in events[first:]
        if (e.kind == "schedule" and re.match(r"v\d+ \(drift\)", e.message)) or
        (e.kind == "replan" and "(drift)" in e.message)]
    def median(xs):
        xs = sorted(xs)
        return xs[len(xs) // 2] if xs else None
    result.update(
        throttled_after_step=before, first_throttled_step=first_slow,
        step_s_before=median([t for s, (t, v) in per_step.items() if before - 30 < s <= before]),
        step_s_after=median([t for s, (t, v) in per_step.items() if first_slow <= s < first_slow + 10]),
        drift_at_steps=drift_steps, false_drifts_before=[s for s in drift_steps if s < before],
        replans=[msg[:160] for msg in followed])
    # The steps the detector saw before it fired: every step, or during a
    # comparison only those of the plan it watched.
    watched = None
    if first is not None:
        m = re.match(r"drift at step \d+ during the (baseline check of v(\d+)|"
                     r"\w+(?: \w+)? of v\d+ against v(\d+))", events[first].message)
        if m:
            watched = int(m.group(2) or m.group(3))
    seen = None
    if after:
        result["detected_after_steps"] = after[0] - first_slow + 1
        seen = result["detected_after_steps"] if watched is None else sum(
            1 for s, (t, v) in per_step.items() if first_slow <= s <= after[0] and v == watched)
        result["watched_version"] = watched
        result["detected_after_watched_steps"] = seen
    result["ok"] = bool(after) and seen <= a.window and bool(followed)
    line = json.dumps(result, sort_keys=True)
    print(line)
    if a.out:
        with open(a.out, "a") as f:
            f.write(line + "\n")
    sys.exit(0 if result["ok"] else 1)


if __name__ == "__main__":
    main()
