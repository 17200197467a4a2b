#!/usr/bin/python3
"""Step time while a checkpoint is written in the background.

Runs the standalone worker (world 1, CPU) on a model with about 120 MB of
checkpointed state, checkpointing every EVERY steps, and times each step as
the wall time between its JSON line and the previous one (so the snapshot
copy and the step-boundary exchange, which happen between steps, count).
The steps during which a checkpoint's file is written (the EVERY - 1 steps
after each checkpoint step, and the checkpoint step itself, which takes the
snapshot) are compared with the same steps of a run without checkpoints.

    bench/checkpoint_stall/run.py [--build build] [--steps 41] [--every 4]
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


def run(worker, tmp, steps, every, tag):
    ckpt = os.path.join(tmp, f"ckpt-{tag}") if every else ""
    spec = os.path.join(tmp, f"{tag}.yaml")
    with open(spec, "w") as f:
        f.write(SPEC.format(steps=steps, ckpt=ckpt, every=every))
    proc = subprocess.Popen(
        [worker, "--standalone", "--spec", spec, "--rank", "0", "--world",
         "1", "--rendezvous", "127.0.0.1:29731", "--threads", "1"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    times = []
    last = time.monotonic()
    for line in proc.stdout:
        if line.startswith('{"step"'):
            now = time.monotonic()
            times.append(now - last)
            last = now
    assert proc.wait() == 0
    return times[1:]  # the first step includes start-up


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--build", default="build")
    p.add_argument("--steps", type=int, default=41)
    p.add_argument("--every", type=int, default=4)
    a = p.parse_args()
    worker = os.path.join(a.build, "worker", "tandem-worker")
    with tempfile.TemporaryDirectory() as tmp:
        plain = run(worker, tmp, a.steps, 0, "plain")
        ckpt = run(worker, tmp, a.steps, a.every, "ckpt")
    # times[i] is step i + 1; step s checkpoints when (s + 1) % every == 0.
    during = [i for i in range(len(ckpt)) if (i + 2) % a.every in (0, 1)
              or a.every <= 2]
    others = [i for i in range(len(ckpt)) if i not in during]
    med = statistics.median
    d_ckpt = med(ckpt[i] for i in during)
    d_plain = med(plain[i] for i in during)
    o_ckpt = med(ckpt[i] for i in others) if others else float("nan")
    print(f"steps while a checkpoint is taken or written: median "
          f"{d_ckpt * 1e3:.1f} ms, same steps without checkpoints "
          f"{d_plain * 1e3:.1f} ms: {d_ckpt / d_plain:.3f}x; other steps "
          f"{o_ckpt * 1e3:.1f} ms")
    worst = max(ckpt[i] / med(plain) for i in during)
    print(f"worst such step: {worst:.2f}x the plain run's median step")
    return 0


if __name__ == "__main__":
    sys.exit(main())
