"""The closed loop over real processes on loopback: a coordinator, two
tandem-worker processes in agent mode, and the Python client."""

import json
import re
import statistics
import time

import pytest

import tandem
from tandem_harness import unique_name, wait_for
from tandem.progress import describe_outcome
from tandem.v1 import job_pb2

RUNNING = job_pb2.JOB_STATE_RUNNING
SUCCEEDED = job_pb2.JOB_STATE_SUCCEEDED
FAILED = job_pb2.JOB_STATE_FAILED

SPEC = {
    "model": {"preset": "llama", "layers": 2, "d_model": 64, "heads": 4,
              "ffn": 128, "vocab": 256},
    "batch": {"micro_batch": 2, "seq_len": 32},
    "parallel": {"world_size": 2},
    # A loose threshold: 10 ms iterations on a shared 2-core machine are
    # noisy, and only injected drift should re-plan.
    "optimize": {"warmup_steps": 3, "drift_threshold": 0.5, "drift_window": 4},
}


def spec(steps, **extra):
    s = {k: dict(v) for k, v in SPEC.items()}
    s["name"] = unique_name("loop")
    s["train"] = {"steps": steps}
    for k, v in extra.items():
        s.setdefault(k, {}).update(v)
    return s


def events(client, job_id):
    return client.get(job_id)[1]


def messages(client, job_id, kind=None):
    return [e.message for e in events(client, job_id)
            if kind is None or e.kind == kind]


def step_lines(worker):
    """The worker's per-step JSON lines (stdout), in order."""
    steps = []
    for line in worker.out_path.read_text().splitlines():
        d = json.loads(line)
        if "step" in d and "iteration_s" in d:
            steps.append(d)
    return steps


def settled_times(versions, times, version):
    """Iteration times of the steps run under `version`, less the first step
    after each switch (and step 0): those carry the switch's own costs."""
    return [t for i, (v, t) in enumerate(zip(versions, times))
            if v == version and i > 0 and versions[i - 1] == version]


REPLAN_STEPS = 40


