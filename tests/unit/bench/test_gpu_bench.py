"""bench/gpu/gpu_bench.py: its pure parts on synthetic inputs (medians and
spreads over rounds, the interleaving, the budgets, tandem-plan's summary
and schedules, the numerics rule), and its --dry mode end to end against
the real tandem-worker and tandem-plan (skipped without them)."""

import importlib.util
import json
import math
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))))
SCRIPT = os.path.join(ROOT, "bench", "gpu", "gpu_bench.py")
BUILD = os.path.join(ROOT, "build")
WORKER = os.path.join(BUILD, "worker", "tandem-worker")
PLAN = os.path.join(BUILD, "coordinator", "tandem-plan")

spec = importlib.util.spec_from_file_location("gpu_bench", SCRIPT)
gb = importlib.util.module_from_spec(spec)
spec.loader.exec_module(gb)


# -- rounds ---------------------------------------------------------------------

def test_median_spread_is_the_median_over_rounds_not_the_best():
    assert gb.median_spread([0.3, 0.5, 0.4]) == (0.4, 0.3, 0.5)
    assert gb.median_spread([2.0, 1.0]) == (1.5, 1.0, 2.0)
    assert gb.median_spread([1.0, None, 3.0, 2.0]) == (2.0, 1.0, 3.0)
    assert gb.median_spread([]) == (None, None, None)


def test_round_orders_alternate_and_run_everyone_once_per_round():
    orders = gb.round_orders(["A", "B", "C"], 4)
    assert orders == [["A", "B", "C"], ["C", "B", "A"], ["A", "B", "C"], ["C", "B", "A"]]
    assert gb.round_orders(["A"], 2) == [["A"], ["A"]]
    assert gb.round_orders(["A", "B"], 0) == []


def test_run_rounds_interleaves_calls_and_keeps_every_round():
    calls = []
    seq = iter(range(100))

    def f(name):
        return lambda: calls.append(name) or next(seq)
    res = gb.run_rounds([("t", f("t")), ("e", f("e"))], 3)
    assert calls == ["t", "e", "e", "t", "t", "e"]
    assert res == {"t": [0, 3, 4], "e": [1, 2, 5]}


def test_round_ratios_pair_rounds():
    assert gb.round_ratios([2.0, 3.0, 4.0], [1.0, 1.5, 1.0]) == [2.0, 2.0, 4.0]
    assert gb.round_ratios([2.0, None], [1.0, 1.0]) == [2.0]


# -- budgets and the planner's text ------------------------------------------------

def test_free_budget_leaves_the_guard_band_and_the_spread():
    assert gb.free_budget(980) == 1000
    assert gb.free_budget(970, spread=10) == 1000
    assert gb.free_budget(980, band=0.0) == 980
    with pytest.raises(ValueError):
        gb.free_budget(0)


def test_choose_budgets_take_quarter_and_half_of_the_states_off():
    b = gb.choose_budgets(10_000, 4_000)
    assert b == [("fits", 10_000, False), ("-25% states", 9_000, True),
                 ("-50% states", 8_000, True)]
    assert [x[1] for x in b] == sorted([x[1] for x in b], reverse=True)
    with pytest.raises(ValueError):
        gb.choose_budgets(10_000, 0)


SUMMARY = """# hardware: 1 ranks ...
# predictions (passes zero3-insert offload prefetch, graph dry, 1 ranks)
iteration_s     0.009788
compute_s       0.009739
comm_s          0.000000
exposed_comm_s  0.000000
copy_s          0.000138
overlap_ratio   1.0000
peak            3.18 MiB (3335432 B) of budget 3.45 MiB (3617416 B) (92.2%)
unmodeled_bytes 520
peak_at         n8 loss.bwd: sharded 664832, persistent 0, gathered 0, activations 1289984, gradients 664832, optimizer states 715264, collective buffers 0, unmodeled 520 (B)
lower_bound_s   0.009739
ratio           1.0050
plan_wall_s     0.000708
# explanation
#    decision      pass                 gain_s   exposed_s       held       peak  binding / what
1    offload       offload           -0.000021    0.000000  256.00KiB -256.00KiB  memory at n8
"""

FALLBACK = """peak            2.66 MiB (2790924 B) of budget 3.77 MiB (3949832 B) (70.7%)
# explanation
#    decision      pass                 gain_s   exposed_s       held       peak  binding / what
1    least-memory  planner           -0.000202    0.000000    1.27MiB   -1.11MiB  memory at n16
     every optimizer state offloaded (21 entries) on the baseline: the pipeline found no plan
"""


