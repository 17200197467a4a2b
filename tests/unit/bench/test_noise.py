"""bench/noise's analysis (noise.py) on synthetic jobs: when a job counts as
settled and how many versions it published after, which plans are one plan,
and when a kept plan is wrong or a reported interval misses the quiet
re-measure (issue 34)."""

import argparse
import json
import importlib.util
import os
from types import SimpleNamespace

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))))
spec = importlib.util.spec_from_file_location(
    "noise", os.path.join(ROOT, "bench", "noise", "noise.py"))
noise = importlib.util.module_from_spec(spec)
spec.loader.exec_module(noise)

SCHEDULE = """schedule v{v} graph=abc mode=zero3 budget=0  # budget
group g0 p0,p1  # layers.0: a, b
persistent p2
before n1 allgather g0  # layers.0
{extra}predict iteration={pred} compute=0.1 comm=0.1 exposed=0 copy=0 peak=1
provenance passes=zero3-insert{rollback} window=2..4 wall=0.001 reason=x
"""


def schedule(v, pred, extra="", rollback=""):
    return SCHEDULE.format(v=v, pred=pred, extra=extra, rollback=rollback)


def steps(versions):
    """per_step as steady.slowest_per_step gives it: step -> (s, version)."""
    return {s: (0.1, v) for s, v in enumerate(versions)}


def args(**kw):
    base = dict(settle_steps=15)
    base.update(kw)
    return argparse.Namespace(**base)


def final(speedup=0.0, low=0.0, high=0.0, text="not measured yet"):
    return SimpleNamespace(measured_speedup=speedup, speedup_low=low, speedup_high=high,
                           speedup_text=text, state=3)


def test_plan_key_ignores_header_predictions_and_comments():
    a = noise.plan_key(schedule(1, 0.5))
    b = noise.plan_key(schedule(4, 0.7, rollback=",rollback-to-v1"))
    assert a == b
    c = noise.plan_key(schedule(2, 0.5, extra="after n2 release g0\n"))
    assert c != a


def test_settle_step_is_the_end_of_the_first_stretch_one_plan_ran_alone():
    # v0 for 6 steps, v1 for 10, v2 for 20 (settles at 16 + 15), then v3.
    per_step = steps([0] * 6 + [1] * 10 + [2] * 20 + [3] * 40)
    settled, first = noise.settle_step(per_step, 15)
    assert first == {0: 0, 1: 6, 2: 16, 3: 36}
    assert settled == 31
    # A baseline check's v0 blocks break the stretch: v1 ran 8 steps, then
    # 4-step blocks of v0 and v1; the check's last v1 block runs on alone
    # from step 34 (settled at 49).
    per_step = steps([0] * 6 + [1] * 8 + [0] * 4 + [1] * 4 + [0] * 4 + [1] * 4 +
                     [0] * 4 + [1] * 4 + [1] * 30)
    assert noise.settle_step(per_step, 15)[0] == 49
    # A trial alternating 4-step blocks of v1 and v2 for 24 steps, whose
    # verdict (a rollback, v3) comes after: the verdict is before the settle
    # point (the old rule settled at step 31, 15 steps after v2 first ran,
    # and counted v3 as a version published once settled).
    per_step = steps([0] * 6 + [1] * 10 + [2, 2, 2, 2, 1, 1, 1, 1] * 3 + [3] * 30)
    settled, first = noise.settle_step(per_step, 15)
    assert first[3] == 40 and settled == 55
    # Never 15 steps of one version alone, to the job's end: never settled.
    per_step = steps([0] * 6 + [1] * 10 + [2] * 10 + [3] * 10)
    assert noise.settle_step(per_step, 15)[0] is None
    # The last version running 15 steps to the end settles it.
    per_step = steps([0] * 6 + [1] * 10 + [2] * 10 + [3] * 15)
    assert noise.settle_step(per_step, 15)[0] == 41
    assert noise.settle_step(steps([0] * 30), 15)[0] is None