def test_two_ranks_submit_to_succeeded_with_replan(cluster):
    coord = cluster.coordinator()
    with tandem.Client(coord.address, timeout=10) as client:
        # A 6-step profile window keeps >= 6 baseline steps to measure; the
        # drift threshold is out of reach so that the initial plan runs to the
        # end (drift re-plans are test_reoptimize_and_injected_drift's).
        # No trial, no baseline check (their own tests below): the initial
        # plan runs to the end.
        job = client.submit(spec(
            steps=REPLAN_STEPS,
            optimize={"warmup_steps": 6, "drift_threshold": 100,
                      "trial_margin": 0, "baseline_pairs": 0}))
        workers = [cluster.worker(coord, job.id, r) for r in range(2)]
        for w in workers:
            assert w.wait(timeout=240) == 0, w.log()
        final = client.get(job.id)[0]
        assert final.state == SUCCEEDED
        assert final.step == REPLAN_STEPS
        msgs = messages(client, job.id)
        assert any("v1 (initial)" in m for m in msgs), msgs
        assert any("v1 active on all 2 ranks" in m for m in msgs), msgs
        text, schedule = client.schedule(job.id)
        assert schedule.version >= 1
        assert "persistent" in text or "allgather" in text
        # Both ranks printed the same losses.
        lines = [w.out_path.read_text().splitlines() for w in workers]
        assert lines[0][-1].split('"rank"')[0] == lines[1][-1].split('"rank"')[0]

    # (a) What the ranks ran, from their own step lines: every step once,
    # both ranks under the same schedule version at every step (the switch
    # agreed on one iteration), starting from the baseline v0 and switching
    # to a published plan (>= 1) that the coordinator knows.
    runs = [step_lines(w) for w in workers]
    for rank, run in enumerate(runs):
        assert [d["step"] for d in run] == list(range(REPLAN_STEPS)), \
            (rank, [d["step"] for d in run])
    versions = [[d["schedule_version"] for d in run] for run in runs]
    assert versions[0] == versions[1], versions
    v = versions[0]
    assert v[0] == 0, v
    # A trial alternates with the plan it is tried against, and a baseline
    # check with v0 (blocks of steps back on an older version): without the
    # trial's steps and the check's baseline blocks, no step goes back to an
    # older version.
    tried = {int(m.group(1)) for m in
             (re.match(r"v(\d+) \(trial\)", x) for x in msgs) if m}
    checked = any("(baseline-check) from step" in x for x in msgs)
    first_plan = next((i for i, x in enumerate(v) if x > 0), len(v))
    kept = [x for i, x in enumerate(v)
            if x not in tried and not (checked and x == 0 and i > first_plan)]
    assert all(a <= b for a, b in zip(kept, kept[1:])), (v, tried)
    newest = v[-1]
    assert newest >= 1, "no step ran under a planned schedule: %s" % v
    assert schedule.version >= newest, (schedule.version, v)

    # (b) The plan measured no slower than the baseline on these processes:
    # a step's time is the slower rank's; the noise margin comes from the
    # spread of the baseline's own steps.
    times = [max(a["iteration_s"], b["iteration_s"]) for a, b in zip(*runs)]
    base = settled_times(v, times, 0)
    planned = settled_times(v, times, newest)
    figures = ("versions %s; v0 steps (ms) %s; v%d steps (ms) %s" % (
        v, ["%.2f" % (t * 1e3) for t in base], newest,
        ["%.2f" % (t * 1e3) for t in planned]))
    assert len(base) >= 4 and len(planned) >= 4, \
        "too few steps to compare: " + figures
    base_median = statistics.median(base)
    relative_mad = statistics.median(
        [abs(t - base_median) for t in base]) / base_median
    margin = max(0.15, 3 * relative_mad)
    planned_median = statistics.median(planned)
    print("replan: v0 median %.2f ms (relative MAD %.3f, margin %.3f), "
          "v%d median %.2f ms (%+.1f%%); %d and %d steps" % (
              base_median * 1e3, relative_mad, margin, newest,
              planned_median * 1e3,
              100 * (planned_median / base_median - 1), len(base),
              len(planned)))
    assert planned_median <= base_median * (1 + margin), (
        "v%d median %.2f ms > v0 median %.2f ms * (1 + %.3f); %s" % (
            newest, planned_median * 1e3, base_median * 1e3, margin, figures))

    # (c) The coordinator says what the plan bought, from the same steps:
    # its measured median agrees with the ranks' own lines, and its speedup
    # is either measured interleaved with the baseline (with an interval) or
    # says why not yet (test_speedup_measured_interleaved_with_the_baseline).
    assert final.schedule_version == newest
    assert final.measured_iteration_s == pytest.approx(planned_median,
                                                       rel=0.10), figures
    assert final.predicted_iteration_s > 0
    assert final.speedup_text, final
    if final.measured_speedup > 0:
        assert (final.speedup_low <= final.measured_speedup
                <= final.speedup_high), final
        assert "measured interleaved over" in final.speedup_text, final
    else:
        assert final.speedup_text.startswith("not measured"), final


def run_planned_job(cluster, coord, client, job_spec):
    """Submits `job_spec`, runs its two workers to the end and returns the
    job, the workers, its final state and its event messages; skips the test
    when v1 measured behind the baseline on this machine and was rolled back
    (what follows v1 is then not what the test is about)."""
    job = client.submit(job_spec)
    workers = [cluster.worker(coord, job.id, r) for r in range(2)]
    for w in workers:
        assert w.wait(timeout=240) == 0, w.log()
    final = client.get(job.id)[0]
    msgs = messages(client, job.id)
    assert final.state == SUCCEEDED, msgs
    if any(m.startswith("v1 measured") for m in
           messages(client, job.id, "rollback")):
        pytest.skip("v1 measured behind the baseline on this machine and "
                    "was rolled back: %s" % msgs)
    return job, workers, final, msgs


# The trial starts near step 17: 6 block pairs of 4 steps (48 steps), and a
# comparison whose ratio already clears min_gain measures on past them only
# in half the steps the job has left (here 6 pairs: none past them), with
# room for its verdict and the version after it.
TRIAL_STEPS = 130