def test_parse_summary_reads_peak_states_times_and_the_fallback():
    s = gb.parse_summary(SUMMARY)
    assert s["peak_bytes"] == 3335432 and s["budget_bytes"] == 3617416
    assert s["state_bytes_at_peak"] == 715264
    assert s["iteration_s"] == pytest.approx(0.009788)
    assert s["copy_s"] == pytest.approx(0.000138)
    assert s["over_budget"] is False and s["least_memory"] is False
    f = gb.parse_summary(FALLBACK)
    assert f["least_memory"] is True and f["peak_bytes"] == 2790924
    over = gb.parse_summary("peak            5 MiB (5000 B) of budget 4 MiB (4000 B) "
                            "(125.0%)  OVER BUDGET\n")
    assert over["over_budget"] is True


def test_schedule_offloads_counts_entries_and_bytes():
    text = ("schedule v0 graph=ab mode=zero3 budget=1\ngroup g0 p0\n"
            "offload o0 p0 bytes=262144\noffload o1 p20 bytes=90112\n"
            "after n0 offload o0\nbefore n9 reload o0\n")
    assert gb.schedule_offloads(text) == (2, 262144 + 90112)
    assert gb.schedule_offloads("group g0 p0\nbefore n0 allgather g0\n") == (0, 0)


def test_graph_params_counts_state_bytes_by_dtype():
    text = ("graph dry world=1 micro_batches=1 tokens=64\n"
            "param p0 embed.weight f32[512,64] unit=embed\n"
            "param p1 layers.0.attn_norm.weight f32[64] unit=layers.0\n"
            "node n0 embed fwd params=p0 time=1e-07 act=512\n")
    assert gb.graph_params(text) == (512 * 64 + 64, 8 * (512 * 64 + 64))
    bf = "param p0 w bf16[10,10] unit=u\nparam p1 v f16[5] unit=u\n"
    assert gb.graph_params(bf) == (105, 12 * 105)


def test_profile_spread_from_the_header():
    assert gb.profile_spread("profile graph=x rank=0 peak=120 peak_min=100 work=1\n"
                             "time n0 1 samples=2\n") == 20
    assert gb.profile_spread("profile graph=x rank=0\n") == 0
    assert gb.profile_spread("") == 0


# -- numerics ---------------------------------------------------------------------

def test_numerics_verdict_scales_the_tolerance_by_the_precision_effect():
    f32 = [6.0, 5.0, 4.0]
    auto = [6.01, 5.0, 4.0]      # effect 0.01: tolerance 3 * 0.01 + 1e-3
    ok = gb.numerics_verdict([6.02, 5.03, 4.0], auto, f32)
    assert ok["met"] and ok["precision_effect"] == pytest.approx(0.01)
    assert ok["tolerance"] == pytest.approx(0.031)
    assert ok["max_abs_diff"] == pytest.approx(0.03) and ok["worst_step"] == 1
    bad = gb.numerics_verdict([6.01, 5.04, 4.0], auto, f32)
    assert not bad["met"]
    assert not gb.numerics_verdict([6.01, math.nan, 4.0], auto, f32)["met"]
    assert not gb.numerics_verdict([6.01, 5.0], auto, f32)["met"]
    # No precision effect at all: the absolute floor alone.
    assert gb.numerics_verdict([1.0005], [1.0], [1.0])["met"]
    assert not gb.numerics_verdict([1.002], [1.0], [1.0])["met"]


def test_gradscaler_scales_follow_torch_update_rule():
    used, final = gb.gradscaler_scales([True, False, False, False, True, False], 8.0, 2.0,
                                       0.5, 2)
    # skip: back off; two clean steps in a row: grow; a skip resets the count.
    assert used == [8.0, 4.0, 4.0, 8.0, 8.0, 4.0]
    assert final == 4.0
    used, final = gb.gradscaler_scales([False] * 3, 65536.0, 2.0, 0.5, 2000)
    assert used == [65536.0] * 3 and final == 65536.0
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():  # the rule against torch's own GradScaler
        scaler = torch.cuda.amp.GradScaler(init_scale=8.0, growth_factor=2.0,
                                           backoff_factor=0.5, growth_interval=2)
        p = torch.nn.Parameter(torch.ones(1, device="cuda"))
        opt = torch.optim.SGD([p], lr=0.0)
        seen = []
        for skip in [True, False, False, False, True, False]:
            seen.append(scaler.get_scale())
            opt.zero_grad()
            scaler.scale((p * (math.inf if skip else 1.0)).sum()).backward()
            scaler.step(opt)
            scaler.update()
        assert seen == [8.0, 4.0, 4.0, 8.0, 8.0, 4.0] and scaler.get_scale() == 4.0


