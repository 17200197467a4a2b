#!/usr/bin/python3
"""bench/overhead: Tandem's runtime against PyTorch eager on one rank, and
against PyTorch DDP on two ranks at DDP's memory (issue 33).

  bench/overhead/overhead.py [--models tiny-llama,wide-short,exported-gpt,exported-vit]
                             [--rounds 5] [--steps 8] [--warmup 3] [--world2]
                             [--build build] [--out FILE]

World 1 (compute alone, one thread, OPENBLAS_NUM_THREADS=1): per model, R
interleaved rounds; each round runs tandem-worker --standalone --world 1
and bench/overhead/eager.py (PyTorch eager: zero_grad, forward, backward,
clip_grad_norm_, torch.optim.AdamW) once each, their order alternating
round by round. A run's figure is the median of its measured steps (the
warm-up discarded); a model's ratio is the median over rounds of each
round's Tandem/eager, with the min-max over rounds as its spread (never a
best of several). Where Tandem's time goes, phase by phase, comes from the
worker's trace of its last step (--trace-out): forward and backward node
spans, the optimizer (exchange, clip, AdamW), waits for collectives, and
the rest of the step (boundary hooks, the memory meter and the profiler's
bookkeeping, schedule agreement); eager's from its own clock reads around
each phase.

--world2: two ranks on loopback (no shaping), at DDP's memory: Tandem under
the plan that keeps every param gathered (`tandem-plan --passes
zero3-insert,unshard` with memory to spare:
a reduce-scatter during backward and one all-gather of the updated shards,
what DDP's all-reduce moves) against bench/e2e/ddp_reference.py under
PyTorch DDP, interleaved likewise; built-in models only.

JSON lines go to --out (default: $TMPDIR/tandem-overhead.jsonl), the table
to stdout.
"""

import argparse
import glob
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PY = "/usr/bin/python3"

# bench/e2e's models (per-rank batch), and a torchvision model exported.
MODELS = {
    "tiny-llama": dict(layers=4, d_model=256, heads=8, kv_heads=8, ffn=704, vocab=4096,
                       seq_len=128, micro_batch=4),
    "wide-short": dict(layers=2, d_model=320, heads=5, kv_heads=5, ffn=896, vocab=4096,
                       seq_len=64, micro_batch=2),
    # --device cuda: a size where a GPU step is compute (eager.py's too).
    "gpu-llama": dict(layers=8, d_model=1024, heads=16, kv_heads=16, ffn=2816, vocab=32000,
                      seq_len=1024, micro_batch=8),
    "exported-gpt": dict(export="tests/models/gpt.py:build_demo", vocab=4096, seq_len=128,
                         micro_batch=4),
    "exported-vit": dict(export="bench/overhead/models.py:vit", micro_batch=32,
                         input_ranges=["labels=0:9"]),
}