def pair_ratios(v, times, candidate, incumbent, last_index):
    """The coordinator's comparison, recomputed from the ranks' own step
    lines: from the candidate's first step, blocks of consecutive steps under
    the candidate or the incumbent (each block's first step left out), each candidate block paired with the
    next incumbent block (or the reverse), each pair's ratio of medians."""
    blocks = []
    for i in range(v.index(candidate), last_index + 1):
        if v[i] not in (candidate, incumbent):
            continue
        if blocks and blocks[-1][0] == v[i] and blocks[-1][2] == i - 1:
            blocks[-1][1].append(times[i])
            blocks[-1][2] = i
        else:
            blocks.append([v[i], [times[i]], i])
    ratios, pending = [], None
    for version, steps, _ in blocks:
        counted = steps[1:]
        if len(counted) < 2:
            continue
        if pending is not None and pending[0] != version:
            mine = counted if version == candidate else pending[1]
            theirs = pending[1] if version == candidate else counted
            ratios.append(statistics.median(mine) / statistics.median(theirs))
            pending = None
        else:
            pending = (version, counted)
    return ratios


def test_trial_of_the_runner_up_on_real_workers(cluster):
    """The planner's runner-up (any, with trial_margin 1) runs on the job
    once the plan has run drift_window steps, alternating with that plan in
    blocks of steps on both ranks, and is kept only when the interleaved
    blocks measure it faster: the ratio the coordinator announces is the one
    the ranks' own step times give, and a trial not kept ends on the plan it
    was tried against (coordinator/README.md, "Decisions under noise")."""
    coord = cluster.coordinator()
    window = 4
    with tandem.Client(coord.address, timeout=10) as client:
        job, workers, final, msgs = run_planned_job(
            cluster, coord, client,
            spec(steps=TRIAL_STEPS,
                 optimize={"warmup_steps": 6, "drift_threshold": 100,
                           "drift_window": window, "trial_margin": 1.0,
                           # No baseline check after the verdict: the job
                           # ends on the verdict's version, not in a v0 block.
                           "baseline_pairs": 0}))
        trials = messages(client, job.id, "trial")
        # The announcement and the verdict.
        assert len(trials) == 2, "\n".join(msgs)
        announced = re.search(r"measuring (\S+)'s plan next", trials[0])
        assert announced, trials[0]
        source = announced.group(1)
        published = [m for m in msgs if "(trial) from step" in m]
        assert len(published) == 1, msgs
        assert ("trial:%s,trial-of-v1;" % source) in published[0], published[0]
        trial = int(re.match(r"v(\d+) \(trial\)", published[0]).group(1))
        v1 = client.schedule(job.id, 1).schedule
        tried = client.schedule(job.id, trial).schedule
        assert list(tried.actions) != list(v1.actions), "the same plan"
        ended = client.schedule(job.id).schedule

    runs = [step_lines(w) for w in workers]
    versions = [[d["schedule_version"] for d in run] for run in runs]
    assert versions[0] == versions[1], versions
    v = versions[0]
    # The ranks alternated: full blocks of the trial and of v1 in turn, the
    # trial first, until the verdict's version took effect. The block is
    # the length the coordinator announced.
    blocks = re.search(r"interleaved in blocks of (\d+) steps", trials[1])
    assert blocks, trials[1]
    block = int(blocks.group(1))
    start = v.index(trial)
    end = next(i for i in range(start, len(v)) if v[i] not in (trial, 1))
    alternated = v[start:end]
    expected = [trial if (i // block) % 2 == 0 else 1
                for i in range(len(alternated))]
    assert alternated == expected, v
    assert alternated.count(1) >= 2 * block - 1, v
    times = [max(a["iteration_s"], b["iteration_s"]) for a, b in zip(*runs)]
    verdict = re.search(
        r"v%d/v1 = ([0-9.]+) \(([0-9.]+)-([0-9.]+), 95%% interval\) at step "
        r"(\d+): (.*)$" % trial, trials[1])
    assert verdict, trials[1]
    ratio, low, high = (float(verdict.group(k)) for k in (1, 2, 3))
    decided_at = int(verdict.group(4))
    # Progress step S reports the step line of index S - 1.
    ratios = pair_ratios(v, times, trial, 1, decided_at - 1)
    assert len(ratios) >= 2, (ratios, v)
    mine = statistics.geometric_mean(ratios)
    print("trial: v%d (%s) against v1 in %d block pairs: %.3f (%.3f-%.3f); "
          "ranks' own lines %.3f; versions %s" % (
              trial, source, len(ratios), ratio, low, high, mine, v))
    assert mine == pytest.approx(ratio, abs=2e-3), (ratios, trials[1])
    assert low <= ratio <= high, trials[1]
    if "; kept: its plan runs on" in trials[1]:
        assert high < 1 and ratio <= 0.97, trials[1]
        assert final.schedule_version > trial, (final, v)
        assert list(ended.actions) == list(tried.actions)
        assert "kept-v%d" % trial in list(ended.provenance.passes)
    else:
        assert "back to v1's schedule" in trials[1], trials[1]
        # The job may end inside the baseline check that follows, on one of
        # its baseline blocks (v0): the last plan the ranks ran is the
        # rollback's.
        ran = [x for x in v if x != 0]
        assert ran[-1] > trial, (final, v)
        assert final.schedule_version in (0, ran[-1]), (final, v)
        assert list(ended.actions) == list(v1.actions)
        assert "rollback-to-v1" in list(ended.provenance.passes)
    # Once decided, the verdict's version runs; then at most the baseline
    # check of it, alternating with v0 (test_speedup_measured_...).
    settled = v[end]
    after = [x for x in v[end:] if x not in (settled, 0)]
    assert all(x == settled + 1 for x in after), v
    assert trial not in v[end:] and all(x != 1 for x in v[end:]), v


def test_speedup_measured_interleaved_with_the_baseline(cluster):
    """Once the plan has settled, the ranks alternate it with the baseline
    (v0) for the block pairs its schedule event names (optimize.baseline_pairs,
    more on a machine whose steps spread, in at most half the job's steps
    left), then run it on: the speedup the coordinator reports (with its
    interval and basis) is the one the ranks' own step lines give for those
    blocks (coordinator/README.md, "Decisions under noise")."""
    coord = cluster.coordinator()
    least = 3
    with tandem.Client(coord.address, timeout=10) as client:
        job, workers, final, msgs = run_planned_job(
            cluster, coord, client,
            spec(steps=70,
                 optimize={"warmup_steps": 6, "drift_threshold": 100,
                           "trial_margin": 0, "baseline_pairs": least}))
        published = [m for m in msgs if "(baseline-check) from step" in m]
        assert len(published) == 1, msgs
        check = int(re.match(r"v(\d+) \(baseline-check\)",
                             published[0]).group(1))
        pairs = int(re.search(r"alternated with the baseline \(v0\) for "
                              r"(\d+) block pairs", published[0]).group(1))
        assert pairs >= least, published[0]
        measured = messages(client, job.id, "baseline")
        assert len(measured) == 1, msgs
        status_line = describe_outcome(final)

    runs = [step_lines(w) for w in workers]
    versions = [[d["schedule_version"] for d in run] for run in runs]
    assert versions[0] == versions[1], versions
    v = versions[0]
    m = re.search(r"alternated in (\d+) block pairs of (\d+) steps, at step "
                  r"(\d+): (.*)$", measured[0])
    assert m and int(m.group(1)) == pairs, (measured[0], published[0])
    block = int(m.group(2))
    start = v.index(check)
    alternated = v[start:start + 2 * block * pairs]
    expected = [check if (i // block) % 2 == 0 else 0
                for i in range(2 * block * pairs)]
    assert alternated == expected, v
    assert all(x == check for x in v[start + 2 * block * pairs:]), v
    times = [max(a["iteration_s"], b["iteration_s"]) for a, b in zip(*runs)]
    ratios = pair_ratios(v, times, check, 0, int(m.group(3)) - 1)
    assert len(ratios) == pairs, (ratios, v)
    mine = 1 / statistics.geometric_mean(ratios)
    print("baseline check: v%d, pair speedups %s, ranks' own lines %.3f; "
          "coordinator: %s" % (check, ["%.3f" % (1 / r) for r in ratios],
                               mine, final.speedup_text))
    assert final.speedup_text in status_line, status_line
    if final.measured_speedup > 0:
        assert final.measured_speedup == pytest.approx(mine, rel=2e-3)
        assert (final.speedup_low <= final.measured_speedup
                <= final.speedup_high), final
        # Every block whole, less its first step.
        assert final.speedup_steps == 2 * (block - 1) * pairs, final
        assert ("than the baseline (v0: FSDP-style on-demand gathers), "
                "measured interleaved over %d steps" % final.speedup_steps
                ) in final.speedup_text, final.speedup_text
    else:
        # The pairs disagreed by more than the figure may carry.
        assert final.speedup_text.startswith("not measured yet"), final
        assert "wider than 20%" in final.speedup_text, final


def test_same_job_again_starts_on_the_cached_plan(cluster):
    """A job the coordinator planned before starts on that plan: the second
    submission runs the plan from step 1, where the first needed its warm-up
    (6 steps on the baseline, then the switch)."""
    coord = cluster.coordinator()
    # No baseline check: the second job's steps are its plan's alone
    # (test_speedup_measured_interleaved_with_the_baseline has the check).
    first_spec = spec(steps=24, optimize={"warmup_steps": 6,
                                          "drift_threshold": 100,
                                          "baseline_pairs": 0})

    def run(job_spec):
        with tandem.Client(coord.address, timeout=10) as client:
            job = client.submit(job_spec)
            workers = [cluster.worker(coord, job.id, r) for r in range(2)]
            for w in workers:
                assert w.wait(timeout=240) == 0, w.log()
            assert client.get(job.id)[0].state == SUCCEEDED
            runs = [step_lines(w) for w in workers]
            versions = [d["schedule_version"] for d in runs[0]]
            assert versions == [d["schedule_version"] for d in runs[1]]
            times = [max(a["iteration_s"], b["iteration_s"])
                     for a, b in zip(*runs)]
            return job, messages(client, job.id), versions, times

    first, first_msgs, v1, t1 = run(first_spec)
    assert any("v1 (initial)" in m for m in first_msgs), first_msgs
    switched = v1.index(1)
    assert switched >= 6, v1

    second_spec = dict(first_spec, name=unique_name("loop"))
    second, msgs, v2, t2 = run(second_spec)
    cached = [m for m in msgs if "(cached)" in m]
    assert cached and "v1 (cached) from step 1" in cached[0], msgs
    assert "job %s's plan" % first.id in cached[0], cached[0]
    assert not any("(initial)" in m for m in msgs), msgs
    # Step 0 is the baseline's; from step 1 on, the first job's plan.
    assert v2[0] == 0 and all(v >= 1 for v in v2[1:]), v2
    base = statistics.median(settled_times(v1, t1, 0))
    planned = statistics.median(settled_times(v1, t1, 1))
    again = statistics.median(t2[2:])
    # For the record only: the two jobs run minutes apart on a shared
    # machine, so their step times are not compared (a CI run failed on a
    # 33 ms step against 24 and 31 under a concurrent load; the plan cache's
    # speed is bench/README.md's, the test checks that it is used).
    print("cache: first job v0 %.2f ms, v1 %.2f ms; second job from step 2 "
          "%.2f ms" % (base * 1e3, planned * 1e3, again * 1e3))


@pytest.mark.parametrize("policy, passes", [
    ("fsdp", "zero3-insert,fsdp-prefetch"),
    ("deepcompile", "deepspeed-persistence,zero3-insert,split-groups,"
                    "memory-only-offload,greedy-prefetch,greedy-unshard"),
])
def test_reference_policy_runs_on_real_workers(cluster, policy, passes):
    """optimize.policy runs that policy's plan on the workers: A/B against
    the framework a user would otherwise run, on the same job."""
    coord = cluster.coordinator()
    with tandem.Client(coord.address, timeout=10) as client:
        # The policy's plan as the newest version: no baseline check after.
        job, _, final, msgs = run_planned_job(
            cluster, coord, client,
            spec(steps=12, optimize={"policy": policy, "baseline_pairs": 0}))
        planned = [m for m in msgs if "v1 (initial)" in m]
        assert planned, msgs
        assert ("passes " + passes + ";") in planned[0], planned[0]
        # Planned on what the workers reported, not an assumed accelerator.
        assert "2 ranks, 2 per node" in planned[0], planned[0]
        assert "no memory limit" not in planned[0], planned[0]
        assert any("v1 active on all 2 ranks" in m for m in msgs), msgs
        _, schedule = client.schedule(job.id)
        assert schedule.version >= 1
        assert list(schedule.provenance.passes) == passes.split(",")


def test_reoptimize_and_injected_drift_take_effect(cluster):
    coord = cluster.coordinator()
    with tandem.Client(coord.address, timeout=10) as client:
        # No trials: a trial of the runner-up measured across the injected
        # slowdown (step 14) rolls back to the plan, and its rollback's
        # "the machine changed" forgets what drift would compare against
        # (failed 1 run in 5 once steps got faster; the reoptimize lands at a
        # step that depends on the steps' speed). Trials have their own
        # tests (the trial test above, the coordinator's unit tests).
        # 90 steps: a plan found behind the baseline's measurements from
        # before the slowdown is checked against it interleaved first (up to
        # 6 block pairs of 4 steps), and drift is judged after the verdict.
        job = client.submit(spec(steps=90, optimize={"trial_margin": 0,
                                                     "baseline_pairs": 0}))
        extra = ("--slow-node-ms", "15", "--slow-from-step", "14")
        workers = [cluster.worker(coord, job.id, r, extra) for r in range(2)]
        wait_for(lambda: client.get(job.id)[0].schedule_version >= 1,
                 timeout=120, what="schedule v1 active")
        client.reoptimize(job.id, reason="test")
        for w in workers:
            assert w.wait(timeout=300) == 0, w.log()
        msgs = messages(client, job.id)
        assert any("(reoptimize)" in m for m in msgs), msgs
        assert any(m.startswith("drift at step") for m in msgs), msgs
        assert any("(drift)" in m for m in msgs), msgs
        # The drift plan is published, or the job kept its plan: the re-plan
        # gave the active plan again, or another the re-fitted model does not
        # price faster by optimize.min_gain (the injected slowdown slows
        # every plan alike); either way it is expected from then on at what
        # it measured. A drift plan other than the active one is checked
        # against it, interleaved, before it runs on.
        kept = any("(drift) gave the active" in m or
                   ("(drift): the model re-fitted" in m and
                    "the job keeps" in m) for m in msgs)
        drift_plans = [m for m in msgs if " (drift) from step " in m]
        assert kept or drift_plans, msgs
        for m in drift_plans:
            assert "drift-check-of-v" in m and "alternated with v" in m, m


def test_coordinator_restart_job_completes(cluster):
    coord = cluster.coordinator()
    with tandem.Client(coord.address, timeout=10) as client:
        job = client.submit(spec(steps=400))
    workers = [cluster.worker(coord, job.id, r) for r in range(2)]
    with tandem.Client(coord.address, timeout=10) as client:
        wait_for(lambda: client.get(job.id)[0].step >= 5, timeout=120,
                 what="training under way")
    port = coord.port
    coord.kill()
    time.sleep(1.0)  # workers keep training while it is away
    coord.start(port=port)
    with tandem.Client(coord.address, timeout=10) as client:
        assert client.get(job.id)[0].state in (RUNNING, SUCCEEDED)
        for w in workers:
            assert w.wait(timeout=240) == 0, w.log()
        final = client.get(job.id)[0]
        assert final.state == SUCCEEDED, messages(client, job.id)
        assert final.step == 400
        # Training went on while the coordinator was away.
        assert any("ranks finished 400 steps" in m for m in
                   messages(client, job.id))


def test_worker_killed_fails_job_naming_rank(cluster):
    # A long heartbeat timeout: the loss is noticed from the survivor's
    # failed collective and the dead rank's closed session, not from
    # heartbeats (issue 16: it took the full 15 s before).
    coord = cluster.coordinator(heartbeat_timeout_s=60)
    with tandem.Client(coord.address, timeout=10) as client:
        job = client.submit(spec(steps=100000))
        workers = [cluster.worker(coord, job.id, r) for r in range(2)]
        wait_for(lambda: client.get(job.id)[0].step >= 3, timeout=120,
                 what="training under way")
        killed_at = time.monotonic()
        workers[1].kill()
        wait_for(lambda: client.get(job.id)[0].state == FAILED, timeout=30,
                 what="job FAILED")
        assert time.monotonic() - killed_at < 30
        error = client.get(job.id)[0].error
        assert "rank 1" in error and "its session closed" in error, error
        # The survivor is told to stop (or loses its peer) and exits non-zero.
        assert workers[0].wait(timeout=120) != 0


def test_cancel_stops_workers_with_clear_error(cluster):
    coord = cluster.coordinator()
    with tandem.Client(coord.address, timeout=10) as client:
        job = client.submit(spec(steps=100000))
        workers = [cluster.worker(coord, job.id, r) for r in range(2)]
        wait_for(lambda: client.get(job.id)[0].step >= 3, timeout=120,
                 what="training under way")
        client.cancel(job.id, reason="demo over")
        for w in workers:
            assert w.wait(timeout=120) != 0
        assert any("CANCELLED" in w.log_path.read_text() for w in workers), \
            [w.log() for w in workers]