def flat(medians, rounds=4, steps=5):
    """Re-measured rounds whose steps all take each plan's time."""
    return {v: [[t] * steps for _ in range(rounds)] for v, t in medians.items()}


def test_analyse_counts_versions_after_settling_and_flags_a_wrong_plan():
    per_step = steps([0] * 6 + [1] * 20 + [2] * 30 + [3] * 44)  # 100 steps
    texts = {0: schedule(0, 0), 1: schedule(1, 0.5), 2: schedule(2, 0.4, extra="after n2 release g0\n"),
             3: schedule(3, 0.5, rollback=",rollback-to-v1")}
    reps = {0: 0, 1: 1, 2: 2, 3: 1}
    run = dict(job="j", per_step=per_step, texts=texts, flips=None,
               final=final(1.30, 1.20, 1.40, "1.30x (1.20-1.40)"))
    # v3 reruns v1's plan, which the quiet re-measure finds 10% slower than
    # v2's in every round: a wrong plan kept.
    row = noise.analyse(args(), run, ("rounds", flat({0: 0.65, 1: 0.55, 2: 0.50})), reps)
    assert row["settled_at_step"] == 21
    # v2 (step 26) and v3 (step 56) after step 21, over 79 steps.
    assert row["versions_per_100_settled"] == round(100 * 2 / 79, 2)
    assert row["end_version"] == 3 and row["end_plan_of"] == 1
    # v3 reruns v1's plan, first run at step 6.
    assert row["first_step_on_end_plan"] == 6
    assert row["wrong_plan_kept"] is True and row["wrong_plans"] == ["v2"]
    assert row["final_over_best"] == round(0.55 / 0.50, 4) and row["best_plan"] == "v2"
    assert row["quiet_speedup"] == round(0.65 / 0.55, 4)
    assert row["interval_contains_quiet"] is False  # 1.18 outside 1.20-1.40
    assert row["interval_overlaps_quiet"] is False  # the re-measure's: 1.18-1.18
    assert row["quiet_round_steps_s"]["v1"] == [[0.55] * 5] * 4
    # Within min_gain of the best: not wrong; the interval holds it.
    row = noise.analyse(args(), run, ("rounds", flat({0: 0.65, 1: 0.50, 2: 0.49})), reps)
    assert row["wrong_plan_kept"] is False and row["remeasure_could_not_tell"] == []
    assert row["interval_contains_quiet"] is True
    assert row["interval_overlaps_quiet"] is True
    # The ended-on plan the best: final over best is 1.
    row = noise.analyse(args(), run, ("rounds", flat({0: 0.65, 1: 0.45, 2: 0.50})), reps)
    assert row["final_over_best"] == 1.0 and row["best_plan"] == "v1"
    assert noise.summarize("demo", "quiet", [row])["first_step_on_end_plan_max"] == 6


def test_first_step_on_plan_follows_the_plan_not_the_version():
    # v2 a trial of another plan, v3 a rollback to v1's, v4 a baseline
    # check of it alternating with v0: the job reached its plan at step 5.
    per_step = steps([0] * 5 + [1] * 4 + [2, 2, 1, 1] + [3] * 4 + [4, 4, 0, 0, 4])
    reps = {0: 0, 1: 1, 2: 2, 3: 1, 4: 1}
    assert noise.first_step_on_plan(per_step, reps, 4) == 5
    # A job that never left the baseline was on its plan from step 0.
    assert noise.first_step_on_plan(steps([0] * 10), {0: 0}, 0) == 0
    # The trial's plan kept: reached when the trial began.
    assert noise.first_step_on_plan(per_step, {0: 0, 1: 1, 2: 2, 3: 2, 4: 2}, 4) == 9