def log(msg):
    print(f"[overhead {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spread(values):
    return (min(values), max(values)) if values else (None, None)


class Bench:
    def __init__(self, a):
        self.a = a
        self.work = tempfile.mkdtemp(prefix="tandem-overhead-")
        self.worker = os.path.join(a.build, "worker", "tandem-worker")
        self.plan = os.path.join(a.build, "coordinator", "tandem-plan")
        self.env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1",
                        PYTHONPATH=os.path.join(ROOT, "client", "python"))
        # glibc keeps freed blocks, for both contenders (the caller's values
        # win): otherwise eager's large blocks go back to the kernel each
        # step and fault in again, which on some VMs tripled its step while
        # Tandem's block cache kept its own (bench/README.md, "Results
        # (2026-12-02b ...)").
        for name in ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_"):
            self.env.setdefault(name, str(1 << 30))
        # A build-gpu/ that scripts/gpu-check.sh built against .gpu-deps'
        # libraries (a machine without them installed) runs against them.
        deps = glob.glob(os.path.join(a.build, "deps", "usr", "lib", "*-linux-gnu"))
        if os.environ.get("LD_LIBRARY_PATH"):
            deps.append(os.environ["LD_LIBRARY_PATH"])
        if deps:
            self.env["LD_LIBRARY_PATH"] = os.pathsep.join(deps)

    def run(self, cmd, timeout=900):
        p = subprocess.run(cmd, cwd=ROOT, env=self.env, capture_output=True, text=True,
                           timeout=timeout)
        if p.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd[:3])}... exited {p.returncode}: "
                               f"{p.stderr.strip()[-600:]}")
        return p.stdout

    def archive(self, name, m):
        path = os.path.join(self.work, f"{name}.tandem")
        if not os.path.exists(path):
            cmd = [PY, "-m", "tandem", "export", m["export"], "-o", path]
            for r in m.get("input_ranges", []):
                cmd += ["--input-range", r]
            self.run(cmd)
        return path

    def spec(self, name, m, world, steps):
        path = os.path.join(self.work, f"{name}-w{world}.yaml")
        if "export" in m:
            vocab = f", vocab: {m['vocab']}" if m.get("vocab") else ""
            model = f"{{kind: torchscript, path: {self.archive(name, m)}{vocab}}}"
        else:
            model = (f"{{preset: llama, layers: {m['layers']}, d_model: {m['d_model']}, "
                     f"heads: {m['heads']}, kv_heads: {m['kv_heads']}, ffn: {m['ffn']}, "
                     f"vocab: {m['vocab']}}}")
        batch = f"micro_batch: {m['micro_batch']}"
        if m.get("seq_len"):
            batch += f", seq_len: {m['seq_len']}"
        with open(path, "w") as f:
            f.write(f"""name: {name}
model: {model}
data: {{kind: synthetic, seed: 1}}
batch: {{{batch}}}
train: {{steps: {steps}, lr: 1.0e-3, seed: 1, grad_clip: 1.0}}
parallel: {{world_size: {world}, zero_stage: 3}}
""")
        return path

    # -- one run of each contender --------------------------------------------

    def tandem_world1(self, name, m):
        steps = self.a.warmup + self.a.steps
        trace = os.path.join(self.work, f"{name}.trace.json")
        out = self.run([self.worker, "--standalone", "--spec", self.spec(name, m, 1, steps),
                        "--rank", "0", "--world", "1", "--rendezvous",
                        f"127.0.0.1:{free_port()}", "--threads", "1", "--trace-out", trace,
                        "--device", self.a.device])
        rows = [json.loads(l) for l in out.splitlines() if l.startswith('{"step"')]
        measured = rows[self.a.warmup:]
        return dict(step_s=statistics.median(r["iteration_s"] for r in measured),
                    exposed_comm_s=statistics.median(r["exposed_comm_s"] for r in measured),
                    peak_bytes=max(r["peak_bytes"] for r in measured),
                    phases=trace_phases(trace))

    def eager_world1(self, name, m):
        cmd = [self.a.python, os.path.join(ROOT, "bench", "overhead", "eager.py"), "--steps",
               str(self.a.steps), "--warmup", str(self.a.warmup), "--device", self.a.device]
        cmd += (["--module", m["export"]] if "export" in m else ["--builtin", name])
        last = json.loads(self.run(cmd).strip().splitlines()[-1])
        return dict(step_s=last["median_step_s"],
                    phases={k[len("median_"):-2]: v for k, v in last.items()
                            if k.startswith("median_") and k != "median_step_s"})

    def persistent_schedule(self, name, m):
        path = os.path.join(self.work, f"{name}-persistent.sched")
        text = (f"arch=llama layers={m['layers']} d_model={m['d_model']} heads={m['heads']} "
                f"kv_heads={m['kv_heads']} ffn={m['ffn']} vocab={m['vocab']} world=2 "
                f"micro_batch={m['micro_batch']} seq_len={m['seq_len']}")
        out = self.run([self.plan, "--model", text, "--hw", "memory=64GiB",
                        "--passes", "zero3-insert,unshard"])
        if "persistent p" not in out:
            raise RuntimeError(f"tandem-plan kept no param gathered for {name}")
        with open(path, "w") as f:
            f.write(out.partition("# predictions")[0])
        return path

    def pair(self, make):
        port = free_port()
        procs = [subprocess.Popen(make(r, f"127.0.0.1:{port}"), cwd=ROOT, env=self.env,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                 for r in range(2)]
        outs = []
        for p in procs:
            o, e = p.communicate(timeout=900)
            if p.returncode != 0:
                raise RuntimeError(f"rank exited {p.returncode}: {e.strip()[-600:]}")
            outs.append(o)
        return outs

    def tandem_world2(self, name, m, sched):
        steps = self.a.warmup + self.a.steps
        spec = self.spec(name, m, 2, steps)
        outs = self.pair(lambda r, rv: [self.worker, "--standalone", "--spec", spec, "--rank",
                                        str(r), "--world", "2", "--rendezvous", rv,
                                        "--threads", "1", "--schedule", sched])
        per = [[json.loads(l) for l in o.splitlines() if l.startswith('{"step"')][self.a.warmup:]
               for o in outs]
        n = min(len(p) for p in per)
        it = [max(p[i]["iteration_s"] for p in per) for i in range(n)]
        ex = [max(p[i]["exposed_comm_s"] for p in per) for i in range(n)]
        return dict(step_s=statistics.median(it), exposed_comm_s=statistics.median(ex))

    def ddp_world2(self, name, m):
        args = ["--layers", str(m["layers"]), "--d-model", str(m["d_model"]), "--heads",
                str(m["heads"]), "--kv-heads", str(m["kv_heads"]), "--ffn", str(m["ffn"]),
                "--vocab", str(m["vocab"]), "--seq-len", str(m["seq_len"]), "--micro-batch",
                str(m["micro_batch"])]
        ddp = os.path.join(ROOT, "bench", "e2e", "ddp_reference.py")
        outs = self.pair(lambda r, rv: [PY, ddp, "--rank", str(r), "--world", "2", "--master",
                                        rv, "--steps", str(self.a.steps), "--warmup",
                                        str(self.a.warmup)] + args)
        per = [[json.loads(l) for l in o.splitlines() if l.startswith('{"step"')] for o in outs]
        n = min(len(p) for p in per)
        return dict(step_s=statistics.median(max(p[i]["step_s"] for p in per)
                                             for i in range(n)))

    # -- rounds ---------------------------------------------------------------

    def rounds(self, contenders):
        """Each round runs every contender once; the order alternates (A B,
        B A, ...) so neither always runs first."""
        results = {c: [] for c, _ in contenders}
        for r in range(self.a.rounds):
            order = contenders if r % 2 == 0 else list(reversed(contenders))
            for c, fn in order:
                results[c].append(fn())
        return results


# The trace's phase names (common/ir's PhaseName).
PHASES = {"fwd": "forward", "bwd": "backward", "opt": "optimizer",
          "forward": "forward", "backward": "backward", "optimizer": "optimizer"}


def trace_phases(path):
    """Seconds of the traced step by phase, from the compute stream's spans
    (the thread the trace names "compute"): forward, backward and optimizer
    node spans, waits (for collectives, the end-of-step exchange); what no
    span covers is 'other' (hooks, the meter's and the profiler's
    bookkeeping, schedule agreement, the loss's reads)."""
    with open(path) as f:
        t = json.load(f)
    ev = t["traceEvents"]
    compute = [e["tid"] for e in ev if e.get("ph") == "M" and e.get("name") == "thread_name"
               and e["args"].get("name") == "compute"]
    tid = compute[0] if compute else 1
    out = dict(forward=0.0, backward=0.0, optimizer=0.0, waits=0.0)
    for e in ev:
        if e.get("ph") != "X" or e.get("tid") != tid:
            continue
        s = e["dur"] / 1e6
        if e.get("cat") == "node":
            phase = PHASES.get(e.get("args", {}).get("phase"), "forward")
            out[phase] += s
        else:
            out["waits"] += s
    total = t["otherData"]["iteration_s"]
    out["other"] = max(0.0, total - sum(out.values()))
    out["iteration"] = total
    return out


def ratio_summary(tandem, ref):
    ratios = [t["step_s"] / r["step_s"] for t, r in zip(tandem, ref)]
    lo, hi = spread(ratios)
    return dict(ratio=statistics.median(ratios), ratio_min=lo, ratio_max=hi,
                rounds=len(ratios), tandem_s=statistics.median(t["step_s"] for t in tandem),
                reference_s=statistics.median(r["step_s"] for r in ref))


def median_phases(runs):
    keys = sorted({k for r in runs for k in r["phases"]})
    return {k: statistics.median(r["phases"].get(k, 0.0) for r in runs) for k in keys}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default=",".join(m for m in MODELS if m != "gpu-llama"))
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--world2", action="store_true")
    ap.add_argument("--device", default="cpu", help="cpu, or cuda (world 1, built-in models)")
    ap.add_argument("--python", default=PY, help="the Python with torch for eager.py")
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--out", default=os.path.join(tempfile.gettempdir(),
                                                  "tandem-overhead.jsonl"))
    a = ap.parse_args()
    b = Bench(a)
    rows = []

    def emit(row):
        rows.append(row)
        with open(a.out, "a") as f:
            f.write(json.dumps(dict(row, time=time.strftime("%Y-%m-%dT%H:%M:%S"))) + "\n")
    for name in a.models.split(","):
        if name not in MODELS:
            sys.exit(f"unknown model '{name}' (expected one of {', '.join(MODELS)})")
        m = MODELS[name]
        log(f"{name}: world 1, {a.rounds} rounds")
        res = b.rounds([("tandem", lambda: b.tandem_world1(name, m)),
                        ("eager", lambda: b.eager_world1(name, m))])
        row = dict(model=name, world=1, reference="pytorch-eager", device=a.device,
                   tokens_per_step=m["micro_batch"] * m["seq_len"] if m.get("seq_len") else None,
                   **ratio_summary(res["tandem"], res["eager"]),
                   round_tandem_s=[r["step_s"] for r in res["tandem"]],
                   round_reference_s=[r["step_s"] for r in res["eager"]],
                   tandem_phases=median_phases(res["tandem"]),
                   eager_phases=median_phases(res["eager"]),
                   tandem_exposed_comm_s=statistics.median(
                       r["exposed_comm_s"] for r in res["tandem"]))
        emit(row)
        if a.world2 and "export" not in m:
            sched = b.persistent_schedule(name, m)
            log(f"{name}: world 2 at DDP's memory, {a.rounds} rounds")
            res = b.rounds([("tandem", lambda: b.tandem_world2(name, m, sched)),
                            ("ddp", lambda: b.ddp_world2(name, m))])
            emit(dict(model=name, world=2, reference="pytorch-ddp",
                             **ratio_summary(res["tandem"], res["ddp"]),
                             round_tandem_s=[r["step_s"] for r in res["tandem"]],
                             round_reference_s=[r["step_s"] for r in res["ddp"]],
                             tandem_exposed_comm_s=statistics.median(
                                 r["exposed_comm_s"] for r in res["tandem"])))
    report(rows)


