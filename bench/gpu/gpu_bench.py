#!/usr/bin/python3
"""bench/gpu: one command on a GPU machine for three measurements of the
worker, with a short --dry mode that runs on CPU in CI.

  bench/gpu/gpu_bench.py [--build build-gpu] [--device cuda|cpu] [--dry]
                         [--rounds 3] [--out FILE]
                         [--only offload,numerics,throughput]

Run it with the Python that has torch (CUDA torch on a GPU machine):
`"$PYTHON" bench/gpu/gpu_bench.py --build build-gpu`.

offload     Tandem's adaptive offload (tandem-plan --passes
            zero3-insert,offload,prefetch) against offload-all
            (zero3-insert,offload-all,prefetch) and no offload
            (zero3-insert,prefetch) at world 1, at three budgets: one where
            nothing must leave (the no-offload plan's predicted peak plus
            the worker's guard band) and two where memory binds (that budget
            less 25% and 50% of the optimizer-state bytes). Every plan is
            planned from a profile of a short run under the default schedule
            and run by tandem-worker --standalone --schedule with
            memory.budget_bytes set to the budget. A plan the planner cannot
            fit (tandem-plan exits 2, or falls back to its least-memory plan)
            is a row saying so. Target (DeepCompile's claim): adaptive at
            least 2x faster than offload-all where memory binds.
numerics    The worker at bf16 (and f16 on CUDA, with dynamic loss scaling)
            against PyTorch eager under torch.autocast (f16: and
            GradScaler with the worker's scaler arguments), training
            tests/reference/hf_models.py's own Llama from the same initial
            weights (model.init_from) on the same tokens (data.kind tokens)
            with torch.optim.AdamW and clip_grad_norm_; the worker and eager
            at f32 show the size of the precision effect. A CPU rank must
            refuse model.dtype f16 ("model.dtype f16 needs a CUDA device").
throughput  tokens/s of a built-in preset: the worker standalone (world 1,
            its default schedule) against bench/overhead/eager.py --builtin
            (PyTorch eager) on the same sizes.

Every contender is run the same number of times in interleaved rounds, the
order reversed every other round (A B C, C B A, ...); a run's figure is the
median of its measured steps (warm-up dropped), a contender's the median
over rounds with the min-max over rounds as its spread, and a ratio the
median of each round's ratio (never a best of several).

JSON lines (one per measurement row, each with "section", "device", "dry")
are appended to --out (default $TMPDIR/tandem-gpu-bench.jsonl); a table per
section goes to stdout. Exit status: 0 when every run ran (a missed target
is "target met: no", not an error), 1 when a run failed (a process crashed,
a refusal that should happen did not), 2 on bad arguments.
"""

import argparse
import errno
import glob
import importlib.util
import json
import math
import os
import re
import shutil
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import time
import traceback

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SECTIONS = ("offload", "numerics", "throughput")

# The worker's guard band (common/lowering/least_memory.h, kMemoryGuardBand):
# the planner keeps this fraction of the budget free, so "nothing must leave"
# is the no-offload plan's predicted peak over (1 - band).
GUARD_BAND = 0.02
# Budgets where memory binds: the no-offload budget less these fractions of
# the optimizer-state bytes.
BINDING_FRACTIONS = (0.25, 0.5)
# DeepCompile's claim: adaptive offload at least this much faster than
# offload-all where memory binds.
OFFLOAD_TARGET = 2.0
PLANS = {
    "no-offload": "zero3-insert,prefetch",
    "offload-all": "zero3-insert,offload-all,prefetch",
    "adaptive": "zero3-insert,offload,prefetch",
}
F16_REFUSAL = "model.dtype f16 needs a CUDA device"
# The worker at f32 against eager at f32 (scripts/gpu-check.sh's CUDA-vs-CPU
# bound): a check of the setup, not of precision.
F32_RTOL = 1e-3
# Low precision: |worker - autocast| within NUMERICS_K times the largest
# |f32 - autocast| over the steps, plus NUMERICS_ABS, at every step.
NUMERICS_K = 3.0
NUMERICS_ABS = 1e-3

# Sizes. Dry: bench/e2e's tiny sizes (scripts/gpu-check.sh's model).
TINY = dict(layers=2, d_model=64, heads=4, kv_heads=4, ffn=176, vocab=512,
            seq_len=32, micro_batch=2)
CONFIGS = {
    "dry": dict(
        offload=dict(model=TINY, warmup=2, steps=4, profile_steps=4),
        numerics=dict(model=TINY, steps=8, dtypes=("bf16",)),
        throughput=dict(builtin="tiny-llama", warmup=1, steps=3),
        rounds=2, timeout_s=300),
    # On a GPU. Offload: optimizer states must matter. 542M f32 params
    # (embed and lm_head 2 x 65.5M, 8 layers of 51.4M): 2.2 GB of params,
    # 2.2 GB of gradients and 4.3 GB of AdamW moments against ~2.5 GB of
    # activations at 2 x 512 tokens, so the states are ~40% of the peak,
    # and moving all of them out and back (8.7 GB over the host link, ~0.2-
    # 0.35 s at 25-50 GB/s) takes longer than a step's compute (~3.3 TFLOP,
    # well under 0.1 s): how much must leave decides the step time, which
    # is what adaptive against offload-all tests. (gpu-llama, d_model 1024
    # at 8 x 1024 tokens, is activation-bound: its states are ~10% of the
    # peak.)
    "cuda": dict(
        offload=dict(model=dict(layers=8, d_model=2048, heads=16, kv_heads=16,
                                ffn=5632, vocab=32000, seq_len=512,
                                micro_batch=2),
                     warmup=2, steps=6, profile_steps=5),
        # Numerics: big enough that f16 meets real gradients (a 32000-token
        # vocabulary, grouped-query attention), small enough to train 30
        # steps in seconds.
        numerics=dict(model=dict(layers=4, d_model=512, heads=8, kv_heads=4,
                                 ffn=1376, vocab=32000, seq_len=256,
                                 micro_batch=4),
                      steps=30, dtypes=("bf16", "f16")),
        throughput=dict(builtin="gpu-llama", warmup=3, steps=10),
        rounds=None, timeout_s=900),
}
# The optimizer every numerics run uses (tests/export/test_exported_numerics).
LR, BETAS, EPS, WD, CLIP = 3e-3, (0.9, 0.95), 1e-8, 0.01, 1.0
INIT_SEED = 5
# f16's scaler: GradScaler's defaults but a short growth interval, so that a
# 30-step run sees the scale both back off and grow.
SCALER = dict(init_scale=65536.0, growth_factor=2.0, backoff_factor=0.5,
              growth_interval=10)


