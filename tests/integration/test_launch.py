"""`tandem launch` as a user runs it: a real coordinator, the CLI starting
real tandem-worker processes on this host, watching the job, and forwarding
Ctrl-C to them."""

import json
import os
import signal
import subprocess
import sys
import time

import yaml

import tandem
import tandem_harness as harness
from tandem_harness import REPO, unique_name, wait_for, \
    worker_binary

CLIENT = REPO / "client" / "python"


def spec_file(tmp_path, steps, world=None):
    spec = {
        "name": unique_name(),
        "model": {"preset": "llama", "layers": 2, "d_model": 32, "heads": 4,
                  "ffn": 64, "vocab": 128},
        "batch": {"micro_batch": 2, "seq_len": 16},
        "train": {"steps": steps},
        "optimize": {"warmup_steps": 3},
    }
    if world is not None:
        spec["parallel"] = {"world_size": world}
    path = tmp_path / ("%s.yaml" % spec["name"])
    path.write_text(yaml.safe_dump(spec))
    return path


def launch(coordinator, *args, **popen):
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1",
               TANDEM_WORKER=str(worker_binary()))
    return subprocess.Popen(
        [sys.executable, "-m", "tandem", "--coordinator", coordinator.address,
         "launch"] + [str(a) for a in args],
        cwd=str(CLIENT), env=env, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, **popen)


def test_launch_nproc_2_runs_a_job_to_completion(cluster, tmp_path):
    c = cluster.coordinator()
    logs = tmp_path / "logs"
    p = launch(c, "--nproc", 2, "--threads", 1, "--log-dir", logs,
               spec_file(tmp_path, steps=8))
    out, err = p.communicate(timeout=240)
    assert p.returncode == 0, (out, err)
    job_id = out.split("submitted job ", 1)[1].split(";", 1)[0]
    assert "started 2 workers" in out
    assert "job %s SUCCEEDED after 8 steps" % job_id in out
    # One log and one step stream per rank, with the ranks launch gave.
    for rank in (0, 1):
        assert (logs / ("rank%d.log" % rank)).is_file()
        steps = [json.loads(line) for line in
                 (logs / ("rank%d.out" % rank)).read_text().splitlines()
                 if '"loss"' in line]
        assert len(steps) == 8 and all(s["rank"] == rank for s in steps)
    with tandem.Client(c.address) as client:
        job, _ = client.get(job_id)
        assert tandem.state_name(job.state) == "SUCCEEDED"
        assert job.spec.parallel.world_size == 2  # from --nproc


def test_launch_f16_on_cpu_workers_fails_the_job_saying_why(cluster,
                                                             tmp_path):
    """model.dtype f16 is accepted at submit (the hardware is not declared);
    the first CPU worker that registers fails the job with the reason, and
    launch ends instead of waiting."""
    c = cluster.coordinator()
    path = spec_file(tmp_path, steps=4)
    spec = yaml.safe_load(path.read_text())
    spec["model"]["dtype"] = "f16"
    path.write_text(yaml.safe_dump(spec))
    p = launch(c, "--nproc", 2, "--threads", 1, "--log-dir", tmp_path / "logs",
               path)
    out, err = p.communicate(timeout=240)
    assert p.returncode != 0, (out, err)
    job_id = out.split("submitted job ", 1)[1].split(";", 1)[0]
    why = ("reports device cpu, but model.dtype f16 needs a CUDA device on "
           "every rank")
    with tandem.Client(c.address) as client:
        job, _ = client.get(job_id)
        assert tandem.state_name(job.state) == "FAILED"
        assert why in job.error, job.error
        assert job.spec.train.loss_scale.mode == "dynamic"
    assert why in out + err


def test_skipped_steps_counted_and_shown_by_status(cluster, tmp_path):
    """Dynamic loss scaling on CPU workers (f32 here: the scaler works in
    any dtype) with a scale whose gradients overflow: the steps the ranks
    skip are counted by the coordinator, each is a "skipped" event, and
    `tandem status` shows the scale and the count."""
    c = cluster.coordinator()
    path = spec_file(tmp_path, steps=10)
    spec = yaml.safe_load(path.read_text())
    spec["train"]["loss_scale"] = {"mode": "dynamic", "init_scale": 1e30,
                                   "backoff_factor": 0.001}
    path.write_text(yaml.safe_dump(spec))
    p = launch(c, "--nproc", 2, "--threads", 1, "--log-dir", tmp_path / "logs",
               path)
    out, err = p.communicate(timeout=240)
    assert p.returncode == 0, (out, err)
    job_id = out.split("submitted job ", 1)[1].split(";", 1)[0]
    with tandem.Client(c.address) as client:
        job, events = client.get(job_id)
    skipped = [e.message for e in events if e.kind == "skipped"]
    assert job.skipped_steps >= 1 and len(skipped) == job.skipped_steps, (
        job, skipped)
    assert "at loss scale 1e+30" in skipped[0], skipped
    assert 0 < job.loss_scale < 1e30
    status = subprocess.run(
        [sys.executable, "-m", "tandem", "--coordinator", c.address,
         "status", job_id], cwd=str(CLIENT), capture_output=True, text=True,
        timeout=60)
    assert status.returncode == 0, status.stderr
    assert "%d step%s skipped" % (job.skipped_steps,
                                  "" if job.skipped_steps == 1 else "s") \
        in status.stdout, status.stdout


