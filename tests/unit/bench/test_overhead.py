"""bench/overhead's pure parts: phases from a worker trace, ratios over rounds."""

import json
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "..", "bench",
                                "overhead"))
import overhead  # noqa: E402


def write_trace(tmp_path, iteration_s=1.0):
    """A trace in the worker's form (worker/runtime/iteration_timeline.cc):
    stream names in metadata, node spans with their phase, a wait and an
    exchange on the compute stream, a collective on the communication one."""
    ev = [
        {"ph": "M", "name": "thread_name", "pid": 0, "tid": 1, "args": {"name": "compute"}},
        {"ph": "M", "name": "thread_name", "pid": 0, "tid": 2,
         "args": {"name": "communication"}},
        {"ph": "X", "name": "embed", "cat": "node", "tid": 1, "ts": 0, "dur": 200000,
         "args": {"node_id": 0, "phase": "fwd"}},
        {"ph": "X", "name": "embed.bwd", "cat": "node", "tid": 1, "ts": 300000, "dur": 400000,
         "args": {"node_id": 1, "phase": "bwd"}},
        {"ph": "X", "name": "optimizer", "cat": "node", "tid": 1, "ts": 750000, "dur": 100000,
         "args": {"node_id": 2, "phase": "opt"}},
        {"ph": "X", "name": "wait allgather g0", "cat": "wait", "tid": 1, "ts": 200000,
         "dur": 50000, "args": {}},
        {"ph": "X", "name": "exchange", "cat": "exchange", "tid": 1, "ts": 700000,
         "dur": 50000, "args": {}},
        {"ph": "X", "name": "allgather g0", "cat": "collective", "tid": 2, "ts": 0,
         "dur": 900000, "args": {}},
    ]
    path = tmp_path / "trace.json"
    path.write_text(json.dumps({"traceEvents": ev, "otherData": {"iteration_s": iteration_s}}))
    return str(path)


def test_trace_phases_compute_stream_only_rest_is_other(tmp_path):
    p = overhead.trace_phases(write_trace(tmp_path))
    assert p["forward"] == pytest.approx(0.2)
    assert p["backward"] == pytest.approx(0.4)
    assert p["optimizer"] == pytest.approx(0.1)
    # The wait and the exchange; the collective on its own stream is not.
    assert p["waits"] == pytest.approx(0.1)
    assert p["other"] == pytest.approx(0.2)


def test_ratio_is_median_of_round_ratios_never_the_best():
    tandem = [{"step_s": s} for s in (1.0, 2.0, 1.1)]
    eager = [{"step_s": s} for s in (1.0, 1.0, 1.0)]
    r = overhead.ratio_summary(tandem, eager)
    assert r["ratio"] == pytest.approx(1.1)
    assert (r["ratio_min"], r["ratio_max"]) == pytest.approx((1.0, 2.0))
    assert r["rounds"] == 3


def test_rounds_alternate_order_and_run_everyone_alike():
    calls = []
    b = overhead.Bench.__new__(overhead.Bench)
    b.a = type("A", (), {"rounds": 4})()
    res = b.rounds([("t", lambda: calls.append("t") or {"step_s": 1}),
                    ("e", lambda: calls.append("e") or {"step_s": 1})])
    assert calls == ["t", "e", "e", "t", "t", "e", "e", "t"]
    assert len(res["t"]) == len(res["e"]) == 4
