"""deploy/slurm on a real Slurm cluster (tests/e2e/slurm_cluster.py): two
slurmd nodes on this host, the sbatch script and one tandem-worker per task.
"""

import os
import signal
import time

import pytest
import yaml

import tandem
import tandem_harness as harness
from tandem_harness import REPO, Coordinator, build_dir, unique_name, wait_for
from tandem.v1 import job_pb2

SBATCH = REPO / "deploy" / "slurm" / "tandem.sbatch"
SUCCEEDED = job_pb2.JOB_STATE_SUCCEEDED
FAILED = job_pb2.JOB_STATE_FAILED
CANCELLED = job_pb2.JOB_STATE_CANCELLED

# A small model: a step takes tens of milliseconds on one thread.
MODEL = {"preset": "llama", "layers": 2, "d_model": 64, "heads": 4,
         "ffn": 128, "vocab": 256}


def spec(steps):
    return {"name": unique_name("slurm"), "model": dict(MODEL),
            "batch": {"micro_batch": 2, "seq_len": 32},
            "train": {"steps": steps}, "parallel": {"world_size": 2},
            "optimize": {"warmup_steps": 3, "drift_threshold": 0.5}}


def launch_env(tmp_path, **extra):
    env = {"TANDEM_ROOT": str(REPO), "TANDEM_BUILD_DIR": str(build_dir()),
           "TANDEM_LOG_DIR": str(tmp_path / "logs"),
           "TANDEM_BIND_HOST": "127.0.0.1", "TANDEM_THREADS": "1",
           "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}
    env.update(extra)
    return env


def sbatch_args(tmp_path):
    return ["-N2", "-n2", "--ntasks-per-node=1",
            "--output=%s" % (tmp_path / "slurm-%j.out"), "--chdir=%s" % tmp_path]


def slurm_output(tmp_path, job_id):
    f = tmp_path / ("slurm-%s.out" % job_id)
    return f.read_text() if f.exists() else "(no %s)" % f.name


def rank_logs(tmp_path):
    """The text logs in the job's logs directory (not the coordinator's
    SQLite database, which a script may keep there too)."""
    logs = tmp_path / "logs"
    return "\n".join(
        "== %s\n%s" % (f.name, f.read_text(errors="replace")[-3000:])
        for f in sorted(logs.glob("*"))
        if f.is_file() and ".db" not in f.name)


def test_sbatch_two_tasks_run_job_to_succeeded(slurm, coordinator, tmp_path):
    with tandem.Client(coordinator.address, timeout=10) as client:
        job = client.submit(spec(steps=8))
        slurm_job = slurm.sbatch(SBATCH, sbatch_args(tmp_path), launch_env(
            tmp_path, TANDEM_COORDINATOR=coordinator.address,
            TANDEM_JOB=job.id))
        info = slurm.wait_job_end(slurm_job, timeout=150)
        diagnostics = "%s\n%s" % (slurm_output(tmp_path, slurm_job),
                                  rank_logs(tmp_path))
        assert info["JobState"] == "COMPLETED", diagnostics
        assert info["ExitCode"] == "0:0", diagnostics
        assert info["NodeList"] == "node[1-2]", info

        final, events = client.get(job.id)
        assert final.state == SUCCEEDED, (final, diagnostics)
        assert final.step == 8

    out = slurm_output(tmp_path, slurm_job)
    assert "is serving" in out, out
    # One log per rank, each naming its rank, world and Slurm node.
    logs = tmp_path / "logs"
    nodes = set()
    for rank in range(2):
        log = (logs / ("rank-%d.log" % rank)).read_text()
        assert "rank %d of 2 (local 0)" % rank in log, log
        nodes.add(log.split("[")[1].split("]")[0])
        assert "job %s rank %d of 2" % (job.id, rank) in log, log
        steps = (logs / ("rank-%d.jsonl" % rank)).read_text().splitlines()
        assert '"param_digests"' in steps[-1], steps[-3:]
    assert nodes == {"node1", "node2"}


def test_killed_worker_is_started_again_in_its_task(slurm, coordinator,
                                                     tmp_path):
    """restart.max_restarts: a SIGKILLed worker's task starts it again
    (keeping the allocation), the other rank exits 75 and is started again
    too, and the job resumes from its checkpoint and succeeds."""
    s = spec(steps=40)
    s["checkpoint"] = {"dir": str(tmp_path / "ckpt"), "every": 5}
    s["restart"] = {"max_restarts": 1}
    with tandem.Client(coordinator.address, timeout=10) as client:
        job = client.submit(s)
        slurm_job = slurm.sbatch(SBATCH, sbatch_args(tmp_path), launch_env(
            tmp_path, TANDEM_COORDINATOR=coordinator.address,
            TANDEM_JOB=job.id))
        wait_for(lambda: client.get(job.id).job.step >= 12, timeout=120,
                 what=lambda: "12 steps; %s" % rank_logs(tmp_path))
        pids = harness.worker_pids(job.id)
        assert len(pids) == 2, pids
        os.kill(pids[1], signal.SIGKILL)
        info = slurm.wait_job_end(slurm_job, timeout=180)
        diagnostics = "%s\n%s" % (slurm_output(tmp_path, slurm_job),
                                   rank_logs(tmp_path))
        assert info["JobState"] == "COMPLETED", diagnostics
        final = client.get(job.id)
        assert final.job.state == SUCCEEDED, (final.job, diagnostics)
        assert final.job.restarts == 1
        assert any(e.kind == "restart" and e.message.startswith("resumed")
                   for e in final.events), diagnostics
    relaunched = [r for r in range(2) if "starting it again" in
                  (tmp_path / "logs" / ("rank-%d.log" % r)).read_text()]
    assert relaunched == [0, 1], diagnostics


def test_scancel_fails_job_with_signal_event(slurm, coordinator, tmp_path):
    with tandem.Client(coordinator.address, timeout=10) as client:
        job = client.submit(spec(steps=100000))
        slurm_job = slurm.sbatch(SBATCH, sbatch_args(tmp_path), launch_env(
            tmp_path, TANDEM_COORDINATOR=coordinator.address,
            TANDEM_JOB=job.id))
        wait_for(lambda: client.get(job.id)[0].step >= 3, timeout=90,
                 what=lambda: "3 steps; %s" % rank_logs(tmp_path))

        slurm.scancel(slurm_job)
        cancelled_at = time.monotonic()
        final = wait_for(
            lambda: (lambda j: j if j.state in (FAILED, CANCELLED) else None)(
                client.get(job.id)[0]),
            timeout=20, what=lambda: "the job to fail after scancel; %s"
            % rank_logs(tmp_path))
        ended_s = time.monotonic() - cancelled_at
        print("scancel -> %s in %.2f s" % (job_pb2.JobState.Name(final.state),
                                           ended_s))
        events = client.get(job.id)[1]
        text = "\n".join("%s: %s" % (e.kind, e.message) for e in events)
        assert "stopped by signal SIGTERM (scancel?)" in final.error, text
        assert "stopped by signal SIGTERM" in text, text
        # Well before heartbeats (60 s here) would have told.
        assert ended_s < 10, ended_s

        info = slurm.wait_job_end(slurm_job, timeout=60)
        assert info["JobState"] == "CANCELLED", info
    for rank in range(2):
        log = (tmp_path / "logs" / ("rank-%d.log" % rank)).read_text()
        assert "stopped by signal SIGTERM" in log, log


def test_sbatch_starts_coordinator_on_first_node(slurm, tmp_path):
    """No TANDEM_COORDINATOR: the script starts one on the first node,
    submits the spec with world_size = SLURM_NTASKS and stops it last."""
    spec_file = tmp_path / "job.yaml"
    s = spec(steps=5)
    s["parallel"]["world_size"] = 1  # the script sets SLURM_NTASKS
    spec_file.write_text(yaml.safe_dump(s))
    db = tmp_path / "logs" / "tandem.db"
    port = __import__("slurm_cluster").free_port()
    slurm_job = slurm.sbatch(SBATCH, sbatch_args(tmp_path), launch_env(
        tmp_path, TANDEM_SPEC=str(spec_file),
        TANDEM_COORDINATOR_PORT=str(port), TANDEM_DB=str(db)))
    info = slurm.wait_job_end(slurm_job, timeout=150)
    out = slurm_output(tmp_path, slurm_job)
    assert info["JobState"] == "COMPLETED", "%s\n%s" % (out,
                                                         rank_logs(tmp_path))
    assert "started the coordinator on" in out, out
    assert "is serving" in out, out
    assert "SUCCEEDED" in out, out
    log = (tmp_path / "logs" / "coordinator.log").read_text()
    assert "listening on port %d" % port in log, log
    # Secure by default off loopback: TLS and a token made for the
    # allocation, kept where only its user can read them.
    assert "TLS, tokens" in log, log
    secrets = tmp_path / "logs" / "secrets"
    assert secrets.stat().st_mode & 0o777 == 0o700
    assert (secrets / "tokens").stat().st_mode & 0o077 == 0
    assert db.exists()


def test_scancel_with_coordinator_in_job_records_failure(slurm, tmp_path):
    """scancel signals the coordinator the script started too; the workers'
    report still reaches its database before it stops."""
    spec_file = tmp_path / "job.yaml"
    spec_file.write_text(yaml.safe_dump(spec(steps=100000)))
    logs = tmp_path / "logs"
    port = __import__("slurm_cluster").free_port()
    slurm_job = slurm.sbatch(SBATCH, sbatch_args(tmp_path), launch_env(
        tmp_path, TANDEM_SPEC=str(spec_file),
        TANDEM_COORDINATOR_PORT=str(port), TANDEM_DB=str(logs / "tandem.db")))

    def stepping(client):
        try:
            jobs = client.list()
        except tandem.TandemError:
            return False  # not up yet
        return bool(jobs) and jobs[0].step >= 3

    # The coordinator the script started serves TLS with a token it made.
    secrets = logs / "secrets"
    wait_for(lambda: (secrets / "tokens").is_file() and
             (secrets / "server.pem").is_file(), timeout=60,
             what="the script's credentials")
    token = (secrets / "tokens").read_text().split()[0]
    with tandem.Client("127.0.0.1:%d" % port, timeout=5) as plain:
        with pytest.raises(tandem.TandemError) as refused:
            plain.list()  # a TLS port never answers plaintext
        assert "--tls-ca" in refused.value.message
    with tandem.Client("127.0.0.1:%d" % port, timeout=5, token=token,
                       tls_ca=str(secrets / "server.pem")) as client:
        wait_for(lambda: stepping(client), timeout=90,
                 what=lambda: "3 steps; %s" % rank_logs(tmp_path))
    slurm.scancel(slurm_job)
    info = slurm.wait_job_end(slurm_job, timeout=60)
    assert info["JobState"] == "CANCELLED", info

    # The database as the in-job coordinator left it.
    reopened = Coordinator(harness.coordinator_binary(), logs)
    reopened.start()
    try:
        with tandem.Client(reopened.address, timeout=10) as client:
            (job,) = client.list()
            assert job.state in (FAILED, CANCELLED), job
            assert "stopped by signal SIGTERM (scancel?)" in job.error, job
    finally:
        reopened.stop()
