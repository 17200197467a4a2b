"""Fixtures for the loop tests: a real coordinator and real tandem-worker
processes on loopback. The helpers behind them are
tests/harness/tandem_harness.py (tests/pytest.ini puts it on the path)."""

import pytest

from tandem_harness import (Coordinator, Worker, coordinator_binary,
                            worker_binary)


@pytest.fixture
def cluster(tmp_path):
    """Starts a coordinator and hands out workers; stops everything."""
    if not worker_binary().is_file():
        pytest.skip("tandem-worker is not built at %s (scripts/setup.sh "
                    "builds it)" % worker_binary())
    if not coordinator_binary().is_file():
        pytest.skip("tandem-coordinator is not built")

    class Cluster:
        def __init__(self):
            self.coordinators = []
            self.workers = []

        def coordinator(self, heartbeat_timeout_s=60, port=0, extra=(),
                        host="127.0.0.1"):
            d = tmp_path / ("coord%d" % len(self.coordinators))
            d.mkdir(exist_ok=True)
            c = Coordinator(coordinator_binary(), d,
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
