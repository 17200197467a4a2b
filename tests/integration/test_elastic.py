"""Elastic restarts on real processes (issue 16): `tandem launch` runs a
60-step job with restart.max_restarts; a worker is SIGKILLed at three random
steps. Each time the coordinator restarts the job from its newest complete
checkpoint, the launcher starts the workers again, and the job completes
with every step's loss equal, bit for bit, to an uninterrupted run's."""

import json
import math
import os
import random
import signal
import subprocess
import sys
import time

import yaml

import tandem
import tandem_harness as harness
from tandem_harness import REPO, unique_name, wait_for, worker_binary
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
        # Synchronous checkpoints: complete before the step's progress is
        # reported, so a kill recomputes at most `every` steps (in the
        # background, the steps a write is in flight more: test_chaos.py
        # kills during those writes).
        "checkpoint": {"dir": str(tmp_path / (name + "-ckpt")),
                       "every": EVERY, "sync": True},
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
            pids = harness.worker_pids(job_id)
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
        assert recomputed <= EVERY, m
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


def test_rank_that_never_returns_resumes_at_a_smaller_world(cluster, tmp_path):
    """restart.min_world 1 on a 2-rank job: rank 1 is SIGKILLed and never
    relaunched. The job restarts, waits rejoin_timeout_s for it, resumes at
    world 1 with rank 0 (which registers once more, told the new world),
    reshards the newest checkpoint 2 -> 1 and completes."""
    from tandem_harness import Worker
    # A loaded machine may miss the peer's failed collective: then the
    # heartbeat timeout finds rank 1 gone.
    c = cluster.coordinator(heartbeat_timeout_s=10)
    steps = 24
    spec = {
        "name": unique_name("shrink"),
        "model": {"preset": "llama", "layers": 2, "d_model": 64, "heads": 4,
                  "ffn": 128, "vocab": 256},
        "batch": {"micro_batch": 2, "seq_len": 32},
        "parallel": {"world_size": 2},
        "train": {"steps": steps},
        "optimize": {"warmup_steps": 3, "drift_threshold": 0.5},
        "checkpoint": {"dir": str(tmp_path / "shrink-ckpt"), "every": 4},
        "restart": {"max_restarts": 2, "min_world": 1,
                    "rejoin_timeout_s": 2},
    }
    launches = []

    def start(rank):
        d = tmp_path / ("launch%d" % len(launches))
        d.mkdir()
        w = Worker(d, c, job_id, rank, extra=["--slow-node-ms", "2"])
        cluster.workers.append(w)
        launches.append((rank, w))
        return w

    with tandem.Client(c.address, timeout=10) as client:
        job_id = client.submit(spec).id
        rank0, rank1 = start(0), start(1)
        wait_for(lambda: client.get(job_id).job.step >= 10, timeout=120,
                 what="step 10 (past the checkpoint at step 8)")
        rank1.kill()
        # Rank 0's collective fails, the job restarts and rank 0 exits 75.
        assert rank0.wait(timeout=60) == 75, rank0.log()
        assert client.get(job_id).job.restarts == 1
        again = start(0)
        # Past rejoin_timeout_s it resumes at world 1: rank 0, registered
        # for world 2, is told to register again.
        assert again.wait(timeout=60) == 75, again.log()
        job = client.get(job_id).job
        assert job.submitted_world_size == 2, job
        assert job.spec.parallel.world_size == 1, job
        last = start(0)
        assert last.wait(timeout=240) == 0, last.log()
        status = client.get(job_id)
        assert status.job.state == job_pb2.JOB_STATE_SUCCEEDED, \
            status.job.error
        assert status.job.restarts == 1
        restarts = [e.message for e in status.events if e.kind == "restart"]
        print("\n".join(restarts))
        assert any("resumes at world 1 of 2: rank 1 did not register "
                   "within restart.rejoin_timeout_s" in m
                   for m in restarts), restarts
        resumed = [m for m in restarts if m.startswith("resumed at step")]
        assert resumed and "the newest checkpoint" in resumed[-1], restarts
    shown = subprocess.run(
        [sys.executable, "-m", "tandem", "--coordinator", c.address,
         "status", job_id], cwd=str(CLIENT), capture_output=True, text=True,
        timeout=60)
    assert shown.returncode == 0, shown.stderr
    assert "restarts   1 of 2" in shown.stdout, shown.stdout
    assert ("world      1 ranks, resumed smaller: submitted with 2 "
            "(restart.min_world 1)") in shown.stdout, shown.stdout
    log = last.log_path.read_text()
    assert "rank 0 of 1" in log, log
    assert "resharded from 2 ranks to 1" in log, log
    rows = losses(last.out_path)
    first = rows[0][0]
    # A checkpoint is complete a step or two after its own step (above).
    assert first in (4, 8), rows[:3]
    assert resumed[-1].startswith("resumed at step %d " % first), resumed
    assert [s for s, _ in rows] == list(range(first, steps))
    assert all(math.isfinite(loss) for _, loss in rows)
