"""Elastic restarts on real processes (issue 16): `tandem launch` runs a
60-step job with restart.max_restarts; a worker is SIGKILLed at three random
steps. Each time the coordinator restarts the job from its newest complete
checkpoint, the launcher starts the workers again, and the job completes
with every step's loss equal, bit for bit, to an uninterrupted run's."""

import json
import os
import random
import signal
import subprocess
import sys
import time

import yaml

import tandem
from conftest import (REPO, client_conftest, unique_name, wait_for,
                      worker_binary)
from tandem.v1 import job_pb2

CLIENT = REPO / "client" / "python"
STEPS = 60
EVERY = 5


def spec_file(tmp_path, name, restarts):
    spec = {
        "name": name,
        "model": {"preset": "llama", "layers": 2, "d_model": 64, "heads": 4,
                  "ffn": 128, "vocab": 256},
        "batch": {"micro_batch": 2, "seq_len": 32},
        "parallel": {"world_size": 2},
        "train": {"steps": STEPS},
        "optimize": {"warmup_steps": 3, "drift_threshold": 0.5},
        "checkpoint": {"dir": str(tmp_path / (name + "-ckpt")),
                       "every": EVERY},
        "restart": {"max_restarts": restarts},
    }
    path = tmp_path / (name + ".yaml")
    path.write_text(yaml.safe_dump(spec))
    return path


def slow_worker(tmp_path):
    """tandem-worker with 2 ms in every node, so that a step lasts long
    enough for the test to aim its kills."""
    path = tmp_path / "slow-worker.sh"
    path.write_text("#!/bin/sh\nexec %s \"$@\" --slow-node-ms 2\n"
                    % worker_binary())
    path.chmod(0o755)
    return path


def launch(coordinator, tmp_path, spec, logs):
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1",
               TANDEM_WORKER=str(slow_worker(tmp_path)))
    return subprocess.Popen(
        [sys.executable, "-m", "tandem", "--coordinator", coordinator.address,
         "launch", "--nproc", "2", "--threads", "1", "--log-dir", str(logs),
         str(spec)], cwd=str(CLIENT), env=env, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True)


def losses(out_path):
    """Every step line of a rank's stdout, relaunches included, in order:
    [(step, loss)]."""
    rows = []
    for line in out_path.read_text().splitlines():
        d = json.loads(line)
        if "step" in d and "loss" in d and "iteration_s" in d:
            rows.append((d["step"], d["loss"]))
    return rows


def test_three_sigkills_resume_exactly(cluster, tmp_path):
    c = cluster.coordinator()
    # The uninterrupted run: the losses every step must reproduce.
    ref = launch(c, tmp_path, spec_file(tmp_path, unique_name("ref"), 0),
                 tmp_path / "ref")
    out, err = ref.communicate(timeout=300)
    assert ref.returncode == 0, (out, err)
    expected = [dict(losses(tmp_path / "ref" / ("rank%d.out" % r)))
                for r in (0, 1)]
    assert sorted(expected[0]) == list(range(STEPS))

    rng = random.Random(int(os.environ.get("TANDEM_CHAOS_SEED", "16")))
    kill_at = sorted(rng.sample(range(8, STEPS - 8), 3))
    logs = tmp_path / "chaos"
    run = launch(c, tmp_path, spec_file(tmp_path, unique_name("chaos"), 3),
                 logs)
    first = run.stdout.readline()
    assert "submitted job " in first, first + run.stderr.read()
    job_id = first.split("submitted job ", 1)[1].split(";", 1)[0]
    killed = []
    with tandem.Client(c.address, timeout=10) as client:
        for n, step in enumerate(kill_at):
            def reached():
                job = client.get(job_id).job
                return (job.state == job_pb2.JOB_STATE_RUNNING and
                        job.restarts == n and job.step >= step)
            wait_for(reached, timeout=120, interval=0.02,
                     what="step %d before kill %d" % (step, n + 1))
            pids = client_conftest.worker_pids(job_id)
            assert len(pids) == 2, pids
            victim = rng.choice(pids)
            os.kill(victim, signal.SIGKILL)
            killed.append((client.get(job_id).job.step, victim))
            wait_for(lambda: client.get(job_id).job.restarts == n + 1,
                     timeout=60, what="restart %d" % (n + 1))
        out, err = run.communicate(timeout=300)
        assert run.returncode == 0, (out, err)
        status = client.get(job_id)
    assert status.job.state == job_pb2.JOB_STATE_SUCCEEDED, status.job.error
    assert status.job.restarts == 3
    restarts = [e.message for e in status.events if e.kind == "restart"]
    print("killed (step, pid):", killed)
    print("\n".join(restarts))
    assert len([m for m in restarts if m.startswith("restart ")]) == 3
    resumed = [m for m in restarts if m.startswith("resumed at step")]
    assert len(resumed) == 3, restarts
    for m in resumed:
        recomputed = int(m.split("; ")[1].split()[0])
        # A checkpoint is complete (its manifest written) a step or two
        # after its own step: a kill in between resumes from the one before.
        assert recomputed <= EVERY + 2, m
    # Every step's loss, including the recomputed ones and each rank's,
    # equals the uninterrupted run's exactly.
    for rank in (0, 1):
        rows = losses(logs / ("rank%d.out" % rank))
        assert {s for s, _ in rows} == set(range(STEPS))
        assert len(rows) > STEPS  # some steps ran twice
        for s, loss in rows:
            assert loss == expected[rank][s], (rank, s, loss,
                                               expected[rank][s])
    assert out.count("starting it again") >= 6, out  # both ranks, 3 times
