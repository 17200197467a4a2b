#!/usr/bin/python3
"""Prints bench/e2e's results (JSON lines from driver.py) as a markdown table
and checks issue 9's targets.

  report.py results.jsonl
"""

import json
import sys

POLICIES = ["on-demand", "deepspeed-zero3", "fsdp", "deepcompile", "tandem"]


def f(v, fmt="{:.3f}"):
    return "—" if v is None else fmt.format(v)


def mib(v):
    return "—" if v is None else f"{v / 2**20:.1f}"


def main():
    rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
    facts = [r for r in rows if r.get("contender", "").startswith("machine")]
    rows = [r for r in rows if not r.get("contender", "").startswith("machine")]
    for fct in facts:
        print("<!-- " + json.dumps(fct) + " -->")
    print("| model | Mbit/s | budget | contender | step s (median) | min–max | lower bound s "
          "(compute / comm alone) | ×LB | ×DDP | exposed comm s | peak MiB/rank | "
          "predicted s | pred. err | note |")
    print("|---|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    for r in rows:
        if r["contender"] == "compute-alone":
            continue
        lb = r.get("lower_bound_s")
        comp = r.get("ddp_compute_alone_s") if r["contender"] == "ddp" else r.get("compute_alone_s")
        lbtxt = f"{f(lb)} ({f(comp)} / {f(r.get('comm_alone_s'))})" if lb else "—"
        spread = (f"{f(r.get('step_min_s'))}–{f(r.get('step_max_s'))}"
                  if r.get("step_s") else "—")
        note = ""
        if r.get("error"):
            note = r["error"][:90].replace("|", "/").replace("\n", " ")
        elif r.get("plan_over_budget"):
            note = "plan over budget"
        if r.get("trial"):
            note = f"trial: {r['trial']}" + (f"; {note}" if note else "")
        if r.get("fallback_steps"):
            note = (f"memory guard: {r['fallback_steps']} of {r.get('steps')} measured steps "
                    "on the least-memory schedule" + (f"; {note}" if note else ""))
        budget = f"{r['budget']} ({mib(r.get('budget_bytes'))} MiB)"
        print(f"| {r['model']} | {r['rate_mbit']} | {budget} | {r['contender']} | "
              f"{f(r.get('step_s'))} | {spread} | {lbtxt} | {f(r.get('ratio_lb'), '{:.2f}')} | "
              f"{f(r.get('ratio_ddp'), '{:.2f}')} | {f(r.get('exposed_comm_s'))} | "
              f"{mib(r.get('peak_bytes'))} | {f(r.get('predicted_s'))} | "
              f"{f(r.get('prediction_error'), '{:+.0%}')} | {note} |")

    # Targets (issue 9).
    print()
    print("Targets:")
    keys = sorted({(r["model"], r["rate_mbit"], r["budget"]) for r in rows
                   if r["contender"] in POLICIES})
    ddp = {(r["model"], r["rate_mbit"]): r.get("step_s") for r in rows
           if r["contender"] == "ddp" and r["budget"] == "large"}
    for k in keys:
        got = {r["contender"]: r for r in rows
               if (r["model"], r["rate_mbit"], r["budget"]) == k and r["contender"] in POLICIES}
        t = got.get("tandem", {})
        ts = t.get("step_s")
        msgs = []
        if ts is None:
            msgs.append(f"tandem did not run: {t.get('error', '?')}")
        else:
            lb = t.get("lower_bound_s")
            if lb:
                msgs.append(f"×LB {ts / lb:.2f} ({'MET' if ts / lb <= 1.15 else 'missed'} ≤1.15)")
            od = got.get("on-demand", {}).get("step_s")
            if od:
                msgs.append(f"vs on-demand {od / ts:.2f}x ({'MET' if od / ts >= 1.3 else 'missed'} ≥1.3)")
            # A reference whose steps ran on the memory guard's fallback
            # measured that schedule, not its own plan: it does not count.
            refs = [(p, got[p]["step_s"]) for p in ("fsdp", "deepspeed-zero3", "deepcompile")
                    if got.get(p, {}).get("step_s") and not got[p].get("fallback_steps")]
            slower = [p for p, s in refs if ts > s]
            msgs.append("never slower than refs: " + ("MET" if not slower else
                        "missed vs " + ", ".join(f"{p} {s:.3f}" for p, s in refs if p in slower)))
            d = ddp.get(k[:2])
            if d:
                lim = 1.0 if k[2] == "large" else 1.2
                msgs.append(f"×DDP {ts / d:.2f} ({'MET' if ts / d <= lim else 'missed'} ≤{lim})")
            if t.get("fallback_steps"):
                msgs.append(f"{t['fallback_steps']} steps on the memory guard's fallback")
            if t.get("predicted_s"):
                e = t["predicted_s"] / ts - 1
                msgs.append(f"prediction {e:+.1%} ({'MET' if abs(e) <= 0.10 else 'missed'} ±10%)")
        print(f"- {k[0]} @ {k[1]} Mbit/s, {k[2]} budget: " + "; ".join(msgs))


if __name__ == "__main__":
    main()