def test_rel_verdict():
    assert gb.rel_verdict([1.0, 2.0], [1.0, 2.001], 1e-3)["met"]
    assert not gb.rel_verdict([1.0, 2.1], [1.0, 2.0], 1e-3)["met"]
    assert not gb.rel_verdict([], [], 1e-3)["met"]


def test_global_batch_reads_the_token_file_as_the_worker_does():
    torch = pytest.importorskip("torch")
    tokens = torch.arange(0, 2 * 4 + 1)  # 2 windows of 4 tokens (+1 label)
    b0 = gb.global_batch(tokens, 0, 2, 4)
    assert b0["input_ids"].tolist() == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert b0["labels"].tolist() == [[1, 2, 3, 4], [5, 6, 7, 8]]
    # Sequence i starts at (i * seq_len) mod the windows: step 1 wraps.
    assert gb.global_batch(tokens, 1, 2, 4)["input_ids"].tolist() == b0["input_ids"].tolist()
    assert gb.global_batch(tokens, 0, 3, 4)["input_ids"][2].tolist() == [0, 1, 2, 3]


def test_tokens_per_s_and_yaml():
    assert gb.tokens_per_s(8, 1024, 0.2) == pytest.approx(40960)
    assert gb.tokens_per_s(8, 1024, 0) is None
    y = gb.to_yaml({"name": "x", "model": {"preset": "llama", "layers": 2},
                    "train": {"loss_scale": {"mode": "dynamic", "growth_interval": 10},
                              "eps": 1e-08}})
    assert y.splitlines() == ["name: x", "model:", "  preset: llama", "  layers: 2",
                              "train:", "  loss_scale:", "    mode: dynamic",
                              "    growth_interval: 10", "  eps: 1e-08"]


def test_report_says_target_met_per_binding_budget():
    rows = [
        dict(section="offload", kind="ratio", budget_label="fits", budget_bytes=4 << 20,
             binding=False, ratio=1.1, ratio_min=1.0, ratio_max=1.2, target_met=None),
        dict(section="offload", kind="ratio", budget_label="-25% states",
             budget_bytes=3 << 20, binding=True, ratio=2.5, ratio_min=2.1, ratio_max=2.9,
             target_met=True),
        dict(section="offload", kind="ratio", budget_label="-50% states",
             budget_bytes=2 << 20, binding=True, ratio=None, target_met=False,
             why="needs both offload-all and adaptive to fit: adaptive does not"),
        dict(section="offload", kind="plan", budget_label="-50% states",
             budget_bytes=2 << 20, binding=True, contender="adaptive", feasible=False,
             why="tandem-plan: no plan fits"),
    ]
    rows.append(dict(section="numerics", kind="comparison", dtype="f16", max_abs_diff=1e-3,
                     max_rel_diff=1e-4, precision_effect=2e-3, tolerance=7e-3, met=True,
                     tandem_skipped=2, eager_skipped=2, tandem_final_scale=32768.0,
                     eager_final_scale=32768.0, rule="the rule"))
    import io
    out = io.StringIO()
    gb.report(rows, out)
    text = out.getvalue()
    assert "| 2.500 (2.100–2.900) | yes |" in text
    assert "adaptive does not | no |" in text
    assert "n/a (nothing must leave)" in text
    assert "infeasible: tandem-plan: no plan fits" in text
    assert "| f16 | 1.00e-03 | 1.00e-04 | 2.00e-03 | 7.00e-03 | yes | 2 / 2 | 32768 / 32768 |" \
        in text


# -- the command ------------------------------------------------------------------

def run(args, timeout):
    return subprocess.run([sys.executable, SCRIPT] + args, cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout)


def test_bad_section_is_refused():
    p = run(["--only", "offload,bogus"], 120)
    assert p.returncode == 2 and "bogus" in p.stderr


def test_without_a_gpu_and_without_dry_it_says_so_and_succeeds():
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: the full run is not a unit test")
    p = run([], 120)
    assert p.returncode == 0, p.stderr
    assert "no GPU: run with --dry" in p.stdout


