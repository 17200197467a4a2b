"""Fixtures for the client's tests: a real tandem-coordinator process (port
0, temporary --db) and scripted sessions speaking WorkerService. The helpers
behind them are tests/harness/tandem_harness.py, shared with the system
suites; pyproject.toml's pytest settings put it on the path."""

import pytest

import tandem
from tandem_harness import (  # noqa: F401  (re-exported to the tests)
    EXAMPLE_SPEC, PY_ROOT, REPO, Coordinator, ScriptedSession, build_dir,
    coordinator_binary, free_port, require_coordinator_binary, run_cli,
    small_spec, unique_name, wait_for, wait_for_state, worker_pids,
    worker_processes)


@pytest.fixture(scope="session")
def coordinator(tmp_path_factory):
    """One coordinator for the session (jobs of different tests do not
    interact: each test uses its own jobs)."""
    c = Coordinator(require_coordinator_binary(), tmp_path_factory.mktemp("coord"))
    c.start()
    yield c
    c.stop()


@pytest.fixture
def new_coordinator(tmp_path):
    """A factory of private coordinators (restart tests); all are stopped at
    teardown."""
    started = []

    def make(**kwargs):
        d = tmp_path / ("coord%d" % len(started))
        d.mkdir()
        c = Coordinator(require_coordinator_binary(), d, **kwargs)
        started.append(c)
        return c.start()

    yield make
    for c in started:
        c.stop()


@pytest.fixture
def client(coordinator):
    with tandem.Client(coordinator.address, timeout=10) as c:
        yield c


@pytest.fixture
def scripted_sessions():
    """scripted_sessions(address, job_id, n) → n registered ranks; closed at
    teardown."""
    made = []

    def make(address, job_id, n):
        ws = [ScriptedSession(address, job_id, r) for r in range(n)]
        made.extend(ws)
        return ws

    yield make
    for w in made:
        w.close()
