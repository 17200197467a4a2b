#!/usr/bin/python3
"""Prints bench/e2e's results (JSON lines from driver.py) as markdown tables
and checks issue 33's targets.

  report.py results.jsonl

The summary has one row per model, rate and budget: every contender's median
over rounds with its min-max over rounds, Tandem/DDP, Tandem/best reference
(the fastest by median of DDP, on-demand, deepspeed-zero3, fsdp and
deepcompile at that budget, leaving out a reference whose steps ran on the
memory guard's fallback: those measured the least-memory schedule, not its
plan), which plan Tandem's row ran, and its first plan's prediction against
that plan's first measurement. The detail table follows, one line per
contender with each round's value. Then the targets ("Done when"):
  - Tandem/DDP <= 1.00 by median on every large-budget row (6 in a full run):
    where the driver measured the two pair by pair (the row's
    "ddp_paired": the rounds' pairs and more back to back), the geometric
    mean of the pairs' ratios of medians decides, shown with its 95%
    interval ("outside noise" when all of it is below 1); else the ratio of
    the rounds' medians;
  - Tandem never behind the best reference beyond the measured spread:
    Tandem's fastest round no slower than the best reference's slowest (the
    two min-max ranges overlap, or Tandem is ahead), on every row (12);
    where the driver checked Tandem's plan against that reference's in
    alternating blocks (the row's "paired"), that interval decides
    instead: behind only when all of it is above 1; where every
    reference that ran did so on the memory guard's fallback (none fits
    the budget as planned), against the fastest of those runs, and the
    row says so;
  - the first plan's prediction within 10% of its own first measurement, on
    every row.
A row that misses says why, with its numbers.
"""

import json
import sys

POLICIES = ["on-demand", "deepspeed-zero3", "fsdp", "deepcompile"]
REFERENCES = ["ddp"] + POLICIES
TANDEM = ["tandem-passes", "tandem"]
COLUMNS = REFERENCES + TANDEM
LARGE_ROWS, ALL_ROWS = 6, 12  # in a full run: 3 models x 2 rates (x 2 budgets)


def f(v, fmt="{:.3f}"):
    return "—" if v is None else fmt.format(v)


def mib(v):
    return "—" if v is None else f"{v / 2**20:.1f}"


def pct(v):
    return "—" if v is None else f"{v:+.1%}"


def load(path):
    rows = [json.loads(l) for l in open(path) if l.strip()]
    facts = [r for r in rows if r.get("contender", "").startswith("machine")]
    rows = [r for r in rows if not r.get("contender", "").startswith("machine")]
    return facts, rows


def key_of(r):
    return (r["model"], r["rate_mbit"], r["budget"])


def by_key(rows):
    """{(model, rate, budget): {contender: row}}; DDP's large-budget row
    counts at its budget only (it cannot run at the small one)."""
    out = {}
    for r in rows:
        if r.get("contender") in COLUMNS:
            out.setdefault(key_of(r), {})[r["contender"]] = r
    return out


def best_reference(got):
    """The fastest reference by median at one row's budget: (name, row), or
    None. References without a median, and those whose steps ran on the
    memory guard's fallback, are left out."""
    cands = [(got[p]["step_s"], p) for p in REFERENCES
             if got.get(p, {}).get("step_s") and not got[p].get("fallback_steps")]
    if not cands:
        return None
    _, name = min(cands)
    return name, got[name]


def spread(r):
    """(min, max) over rounds of a row's per-round medians."""
    return (r.get("step_min_s", r.get("step_s")), r.get("step_max_s", r.get("step_s")))


