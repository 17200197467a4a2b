"""The closed loop over real processes on loopback: a coordinator, two
tandem-worker processes in agent mode, and the Python client."""

import time

import pytest

import tandem
from conftest import unique_name, wait_for
from tandem.v1 import job_pb2

RUNNING = job_pb2.JOB_STATE_RUNNING
SUCCEEDED = job_pb2.JOB_STATE_SUCCEEDED
FAILED = job_pb2.JOB_STATE_FAILED

SPEC = {
    "model": {"preset": "llama", "layers": 2, "d_model": 64, "heads": 4,
              "ffn": 128, "vocab": 256},
    "batch": {"micro_batch": 2, "seq_len": 32},
    "parallel": {"world_size": 2},
    # A loose threshold: 10 ms iterations on a shared 2-core machine are
    # noisy, and only injected drift should re-plan.
    "optimize": {"warmup_steps": 3, "drift_threshold": 0.5, "drift_window": 4},
}


def spec(steps, **extra):
    s = {k: dict(v) for k, v in SPEC.items()}
    s["name"] = unique_name("loop")
    s["train"] = {"steps": steps}
    for k, v in extra.items():
        s.setdefault(k, {}).update(v)
    return s


def events(client, job_id):
    return client.get(job_id)[1]


def messages(client, job_id, kind=None):
    return [e.message for e in events(client, job_id)
            if kind is None or e.kind == kind]


def test_two_ranks_submit_to_succeeded_with_replan(cluster):
    coord = cluster.coordinator()
    with tandem.Client(coord.address, timeout=10) as client:
        job = client.submit(spec(steps=24))
        workers = [cluster.worker(coord, job.id, r) for r in range(2)]
        for w in workers:
            assert w.wait(timeout=240) == 0, w.log()
        final = client.get(job.id)[0]
        assert final.state == SUCCEEDED
        assert final.step == 24
        msgs = messages(client, job.id)
        assert any("v1 (initial)" in m for m in msgs), msgs
        assert any("v1 active on all 2 ranks" in m for m in msgs), msgs
        text, schedule = client.schedule(job.id)
        assert schedule.version >= 1
        assert "persistent" in text or "allgather" in text
        # Both ranks printed the same losses.
        lines = [w.out_path.read_text().splitlines() for w in workers]
        assert lines[0][-1].split('"rank"')[0] == lines[1][-1].split('"rank"')[0]


def test_reoptimize_and_injected_drift_take_effect(cluster):
    coord = cluster.coordinator()
    with tandem.Client(coord.address, timeout=10) as client:
        job = client.submit(spec(steps=60))
        extra = ("--slow-node-ms", "15", "--slow-from-step", "14")
        workers = [cluster.worker(coord, job.id, r, extra) for r in range(2)]
        wait_for(lambda: client.get(job.id)[0].schedule_version >= 1,
                 timeout=120, what="schedule v1 active")
        client.reoptimize(job.id, reason="test")
        for w in workers:
            assert w.wait(timeout=300) == 0, w.log()
        msgs = messages(client, job.id)
        assert any("(reoptimize)" in m for m in msgs), msgs
        assert any(m.startswith("drift at step") for m in msgs), msgs
        assert any("(drift)" in m for m in msgs), msgs
        assert client.get(job.id)[0].schedule_version >= 3


def test_coordinator_restart_job_completes(cluster):
    coord = cluster.coordinator()
    with tandem.Client(coord.address, timeout=10) as client:
        job = client.submit(spec(steps=400))
    workers = [cluster.worker(coord, job.id, r) for r in range(2)]
    with tandem.Client(coord.address, timeout=10) as client:
        wait_for(lambda: client.get(job.id)[0].step >= 5, timeout=120,
                 what="training under way")
    port = coord.port
    coord.kill()
    time.sleep(1.0)  # workers keep training while it is away
    coord.start(port=port)
    with tandem.Client(coord.address, timeout=10) as client:
        assert client.get(job.id)[0].state in (RUNNING, SUCCEEDED)
        for w in workers:
            assert w.wait(timeout=240) == 0, w.log()
        final = client.get(job.id)[0]
        assert final.state == SUCCEEDED, messages(client, job.id)
        assert final.step == 400
        # Training went on while the coordinator was away.
        assert any("ranks finished 400 steps" in m for m in
                   messages(client, job.id))


def test_worker_killed_fails_job_naming_rank(cluster):
    coord = cluster.coordinator(heartbeat_timeout_s=3)
    with tandem.Client(coord.address, timeout=10) as client:
        job = client.submit(spec(steps=100000))
        workers = [cluster.worker(coord, job.id, r) for r in range(2)]
        wait_for(lambda: client.get(job.id)[0].step >= 3, timeout=120,
                 what="training under way")
        killed_at = time.monotonic()
        workers[1].kill()
        wait_for(lambda: client.get(job.id)[0].state == FAILED, timeout=30,
                 what="job FAILED")
        assert time.monotonic() - killed_at < 3 + 10
        error = client.get(job.id)[0].error
        assert "rank 1" in error, error
        # The survivor is told to stop (or loses its peer) and exits non-zero.
        assert workers[0].wait(timeout=120) != 0


def test_cancel_stops_workers_with_clear_error(cluster):
    coord = cluster.coordinator()
    with tandem.Client(coord.address, timeout=10) as client:
        job = client.submit(spec(steps=100000))
        workers = [cluster.worker(coord, job.id, r) for r in range(2)]
        wait_for(lambda: client.get(job.id)[0].step >= 3, timeout=120,
                 what="training under way")
        client.cancel(job.id, reason="demo over")
        for w in workers:
            assert w.wait(timeout=120) != 0
        assert any("CANCELLED" in w.log_path.read_text() for w in workers), \
            [w.log() for w in workers]