def test_paired_ratio_holds_when_the_host_changes_speed_between_rounds():
    # v1 is 10% slower than v2 in every round, while the host runs rounds 1
    # and 3 at half speed: each round's ratio is 1.10, so is their mean,
    # and the interval is tight. Medians over rounds taken apart would
    # compare 1.1-1.2 against 1.0-2.0: no verdict.
    scale = [1.0, 2.0, 1.0, 2.0]
    v1 = [[1.10 * k + 0.001 * i for i in range(5)] for k in scale]
    v2 = [[1.00 * k + 0.001 * i for i in range(5)] for k in scale]
    ratio, low, high = noise.paired_ratio(v1, v2)
    assert abs(ratio - 1.10) < 0.002
    assert 1.09 < low <= ratio <= high < 1.11
    # Seeded: the same rounds give the same interval.
    assert noise.paired_ratio(v1, v2) == (ratio, low, high)
    assert noise.paired_ratio([], []) is None


def test_a_gap_the_remeasure_cannot_tell_is_not_a_wrong_plan():
    # The ended-on v1 trails v2 by 8% on the geometric mean of four rounds,
    # but one round has v2 15% slower: the interval holds 1, so the
    # re-measure could not tell them apart (the rule before counted this as
    # a wrong plan kept, by the medians alone).
    rounds = {0: [[1.3] * 5] * 4,
              1: [[1.00] * 5, [1.00] * 5, [1.00] * 5, [1.00] * 5],
              2: [[0.80] * 5, [0.80] * 5, [0.85] * 5, [1.15] * 5]}
    got = noise.verdicts(rounds, end_plan=1)
    ratio, low, high = got["end_over_plan"]["v2"]
    assert ratio > 1 + noise.MIN_GAIN and low <= 1 < high
    assert got["wrong_plan_kept"] is False
    assert got["remeasure_could_not_tell"] == ["v2"]
    s = noise.summarize("demo", "quiet", [dict(got, versions_per_100_settled=0,
                                              settled_at_step=20)])
    assert s["wrong_plans_kept"] == 0 and s["remeasure_could_not_tell"] == 1
    # A job that ended on the baseline's plan: its quiet speedup is 1.
    got = noise.verdicts(rounds, end_plan=0, reported=(0.9, 1.1))
    assert got["quiet_speedup"] == 1.0 and got["interval_contains_quiet"] is True


def test_reanalyse_reads_rounds_of_medians_from_older_runs(tmp_path, capsys):
    path = tmp_path / "old.jsonl"
    rows = [{"contender": "machine", "cpu": "x"},
            {"model": "demo", "condition": "quiet", "job": "j", "end_plan_of": 1,
             "reported_interval": None, "wrong_plan_kept": True,
             "quiet_rounds_s": {"v0": [1.3, 1.3, 1.3], "v1": [1.0, 1.1, 1.0],
                                "v2": [0.9, 1.0, 0.9]},
             "versions_per_100_settled": 0.0, "settled_at_step": 30}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    noise.reanalyse(str(path))
    out = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert out[0]["end_over_plan"]["v2"][0] == round((1.0 / 0.9 * 1.1 / 1.0 * 1.0 / 0.9) ** (1 / 3), 4)
    assert out[0]["wrong_plans"] == ["v2"]  # 1.11, 1.10 and 1.11: every round
    assert out[1]["summary"] and out[1]["wrong_plans_kept"] == 1


def test_analyse_without_a_reported_speedup_judges_no_interval():
    per_step = steps([0] * 6 + [1] * 40)
    run = dict(job="j", per_step=per_step, texts={0: schedule(0, 0), 1: schedule(1, 0.5)},
               flips=3, final=final())
    row = noise.analyse(args(), run, ("rounds", flat({0: 0.6, 1: 0.5})), {0: 0, 1: 1})
    assert row["reported_speedup"] is None and row["interval_contains_quiet"] is None
    s = noise.summarize("demo", "flaps", [row])
    assert s["speedup_not_reported"] == 1 and s["interval_contains_quiet"] == "0 of 0"
    assert s["wrong_plans_kept"] == 0
    # No wait shares measured, no busy verdict.
    assert s["cpu_wait_share_median"] is None and s["busy_verdicts"] == 0


def test_summary_says_how_busy_the_host_was_across_jobs():
    per_step = steps([0] * 6 + [1] * 40)
    run = dict(job="j", per_step=per_step, texts={0: schedule(0, 0), 1: schedule(1, 0.5)},
               flips=None, final=final())
    row = noise.analyse(args(), run, ("rounds", flat({0: 0.6, 1: 0.5})), {0: 0, 1: 1})
    rows = [dict(row, cpu_wait_share=[0.06, 0.08, 0.12], busy_verdicts=[]),
            dict(row, cpu_wait_share=[0.10, 0.20, 0.40], busy_verdicts=["a", "b"]),
            dict(row, cpu_wait_share=[0.12, 0.30, 0.50], busy_verdicts=["c"]),
            dict(row, busy_verdicts=[])]  # a job whose steps reported none
    s = noise.summarize("demo", "cpu-hog", rows)
    assert s["cpu_wait_share_median"] == [0.10, 0.20, 0.40]
    assert s["busy_verdicts"] == 3 and s["jobs_with_busy_verdicts"] == 2


def test_reanalyse_unreadable_or_not_json_says_what_to_give(tmp_path):
    missing = tmp_path / "nope.jsonl"
    with pytest.raises(SystemExit) as e:
        noise.reanalyse(str(missing))
    assert "cannot read %s" % missing in str(e.value)
    assert "results-*.jsonl" in str(e.value)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"summary": true}\nnot json\n')
    with pytest.raises(SystemExit) as e:
        noise.reanalyse(str(bad))
    assert "line 2 is not JSON" in str(e.value)


