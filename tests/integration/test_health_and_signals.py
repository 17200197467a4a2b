"""grpc.health.v1 on the coordinator and on workers (--health-listen), checked
with tandem-health; and SIGTERM to a worker ending its job with a clear
event, over real processes."""

import re
import signal
import subprocess
import time

import tandem
import tandem_harness as harness
from tandem_harness import unique_name, wait_for
from tandem.v1 import job_pb2

FAILED = job_pb2.JOB_STATE_FAILED

SPEC = {"model": {"preset": "llama", "layers": 2, "d_model": 64, "heads": 4,
                  "ffn": 128, "vocab": 256},
        "batch": {"micro_batch": 2, "seq_len": 32},
        "parallel": {"world_size": 2}}


def spec(steps):
    return dict(SPEC, name=unique_name("health"), train={"steps": steps})


def health(address, *args):
    binary = harness.build_dir() / "coordinator" / "tandem-health"
    return subprocess.run([str(binary), *args, address], capture_output=True,
                          text=True, timeout=30)


def health_port(worker):
    def port():
        m = re.search(r"health on port (\d+)", worker.log_path.read_text())
        return int(m.group(1)) if m else None
    return wait_for(port, timeout=20, what="the worker's health port")


def test_coordinator_serves_health(cluster):
    coord = cluster.coordinator()
    out = health(coord.address)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "%s: SERVING" % coord.address
    for service in ("tandem.v1.JobService", "tandem.v1.WorkerService"):
        out = health(coord.address, "--service", service)
        assert out.returncode == 0, out.stderr
    out = health(coord.address, "--service", "no.such.Service")
    assert out.returncode == 1
    assert "does not know service 'no.such.Service'" in out.stderr


def test_health_of_nothing_listening_fails_after_wait(cluster):
    coord = cluster.coordinator()
    address = coord.address
    coord.stop()
    start = time.monotonic()
    out = health(address, "--wait", "1")
    assert out.returncode == 1
    assert "unreachable" in out.stderr and "(waited 1 s)" in out.stderr, \
        out.stderr
    assert 0.9 < time.monotonic() - start < 10


def test_worker_health_ready_after_registration(cluster):
    coord = cluster.coordinator()
    with tandem.Client(coord.address, timeout=10) as client:
        job = client.submit(spec(steps=100000))
        w0 = cluster.worker(coord, job.id, 0,
                            extra=["--health-listen", "127.0.0.1:0"])
        address = "127.0.0.1:%d" % health_port(w0)
        # Alive at once; ready once registered (rank 1 has not come yet, so
        # it waits in the rendezvous).
        assert health(address).returncode == 0
        out = health(address, "--service", "ready", "--wait", "20")
        assert out.returncode == 0, out.stderr + w0.log()
        w1 = cluster.worker(coord, job.id, 1)
        wait_for(lambda: client.get(job.id)[0].step >= 2, timeout=60,
                 what="2 steps; " + w0.log())
        w1.proc.send_signal(signal.SIGTERM)
        assert w1.wait(timeout=20) == 128 + signal.SIGTERM, w1.log()
        assert w0.wait(timeout=20) != 0, w0.log()
        # The port closed with the process.
        assert health(address).returncode == 1


def test_sigterm_fails_job_with_signal_event(cluster):
    coord = cluster.coordinator()
    with tandem.Client(coord.address, timeout=10) as client:
        job = client.submit(spec(steps=100000))
        workers = [cluster.worker(coord, job.id, r) for r in range(2)]
        wait_for(lambda: client.get(job.id)[0].step >= 2, timeout=60,
                 what="2 steps; " + workers[0].log())
        start = time.monotonic()
        workers[0].proc.send_signal(signal.SIGTERM)
        final = wait_for(
            lambda: (lambda j: j if j.state == FAILED else None)(
                client.get(job.id)[0]),
            timeout=15, what="the job to fail")
        assert time.monotonic() - start < 5
        assert final.error.endswith(
            "rank 0 stopped by signal SIGTERM (scancel?)"), final.error
        events = [e.message for e in client.get(job.id)[1]]
        assert any("rank 0 stopped by signal SIGTERM" in m for m in events), \
            events
        assert workers[0].wait(timeout=20) == 128 + signal.SIGTERM, \
            workers[0].log()
        assert "stopped by signal SIGTERM" in workers[0].log()
        # The other rank is told to stop by the coordinator.
        assert workers[1].wait(timeout=20) != 0, workers[1].log()
        assert "stopped by signal SIGTERM" in workers[1].log()


def test_world_mismatch_fails_job_at_once(cluster):
    """A launcher that started 3 ranks for a 2-rank job (--world 3, as
    deploy/slurm passes SLURM_NTASKS) fails the job with a clear error."""
    coord = cluster.coordinator()
    with tandem.Client(coord.address, timeout=10) as client:
        job = client.submit(spec(steps=5))
        w0 = cluster.worker(coord, job.id, 0, extra=["--world", "3"])
        assert w0.wait(timeout=30) == 1, w0.log()
        final = client.get(job.id)[0]
        assert final.state == FAILED
        assert "rank 0 was launched as one of 3 ranks (--world), but job " \
            "%s has world_size 2" % job.id in final.error, final.error
