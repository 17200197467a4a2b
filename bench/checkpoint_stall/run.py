#!/usr/bin/python3
"""Step time while a checkpoint is written in the background.

Runs the standalone worker (world 1, CPU) on a model with about 120 MB of
checkpointed state, checkpointing every EVERY steps, and times each step as
the wall time between its JSON line and the previous one (so the snapshot
copy and the step-boundary exchange, which happen between steps, count).
A run without checkpoints and a run with them alternate ROUNDS times, so a
noisy host disturbs both alike. Reported:

- every step of the checkpointing runs against every step of the plain ones
  (median and mean ratio): the write is spread over the steps after each
  snapshot (worker/README.md, "Persistence and faults"), so every step is
  "during a checkpoint";
- by position in the checkpoint interval (the snapshot step first), the
  median step against the plain runs' median: where the cost lands;
- the worst step of the checkpointing runs against the plain median.

--threads is the worker's (libtorch's and OpenBLAS's compute threads): 1
leaves the writer a core of this 2-core machine, 2 leaves it none.

With --buffered-too each round also runs the checkpointing job with
TANDEM_CHECKPOINT_DIRECT_IO=0 (rank files through the page cache, as before
direct I/O), reported the same way: both from the same rounds.

    bench/checkpoint_stall/run.py [--build build] [--steps 41] [--every 4]
                                  [--rounds 3] [--buffered-too] [--threads 1]
"""

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

SPEC = """name: checkpoint-stall
model: {{preset: llama, layers: 2, d_model: 384, heads: 6, kv_heads: 6, ffn: 1024, vocab: 8192}}
data: {{kind: synthetic, seed: 3}}
batch: {{micro_batch: 4, seq_len: 64}}
train: {{steps: {steps}, lr: 0.001, seed: 5}}
parallel: {{world_size: 1, zero_stage: 3}}
checkpoint: {{dir: "{ckpt}", every: {every}}}
"""


def run(worker, tmp, steps, every, tag, threads, env=None):
    """Step times of one run, its first (start-up) step left out:
    times[i] is step i + 1."""
    ckpt = os.path.join(tmp, f"ckpt-{tag}") if every else ""
    spec = os.path.join(tmp, f"{tag}.yaml")
    with open(spec, "w") as f:
        f.write(SPEC.format(steps=steps, ckpt=ckpt, every=every))
    proc = subprocess.Popen(
        [worker, "--standalone", "--spec", spec, "--rank", "0", "--world",
         "1", "--rendezvous", "127.0.0.1:29731", "--threads", str(threads)],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
        env=dict(os.environ, **(env or {})))
    times = []
    last = time.monotonic()
    for line in proc.stdout:
        if line.startswith('{"step"'):
            now = time.monotonic()
            times.append(now - last)
            last = now
    assert proc.wait() == 0
    return times[1:]


def report(label, plain, ckpt, by_phase, a):
    med, mean = statistics.median, statistics.fmean
    base = med(plain)
    print(f"{label}{a.rounds} rounds of {a.steps} steps, {a.threads} compute "
          f"thread(s), checkpoint every "
          f"{a.every}: median step {med(ckpt) * 1e3:.1f} ms against "
          f"{base * 1e3:.1f} ms without checkpoints ({med(ckpt) / base:.3f}x); "
          f"mean {mean(ckpt) * 1e3:.1f} against {mean(plain) * 1e3:.1f} ms "
          f"({mean(ckpt) / mean(plain):.3f}x)")
    print("  by position in the interval (0: the snapshot step), median "
          "against the plain median: " + ", ".join(
              f"{k}: {med(v) / base:.3f}x" for k, v in by_phase.items() if v))
    print(f"  worst step {max(ckpt) / base:.2f}x the plain median "
          f"(the plain runs' own worst: {max(plain) / base:.2f}x)")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--build", default="build")
    p.add_argument("--steps", type=int, default=41)
    p.add_argument("--every", type=int, default=4)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--buffered-too", action="store_true")
    p.add_argument("--threads", type=int, default=1)
    a = p.parse_args()
    worker = os.path.join(a.build, "worker", "tandem-worker")
    variants = {"": {}}
    if a.buffered_too:
        variants = {"direct I/O: ": {},
                    "buffered (TANDEM_CHECKPOINT_DIRECT_IO=0): ":
                        {"TANDEM_CHECKPOINT_DIRECT_IO": "0"}}
    plain = []
    ckpt = {v: [] for v in variants}
    by_phase = {v: {k: [] for k in range(a.every)} for v in variants}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(a.rounds):
            plain += run(worker, tmp, a.steps, 0, f"plain{r}", a.threads)
            for i, (v, env) in enumerate(variants.items()):
                times = run(worker, tmp, a.steps, a.every, f"ckpt{r}-{i}",
                            a.threads, env)
                ckpt[v] += times
                # Step s (times[s - 1]) snapshots when (s + 1) % every == 0:
                # phase 0 is the snapshot step, 1 the step after, ...
                for j, t in enumerate(times):
                    by_phase[v][(j + 2) % a.every].append(t)
    for v in variants:
        report(v, plain, ckpt[v], by_phase[v], a)
    return 0


if __name__ == "__main__":
    sys.exit(main())