def test_each_job_gets_a_fresh_workdir(tmp_path):
    """An earlier run's database in a job's directory would hand the job
    that run's plan from the plan cache: nothing of it is left."""
    work = tmp_path / "demo-quiet-0"
    work.mkdir()
    for name in ("tandem.db", "tandem.db-wal", "worker0.jsonl"):
        (work / name).write_text("old")
    assert noise.fresh_workdir(str(work)) == str(work)
    assert work.is_dir() and list(work.iterdir()) == []
    fresh = tmp_path / "new" / "demo-flaps-1"
    noise.fresh_workdir(str(fresh))
    assert fresh.is_dir()


def alternating(first_s, other_s, block=4, pairs=3, slow_pairs=()):
    """An --alternate run's steps: step 0 the first plan (v3), then blocks
    of the other (v5) and the first, the other first; each block's first
    step a slow switch, and the host at half speed in `slow_pairs`."""
    steps = {0: (first_s * 3, 3)}
    s = 1
    for p in range(pairs):
        k = 2.0 if p in slow_pairs else 1.0
        for t, v in ((other_s, 5), (first_s, 3)):
            for i in range(block):
                steps[s] = ((t * 5 if i == 0 else t + 0.001 * i) * k, v)
                s += 1
    return steps


def test_block_pairs_pair_each_alternate_block_with_the_next_first_block():
    first, other = noise.block_pairs(alternating(0.5, 0.6, slow_pairs=(1,)), 4)
    assert len(first) == len(other) == 3
    # Each block's switch step left out.
    assert other[0] == [0.601, 0.602, 0.603] and first[0] == [0.501, 0.502, 0.503]
    assert other[1] == [1.202, 1.204, 1.206]  # the slow pair, both sides
    # A pair cut short at the end of the run is left out.
    steps = alternating(0.5, 0.6)
    del steps[max(steps)]
    assert len(noise.block_pairs(steps, 4)[0]) == 2
    # A run that never alternated gives no pair.
    assert noise.block_pairs({s: (0.5, 3) for s in range(9)}, 4) == ([], [])
    assert noise.block_pairs({}, 4) == ([], [])