def summarize(rows):
    """One summary per (model, rate, budget) with a Tandem row: the ratios,
    the best reference, and the targets' verdicts with their reasons."""
    out = []
    for k, got in sorted(by_key(rows).items()):
        t = got.get("tandem")
        if t is None:
            continue
        s = dict(model=k[0], rate_mbit=k[1], budget=k[2], got=got, tandem=t)
        ts = t.get("step_s")
        ddp = got.get("ddp", {}).get("step_s")
        best = best_reference(got)
        s["ratio_ddp"] = ts / ddp if ts and ddp else None
        s["best"] = best[0] if best else None
        s["ratio_best"] = ts / best[1]["step_s"] if ts and best else None
        s["excluded"] = [p for p in REFERENCES if got.get(p, {}).get("fallback_steps")]
        # Target 1: Tandem/DDP <= 1.00 (large budget only).
        if k[2] == "large":
            if ts is None:
                s["ddp_target"] = (False, f"tandem did not run: {t.get('error', '?')}")
            elif ddp is None:
                s["ddp_target"] = (False, "no DDP median")
            else:
                ok = ts / ddp <= 1.0
                why = (f"Tandem/DDP {ts / ddp:.3f} (tandem {ts:.3f}, DDP {ddp:.3f})"
                       + ("" if ok else " > 1.00"))
                dp = t.get("ddp_paired") or {}
                if dp.get("ratio"):
                    ok = dp["ratio"] <= 1.0
                    s["ratio_ddp_paired"] = (dp["ratio"], dp["low"], dp["high"])
                    noise = ("outside noise" if dp["high"] < 1.0 else
                             "within noise" if dp["low"] <= 1.0 else "behind beyond noise")
                    why = (f"Tandem/DDP {dp['ratio']:.3f} ({dp['low']:.3f}–{dp['high']:.3f}) "
                           f"over {dp['pairs']} pairs of runs ({dp.get('round_pairs')} "
                           f"rounds, {dp.get('extra_pairs')} back to back): {noise}"
                           + ("" if ok else ", > 1.00")
                           + f"; the rounds' medians alone {ts / ddp:.3f}")
                elif dp.get("error"):
                    why += f"; pair by pair: {dp['error'][:200]}"
                s["ddp_target"] = (ok, why)
        # Target 2: never behind the best reference beyond the spread.
        if ts is None:
            s["spread_target"] = (False, f"tandem did not run: {t.get('error', '?')}")
        elif best is None:
            # Every reference that ran at all ran on the memory guard's
            # least-memory schedule: none fits the budget as planned. Tandem
            # is held against the fastest of those runs all the same.
            fell = sorted((got[p]["step_s"], p) for p in REFERENCES
                          if got.get(p, {}).get("step_s") and got[p].get("fallback_steps"))
            if not fell:
                s["spread_target"] = (True, "no reference measured")
            else:
                fs, fp = fell[0]
                tmin, _ = spread(t)
                _, fmax = spread(got[fp])
                ok = tmin <= fmax
                s["spread_target"] = (
                    ok, f"no reference fits the budget: {', '.join(sorted(p for _, p in fell))} "
                        f"ran on the memory guard's least-memory schedule; tandem {ts:.3f} "
                        f"against the fastest of those runs, {fp} {fs:.3f} ({ts / fs:.2f}x)"
                        + ("" if ok else ": Tandem's fastest round is slower than its "
                                         "slowest"))
        else:
            tmin, tmax = spread(t)
            bmin, bmax = spread(best[1])
            ok = tmin <= bmax
            why = ("" if ok else ": Tandem's fastest round is slower than the "
                                 "reference's slowest")
            p = t.get("paired") or {}
            if p.get("reference") == best[0] and p.get("ratio"):
                ok = p["low"] <= 1.0
                why = (f"; alternating with it, Tandem/{best[0]} {p['ratio']:.3f} "
                       f"({p['low']:.3f}–{p['high']:.3f}) over {p['pairs']} block pairs"
                       + ("" if ok else ": behind beyond the interval"))
            elif p.get("error"):
                why += f"; the alternating check failed: {p['error'][:200]}"
            s["spread_target"] = (
                ok, f"tandem {ts:.3f} ({tmin:.3f}–{tmax:.3f}) vs best reference {best[0]} "
                    f"{best[1]['step_s']:.3f} ({bmin:.3f}–{bmax:.3f})" + why)
        # Target 3: the first plan's prediction within 10% of its first
        # measurement.
        e = t.get("first_prediction_error")
        if e is None:
            s["prediction_target"] = (False, "no first-plan prediction and measurement")
        else:
            ok = abs(e) <= 0.10
            s["prediction_target"] = (
                ok, f"first plan v{t.get('first_version')} predicted "
                    f"{f(t.get('first_predicted_s'))}, measured {f(t.get('first_measured_s'))} "
                    f"({e:+.1%})" + ("" if ok else ", beyond ±10%")
                    + first_window_note(t))
        if t.get("fallback_steps"):
            note = (f"; Tandem's own steps ran on the memory guard's fallback "
                    f"({t['fallback_steps']} of {t.get('steps')})")
            for field in ("ddp_target", "spread_target"):
                if field in s:
                    s[field] = (s[field][0], s[field][1] + note)
        out.append(s)
    return out


def first_window_note(t):
    """The first plan against its first window as well (not the target's
    figure): the model's own error, without the host's drift over the job."""
    w = t.get("first_window_prediction_error")
    if w is None:
        return ""
    return (f"; against its first window ({f(t.get('first_window_measured_s'))}, "
            f"the coordinator's first measurement) {w:+.1%}")


def check_targets(summaries):
    """[(target, rows met, rows checked, expected rows in a full run,
    [(row name, met, why)])]."""
    def name(s):
        return f"{s['model']} @ {s['rate_mbit']} Mbit/s, {s['budget']}"
    targets = []
    for field, title, expected in (
            ("ddp_target", "Tandem/DDP ≤ 1.00 by median (large budget)", LARGE_ROWS),
            ("spread_target", "never behind the best reference beyond the spread", ALL_ROWS),
            ("prediction_target", "first-plan prediction within 10%", ALL_ROWS)):
        checked = [(name(s),) + s[field] for s in summaries if field in s]
        targets.append((title, sum(1 for c in checked if c[1]), len(checked), expected,
                        checked))
    return targets


