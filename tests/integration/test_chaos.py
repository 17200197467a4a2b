"""Chaos, the short version (issue 16 item 3; bench/chaos/run.py is the long
one, bench/README.md "chaos"): two jobs under `tandem launch` on one
coordinator with a SQLite database; the coordinator is SIGKILLed and started
again on the same database and port, and workers are SIGKILLed, at moments
aimed at the phases of a job (registration, warm-up, planning, schedule
push, checkpoint write). Nothing may be lost: both jobs succeed with every
step's loss equal, bit for bit, to an uninterrupted run's; every event and
every schedule version seen before a coordinator kill is still served after
it; and every kill is recovered from."""

import importlib.util
import json
import os

import pytest

import tandem_harness as harness
from tandem_harness import REPO, worker_binary

# bench/chaos/run.py, the long version, does the work.
_spec = importlib.util.spec_from_file_location(
    "tandem_chaos", REPO / "bench" / "chaos" / "run.py")
chaos = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(chaos)

# Each kill is (job, kind, phase); each job meets its kills in phase order.
# Job 1 starts once job 0's kills are done and runs beside its last steps.
PLAN = [
    (0, "worker", "warm-up"),
    (0, "worker", "planning"),
    (0, "coordinator", "push"),
    (1, "worker", "checkpoint"),
]


def run_chaos(tmp_path, plan, **kwargs):
    if not worker_binary().is_file() or \
            not harness.coordinator_binary().is_file():
        pytest.skip("tandem-worker or tandem-coordinator is not built")
    seed = int(os.environ.get("TANDEM_CHAOS_SEED", "16"))
    run = chaos.Chaos(
        jobs=max(k[0] for k in plan) + 1, plan=plan, seed=seed, steps=60,
        every=5, parallel=2, slow_node_ms=8, workdir=tmp_path,
        build=harness.build_dir(), timeout_s=300, **kwargs)
    res = run.run()
    chaos.print_report(res)
    (tmp_path / "chaos.json").write_text(json.dumps(res, indent=1,
                                                    default=str))
    return res


def assert_nothing_lost(res):
    s = res["summary"]
    assert s["jobs_completed"] == s["jobs"], res["jobs"]
    assert s["jobs_lost"] == 0, res["jobs"]
    assert s["events_lost"] == 0, (res["kills"], res["details"])
    assert s["schedules_lost"] == 0, (res["kills"], res["details"])
    assert s["not_recovered"] == 0, res["kills"]
    assert s["events_checked"] > 0 and s["schedules_checked"] > 0
    for job in res["jobs"]:
        assert job["final_step_present"] and job["n_loss_mismatches"] == 0


def test_nothing_is_lost(tmp_path):
    res = run_chaos(tmp_path, PLAN)
    s = res["summary"]
    kills = [k for k in res["kills"] if k.get("killed")]
    assert s["coordinator_kills"] >= 1 and s["worker_kills"] >= 2, \
        res["kills"]
    assert len({k["job"] for k in kills}) == 2
    assert_nothing_lost(res)


def test_registration_phase(tmp_path):
    """A coordinator killed while a rank waits for its peers (the
    rendezvous store's waits ride it out, and `tandem launch` waits for the
    coordinator before deciding on a relaunch), and a worker killed after
    registering, before its peers did (its relaunch takes its rank: no
    restart, and no peer fails on its address)."""
    res = run_chaos(tmp_path, [(0, "coordinator", "registration"),
                               (1, "worker", "registration")])
    assert_nothing_lost(res)
    assert all(k.get("killed") for k in res["kills"]), res["kills"]