def log(msg):
    print(f"[gpu-bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def load(path, name):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RunFailed(RuntimeError):
    """A process that should have run did not (or a refusal that should
    have happened did not): the bench exits non-zero."""


# -- pure helpers (tests/unit/bench/test_gpu_bench.py) --------------------------

def median_spread(values):
    """(median, min, max) of a contender's figures over rounds; (None, None,
    None) for none."""
    values = [v for v in values if v is not None]
    if not values:
        return None, None, None
    return statistics.median(values), min(values), max(values)


def round_orders(names, rounds):
    """The order of every round: each contender once per round, the order
    reversed every other round (A B C, C B A, A B C, ...)."""
    names = list(names)
    return [names if r % 2 == 0 else names[::-1] for r in range(rounds)]


def run_rounds(contenders, rounds):
    """Runs [(name, fn)] in round_orders; returns {name: [fn() per round]}."""
    fns = dict(contenders)
    out = {name: [] for name, _ in contenders}
    for order in round_orders([n for n, _ in contenders], rounds):
        for name in order:
            out[name].append(fns[name]())
    return out


def round_ratios(num, den):
    """Each round's num/den (both lists of seconds, round by round)."""
    return [a / b for a, b in zip(num, den) if a is not None and b]


def free_budget(peak, spread=0, band=GUARD_BAND):
    """The budget where nothing must leave: the no-offload plan's predicted
    peak plus the profile's peak spread, over 1 - the guard band the
    planner keeps free (coordinator/planner/planner.cc, MemoryHeadroom)."""
    if peak <= 0:
        raise ValueError(f"need a positive predicted peak, got {peak}")
    return int(math.ceil((peak + max(0, spread)) / (1.0 - band)))


def choose_budgets(free, state_bytes, fractions=BINDING_FRACTIONS):
    """[(label, bytes, binding)]: `free` (nothing must leave), then `free`
    less each fraction of the optimizer-state bytes (memory binds)."""
    if free <= 0 or state_bytes <= 0:
        raise ValueError(f"need a positive budget and state bytes, got {free}, {state_bytes}")
    out = [("fits", int(free), False)]
    for f in fractions:
        out.append((f"-{round(f * 100)}% states", int(free - f * state_bytes), True))
    return out


SUMMARY_NUMBERS = ("iteration_s", "compute_s", "comm_s", "exposed_comm_s", "copy_s",
                   "lower_bound_s")


def parse_summary(text):
    """tandem-plan --summary [--explain]'s figures: {peak_bytes, budget_bytes,
    over_budget, state_bytes_at_peak, iteration_s, ..., least_memory} (the
    last: the planner found no plan for the passes and fell back to its
    least-memory plan, every state offloaded on the baseline)."""
    out = {"least_memory": False}
    for line in text.splitlines():
        key = line.split(None, 1)[0] if line.strip() else ""
        if key in SUMMARY_NUMBERS:
            out[key] = float(line.split()[1])
        elif key == "peak":
            m = re.search(r"\((\d+) B\) of budget .*?\((\d+) B\)", line)
            if m:
                out["peak_bytes"], out["budget_bytes"] = int(m.group(1)), int(m.group(2))
            out["over_budget"] = "OVER BUDGET" in line
        elif key == "peak_at":
            m = re.search(r"optimizer states (\d+)", line)
            if m:
                out["state_bytes_at_peak"] = int(m.group(1))
        if re.match(r"^\d+\s+least-memory\s", line.strip()):
            out["least_memory"] = True
    return out


def schedule_offloads(text):
    """(entries, bytes) of the schedule's OFFLOAD entries (`offload oN pK
    bytes=B` lines of the text form)."""
    entries, total = 0, 0
    for line in text.splitlines():
        m = re.match(r"^offload o\d+ \S+ bytes=(\d+)", line)
        if m:
            entries += 1
            total += int(m.group(1))
    return entries, total


DTYPE_STATE_BYTES = {"f32": 8, "bf16": 12, "f16": 12}


def graph_params(text):
    """(param elements, optimizer-state bytes) of a graph (text form): 8
    state bytes per f32 param element (AdamW's two moments), 12 per bf16 or
    f16 element (with the f32 master)."""
    numel_all, total = 0, 0
    for line in text.splitlines():
        m = re.match(r"^param p\d+ \S+ (\w+)\[([\d,]*)\]", line)
        if m:
            numel = 1
            for d in m.group(2).split(","):
                if d:
                    numel *= int(d)
            numel_all += numel
            total += numel * DTYPE_STATE_BYTES[m.group(1)]
    return numel_all, total


def profile_spread(text):
    """peak - peak_min of a profile (text form), 0 when it says neither."""
    head = text.splitlines()[0] if text else ""
    peak = re.search(r"\bpeak=(\d+)", head)
    low = re.search(r"\bpeak_min=(\d+)", head)
    return int(peak.group(1)) - int(low.group(1)) if peak and low else 0


def numerics_verdict(worker, autocast, f32, k=NUMERICS_K, abs_tol=NUMERICS_ABS):
    """The low-precision check: the worker's losses against the autocast
    reference's, step by step, with the tolerance k * (the largest |f32
    reference - autocast reference| over the steps) + abs_tol."""
    n = min(len(worker), len(autocast), len(f32))
    if n == 0 or len(worker) != len(autocast):
        return dict(steps=n, met=False, why=f"{len(worker)} worker steps against "
                    f"{len(autocast)} reference steps")
    diffs = [abs(a - b) for a, b in zip(worker, autocast)]
    rels = [d / max(abs(b), 1e-12) for d, b in zip(diffs, autocast)]
    effect = max(abs(a - b) for a, b in zip(f32[:n], autocast[:n]))
    tol = k * effect + abs_tol
    finite = all(math.isfinite(x) for x in list(worker) + list(autocast))
    return dict(steps=n, max_abs_diff=max(diffs), max_rel_diff=max(rels),
                worst_step=diffs.index(max(diffs)), precision_effect=effect,
                tolerance=tol, met=finite and max(diffs) <= tol)


def rel_verdict(got, want, rtol):
    """got against want step by step within rtol (relative)."""
    if not got or len(got) != len(want):
        return dict(met=False, max_rel_diff=None)
    diffs = [abs(a - b) for a, b in zip(got, want)]
    rels = [d / max(abs(b), 1e-12) for d, b in zip(diffs, want)]
    return dict(met=max(rels) <= rtol, max_abs_diff=max(diffs), max_rel_diff=max(rels),
                tolerance_rel=rtol)


def gradscaler_scales(skipped, init_scale, growth_factor, backoff_factor,
                      growth_interval):
    """(the scale each step used, the scale after the last step) under
    GradScaler's update() (_amp_update_scale_), given which steps found an
    infinity or a NaN: back off on one and reset the count; grow after
    growth_interval clean steps in a row."""
    scale, tracker, used = float(init_scale), 0, []
    for skip in skipped:
        used.append(scale)
        if skip:
            scale *= backoff_factor
            tracker = 0
        else:
            tracker += 1
            if tracker == growth_interval:
                grown = scale * growth_factor
                scale = grown if math.isfinite(grown) else scale
                tracker = 0
    return used, scale


def tokens_per_s(micro_batch, seq_len, step_s):
    return micro_batch * seq_len / step_s if step_s else None


def global_batch(tokens, step, size, seq_len):
    """Sequences step*size .. step*size+size-1 of a token file as the
    worker's `tokens` source reads it (sequence i starts at token (i *
    seq_len) mod the windows that fit; test_exported_numerics.global_batch)."""
    import torch
    windows = (len(tokens) - 1) // seq_len
    rows = []
    for i in range(step * size, (step + 1) * size):
        first = (i % windows) * seq_len
        rows.append(tokens[first:first + seq_len + 1])
    seqs = torch.stack(rows)
    return {"input_ids": seqs[:, :-1].contiguous(), "labels": seqs[:, 1:].contiguous()}


def to_yaml(value, indent=0):
    """A job spec in block YAML (no PyYAML needed on a GPU machine)."""
    lines = []
    pad = "  " * indent
    for k, v in value.items():
        if isinstance(v, dict):
            lines.append(f"{pad}{k}:")
            lines.append(to_yaml(v, indent + 1))
        else:
            if isinstance(v, bool):
                v = "true" if v else "false"
            lines.append(f"{pad}{k}: {v}")
    return "\n".join(lines)


# -- the bench ------------------------------------------------------------------

class Bench:
    def __init__(self, a, cfg):
        self.a = a
        self.cfg = cfg
        self.dev = a.device
        self.work = tempfile.mkdtemp(prefix="tandem-gpu-bench-")
        self.worker = os.path.join(a.build, "worker", "tandem-worker")
        self.plan = os.path.join(a.build, "coordinator", "tandem-plan")
        self.timeout = cfg["timeout_s"]
        self.env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
        # A build-gpu/ that scripts/gpu-check.sh built against .gpu-deps'
        # libraries runs against them (bench/overhead/overhead.py does too).
        deps = glob.glob(os.path.join(a.build, "deps", "usr", "lib", "*-linux-gnu"))
        if os.environ.get("LD_LIBRARY_PATH"):
            deps.append(os.environ["LD_LIBRARY_PATH"])
        if deps:
            self.env["LD_LIBRARY_PATH"] = os.pathsep.join(deps)
        self.rows = []
        self.run_id = time.strftime("%Y-%m-%dT%H:%M:%S")

    # -- processes --------------------------------------------------------------

    def proc(self, cmd, timeout=None):
        """subprocess.run, retried for two minutes while the binary is being
        replaced (a concurrent build: missing, not yet executable or busy
        for a moment)."""
        for attempt in range(12):
            try:
                return subprocess.run(cmd, cwd=ROOT, env=self.env, capture_output=True,
                                      text=True, timeout=timeout or self.timeout)
            except OSError as e:
                if e.errno not in (errno.ENOENT, errno.EACCES, errno.ETXTBSY) or attempt == 11:
                    raise
                log(f"{os.path.basename(cmd[0])}: {e.strerror}; retrying in 10 s")
                time.sleep(10)

    def checked(self, cmd, what, timeout=None):
        p = self.proc(cmd, timeout)
        if p.returncode != 0:
            raise RunFailed(f"{what}: {os.path.basename(cmd[0])} exited {p.returncode}: "
                            f"{p.stderr.strip()[-1500:]}")
        return p

    def spec(self, name, model, steps, dtype="f32", data=None, train=None, budget=None,
             model_extra=None):
        """A world-1 job spec file: the built-in llama of `model`'s sizes."""
        m = dict(preset="llama", layers=model["layers"], d_model=model["d_model"],
                 heads=model["heads"], kv_heads=model["kv_heads"], ffn=model["ffn"],
                 vocab=model["vocab"])
        if dtype != "f32":
            m["dtype"] = dtype
        m.update(model_extra or {})
        t = dict(steps=steps, lr=1.0e-3, seed=1, grad_clip=1.0)
        t.update(train or {})
        spec = dict(name=name, model=m, data=data or dict(kind="synthetic", seed=1),
                    batch=dict(micro_batch=model["micro_batch"], seq_len=model["seq_len"]),
                    train=t, parallel=dict(world_size=1, zero_stage=3))
        if budget:
            spec["memory"] = dict(budget_bytes=int(budget))
        path = os.path.join(self.work, f"{name}-{len(os.listdir(self.work))}.yaml")
        with open(path, "w") as f:
            f.write(to_yaml(spec) + "\n")
        return path

    def worker_cmd(self, spec, device=None, extra=()):
        return [self.worker, "--standalone", "--spec", spec, "--rank", "0", "--world", "1",
                "--rendezvous", f"127.0.0.1:{free_port()}", "--device", device or self.dev,
                "--threads", "1", "--timeout-s", str(min(self.timeout, 600))] + list(extra)

    def run_worker(self, spec, what, device=None, extra=()):
        """Rank 0's step lines of a standalone run that must succeed, and its
        stderr."""
        p = self.checked(self.worker_cmd(spec, device, extra), what)
        steps = [json.loads(l) for l in p.stdout.splitlines() if l.startswith('{"step"')]
        if not steps:
            raise RunFailed(f"{what}: the worker printed no step lines: {p.stderr[-800:]}")
        return steps, p.stderr

    def emit(self, section, **row):
        row = dict(section=section, device=self.dev, dry=self.a.dry, run=self.run_id, **row)
        self.rows.append(row)
        with open(self.a.out, "a") as f:
            f.write(json.dumps(row) + "\n")
        return row

    # -- offload ----------------------------------------------------------------

    def plan_cmd(self, graph, profile, passes, budget=None, schedule_out=None):
        cmd = [self.plan, "--graph", graph, "--profile", profile, "--passes", passes,
               "--summary", "--explain"]
        if budget:
            # The planner's hardware defaults to 80 GiB; a larger budget
            # needs a larger device.
            cmd += ["--budget", str(int(budget)),
                    "--hw", f"memory={max(int(budget), 80 << 30)}"]
        if schedule_out:
            cmd += ["--schedule-out", schedule_out]
        return cmd

    def plan_at(self, graph, profile, name, budget):
        """{feasible, why, schedule, predicted figures, offloaded} of one
        pass list at one budget."""
        sched = os.path.join(self.work, f"{name}-{budget}.sched")
        p = self.proc(self.plan_cmd(graph, profile, PLANS[name], budget, sched))
        if p.returncode == 2:
            said = [l for l in p.stderr.splitlines() if l.startswith("tandem-plan:")]
            return dict(feasible=False, why=(said[0] if said else "tandem-plan exited 2")[:400])
        if p.returncode != 0:
            raise RunFailed(f"tandem-plan --passes {PLANS[name]} --budget {budget} exited "
                            f"{p.returncode}: {p.stderr.strip()[-800:]}")
        s = parse_summary(p.stdout)
        with open(sched) as f:
            entries, moved = schedule_offloads(f.read())
        out = dict(feasible=True, schedule=sched, predicted_step_s=s.get("iteration_s"),
                   predicted_peak_bytes=s.get("peak_bytes"), offload_entries=entries,
                   offloaded_bytes=moved)
        if s["least_memory"]:
            out.update(feasible=False, why="no plan of these passes fits: the planner "
                       "fell back to its least-memory plan (every state offloaded)")
        elif name == "no-offload" and entries:
            out.update(feasible=False, why=f"the no-offload plan offloads {entries} entries")
        elif s.get("over_budget"):
            out.update(feasible=False, why="predicted over budget")
        return out

    def offload_run(self, spec, sched, steps_warm):
        steps, _ = self.run_worker(spec, "offload run", extra=["--schedule", sched])
        measured = steps[steps_warm:]
        planned = [r for r in measured if r.get("schedule_version", 0) >= 0]
        guard = len(planned) < len(measured)
        use = planned or measured
        return dict(step_s=statistics.median(r["iteration_s"] for r in use),
                    peak_bytes=max(r["peak_bytes"] for r in measured),
                    memory_hold_s=statistics.median(r.get("memory_hold_s", 0) for r in use),
                    exposed_comm_s=statistics.median(r["exposed_comm_s"] for r in use),
                    guard_tripped=guard, steps=len(use))

    def section_offload(self):
        c = self.cfg["offload"]
        m, warm = c["model"], c["warmup"]
        p = self.checked([self.plan, "--list_passes"], "tandem-plan --list_passes")
        listed = set(re.findall(r"^  (\S+)$", p.stdout, re.M))
        missing = sorted({x for v in PLANS.values() for x in v.split(",")} - listed)
        if missing:
            raise RunFailed(f"{self.plan} has no pass {', '.join(missing)}: rebuild "
                            "coordinator/tandem-plan")
        graph = os.path.join(self.work, "offload.graph")
        profile = os.path.join(self.work, "offload.profile")
        log(f"offload: profiling {c['profile_steps']} steps under the default schedule")
        self.run_worker(self.spec("offload", m, c["profile_steps"]), "offload profile run",
                        extra=["--graph-out", graph, "--profile-out", profile])
        with open(graph) as f:
            numel, states = graph_params(f.read())
        with open(profile) as f:
            spread = profile_spread(f.read())
        p = self.checked(self.plan_cmd(graph, profile, PLANS["no-offload"]),
                         "tandem-plan (no budget)")
        free = parse_summary(p.stdout)
        # The budget where nothing must leave must hold the no-offload plan:
        # widen it by 1% until the planner keeps it (its headroom rounds), at
        # most 5 times.
        b0 = free_budget(free["peak_bytes"], spread)
        for _ in range(5):
            if self.plan_at(graph, profile, "no-offload", b0)["feasible"]:
                break
            b0 = int(b0 * 1.01)
        budgets = choose_budgets(b0, states)
        self.emit("offload", kind="setup", model=m, params=numel,
                  state_bytes=states, state_bytes_at_peak=free.get("state_bytes_at_peak"),
                  predicted_peak_bytes=free["peak_bytes"], profile_peak_spread=spread,
                  guard_band=GUARD_BAND, budgets=[b for _, b, _ in budgets],
                  warmup=warm, steps=c["steps"], rounds=self.a.rounds)
        steps_total = warm + c["steps"]
        for label, budget, binding in budgets:
            plans = {n: self.plan_at(graph, profile, n, budget) for n in PLANS}
            spec = self.spec("offload", m, steps_total, budget=budget)
            fit = [n for n in PLANS if plans[n]["feasible"]]
            log(f"offload: budget {budget} B ({label}): {', '.join(fit) or 'no plan fits'}, "
                f"{self.a.rounds} rounds")
            res = run_rounds([(n, (lambda n=n: self.offload_run(spec, plans[n]["schedule"],
                                                               warm))) for n in fit],
                             self.a.rounds)
            step = {}
            for n in PLANS:
                pl = plans[n]
                row = dict(kind="plan", budget_label=label, budget_bytes=budget,
                           binding=binding, contender=n, passes=PLANS[n],
                           feasible=pl["feasible"])
                if not pl["feasible"]:
                    self.emit("offload", **row, why=pl["why"])
                    continue
                runs = res[n]
                med, lo, hi = median_spread([r["step_s"] for r in runs])
                step[n] = [r["step_s"] for r in runs]
                peak = max(r["peak_bytes"] for r in runs)
                self.emit("offload", **row, step_s=med, step_min_s=lo, step_max_s=hi,
                          round_step_s=step[n], peak_bytes=peak,
                          peak_over_budget=peak > budget,
                          guard_tripped=any(r["guard_tripped"] for r in runs),
                          memory_hold_s=statistics.median(r["memory_hold_s"] for r in runs),
                          exposed_comm_s=statistics.median(r["exposed_comm_s"] for r in runs),
                          predicted_step_s=pl["predicted_step_s"],
                          predicted_peak_bytes=pl["predicted_peak_bytes"],
                          offload_entries=pl["offload_entries"],
                          offloaded_bytes=pl["offloaded_bytes"], rounds=len(runs))
            ratio = dict(kind="ratio", budget_label=label, budget_bytes=budget,
                         binding=binding, target=OFFLOAD_TARGET if binding else None)
            if "offload-all" in step and "adaptive" in step:
                rs = round_ratios(step["offload-all"], step["adaptive"])
                med, lo, hi = median_spread(rs)
                ratio.update(ratio=med, ratio_min=lo, ratio_max=hi, round_ratios=rs,
                             target_met=(med >= OFFLOAD_TARGET) if binding else None)
            else:
                ratio.update(ratio=None, target_met=None if not binding else False,
                             why="needs both offload-all and adaptive to fit: "
                             + ", ".join(f"{n} does not" for n in ("offload-all", "adaptive")
                                         if n not in step))
            self.emit("offload", **ratio)

    # -- numerics ---------------------------------------------------------------

    def reference(self, model, init, tokens, dtype, steps):
        """PyTorch eager on hf_models' Llama: AdamW, clip_grad_norm_, under
        autocast at `dtype` (f32: none; f16: and GradScaler). Returns
        {losses, scales (f16), skipped, final_scale}."""
        import torch
        hf = self.hf
        dev = torch.device(self.dev)
        net = hf.CausalLM(hf.Config(layers=model["layers"], d_model=model["d_model"],
                                    heads=model["heads"], kv_heads=model["kv_heads"],
                                    ffn=model["ffn"], vocab=model["vocab"]))
        net.load_state_dict(init)
        net.to(dev)
        params = [p for p in net.parameters()]
        opt = torch.optim.AdamW(params, lr=LR, betas=BETAS, eps=EPS, weight_decay=WD)
        low = {"bf16": torch.bfloat16, "f16": torch.float16}.get(dtype)
        scaler = None
        if dtype == "f16":
            if hasattr(torch, "amp") and hasattr(torch.amp, "GradScaler"):
                scaler = torch.amp.GradScaler("cuda", **SCALER)
            else:
                scaler = torch.cuda.amp.GradScaler(**SCALER)
        size = model["micro_batch"]  # world 1: the global batch is one rank's
        out = dict(losses=[], scales=[], skipped=[])
        for step in range(steps):
            batch = hf.rank_slice(global_batch(tokens, step, size, model["seq_len"]),
                                  1, 1, 0, 0)
            batch = {k: v.to(dev) for k, v in batch.items()}
            opt.zero_grad(set_to_none=True)
            if low is None:
                loss = net(**batch)
            else:
                with torch.autocast(device_type=dev.type, dtype=low):
                    loss = net(**batch)
            if scaler is None:
                loss.backward()
                torch.nn.utils.clip_grad_norm_(params, CLIP)
                opt.step()
            else:
                scale = scaler.get_scale()
                scaler.scale(loss).backward()
                scaler.unscale_(opt)
                torch.nn.utils.clip_grad_norm_(params, CLIP)
                scaler.step(opt)
                scaler.update()
                out["scales"].append(scale)
                # A skipped step backs the scale off (backoff_factor < 1).
                out["skipped"].append(scaler.get_scale() < scale)
            out["losses"].append(loss.float().item())
        if scaler is not None:
            out["final_scale"] = scaler.get_scale()
        return out

    def section_numerics(self):
        import torch
        c = self.cfg["numerics"]
        m, steps = c["model"], c["steps"]
        self.hf = load(os.path.join(ROOT, "tests", "reference", "hf_models.py"), "hf_models")
        hf = self.hf
        # One initial set of weights under Hugging Face names, one token file.
        net = hf.CausalLM(hf.Config(layers=m["layers"], d_model=m["d_model"],
                                    heads=m["heads"], kv_heads=m["kv_heads"], ffn=m["ffn"],
                                    vocab=m["vocab"]))
        init = hf.draw_init(net, INIT_SEED)
        init_path = os.path.join(self.work, "init.safetensors")
        hf.write_safetensors(init, init_path)
        count = steps * m["micro_batch"] * m["seq_len"] + 1
        g = torch.Generator().manual_seed(7)
        tokens = torch.randint(0, m["vocab"], (count,), generator=g)
        tokens_path = os.path.join(self.work, "tokens.bin")
        with open(tokens_path, "wb") as f:
            f.write(struct.pack(f"<{count}H", *tokens.tolist()))
        data = dict(kind="tokens", path=tokens_path, token_bytes=2)

        def worker_spec(dtype):
            train = dict(lr=LR, beta1=BETAS[0], beta2=BETAS[1], eps=EPS, weight_decay=WD,
                         grad_clip=CLIP)
            if dtype == "f16":
                train["loss_scale"] = dict(mode="dynamic", **SCALER)
            return self.spec(f"numerics-{dtype}", m, steps, dtype=dtype, data=data,
                             train=train, model_extra=dict(init_from=init_path))

        def worker(dtype):
            rows, err = self.run_worker(worker_spec(dtype), f"worker at {dtype}")
            return dict(losses=[r["loss"] for r in rows],
                        scales=[r.get("loss_scale") for r in rows],
                        skipped=[bool(r.get("skipped")) for r in rows],
                        device_line=err.strip().splitlines()[0] if err.strip() else "")

        # A CPU rank refuses f16, checked on every machine with the spec the
        # f16 run uses on CUDA (its loss_scale keys, init_from and token
        # file): anything else wrong in it would fail with another message.
        log("numerics: a CPU rank must refuse model.dtype f16")
        p = self.proc(self.worker_cmd(worker_spec("f16"), device="cpu"))
        refused = p.returncode != 0 and F16_REFUSAL in p.stderr
        msg = (p.stderr.strip().splitlines() or [""])[-1][:400]
        self.emit("numerics", kind="refusal", dtype="f16", worker_device="cpu",
                  returncode=p.returncode, refused=refused, expected=F16_REFUSAL, stderr=msg)
        if not refused:
            raise RunFailed(f"a CPU rank did not refuse model.dtype f16 with "
                            f"'{F16_REFUSAL}' (exit {p.returncode}): {msg}")

        log(f"numerics: f32, {steps} steps, worker and eager")
        w32 = worker("f32")
        r32 = self.reference(m, init, tokens, "f32", steps)
        v32 = rel_verdict(w32["losses"], r32["losses"], F32_RTOL)
        self.emit("numerics", kind="losses", dtype="f32", side="tandem",
                  losses=w32["losses"], worker_device=w32["device_line"])
        self.emit("numerics", kind="losses", dtype="f32", side="eager", losses=r32["losses"])
        self.emit("numerics", kind="comparison", dtype="f32", steps=steps, model=m,
                  rule=f"|tandem - eager| <= {F32_RTOL:g} relative at every step", **v32)
        for dtype in c["dtypes"]:
            log(f"numerics: {dtype}, {steps} steps, worker and eager under autocast")
            w = worker(dtype)
            r = self.reference(m, init, tokens, dtype, steps)
            side = dict(scales=w["scales"], skipped=w["skipped"]) if dtype == "f16" else {}
            self.emit("numerics", kind="losses", dtype=dtype, side="tandem",
                      losses=w["losses"], worker_device=w["device_line"], **side)
            rside = dict(scales=r["scales"], skipped=r["skipped"]) if dtype == "f16" else {}
            self.emit("numerics", kind="losses", dtype=dtype, side="eager-autocast",
                      losses=r["losses"], **rside)
            v = numerics_verdict(w["losses"], r["losses"], r32["losses"])
            extra = {}
            if dtype == "f16":
                # The worker's scales against GradScaler's rule applied to
                # its own skipped steps (and its scale after the last step).
                rule, final = gradscaler_scales(w["skipped"], **SCALER)
                extra = dict(tandem_skipped=sum(w["skipped"]), eager_skipped=sum(r["skipped"]),
                             tandem_scales_follow_gradscaler=rule == w["scales"],
                             tandem_final_scale=final,
                             tandem_last_scale=w["scales"][-1] if w["scales"] else None,
                             eager_last_scale=r["scales"][-1] if r["scales"] else None,
                             eager_final_scale=r.get("final_scale"), scaler=SCALER)
            self.emit("numerics", kind="comparison", dtype=dtype, model=m,
                      rule=(f"|tandem - autocast| <= {NUMERICS_K:g} x max|f32 - autocast| "
                            f"+ {NUMERICS_ABS:g} at every step (Tandem: pure {dtype} params "
                            f"with f32 masters, not autocast)"),
                      **v, **extra)

    # -- throughput -------------------------------------------------------------

    def section_throughput(self):
        c = self.cfg["throughput"]
        name, warm, steps = c["builtin"], c["warmup"], c["steps"]
        eager_py = os.path.join(ROOT, "bench", "overhead", "eager.py")
        m = load(eager_py, "overhead_eager").BUILTIN[name]
        spec = self.spec(f"throughput-{name}", m, warm + steps,
                         train=dict(lr=1.0e-3, beta1=0.9, beta2=0.95, eps=1e-8,
                                    weight_decay=0.0, grad_clip=1.0))

        def tandem():
            rows, _ = self.run_worker(spec, f"worker on {name}")
            return statistics.median(r["iteration_s"] for r in rows[warm:])

        def eager():
            p = self.checked([sys.executable, eager_py, "--builtin", name, "--steps",
                              str(steps), "--warmup", str(warm), "--device", self.dev],
                             f"eager.py on {name}")
            rows = [json.loads(l) for l in p.stdout.splitlines() if l.startswith('{"step"')]
            if not rows:
                raise RunFailed(f"eager.py printed no step lines: {p.stderr[-800:]}")
            return statistics.median(r["step_s"] for r in rows)

        log(f"throughput: {name}, {self.a.rounds} rounds")
        res = run_rounds([("tandem", tandem), ("eager", eager)], self.a.rounds)
        tok = m["micro_batch"] * m["seq_len"]
        for side in ("tandem", "eager"):
            med, lo, hi = median_spread(res[side])
            self.emit("throughput", kind="contender", model=name, sizes=m, contender=side,
                      step_s=med, step_min_s=lo, step_max_s=hi, round_step_s=res[side],
                      tokens_per_step=tok, tokens_per_s=tokens_per_s(
                          m["micro_batch"], m["seq_len"], med),
                      warmup=warm, steps=steps, rounds=len(res[side]))
        # tokens/s Tandem over eager, round by round: eager's step / Tandem's.
        rs = round_ratios(res["eager"], res["tandem"])
        med, lo, hi = median_spread(rs)
        self.emit("throughput", kind="ratio", model=name, ratio=med, ratio_min=lo,
                  ratio_max=hi, round_ratios=rs,
                  tandem_tokens_per_s=tokens_per_s(m["micro_batch"], m["seq_len"],
                                                   median_spread(res["tandem"])[0]),
                  eager_tokens_per_s=tokens_per_s(m["micro_batch"], m["seq_len"],
                                                  median_spread(res["eager"])[0]))


# -- tables ---------------------------------------------------------------------

def fmt(v, f="{:.4f}"):
    return "—" if v is None else f.format(v)


def mib(b):
    return "—" if b is None else f"{b / 2**20:.2f}"


def yes_no(v):
    return "n/a" if v is None else ("yes" if v else "no")


def report(rows, out=sys.stdout):
    def p(s=""):
        print(s, file=out)
    off = [r for r in rows if r["section"] == "offload"]
    if off:
        setup = next((r for r in off if r["kind"] == "setup"), None)
        p("## offload (world 1)")
        if setup:
            p(f"model {setup['model']}; optimizer states {mib(setup['state_bytes'])} MiB; "
              f"no-offload plan's predicted peak {mib(setup['predicted_peak_bytes'])} MiB; "
              f"{setup['warmup']} warm-up + {setup['steps']} measured steps, "
              f"{setup['rounds']} rounds")
        p()
        p("| budget MiB | binding | plan | step s, median (min–max) | peak MiB | "
          "peak ≤ budget | offloaded MiB | predicted s | guard |")
        p("|---:|---|---|---|---:|---|---:|---:|---|")
        for r in off:
            if r["kind"] != "plan":
                continue
            head = f"| {mib(r['budget_bytes'])} ({r['budget_label']}) | {yes_no(r['binding'])} "
            if not r["feasible"]:
                p(head + f"| {r['contender']} | infeasible: {r['why']} | | | | | |")
                continue
            p(head + f"| {r['contender']} | {fmt(r['step_s'])} ({fmt(r['step_min_s'])}–"
              f"{fmt(r['step_max_s'])}) | {mib(r['peak_bytes'])} | "
              f"{yes_no(not r['peak_over_budget'])} | {mib(r['offloaded_bytes'])} | "
              f"{fmt(r['predicted_step_s'])} | {'tripped' if r['guard_tripped'] else '—'} |")
        p()
        p(f"| budget MiB | offload-all / adaptive, median (min–max) | target ≥ "
          f"{OFFLOAD_TARGET:g} met |")
        p("|---:|---|---|")
        for r in off:
            if r["kind"] != "ratio":
                continue
            ratio = (f"{fmt(r['ratio'], '{:.3f}')} ({fmt(r['ratio_min'], '{:.3f}')}–"
                     f"{fmt(r['ratio_max'], '{:.3f}')})" if r.get("ratio") is not None
                     else r.get("why", "—"))
            p(f"| {mib(r['budget_bytes'])} ({r['budget_label']}) | {ratio} | "
              f"{yes_no(r['target_met']) if r['binding'] else 'n/a (nothing must leave)'} |")
        p()
    num = [r for r in rows if r["section"] == "numerics"]
    if num:
        p("## numerics (Tandem against PyTorch eager, hf_models' Llama)")
        for r in num:
            if r["kind"] == "refusal":
                p(f"- f16 on a CPU rank: {'refused' if r['refused'] else 'NOT refused'} "
                  f"(exit {r['returncode']}): {r['stderr']}")
        p()
        losses = {(r["dtype"], r["side"]): r["losses"] for r in num if r["kind"] == "losses"}
        cols = [k for k in (("f32", "tandem"), ("f32", "eager"), ("bf16", "tandem"),
                            ("bf16", "eager-autocast"), ("f16", "tandem"),
                            ("f16", "eager-autocast")) if k in losses]
        if cols:
            p("| step | " + " | ".join(f"{d} {s}" for d, s in cols) + " |")
            p("|---:|" + "---:|" * len(cols))
            for i in range(max(len(losses[k]) for k in cols)):
                p(f"| {i} | " + " | ".join(fmt(losses[k][i], "{:.5f}") if i < len(losses[k])
                                           else "—" for k in cols) + " |")
            p()
        p("| dtype | max abs diff | max rel diff | f32-vs-autocast effect | tolerance | "
          "met | skipped (Tandem / eager) | final scale (Tandem / eager) |")
        p("|---|---:|---:|---:|---:|---|---|---|")
        for r in num:
            if r["kind"] != "comparison":
                continue
            skip = (f"{r['tandem_skipped']} / {r['eager_skipped']}"
                    if "tandem_skipped" in r else "—")
            scale = (f"{r['tandem_final_scale']:g} / {r['eager_final_scale']:g}"
                     if "tandem_final_scale" in r else "—")
            tol = (f"{r['tolerance_rel']:g} rel" if "tolerance_rel" in r
                   else fmt(r.get("tolerance"), "{:.2e}"))
            p(f"| {r['dtype']} | {fmt(r.get('max_abs_diff'), '{:.2e}')} | "
              f"{fmt(r.get('max_rel_diff'), '{:.2e}')} | "
              f"{fmt(r.get('precision_effect'), '{:.2e}')} | {tol} | {yes_no(r['met'])} | "
              f"{skip} | {scale} |")
        for r in num:
            if r["kind"] == "comparison":
                p(f"- {r['dtype']}: {r['rule']}")
        p()
    thr = [r for r in rows if r["section"] == "throughput"]
    if thr:
        p("## throughput (world 1, default schedule, against PyTorch eager)")
        p("| model | contender | step s, median (min–max) | tokens/s |")
        p("|---|---|---|---:|")
        for r in thr:
            if r["kind"] == "contender":
                p(f"| {r['model']} | {r['contender']} | {fmt(r['step_s'])} "
                  f"({fmt(r['step_min_s'])}–{fmt(r['step_max_s'])}) | "
                  f"{fmt(r['tokens_per_s'], '{:.0f}')} |")
        for r in thr:
            if r["kind"] == "ratio":
                p(f"\nTandem tokens/s over eager's: {fmt(r['ratio'], '{:.3f}')} "
                  f"({fmt(r['ratio_min'], '{:.3f}')}–{fmt(r['ratio_max'], '{:.3f}')} over "
                  f"{len(r['round_ratios'])} rounds)")
        p()
    for r in rows:
        if r["section"] == "error":
            last = (r["error"].strip().splitlines() or [""])[-1]
            p(f"FAILED {r['failed_section']}: {last[:600]}")


def default_build():
    gpu = os.path.join(ROOT, "build-gpu")
    return gpu if os.path.isdir(gpu) else os.path.join(ROOT, "build")


def resolve_build(path):
    if os.path.isabs(path):
        return path
    return os.path.abspath(path) if os.path.isdir(path) else os.path.join(ROOT, path)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default=None,
                    help="build directory (default: build-gpu if it exists, else build)")
    ap.add_argument("--device", choices=("cuda", "cpu"), default=None,
                    help="default: cuda if torch sees a GPU, else cpu")
    ap.add_argument("--dry", action="store_true",
                    help="small sizes, few steps, 2 rounds, on the CPU (CI)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default=os.path.join(tempfile.gettempdir(),
                                                  "tandem-gpu-bench.jsonl"))
    ap.add_argument("--only", default=",".join(SECTIONS),
                    help="comma-separated sections: " + ", ".join(SECTIONS))
    a = ap.parse_args(argv)
    only = [s for s in a.only.split(",") if s]
    bad = [s for s in only if s not in SECTIONS]
    if bad or not only:
        ap.error(f"--only: unknown section(s) {', '.join(bad) or '(none)'}; "
                 f"use {', '.join(SECTIONS)}")
    if a.rounds < 1:
        ap.error("--rounds must be at least 1")
    try:
        import torch
    except ImportError:
        sys.exit(f"gpu_bench: {sys.executable} cannot import torch; run it with the "
                 "Python that has PyTorch")
    cuda = torch.cuda.is_available()
    if a.dry:
        if a.device == "cuda":
            log("--dry runs on the CPU: --device cuda ignored")
        a.device, a.rounds, cfg = "cpu", CONFIGS["dry"]["rounds"], CONFIGS["dry"]
    else:
        a.device = a.device or ("cuda" if cuda else "cpu")
        if not cuda:
            print("no GPU: run with --dry")
            return 0
        if a.device != "cuda":
            print("the full sizes are for a GPU: use --device cuda, or --dry on the CPU")
            return 0
        cfg = CONFIGS["cuda"]
    a.build = resolve_build(a.build) if a.build else default_build()
    b = Bench(a, cfg)
    need = [b.worker] + ([b.plan] if "offload" in only else [])
    for path in need:
        if not os.path.exists(path):
            print(f"gpu_bench: no {path}: build it first", file=sys.stderr)
            return 1
    log(f"device {a.device}{' (dry)' if a.dry else ''}, build {a.build}, rounds {a.rounds}, "
        f"sections {', '.join(only)}; rows to {a.out}")
    failed = []
    start = time.monotonic()
    for section in SECTIONS:
        if section not in only:
            continue
        t0 = time.monotonic()
        try:
            getattr(b, f"section_{section}")()
        except Exception as e:  # noqa: BLE001 - one section's failure is reported,
            # and the others still run (a GPU machine's time is short).
            failed.append(section)
            what = (str(e) if isinstance(e, (RunFailed, OSError, subprocess.TimeoutExpired))
                    else traceback.format_exc())
            log(f"{section} FAILED: {what}")
            b.emit("error", failed_section=section, error=what[-2000:])
        b.emit("timing", kind="section", name=section, wall_s=time.monotonic() - t0)
    b.emit("timing", kind="total", wall_s=time.monotonic() - start, failed=failed)
    report(b.rows)
    if failed:
        log(f"the failed runs' specs, schedules and profiles are in {b.work}")
    else:
        shutil.rmtree(b.work, ignore_errors=True)
    print(f"{len(b.rows)} rows appended to {a.out}; {time.monotonic() - start:.0f} s"
          + (f"; FAILED: {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
