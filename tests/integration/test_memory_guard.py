"""A plan never kills its job (worker/README.md, "Memory guard"): real
coordinator and tandem-worker processes under a tight memory.budget_bytes.

The model is small enough that the baseline fits 20 MiB but the unbounded
plan does not: before the guard, the first plan was predicted at 98% of the
budget and a later step went over it, failing the job."""

import math
import re

import pytest

import tandem
from tandem_harness import wait_for  # noqa: F401
from test_job_loop import spec, messages, step_lines, SUCCEEDED, FAILED

MIB = 1 << 20
LEAST_MEMORY = -1  # the fallback's version (common/lowering/least_memory.h)
TIGHT = {
    "model": {"layers": 4, "d_model": 128, "ffn": 352, "vocab": 1024},
    "batch": {"micro_batch": 4, "seq_len": 40},
}


def tight_spec(steps, budget):
    return spec(steps=steps, memory={"budget_bytes": budget}, **TIGHT)


def run(cluster, coord, client, job_spec, timeout=240):
    job = client.submit(job_spec)
    workers = [cluster.worker(coord, job.id, r) for r in range(2)]
    rcs = [w.wait(timeout=timeout) for w in workers]
    final = client.get(job.id)[0]
    return job, workers, rcs, final


def check_guarded(workers, budget, steps):
    """Both ranks ran every step under the same versions, and a step over
    the budget was followed by the switch to the least-memory schedule
    within one step (the guard's agreed boundary)."""
    runs = [step_lines(w) for w in workers]
    for run_ in runs:
        assert [d["step"] for d in run_] == list(range(steps))
    versions = [d["schedule_version"] for d in runs[0]]
    assert versions == [d["schedule_version"] for d in runs[1]], versions
    peaks = [max(a["peak_bytes"], b["peak_bytes"]) for a, b in zip(*runs)]
    for i, peak in enumerate(peaks):
        if peak > budget and versions[i] != LEAST_MEMORY and i + 2 < steps:
            assert LEAST_MEMORY in versions[i + 1:i + 3], (i, versions, peaks)
    return versions, peaks


def test_budget_20mib_plan_never_fails_the_job(cluster):
    budget = 20 * MIB
    steps = 30
    coord = cluster.coordinator()
    with tandem.Client(coord.address, timeout=10) as client:
        job, workers, rcs, final = run(cluster, coord, client,
                                       tight_spec(steps, budget))
        msgs = messages(client, job.id)
        assert rcs == [0, 0] and final.state == SUCCEEDED, (
            rcs, final.state, msgs, workers[0].log()[-2000:])
        assert final.step == steps
        versions, peaks = check_guarded(workers, budget, steps)
        planned = [m for m in msgs if "(initial)" in m]
        assert planned and "kept free" in planned[0], msgs
        print("versions", versions)
        print("peaks (MiB)", ["%.2f" % (p / MIB) for p in peaks])
        for m in msgs:
            print("event:", m[:300])
        # Planned steps stay under the budget once the guard's re-plan (if
        # any) took effect: the last quarter of the run is all within it.
        tail = peaks[-steps // 4:]
        assert max(tail) <= budget, (versions, peaks)


def test_budget_refused_then_one_percent_above_least_memory_peak(cluster):
    coord = cluster.coordinator()
    with tandem.Client(coord.address, timeout=10) as client:
        # (a) Too small for any schedule by the model: refused at submit,
        # with a value to paste.
        with pytest.raises(tandem.TandemError) as refused:
            client.submit(tight_spec(10, 4 * MIB))
        text = str(refused.value)
        m = re.search(r"memory\.budget_bytes: (\d+)MiB", text)
        assert m, text
        analytic_mib = int(m.group(1))
        assert analytic_mib * MIB > 4 * MIB

        # (b) The model's figure is a lower bound: at it the job either runs
        # or fails with the measured figure and a value to paste, never at a
        # step under a plan past the budget.
        job, workers, rcs, final = run(cluster, coord, client,
                                       tight_spec(8, analytic_mib * MIB))
        msgs = messages(client, job.id)
        if final.state == FAILED:
            assert re.search(r"memory\.budget_bytes: \d+MiB", final.error), (
                final.error, msgs)
        else:
            assert final.state == SUCCEEDED, (final.state, msgs)

        # (c) Below the baseline's peak, above the least-memory one: the
        # baseline trips the guard at once and the job ends on the
        # least-memory schedule; its largest peak over the run is the
        # least-memory peak.
        steps = 16
        job, workers, rcs, final = run(cluster, coord, client,
                                       tight_spec(steps, 17 * MIB))
        msgs = messages(client, job.id)
        assert rcs == [0, 0] and final.state == SUCCEEDED, (
            rcs, final.state, final.error, msgs)
        runs = [step_lines(w) for w in workers]
        least = max(d["peak_bytes"] for r in runs for d in r
                    if d["schedule_version"] == LEAST_MEMORY)
        print("least-memory peak: model <= %d MiB, measured %d B" % (
            analytic_mib, least))

        # (d) 1% above the least-memory peak: the job runs to the end.
        budget = math.ceil(least * 1.01)
        steps = 20
        job, workers, rcs, final = run(cluster, coord, client,
                                       tight_spec(steps, budget))
        msgs = messages(client, job.id)
        assert rcs == [0, 0] and final.state == SUCCEEDED, (
            rcs, final.state, final.error, msgs,
            workers[0].log()[-2000:])
        versions, peaks = check_guarded(workers, budget, steps)
        print("versions", versions)
        print("peaks (MiB)", ["%.2f" % (p / MIB) for p in peaks])
        for m in msgs:
            print("event:", m[:300])
        assert LEAST_MEMORY in versions, versions