def report(rows):
    print("| model | world | device | reference | Tandem s | reference s | Tandem/ref (min–max "
          "over rounds) | rounds | tokens/s Tandem / reference |")
    print("|---|---:|---|---|---:|---:|---|---:|---|")
    for r in rows:
        tok = r.get("tokens_per_step")
        toks = (f"{tok / r['tandem_s']:.0f} / {tok / r['reference_s']:.0f}" if tok else "—")
        print(f"| {r['model']} | {r['world']} | {r.get('device', 'cpu')} | {r['reference']} | "
              f"{r['tandem_s']:.4f} | {r['reference_s']:.4f} | {r['ratio']:.3f} "
              f"({r['ratio_min']:.3f}–{r['ratio_max']:.3f}) | {r['rounds']} | {toks} |")
    print()
    print("Where the time goes at world 1 (medians over rounds, seconds; Tandem from its "
          "last step's trace):")
    print("| model | | forward | backward | optimizer (+clip) | waits | other |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for r in rows:
        if r["world"] != 1:
            continue
        t, e = r["tandem_phases"], r["eager_phases"]
        print(f"| {r['model']} | Tandem | {t.get('forward', 0):.4f} | {t.get('backward', 0):.4f} "
              f"| {t.get('optimizer', 0):.4f} | {t.get('waits', 0):.4f} | {t.get('other', 0):.4f} |")
        print(f"| | eager | {e.get('forward', 0):.4f} | {e.get('backward', 0):.4f} | "
              f"{e.get('optimizer', 0) + e.get('clip', 0):.4f} | — | — |")


if __name__ == "__main__":
    main()