def test_judge_on_block_pairs_holds_when_the_host_slows_inside_the_run():
    # v3 ended the job, v5 is 20% slower, and the host halves its speed in
    # one block pair: each pair's ratio is still 1/1.2, the interval tight.
    first, other = noise.block_pairs(alternating(0.5, 0.6, pairs=6, slow_pairs=(2,)), 4)
    got = noise.judge({5: (first, other)}, 3, reported=None)
    low, high = got["end_over_plan"]["v5"][1:]
    assert abs(got["end_over_plan"]["v5"][0] - 0.5 / 0.6) < 0.005
    assert high < 0.85 and got["wrong_plan_kept"] is False
    assert got["best_plan"] == "v3" and got["final_over_best"] == 1.0
    # The other way round (the job ended on the slower plan): wrong, told.
    got = noise.judge({5: (other, first)}, 3)
    assert got["wrong_plan_kept"] is True and got["wrong_plans"] == ["v5"]


def test_judge_on_pairs_agrees_with_verdicts_on_rounds():
    rounds = flat({0: 0.65, 1: 0.55, 2: 0.50})
    a = noise.verdicts(rounds, 1, reported=(1.2, 1.4))
    b = noise.judge(noise.pairs_of_rounds(rounds, 1), 1, reported=(1.2, 1.4))
    assert a == b


def test_analyse_and_reanalyse_keep_block_pairs(tmp_path, capsys):
    per_step = steps([0] * 6 + [1] * 40)
    texts = {0: schedule(0, 0), 1: schedule(1, 0.5)}
    run = dict(job="j", per_step=per_step, texts=texts, flips=None,
               final=final(1.20, 1.10, 1.30, "1.20x (1.10-1.30)"))
    # The job ended on v1; v0 re-measures 1.25x slower, in block pairs.
    first, other = noise.block_pairs(alternating(0.4, 0.5, pairs=5), 4)
    row = noise.analyse(args(), run, ("blocks", {0: (first, other)}), {0: 0, 1: 1})
    assert row["quiet_pair_steps_s"]["v0"]["end"][0] == [0.401, 0.402, 0.403]
    assert abs(row["quiet_speedup"] - 1.25) < 0.01
    assert row["interval_contains_quiet"] is True
    row.update(model="demo", condition="quiet")
    path = tmp_path / "r.jsonl"
    path.write_text(json.dumps(row) + "\n")
    noise.reanalyse(str(path))
    out = [json.loads(l) for l in capsys.readouterr().out.splitlines()]
    assert out[0]["quiet_speedup"] == row["quiet_speedup"]
    assert out[1]["interval_contains_quiet"] == "1 of 1"


def test_shown_interval_is_the_figures_or_the_too_wide_one_quoted():
    assert noise.shown_interval((1.1, 1.3), "1.20x (1.10-1.30) faster") == [1.1, 1.3]
    text = ("not measured yet (42 steps interleaved with the baseline (v0: FSDP-style "
            "on-demand gathers) in 7 block pairs: 0.86\u20131.42\u00d7, wider than 20%)")
    assert noise.shown_interval(None, text) == [0.86, 1.42]
    assert noise.shown_interval(None, "not measured yet (no interleaved blocks of the "
                                      "baseline (v0: x) and this plan)") is None
    row = {"reported_interval": None, "speedup_text": text, "quiet_speedup": 1.5}
    assert noise.shown_verdicts(row) == {"shown_interval": [0.86, 1.42],
                                         "shown_contains_quiet": False}
    row["quiet_speedup"] = 1.2
    assert noise.shown_verdicts(row)["shown_contains_quiet"] is True
    s = noise.summarize("demo", "quiet", [dict(row, versions_per_100_settled=0,
                                               settled_at_step=20, wrong_plan_kept=False,
                                               final_over_best=1.0,
                                               interval_contains_quiet=None,
                                               **noise.shown_verdicts(row))])
    assert s["shown_interval_contains_quiet"] == "1 of 1"
