"""Checkpoints written in the background (issue "Training features", item
5): a rank snapshots its state at the checkpoint's step and writes its file
while the next steps train; rank 0 writes the MANIFEST once every rank's
file is durable (worker/README.md, "Persistence and faults"). A run killed
with SIGKILL while a checkpoint's files are being written leaves the
previous checkpoint complete and usable: the resumed run starts from it.

The model is large enough (about 120 MB of state per checkpoint) that a
write spans steps, so the kill lands inside one.

    TANDEM_BUILD_DIR=build /usr/bin/python3 -m pytest -q tests/export/test_background_checkpoint.py
"""

import json
import os
import pathlib
import signal
import subprocess
import sys
import time

import pytest

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import test_exported_numerics as numerics  # noqa: E402

pytestmark = pytest.mark.skipif(not os.path.exists(numerics.WORKER),
                                reason=f"no {numerics.WORKER}")

EVERY = 2
STEPS = 12


def spec_text(ckpt):
    return f"""name: background-checkpoint
model: {{preset: llama, layers: 2, d_model: 384, heads: 6, kv_heads: 6, ffn: 1024, vocab: 8192}}
data: {{kind: synthetic, seed: 3}}
batch: {{micro_batch: 1, seq_len: 16}}
train: {{steps: {STEPS}, lr: 0.001, seed: 5}}
parallel: {{world_size: 1, zero_stage: 3}}
checkpoint: {{dir: "{ckpt}", every: {EVERY}}}
"""


def worker(spec, port):
    return subprocess.Popen(
        [numerics.WORKER, "--standalone", "--spec", str(spec), "--rank", "0",
         "--world", "1", "--rendezvous", f"127.0.0.1:{port}", "--threads",
         "1"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_sigkill_during_a_write_keeps_the_previous_checkpoint(tmp_path):
    ckpt = tmp_path / "ckpt"
    spec = tmp_path / "spec.yaml"
    spec.write_text(spec_text(ckpt))
    proc = worker(spec, numerics.free_port())
    # Kill as soon as a checkpoint's rank file is being written (its .tmp
    # exists) while an earlier checkpoint is complete.
    killed_in = None
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        for step in range(2 * EVERY, STEPS, EVERY):
            d = ckpt / f"step-{step:08d}"
            before = ckpt / f"step-{step - EVERY:08d}" / "MANIFEST"
            if (d / "rank-0.ckpt.tmp").exists() and before.exists():
                proc.send_signal(signal.SIGKILL)
                killed_in = step
                break
        if killed_in is not None:
            break
        time.sleep(0.001)
    out, err = proc.communicate(timeout=60)
    assert killed_in is not None, (
        f"no write in progress was seen before the run ended:\n{err[-2000:]}")
    assert proc.returncode == -signal.SIGKILL
    assert not (ckpt / f"step-{killed_in:08d}" / "MANIFEST").exists()
    complete = sorted(int(p.parent.name[5:]) for p in ckpt.glob("*/MANIFEST"))
    assert complete and complete[-1] < killed_in, complete
    previous = complete[-1]

    # The resumed run starts from the newest complete checkpoint.
    proc = worker(spec, numerics.free_port())
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-3000:]
    assert f"resumed from {ckpt}/step-{previous:08d}" in err, err[-2000:]
    steps = [json.loads(l)["step"] for l in out.splitlines()
             if l.startswith('{"step"')]
    assert steps == list(range(previous, STEPS)), steps
    # Every checkpoint the resumed run wrote is complete, the last included
    # (the run waits for it before it ends).
    assert (ckpt / f"step-{STEPS:08d}" / "MANIFEST").exists()
    print(f"killed while step {killed_in}'s file was written; resumed from "
          f"step {previous}")


def test_sync_checkpoint_is_complete_when_its_step_returns(tmp_path):
    """`checkpoint.sync: true`: the step that snapshots returns (and prints
    its line) only once its checkpoint's MANIFEST is written, so a rank lost
    after it recomputes at most `every` steps."""
    ckpt = tmp_path / "ckpt"
    spec = tmp_path / "spec.yaml"
    spec.write_text(spec_text(ckpt).replace(
        f"every: {EVERY}}}", f"every: {EVERY}, sync: true}}"))
    proc = worker(spec, numerics.free_port())
    seen = []
    for line in proc.stdout:
        if not line.startswith('{"step"'):
            continue
        step = json.loads(line)["step"]
        if (step + 1) % EVERY == 0:
            manifest = ckpt / f"step-{step + 1:08d}" / "MANIFEST"
            seen.append((step, manifest.exists()))
    err = proc.stderr.read()
    assert proc.wait(timeout=120) == 0, err[-3000:]
    assert len(seen) == STEPS // EVERY, seen
    assert all(ok for _, ok in seen), seen