@pytest.mark.skipif(not (os.path.exists(WORKER) and os.path.exists(PLAN)),
                    reason=f"needs {WORKER} and {PLAN} (build them first)")
def test_dry_run_measures_every_section(tmp_path):
    out = tmp_path / "rows.jsonl"
    p = run(["--dry", "--build", BUILD, "--out", str(out)], 420)
    assert p.returncode == 0, f"stdout:\n{p.stdout[-3000:]}\nstderr:\n{p.stderr[-3000:]}"
    rows = [json.loads(l) for l in out.read_text().splitlines()]
    assert rows and all(r["dry"] is True and r["device"] == "cpu" for r in rows)
    assert not [r for r in rows if r["section"] == "error"]
    by = {}
    for r in rows:
        by.setdefault(r["section"], []).append(r)
    assert {"offload", "numerics", "throughput", "timing"} <= set(by)

    # offload: three budgets, decreasing, the first where nothing must leave.
    setup = [r for r in by["offload"] if r["kind"] == "setup"]
    assert len(setup) == 1 and setup[0]["state_bytes"] > 0
    budgets = setup[0]["budgets"]
    assert len(budgets) == 3 and budgets == sorted(budgets, reverse=True)
    plans = [r for r in by["offload"] if r["kind"] == "plan"]
    assert sorted({r["budget_bytes"] for r in plans}, reverse=True) == budgets
    for b in budgets:
        at = {r["contender"]: r for r in plans if r["budget_bytes"] == b}
        assert set(at) == {"no-offload", "offload-all", "adaptive"}
        for r in at.values():
            if r["feasible"]:
                assert r["step_s"] > 0 and r["step_min_s"] <= r["step_s"] <= r["step_max_s"]
                assert r["peak_bytes"] > 0 and len(r["round_step_s"]) == 2
            else:
                assert r["why"]
        assert at["offload-all"]["feasible"] and at["adaptive"]["feasible"]
        assert at["offload-all"]["offloaded_bytes"] == setup[0]["state_bytes"]
    fits = {r["contender"]: r for r in plans if r["budget_bytes"] == budgets[0]}
    assert fits["no-offload"]["feasible"] and fits["no-offload"]["offloaded_bytes"] == 0
    assert not fits["no-offload"]["binding"]
    ratios = [r for r in by["offload"] if r["kind"] == "ratio"]
    assert len(ratios) == 3
    for r in ratios:
        assert r["ratio"] > 0 and len(r["round_ratios"]) == 2
        assert r["target_met"] in ((True, False) if r["binding"] else (None,))

    # numerics: f16 refused on the CPU; bf16 and f32 losses of both sides.
    num = by["numerics"]
    refusal = [r for r in num if r["kind"] == "refusal"]
    assert len(refusal) == 1 and refusal[0]["refused"] and refusal[0]["returncode"] != 0
    assert gb.F16_REFUSAL in refusal[0]["stderr"]
    losses = {(r["dtype"], r["side"]): r["losses"] for r in num if r["kind"] == "losses"}
    for key in (("bf16", "tandem"), ("bf16", "eager-autocast"), ("f32", "tandem"),
                ("f32", "eager")):
        assert key in losses, key
        assert len(losses[key]) == 8 and all(math.isfinite(x) and x > 0 for x in losses[key])
    comp = {r["dtype"]: r for r in num if r["kind"] == "comparison"}
    assert set(comp) == {"f32", "bf16"}
    # The same weights and tokens on both sides: f32 agrees (else the
    # bench's setup, not precision, differs).
    assert comp["f32"]["met"], comp["f32"]
    assert math.isfinite(comp["bf16"]["max_abs_diff"]) and comp["bf16"]["tolerance"] > 0
    assert comp["bf16"]["met"] in (True, False)

    # throughput: both contenders, tokens/s and the ratio.
    thr = {r.get("contender", "ratio"): r for r in by["throughput"]}
    for side in ("tandem", "eager"):
        assert thr[side]["step_s"] > 0 and thr[side]["tokens_per_s"] > 0
        assert len(thr[side]["round_step_s"]) == 2
    assert thr["ratio"]["ratio"] > 0

    total = [r for r in by["timing"] if r["kind"] == "total"]
    assert total and total[0]["failed"] == []
    assert "## offload" in p.stdout and "target ≥ 2 met" in p.stdout
