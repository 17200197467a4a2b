"""Fixtures for the end-to-end tests: a Slurm cluster started by the test
(tests/e2e/slurm_cluster.py) and real Tandem coordinators (the harness's
Coordinator, tests/harness/tandem_harness.py, which tests/pytest.ini puts on
the path)."""

import os

import pytest

from slurm_cluster import SlurmCluster, missing_tools
from tandem_harness import Coordinator, build_dir, coordinator_binary


def require_binaries():
    needed = [build_dir() / "coordinator" / "tandem-coordinator",
              build_dir() / "coordinator" / "tandem-health",
              build_dir() / "worker" / "tandem-worker"]
    missing = [str(p) for p in needed if not p.is_file()]
    if missing:
        pytest.skip("not built: %s (scripts/setup.sh builds them)"
                    % ", ".join(missing))


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    """A two-node Slurm cluster on this host; stopped (jobs cancelled,
    daemons ended) even when a test fails."""
    if os.geteuid() != 0:
        pytest.skip("the Slurm cluster runs slurmd as root; run as root")
    tools = missing_tools()
    if tools:
        pytest.skip("Slurm/munge tools missing: %s (scripts/setup.sh "
                    "installs slurm-wlm and munge)" % ", ".join(tools))
    require_binaries()
    # A short path: munge's and slurmd's sockets live below it.
    cluster = SlurmCluster(tmp_path_factory.mktemp("slurm"))
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def coordinator(tmp_path):
    c = Coordinator(coordinator_binary(), tmp_path,
                    heartbeat_timeout_s=60)
    c.start()
    yield c
    c.stop()