def test_launch_joins_an_existing_job(cluster, tmp_path):
    c = cluster.coordinator()
    with tandem.Client(c.address) as client:
        job = client.submit(str(spec_file(tmp_path, steps=6, world=2)))
    p = launch(c, "--nproc", 2, "--threads", 1, "--job", job.id,
               "--log-dir", tmp_path / "logs")
    out, err = p.communicate(timeout=240)
    assert p.returncode == 0, (out, err)
    assert "joining job %s (world 2)" % job.id in out
    assert "job %s SUCCEEDED after 6 steps" % job.id in out


def test_launch_world_size_mismatch_and_bad_args_are_usage_errors(
        cluster, tmp_path):
    c = cluster.coordinator()
    p = launch(c, "--nproc", 3, spec_file(tmp_path, steps=4, world=2))
    out, err = p.communicate(timeout=60)
    assert p.returncode == 2
    assert "parallel.world_size is 2 but --nproc is 3" in err
    p = launch(c, "--nproc", 2)
    _, err = p.communicate(timeout=60)
    assert p.returncode == 2 and "give a job spec to submit, or --job" in err
    p = launch(c, "--nproc", 2, "--worker", tmp_path / "nope",
               spec_file(tmp_path, steps=4))
    _, err = p.communicate(timeout=60)
    assert p.returncode == 2 and "no tandem-worker binary at" in err
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    p = launch(c, "--nproc", 2, "--log-dir", blocker / "logs",
               spec_file(tmp_path, steps=4))
    _, err = p.communicate(timeout=60)
    assert p.returncode == 2, err
    assert "cannot make the log directory %s" % (blocker / "logs") in err
    assert "Traceback" not in err
    with tandem.Client(c.address) as client:
        assert client.list() == []  # every refusal came before a submit


def worker_pids(job_id):
    return [pid for pid, _ in harness.worker_processes(job_id)]


def launched_job(client):
    def running():
        jobs = client.list(states="RUNNING")
        return jobs[0] if jobs and jobs[0].step >= 2 else None
    return wait_for(running, timeout=120,
                    what="the launched job to run 2 steps")


def test_launch_ctrl_c_cancels_the_job(cluster, tmp_path):
    """Ctrl-C of `tandem launch` cancels the job with the launcher's reason;
    the workers stop when the coordinator tells them, and none is left."""
    c = cluster.coordinator()
    logs = tmp_path / "logs"
    p = launch(c, "--nproc", 2, "--threads", 1, "--log-dir", logs,
               spec_file(tmp_path, steps=100000))
    with tandem.Client(c.address) as client:
        job = launched_job(client)
        assert len(worker_pids(job.id)) == 2
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=90)
        assert p.returncode == 128 + signal.SIGINT, (out, err)
        assert "SIGINT: cancelling job %s" % job.id in out, out
        final, _ = client.get(job.id)
        assert tandem.state_name(final.state) == "CANCELLED", final
        assert "stopped by tandem launch (SIGINT)" in final.error, final.error
    assert worker_pids(job.id) == []


def test_launch_killed_leaves_no_worker_behind(cluster, tmp_path):
    """SIGKILL of `tandem launch` (a closed terminal, a dropped ssh): the
    kernel hangs up on its workers (--exit-with-parent), each tells the
    coordinator why it stops, and the job fails with that reason."""
    c = cluster.coordinator()
    p = launch(c, "--nproc", 2, "--threads", 1, "--log-dir", tmp_path / "logs",
               spec_file(tmp_path, steps=100000))
    with tandem.Client(c.address) as client:
        job = launched_job(client)
        assert len(worker_pids(job.id)) == 2
        p.kill()
        p.communicate(timeout=30)
        wait_for(lambda: worker_pids(job.id) == [], timeout=30,
                 what="the workers to exit after their launcher")

        def ended():
            j, _ = client.get(job.id)
            return j if tandem.is_terminal(j.state) else None
        final = wait_for(ended, timeout=30, what="the job to end")
        assert tandem.state_name(final.state) == "FAILED", final
        assert "stopped by signal SIGHUP: its launcher is gone" in \
            final.error, final.error


def test_launch_cancels_the_job_when_a_worker_dies_early(cluster, tmp_path):
    c = cluster.coordinator()
    fake = tmp_path / "fake-worker"
    fake.write_text("#!/bin/sh\necho 'cannot start: no GPU here' >&2\n"
                    "exit 3\n")
    fake.chmod(0o755)
    start = time.monotonic()
    p = launch(c, "--nproc", 2, "--worker", fake, "--log-dir",
               tmp_path / "logs", spec_file(tmp_path, steps=4))
    out, err = p.communicate(timeout=60)
    assert p.returncode == 1, (out, err)
    assert time.monotonic() - start < 30
    assert "exited with code 3 before the job ended" in err
    assert "cannot start: no GPU here" in err
    job_id = out.split("submitted job ", 1)[1].split(";", 1)[0]
    with tandem.Client(c.address) as client:
        job, _ = client.get(job_id)
        assert tandem.state_name(job.state) == "CANCELLED"
