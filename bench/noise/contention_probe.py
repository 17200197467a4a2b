#!/usr/bin/python3
"""bench/noise/contention_probe.py: can a worker tell that a CPU hog slows
its steps? (issue 34; bench/README.md, "noise", "A signal for the CPU hog")

  bench/noise/contention_probe.py SPEC.yaml [--build build]

Runs two tandem-worker ranks standalone on loopback (one thread each, SPEC
at world 2 with steps enough for ~90 s) and a hog thread in this process
that takes a fixed share of one core in 10 ms slices, through phases of
shares 0, 0.9, 0, 0.5, 0, 0.9 (15 or 10 s each; the first second of each
left out). Per phase and rank it prints one JSON line: the median step
(`iteration_s` of the steps that ended in the phase), and the share of wall
time the rank's threads spent runnable but waiting for a CPU (the kernel's
run_delay, /proc/PID/task/TID/schedstat): the main thread's (`delay_main`,
the one that runs the step's compute) and all threads' summed
(`delay_all`), and the main thread's CPU share (`cpu_main`).
"""

import argparse
import json
import os
import socket
import statistics
import subprocess
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PHASES = [(0.0, 15), (0.9, 15), (0.0, 10), (0.5, 15), (0.0, 10), (0.9, 15)]


def schedstat(pid):
    """{tid: (cpu ns, run_delay ns)} for each thread of `pid`."""
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            f = open(f"/proc/{pid}/task/{tid}/schedstat").read().split()
            out[int(tid)] = (int(f[0]), int(f[1]))
        except OSError:  # the thread ended
            pass
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("spec")
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    a = ap.parse_args()
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = [subprocess.Popen([os.path.join(a.build, "worker", "tandem-worker"), "--standalone",
                               "--spec", a.spec, "--rank", str(r), "--world", "2",
                               "--rendezvous", f"127.0.0.1:{port}", "--threads", "1"],
                              env=env, stdout=subprocess.PIPE, text=True)
             for r in range(2)]
    steps = [[] for _ in procs]

    def read(i):
        for line in procs[i].stdout:
            if line.startswith('{"step"'):
                steps[i].append((time.time(), json.loads(line)["iteration_s"]))

    for i in range(2):
        threading.Thread(target=read, args=(i,), daemon=True).start()
    share, stop = [0.0], [False]

    def hog():
        while not stop[0]:
            t0 = time.time()
            while time.time() - t0 < 0.01 * share[0]:
                pass
            time.sleep(max(0.0, 0.01 * (1 - share[0])))

    threading.Thread(target=hog, daemon=True).start()
    try:
        time.sleep(8)  # start-up and warm-up
        for sh, dur in PHASES:
            share[0] = sh
            time.sleep(1)
            before = [schedstat(p.pid) for p in procs]
            t0 = time.time()
            time.sleep(dur - 1)
            after = [schedstat(p.pid) for p in procs]
            t1 = time.time()
            row = dict(share=sh)
            for r, p in enumerate(procs):
                b, e = before[r], after[r]
                st = [x for ts, x in steps[r] if t0 <= ts <= t1]
                row[f"r{r}"] = dict(
                    step=round(statistics.median(st), 4) if st else None, n=len(st),
                    delay_main=round((e[p.pid][1] - b[p.pid][1]) / 1e9 / (t1 - t0), 3),
                    cpu_main=round((e[p.pid][0] - b[p.pid][0]) / 1e9 / (t1 - t0), 3),
                    delay_all=round(sum(e[t][1] - b[t][1] for t in e if t in b) / 1e9 / (t1 - t0),
                                    3))
            print(json.dumps(row), flush=True)
    finally:
        stop[0] = True
        for p in procs:
            p.kill()


if __name__ == "__main__":
    main()
