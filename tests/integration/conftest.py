"""Fixtures for the loop tests: a real coordinator and real tandem-worker
processes on loopback (reusing the client suite's Coordinator helper)."""

import importlib.util
import os
import pathlib
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location(
    "client_conftest", REPO / "client" / "python" / "tests" / "conftest.py")
client_conftest = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(client_conftest)

Coordinator = client_conftest.Coordinator
wait_for = client_conftest.wait_for
unique_name = client_conftest.unique_name


def worker_binary():
    return client_conftest.build_dir() / "worker" / "tandem-worker"


class Worker:
    """A tandem-worker process in agent mode."""

    def __init__(self, workdir, coordinator, job_id, rank, extra=(),
                 env_extra=None):
        self.log_path = workdir / ("worker%d.log" % rank)
        self.out_path = workdir / ("worker%d.jsonl" % rank)
        env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
        env.update(env_extra or {})
        self.proc = subprocess.Popen(
            [str(worker_binary()), "--coordinator", coordinator.address,
             "--job", job_id, "--rank", str(rank), "--threads", "1", *extra],
            stdout=open(self.out_path, "w"), stderr=open(self.log_path, "w"),
            env=env)

    def wait(self, timeout):
        return self.proc.wait(timeout=timeout)

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def log(self):
        return self.log_path.read_text() + self.out_path.read_text()[-2000:]


@pytest.fixture
def cluster(tmp_path):
    """Starts a coordinator and hands out workers; stops everything."""
    if not worker_binary().is_file():
        pytest.skip("tandem-worker is not built at %s (scripts/setup.sh "
                    "builds it)" % worker_binary())
    if not client_conftest.coordinator_binary().is_file():
        pytest.skip("tandem-coordinator is not built")

    class Cluster:
        def __init__(self):
            self.coordinators = []
            self.workers = []

        def coordinator(self, heartbeat_timeout_s=60, port=0, extra=(),
                        host="127.0.0.1"):
            d = tmp_path / ("coord%d" % len(self.coordinators))
            d.mkdir(exist_ok=True)
            c = Coordinator(client_conftest.coordinator_binary(), d,
                            heartbeat_timeout_s=heartbeat_timeout_s,
                            extra=extra, host=host)
            self.coordinators.append(c)
            return c.start(port=port)

        def worker(self, coordinator, job_id, rank, extra=(), env=None):
            w = Worker(tmp_path, coordinator, job_id, rank, extra, env)
            self.workers.append(w)
            return w

    c = Cluster()
    yield c
    for w in c.workers:
        w.kill()
    for coord in c.coordinators:
        coord.stop()


sys.path.insert(0, str(REPO / "client" / "python"))