def cell(r):
    if r is None:
        return "—"
    if r.get("step_s") is None:
        return "not run" if not r.get("error", "").startswith("cannot run") else "—"
    lo, hi = spread(r)
    dagger = " †" if r.get("fallback_steps") else ""
    return f"{r['step_s']:.3f} ({lo:.3f}–{hi:.3f}){dagger}"


def plan_text(t):
    if t.get("final_version") is None:
        return "—"
    src = t.get("plan_source") or "?"
    who = "Tandem's own pipeline" if src == "tandem" else (
        "the baseline" if src == "baseline" else f"{src}'s plan")
    text = f"v{t['final_version']} ({t.get('final_reason')}): {who}"
    if t.get("same_plan_as"):
        text += " = " + ", ".join(t["same_plan_as"])
    if not t.get("settled"):
        text += "; not settled"
    return text


def main():
    facts, rows = load(sys.argv[1])
    for fct in facts:
        print("<!-- " + json.dumps(fct) + " -->")
    summaries = summarize(rows)
    print("| model | Mbit/s | budget | " + " | ".join(COLUMNS) +
          " | Tandem/DDP | Tandem/best ref | Tandem's plan | first plan: predicted / measured "
          "(error) | final plan: predicted (error) |")
    print("|---|---:|---|" + "---|" * len(COLUMNS) + "---:|---:|---|---|---|")
    for s in summaries:
        t = s["tandem"]
        ratio_best = (f"{s['ratio_best']:.2f} ({s['best']})" if s["ratio_best"] else "—")
        ratio_ddp = f(s["ratio_ddp"], "{:.2f}")
        if s.get("ratio_ddp_paired"):
            ratio_ddp = "{:.2f} ({:.2f}–{:.2f})".format(*s["ratio_ddp_paired"])
        first = (f"{f(t.get('first_predicted_s'))} / {f(t.get('first_measured_s'))} "
                 f"({pct(t.get('first_prediction_error'))})")
        if t.get("first_window_measured_s"):
            first += (f"; first window {f(t['first_window_measured_s'])} "
                      f"({pct(t.get('first_window_prediction_error'))})")
        final = f"{f(t.get('predicted_s'))} ({pct(t.get('prediction_error'))})"
        print(f"| {s['model']} | {s['rate_mbit']} | {s['budget']} | "
              + " | ".join(cell(s["got"].get(c)) for c in COLUMNS)
              + f" | {ratio_ddp} | {ratio_best} | {plan_text(t)} | "
                f"{first} | {final} |")

    print()
    print("| model | Mbit/s | budget | contender | step s (median of rounds) | min–max over rounds "
          "| rounds | lower bound s (compute / comm alone) | ×LB | ×DDP | exposed comm s | "
          "peak MiB/rank | predicted s | pred. err | note |")
    print("|---|---:|---|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---|")
    for r in rows:
        lb = r.get("lower_bound_s")
        comp = r.get("ddp_compute_alone_s") if r["contender"] == "ddp" else r.get("compute_alone_s")
        lbtxt = f"{f(lb)} ({f(comp)} / {f(r.get('comm_alone_s'))})" if lb else "—"
        rng = (f"{f(r.get('step_min_s'))}–{f(r.get('step_max_s'))}" if r.get("step_s") else "—")
        rounds = ", ".join(f(v) for v in r.get("round_step_s") or [])
        note = ""
        if r.get("error"):
            note = r["error"][:90].replace("|", "/").replace("\n", " ")
        elif r.get("plan_over_budget"):
            note = "plan over budget"
        if r.get("contender") == "tandem":
            note = "; ".join(x for x in [plan_text(r), note] if x)
        if r.get("fallback_steps"):
            note = (f"memory guard: {r['fallback_steps']} of {r.get('steps')} measured steps "
                    "on the least-memory schedule" + (f"; {note}" if note else ""))
        budget = f"{r['budget']} ({mib(r.get('budget_bytes'))} MiB)" if r.get("budget_bytes") \
            else r["budget"]
        print(f"| {r['model']} | {r['rate_mbit']} | {budget} | {r['contender']} | "
              f"{f(r.get('step_s'))} | {rng} | {rounds or '—'} | {lbtxt} | "
              f"{f(r.get('ratio_lb'), '{:.2f}')} | {f(r.get('ratio_ddp'), '{:.2f}')} | "
              f"{f(r.get('exposed_comm_s'))} | {mib(r.get('peak_bytes'))} | "
              f"{f(r.get('predicted_s'))} | {pct(r.get('prediction_error'))} | "
              f"{note.replace('|', '/')} |")

    print()
    print("Targets (issue 33, \"Done when\"):")
    for title, met, checked, expected, rows_ in check_targets(summaries):
        verdict = ("MET" if met == checked == expected else
                   "not met" if met < checked else
                   f"met on the rows present; not established (a full run has {expected})")
        print(f"- {title}: {verdict} ({met} of {checked} rows)")
        for name, ok, why in rows_:
            print(f"  - {name}: {'met' if ok else 'MISSED'}: {why}")


if __name__ == "__main__":
    main()
