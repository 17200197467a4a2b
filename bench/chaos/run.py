#!/usr/bin/python3
"""Chaos, measured (issue 16 item 3).

Runs JOBS small jobs (the built-in llama, 2 ranks each, `tandem launch` per
job, restart.max_restarts and a small checkpoint.every) on one coordinator
with a SQLite database, and SIGKILLs the coordinator (then starts it again
on the same database and port) and workers at seeded random moments aimed at
every phase of a job:

  registration  before every rank registered (the job PENDING, one rank in)
  warm-up       training on the baseline, before the first profile window
  planning      a profile window just completed, its plan not yet recorded
                (the first plan; once a job has one, a re-plan asked for
                with Reoptimize and the kill right after the call returns)
  push          a schedule version recorded but not yet active on every rank
                (the first plan's, or one asked for with Reoptimize)
  checkpoint    the step that takes a checkpoint (a multiple of
                checkpoint.every), its file being written in the background

Every kill is classified afterwards from what was observed at the kill and
the coordinator's event times ("hit": the phase it landed in is the one it
was aimed at). It measures:

- jobs completed and jobs lost: a job is lost when it did not end
  SUCCEEDED, or when any step's loss on any rank (recomputed steps included;
  the final step must be there) differs from an uninterrupted reference run
  of the same spec, done first on the same coordinator;
- events lost: every event a `get` showed is checked, by (seq, time, kind,
  message), against what the coordinator serves after each restart and at
  the end, and the end's events against a `watch` replay;
- schedules lost: every schedule version seen (events and the job's active
  version) must still be retrievable, and equal, after each restart and at
  the end;
- time to recover, per kill kind and phase: a coordinator kill, from the
  SIGKILL until every job it hit has every rank connected again and its
  step past the one at the kill (or is RUNNING, for one that was still
  registering); a worker kill, from the SIGKILL until the job resumed
  ("resumed at step" event: RUNNING again and rank 0 stepped), or, for a
  kill during registration, until every rank (none of them the dead
  process) steps.

    bench/chaos/run.py [--jobs 6] [--kills 10] [--seed 16] [--steps 120]
                       [--every 5] [--parallel 2] [--out results.jsonl]
                       [--plan 0:coordinator@push,1:worker@checkpoint]

Exit status 0 when nothing was lost and every job completed, 1 otherwise.
tests/integration/test_chaos.py runs a short version of it; bench/README.md
("chaos") has results and the defects found.
"""

import argparse
import datetime
import json
import os
import pathlib
import platform
import random
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

REPO = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "client" / "python"))

import grpc  # noqa: E402
import yaml  # noqa: E402

import tandem  # noqa: E402
from tandem.errors import TandemError  # noqa: E402
from tandem.v1 import job_pb2  # noqa: E402

# The coordinator process helper the Python suites share.
sys.path.insert(0, str(REPO / "tests" / "harness"))
import tandem_harness  # noqa: E402

PENDING = job_pb2.JOB_STATE_PENDING
RUNNING = job_pb2.JOB_STATE_RUNNING
SUCCEEDED = job_pb2.JOB_STATE_SUCCEEDED
TERMINAL = (job_pb2.JOB_STATE_SUCCEEDED, job_pb2.JOB_STATE_FAILED,
            job_pb2.JOB_STATE_CANCELLED)

PHASES = ("registration", "warm-up", "planning", "push", "checkpoint")
KINDS = ("coordinator", "worker")
WORLD = 2
# A job that has not changed state, step or restarts for this long at the
# end is taken as hung (workers wait 60 s for the coordinator to confirm the
# end, then the heartbeat timeout restarts the job).
STUCK_S = 150
# How long a kill's recovery is waited for before the job counts as broken.
RECOVER_S = 90
WARMUP = 4
SCHEDULE_RE = re.compile(r"^v(\d+) ")
ACTIVE_RE = re.compile(r"^v(\d+) active ")


def log(msg):
    print("[%s] %s" % (time.strftime("%H:%M:%S"), msg), flush=True)


def build_dir(explicit=None):
    b = explicit or os.environ.get("TANDEM_BUILD_DIR") or str(REPO / "build")
    p = pathlib.Path(b)
    return p if p.is_absolute() else (REPO / p)


# --------------------------------------------------------------- processes

class Coordinator(tandem_harness.Coordinator):
    """tandem-coordinator on a fixed database (the client tests' process
    helper); start() again after kill() reuses the port."""

    def __init__(self, binary, workdir, heartbeat_timeout_s=15):
        super().__init__(binary, workdir, heartbeat_timeout_s)

    def start(self, timeout=30):
        """Starts it (on the previous port after the first time); returns
        the time.time() it said it was listening."""
        super().start(port=self.port or 0, timeout=timeout)
        return time.time()


def worker_pids(job_id):
    """{rank: pid} of the tandem-worker processes of a job (from /proc)."""
    pids = {}
    for pid, args in tandem_harness.worker_processes(job_id):
        if b"--rank" in args:
            try:
                pids[int(args[args.index(b"--rank") + 1])] = pid
            except (ValueError, IndexError):
                continue
    return pids


def step_losses(path):
    """[(step, loss)] of every step line of a rank's stdout, relaunches
    included, in order; lines cut short by a SIGKILL are skipped."""
    rows = []
    try:
        text = pathlib.Path(path).read_text()
    except OSError:
        return rows
    for line in text.splitlines():
        try:
            d = json.loads(line)
        except ValueError:
            continue
        if isinstance(d, dict) and "step" in d and "loss" in d and \
                "iteration_s" in d:
            rows.append((d["step"], d["loss"]))
    return rows


class Job:
    """One job under `tandem launch`."""

    def __init__(self, chaos, index, name, budget):
        self.chaos = chaos
        self.index = index
        self.name = name
        self.dir = chaos.workdir / name
        self.dir.mkdir(parents=True, exist_ok=True)
        self.logs = self.dir / "logs"
        self.spec_path = self.dir / "job.yaml"
        spec = {
            "name": name,
            "model": {"preset": "llama", "layers": 2, "d_model": 64,
                      "heads": 4, "ffn": 128, "vocab": 256},
            "batch": {"micro_batch": 2, "seq_len": 32},
            "parallel": {"world_size": WORLD},
            "train": {"steps": chaos.steps},
            "optimize": {"warmup_steps": WARMUP, "drift_threshold": 0.5},
            # A budget of its own (over 5% from every other job's) so that
            # no job starts on another's cached plan: each warms up and
            # plans (coordinator/README.md, "Plan cache").
            "memory": {"budget_bytes": budget},
            "checkpoint": {"dir": str(self.dir / "ckpt"),
                           "every": chaos.every},
            "restart": {"max_restarts": chaos.max_restarts},
        }
        self.spec_path.write_text(yaml.safe_dump(spec))
        self.id = None
        self.proc = None
        self.kills = []

    def start(self):
        env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1",
                   TANDEM_WORKER=str(self.chaos.slow_worker),
                   PYTHONPATH=str(REPO / "client" / "python"))
        self.out_path = self.dir / "launch.out"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tandem", "--coordinator",
             self.chaos.coord.address, "launch", "--nproc", str(WORLD),
             "--threads", "1", "--log-dir", str(self.logs),
             str(self.spec_path)],
            cwd=str(self.dir), env=env, stdout=open(self.out_path, "w"),
            stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            text = self.out_path.read_text()
            if "submitted job " in text:
                self.id = text.split("submitted job ", 1)[1].split(";", 1)[0]
                return self.id
            if self.proc.poll() is not None:
                break
            time.sleep(0.02)
        raise RuntimeError("tandem launch of %s did not submit: %s" %
                           (self.name, self.out_path.read_text()))

    def running(self):
        return self.proc is not None and self.proc.poll() is None

    def losses(self, rank):
        return step_losses(self.logs / ("rank%d.out" % rank))


# ------------------------------------------------------------------ ledger

def retrying(fn, timeout=20.0):
    """fn(), again while the coordinator is unreachable (a restart)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return fn()
        except TandemError as e:
            if e.code not in (grpc.StatusCode.UNAVAILABLE,
                              grpc.StatusCode.DEADLINE_EXCEEDED) or \
                    time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def client_for(address):
    """A Client whose channel retries a restarted coordinator within
    0.1-0.2 s (gRPC's default backoff starts at 1 s and grows), so that
    what is measured is the coordinator's recovery, not this client's.
    (grpc.min_reconnect_backoff_ms is the connect timeout, not a backoff:
    left at its 20 s default.)"""
    channel = grpc.insecure_channel(address, options=[
        ("grpc.initial_reconnect_backoff_ms", 100),
        ("grpc.max_reconnect_backoff_ms", 200)])
    return tandem.Client(address, timeout=5, channel=channel), channel


class Ledger:
    """Everything the coordinator has shown: events by (job, seq) and
    schedule versions (with their content once fetched)."""

    def __init__(self):
        self.lock = threading.Lock()
        self.events = {}     # job -> {seq: (time, kind, message)}
        self.schedules = {}  # job -> {version: Schedule or None}
        self.changed = []    # what the coordinator showed two ways
        self.last = {}       # job -> the latest JobStatus

    def observe(self, job_id, status):
        with self.lock:
            self.last[job_id] = status
            evs = self.events.setdefault(job_id, {})
            vers = self.schedules.setdefault(job_id, {})
            for e in status.events:
                got = (e.time_unix_s, e.kind, e.message)
                old = evs.get(e.seq)
                if old is not None and old != got:
                    self.changed.append((job_id, e.seq, old, got))
                evs[e.seq] = got
                if e.kind == "schedule":
                    m = SCHEDULE_RE.match(e.message)
                    if m:
                        vers.setdefault(int(m.group(1)), None)
            # v0 (the baseline) exists once rank 0 sent the graph; it counts
            # once fetched (fetch_schedules tries it).
            if status.job.schedule_version > 0:
                vers.setdefault(status.job.schedule_version, None)

    def fetch_schedules(self, client):
        """Fetches the content of every version seen but not fetched."""
        with self.lock:
            todo = [(j, v) for j, vs in self.schedules.items()
                    for v, s in vs.items() if s is None]
            todo += [(j, 0) for j, vs in self.schedules.items()
                     if 0 not in vs]
        for j, v in todo:
            try:
                s = client.schedule(j, v).schedule
            except TandemError:
                continue
            with self.lock:
                if self.schedules[j].get(v) is None:
                    self.schedules[j][v] = s
        return todo

    def verify(self, client):
        """Checks everything seen against what the coordinator serves now.
        Returns (events checked, events lost, schedules checked, schedules
        lost), the lost ones as descriptions."""
        call = retrying
        with self.lock:
            events = {j: dict(e) for j, e in self.events.items()}
            schedules = {j: dict(s) for j, s in self.schedules.items()}
        ev_lost, sc_lost = [], []
        n_ev = n_sc = 0
        for j, seen in events.items():
            now = {e.seq: (e.time_unix_s, e.kind, e.message)
                   for e in call(lambda: client.get(j)).events}
            for seq, got in seen.items():
                n_ev += 1
                if now.get(seq) != got:
                    ev_lost.append({"job": j, "seq": seq, "seen": got,
                                    "now": now.get(seq)})
        for j, seen in schedules.items():
            for v, sched in seen.items():
                n_sc += 1
                try:
                    now = call(lambda: client.schedule(j, v)).schedule
                except TandemError as e:
                    sc_lost.append({"job": j, "version": v,
                                    "error": e.message})
                    continue
                if sched is not None and now != sched:
                    sc_lost.append({"job": j, "version": v,
                                    "error": "content changed"})
        return n_ev, ev_lost, n_sc, sc_lost


# ------------------------------------------------------------------- chaos

def plan_kills(rng, n_jobs, n_kills, phases=PHASES):
    """[(job index, kind, phase)]: the kinds and phases covered evenly (each
    (kind, phase) pair before any twice, every phase before a second of its
    kind), spread over the jobs with at most one kill per phase and job
    where possible."""
    combos = []
    allowed = phases
    while len(combos) < n_kills:
        phases = list(allowed)
        rng.shuffle(phases)
        first = rng.choice(KINDS)
        second = KINDS[1 - KINDS.index(first)]
        rnd = [(first if i % 2 == 0 else second, p)
               for i, p in enumerate(phases)]
        rnd += [(second if i % 2 == 0 else first, p)
                for i, p in enumerate(phases)]
        combos += rnd
    combos = combos[:n_kills]
    per_job = [[] for _ in range(n_jobs)]
    plan = []
    for kind, phase in combos:
        free = [i for i in range(n_jobs)
                if phase not in [p for _, p in per_job[i]]] or \
            list(range(n_jobs))
        least = min(len(per_job[i]) for i in free)
        i = rng.choice([i for i in free if len(per_job[i]) == least])
        per_job[i].append((kind, phase))
        plan.append((i, kind, phase))
    return sorted(plan, key=lambda k: (k[0], PHASES.index(k[2])))


def parse_plan(text):
    """"0:coordinator@warm-up,1:worker@push" -> [(0, "coordinator",
    "warm-up"), (1, "worker", "push")], in the order each job meets
    them."""
    plan = []
    for item in text.split(","):
        job, _, rest = item.strip().partition(":")
        kind, _, phase = rest.partition("@")
        if kind not in KINDS or phase not in PHASES:
            raise ValueError("bad kill %r: JOB:KIND@PHASE, KIND one of %s, "
                             "PHASE one of %s" % (item, KINDS, PHASES))
        plan.append((int(job), kind, phase))
    return sorted(plan, key=lambda k: (k[0], PHASES.index(k[2])))


def git_describe():
    """HEAD's short hash, '+dirty' when the tree has changes (the binaries
    may have been built from them)."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"],
                              cwd=str(REPO), capture_output=True, text=True,
                              timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain",
                                "--untracked-files=no"], cwd=str(REPO),
                               capture_output=True, text=True,
                               timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return (head or "unknown") + ("+dirty" if dirty else "")


def mean(xs):
    return statistics.mean(xs) if xs else None


class Chaos:
    def __init__(self, jobs=6, kills=10, seed=16, steps=120, every=5,
                 parallel=2, slow_node_ms=8, workdir=None, build=None,
                 plan=None, max_restarts=None, heartbeat_timeout_s=15,
                 timeout_s=1800, down_s=(0.0, 1.0), spare_endings=False,
                 settle_s=0.0, phases=PHASES):
        self.n_jobs = jobs
        self.n_kills = kills
        self.seed = seed
        self.rng = random.Random(seed)
        self.steps = steps
        self.every = every
        self.parallel = max(1, parallel)
        self.slow_node_ms = slow_node_ms
        self.build = build_dir(build)
        self.plan = plan if plan is not None else plan_kills(
            self.rng, jobs, kills, phases)
        per_job = max([sum(1 for k in self.plan if k[0] == i)
                       for i in range(jobs)] or [0])
        # A kill during registration may cost a launch without a restart.
        self.max_restarts = max_restarts or per_job + 3
        self.heartbeat_timeout_s = heartbeat_timeout_s
        self.t_start = time.monotonic()
        self.deadline = self.t_start + timeout_s
        self.down_s = down_s
        # True: a job with a coordinator kill starts once every other job
        # ended, so that coordinator kills hit only the phases aimed at
        # (not another job's last steps; see tests/integration/
        # test_chaos.py).
        self.spare_endings = spare_endings
        # A worker kill waits until this long after the last coordinator
        # restart (a launcher's channel may still be backing off; see
        # tests/integration/test_chaos.py).
        self.settle_s = settle_s
        self.last_restart = -1e9
        self._own_tmp = workdir is None
        self.workdir = pathlib.Path(workdir or tempfile.mkdtemp(
            prefix="tandem-chaos-"))
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.ledger = Ledger()
        self.kill_records = []
        self.jobs = []
        self.coord = None
        self.client = None
        self._stop = threading.Event()

    # -- helpers

    def left(self):
        return self.deadline - time.monotonic()

    def get(self, job_id):
        """client.get, None while the coordinator is away."""
        try:
            st = self.client.get(job_id)
        except TandemError:
            return None
        self.ledger.observe(job_id, st)
        return st

    def wait(self, what, fn, timeout, interval=0.02):
        deadline = time.monotonic() + min(timeout, max(self.left(), 1))
        while time.monotonic() < deadline:
            v = fn()
            if v:
                return v
            time.sleep(interval)
        return None

    def _observer(self):
        """Polls every job that is not over, so that the ledger holds what
        the coordinator shows between kills too."""
        while not self._stop.wait(0.25):
            for job in list(self.jobs):
                if job.id is None or getattr(job, "over", False):
                    continue
                st = self.get(job.id)
                if st is not None and st.job.state in TERMINAL:
                    job.over = True
            self.ledger.fetch_schedules(self.client)

    def _slow_worker(self):
        path = self.workdir / "slow-worker.sh"
        path.write_text("#!/bin/sh\nexec %s \"$@\" --slow-node-ms %d\n" %
                        (self.worker_binary, self.slow_node_ms))
        path.chmod(0o755)
        return path

    # -- the run

    def run(self):
        # Copies of the binaries: one build for the whole run, even if the
        # build directory is rebuilt meanwhile.
        bindir = self.workdir / "bin"
        bindir.mkdir(exist_ok=True)
        for b in (self.build / "coordinator" / "tandem-coordinator",
                  self.build / "worker" / "tandem-worker"):
            if not b.is_file():
                raise RuntimeError("%s is not built" % b)
            shutil.copy2(b, bindir / b.name)
        binary = bindir / "tandem-coordinator"
        self.commit = git_describe()
        self.load_start = os.getloadavg()
        self.worker_binary = bindir / "tandem-worker"
        self.slow_worker = self._slow_worker()
        cdir = self.workdir / "coordinator"
        cdir.mkdir(exist_ok=True)
        self.coord = Coordinator(binary, cdir, self.heartbeat_timeout_s)
        self.coord.start()
        self.client, self._channel = client_for(self.coord.address)
        log("coordinator on %s (db %s), workdir %s" %
            (self.coord.address, self.coord.db, self.workdir))
        observer = threading.Thread(target=self._observer, daemon=True)
        try:
            self.reference = self._reference()
            observer.start()
            self._chaos()
            return self._finish()
        finally:
            self._stop.set()
            self._cleanup()

    def _reference(self):
        ref = Job(self, -1, "reference", 48 << 20)
        ref.start()
        log("reference run %s (uninterrupted)" % ref.id)
        try:
            code = ref.proc.wait(timeout=max(self.left(), 1))
        except subprocess.TimeoutExpired:
            raise RuntimeError("the reference run did not end")
        if code != 0:
            raise RuntimeError("the reference run failed (%d): %s" %
                               (code, ref.out_path.read_text()[-2000:]))
        losses = [dict(ref.losses(r)) for r in range(WORLD)]
        for r in range(WORLD):
            if sorted(losses[r]) != list(range(self.steps)):
                raise RuntimeError("reference rank %d has steps %s" %
                                   (r, sorted(losses[r])))
        self.ref_job = ref
        retrying(lambda: self.get(ref.id))  # its events count too
        self.ledger.fetch_schedules(self.client)
        return losses

    def _chaos(self):
        # A budget per job 10% apart (no job hits another's cached plan).
        for i in range(self.n_jobs):
            budget = int((64 << 20) * 1.1 ** (i + 1))
            job = Job(self, i, "chaos%d-s%d" % (i, self.seed), budget)
            job.kills = [(k, p) for j, k, p in self.plan if j == i]
            self.jobs.append(job)
        for job in self.jobs:
            # At most `parallel` jobs at once (alone, with spare_endings,
            # when it has a coordinator kill).
            slots = self.parallel
            if self.spare_endings and any(k == "coordinator"
                                          for k, _ in job.kills):
                slots = 1
            self.wait("a free slot", lambda: sum(
                j.running() for j in self.jobs if j is not job)
                < slots, timeout=self.left(), interval=0.1)
            job.start()
            log("job %d: %s, kills %s" % (job.index, job.id, ", ".join(
                "%s@%s" % kp for kp in job.kills) or "none"))
            for kind, phase in job.kills:
                if self.left() <= 0:
                    break
                self._kill(job, kind, phase)

    # -- aiming

    def _events(self, job_id):
        with self.ledger.lock:
            return dict(self.ledger.events.get(job_id, {}))

    def _versions(self, job_id):
        """{version: (recorded time, active time or None)} from the
        events."""
        out = {}
        for seq, (t, kind, msg) in sorted(self._events(job_id).items()):
            if kind != "schedule":
                continue
            m = ACTIVE_RE.match(msg)
            if m:
                v = int(m.group(1))
                if v in out and out[v][1] is None:
                    out[v] = (out[v][0], t)
                continue
            m = SCHEDULE_RE.match(msg)
            if m:
                out.setdefault(int(m.group(1)), (t, None))
        return out

    def _aim(self, job, phase):
        """Waits for the moment to kill at; returns (status, note), status
        None when the job ended first."""
        jid = job.id
        rng = self.rng
        fast = 0.005

        def st_now():
            return self.get(jid)

        def at_step(target):
            """Ready once the job runs at `target` or later (or ended)."""
            def ready():
                st = st_now()
                if st is None or st.job.state in TERMINAL:
                    return st
                if st.job.state == RUNNING and st.job.step >= target:
                    return st
                return None
            return ready

        if phase == "registration":
            # The ranks register within about 0.5 s of each other here.
            jitter = rng.uniform(0.0, 0.1)
            first = [None]

            def ready():
                st = st_now()
                if st is None:
                    return None
                if st.job.state != PENDING or len(st.workers) >= WORLD:
                    return st  # missed: kill now anyway
                if st.workers:
                    if first[0] is None:
                        first[0] = time.monotonic()
                    if time.monotonic() - first[0] >= jitter:
                        return st
                return None
            return self.wait(phase, ready, 120, fast), \
                "jitter %.2f s after the first registration" % jitter

        if phase == "warm-up":
            target = rng.randint(1, WARMUP - 1)
            return self.wait(phase, at_step(target), 120, fast), \
                "at step %d of the %d-step warm-up" % (target, WARMUP)

        if phase == "planning":
            if not self._versions(jid):
                # The first plan: its window completes at step WARMUP + 1
                # (the first step is left out of it).
                def ready():
                    st = st_now()
                    if st is None:
                        return None
                    if st.job.state in TERMINAL or \
                            self._versions(jid) or \
                            (st.job.state == RUNNING and
                             st.job.step >= WARMUP + 1):
                        return st
                    return None
                return self.wait(phase, ready, 120, 0.002), \
                    "first window complete (step %d)" % (WARMUP + 1)
            st = self._settled(job)
            if st is None or st.job.state in TERMINAL:
                return st, "job ended"
            try:
                v = self.client.reoptimize(jid, reason="chaos")
            except TandemError as e:
                return st_now(), "reoptimize failed: %s" % e.message
            job.pending_version = v
            return st, "right after Reoptimize (v%d)" % v

        if phase == "push":
            jitter = rng.uniform(0.0, 0.04)
            vers = self._versions(jid)
            wanted = None
            if vers:
                st = self._settled(job)
                if st is None or st.job.state in TERMINAL:
                    return st, "job ended"
                try:
                    wanted = self.client.reoptimize(jid, reason="chaos")
                except TandemError as e:
                    return st_now(), "reoptimize failed: %s" % e.message
            seen = [None]

            def ready():
                st = st_now()
                if st is None:
                    return None
                if st.job.state in TERMINAL:
                    return st
                for v, (t, active) in self._versions(jid).items():
                    if (wanted is None or v >= wanted) and active is None:
                        if seen[0] is None:
                            seen[0] = time.monotonic()
                        if time.monotonic() - seen[0] >= jitter:
                            return st
                    elif wanted is None or v >= wanted:
                        return st  # already active: missed
                return None
            return self.wait(phase, ready, 120, fast), \
                "%.3f s after the schedule was recorded%s" % (
                    jitter, " (Reoptimize, v%d)" % wanted if wanted else "")

        if phase == "checkpoint":
            st = self._settled(job) or st_now()
            step = st.job.step if st is not None else 0
            # Past the first plan's push (from step WARMUP + 3), so that the
            # kill is not a push too.
            cands = [s for s in range(self.every, self.steps - 1, self.every)
                     if s > max(step + 1, WARMUP + 4)]
            if not cands:
                cands = [self.steps - 1]
            target = rng.choice(cands[:4])
            return self.wait(phase, at_step(target), 180, fast), \
                "at step %d (checkpoint.every %d)" % (target, self.every)
        raise ValueError(phase)

    def _settled(self, job):
        """Waits until the job is RUNNING on its active schedule with every
        version active (no push in flight): the state Reoptimize is aimed
        from."""
        def ready():
            st = self.get(job.id)
            if st is None:
                return None
            if st.job.state in TERMINAL:
                return st
            vers = self._versions(job.id)
            if st.job.state == RUNNING and st.job.step > 0 and (
                    not vers or st.job.schedule_version >= max(vers) or
                    all(a is not None for _, a in vers.values())):
                return st
            return None
        return self.wait("settled", ready, 60, 0.02) or self.get(job.id)

    # -- killing

    def _kill(self, job, kind, phase):
        job.pending_version = None
        if kind == "worker" and self.settle_s > 0:
            time.sleep(max(0.0, self.last_restart + self.settle_s -
                           time.monotonic()))
        st, note = self._aim(job, phase)
        rec = {"job": job.id, "job_index": job.index, "kind": kind,
               "aimed": phase, "aim": note, "killed": False}
        if st is None or st.job.state in TERMINAL:
            rec["note"] = "job ended (or no status) before the kill"
            self.kill_records.append(rec)
            log("job %d: %s kill at %s skipped: %s" % (job.index, kind, phase,
                                                       rec["note"]))
            return
        rec.update(state=job_pb2.JobState.Name(st.job.state),
                   step=st.job.step, version=st.job.schedule_version,
                   restarts=st.job.restarts, registered=len(st.workers))
        if kind == "worker":
            pids = worker_pids(job.id)
            ranks = sorted(pids)
            if phase == "registration":
                reg = sorted(w.rank for w in st.workers if w.rank in pids)
                ranks = reg or ranks
            if not ranks:
                rec["note"] = "no worker process to kill"
                self.kill_records.append(rec)
                return
            rank = self.rng.choice(ranks)
            t_kill = time.time()
            try:
                os.kill(pids[rank], signal.SIGKILL)
            except ProcessLookupError:
                pass
            rec.update(killed=True, rank=rank, pid=pids[rank], t=t_kill)
            self._recover_worker(job, rec, st, t_kill)
        else:
            # The other jobs as last seen (by the observer, at most about
            # 0.25 s ago: asking now would move the kill off its aim).
            with self.ledger.lock:
                before = {j.id: self.ledger.last.get(j.id) for j in self.jobs
                          if j.id and j is not job}
            # A job an earlier kill broke (lost) would never recover.
            broken = {j.id for j in self.jobs if getattr(j, "broken", False)}
            before = {k: v for k, v in before.items()
                      if v is not None and v.job.state not in TERMINAL and
                      k not in broken}
            before[job.id] = st
            t_kill = time.time()
            self.coord.kill()
            rec.update(killed=True, t=t_kill,
                       jobs_hit=sorted(before))
            down = self.rng.uniform(*self.down_s)
            time.sleep(down)
            t_serving = self.coord.start()
            rec["down_s"] = t_serving - t_kill
            retrying(lambda: self.client.get(job.id))
            # What the restarted coordinator recovered, before anything new.
            n_ev, ev_lost, n_sc, sc_lost = self.ledger.verify(self.client)
            rec.update(events_checked=n_ev, events_lost=ev_lost,
                       schedules_checked=n_sc, schedules_lost=sc_lost)
            self._recover_coordinator(rec, before, t_kill, t_serving)
            self.last_restart = time.monotonic()
        rec["observed"] = self._classify(job, rec, st)
        rec["hit"] = rec["observed"] == phase
        self.kill_records.append(rec)
        log("job %d: %s kill aimed at %s (%s): landed in %s at step %d; "
            "recovered in %s s%s" % (
                job.index, kind, phase, note, rec["observed"], rec["step"],
                "%.2f" % rec["recover_s"] if rec.get("recover_s") is not None
                else "-", "" if kind == "worker" else
                " (down %.2f s, %d events and %d schedules checked, %d and "
                "%d lost)" % (rec["down_s"], rec["events_checked"],
                              rec["schedules_checked"],
                              len(rec["events_lost"]),
                              len(rec["schedules_lost"]))))

    def _recover_worker(self, job, rec, st, t_kill):
        last_seq = max(self._events(job.id) or [0])
        was_running = st.job.state == RUNNING
        dead = {w.incarnation for w in st.workers if w.rank == rec["rank"]}

        def back():
            s = self.get(job.id)
            if s is None:
                return None
            if s.job.state in TERMINAL:
                return ("ended " + job_pb2.JobState.Name(s.job.state),
                        time.time() if s.job.state == SUCCEEDED else None)
            for e in s.events:
                if e.seq > last_seq and e.kind == "restart" and \
                        e.message.startswith("resumed at step"):
                    return (e.message, e.time_unix_s)
            if was_running:
                return None
            # Killed while registering: back once every rank, none of them
            # the dead process, trains (or the job resumed, above).
            if s.job.state == RUNNING and s.job.step > 0 and \
                    len(s.workers) == WORLD and \
                    all(w.connected and w.incarnation not in dead
                        for w in s.workers):
                return ("every rank registered and stepping", time.time())
            return None
        got = self.wait("recovery", back, RECOVER_S, 0.02)
        if got is None:
            rec["recover_s"] = None
            rec["note"] = "did not recover within %d s" % RECOVER_S
            job.broken = True
        else:
            rec["recovered"] = got[0]
            rec["recover_s"] = got[1] - t_kill if got[1] else None
            if got[1] is None:
                rec["note"] = "the job %s" % got[0]

    def _recover_coordinator(self, rec, before, t_kill, t_serving):
        pending = dict(before)
        per_job = {}
        connected = {}  # job -> seconds from the kill to every rank back
        failed = {}
        deadline = time.monotonic() + min(RECOVER_S, max(self.left(), 1))
        while pending and time.monotonic() < deadline:
            for jid, b in list(pending.items()):
                s = self.get(jid)
                if s is None:
                    continue
                now = time.time() - t_kill
                all_in = len(s.workers) == WORLD and \
                    all(w.connected for w in s.workers)
                if all_in and jid not in connected:
                    connected[jid] = now
                ok = False
                if s.job.state in TERMINAL:
                    if s.job.state != SUCCEEDED:
                        failed[jid] = job_pb2.JobState.Name(s.job.state)
                        del pending[jid]
                        continue
                    ok = True
                elif b.job.state == PENDING:
                    ok = s.job.state == RUNNING and all_in
                else:
                    ok = s.job.state == RUNNING and all_in and \
                        s.job.step > b.job.step
                if ok:
                    per_job[jid] = now
                    del pending[jid]
            time.sleep(0.02)
        rec["recover_per_job_s"] = per_job
        rec["reconnected_per_job_s"] = connected
        for job in self.jobs:
            if job.id in pending or job.id in failed:
                job.broken = True
        if pending or failed:
            rec["recover_s"] = None
            rec["note"] = "not recovered within %d s: %s; ended otherwise "\
                "than SUCCEEDED: %s" % (RECOVER_S, sorted(pending), failed)
        else:
            rec["recover_s"] = max(per_job.values())
            rec["recover_after_serving_s"] = rec["recover_s"] - (
                t_serving - t_kill)

    def _classify(self, job, rec, st):
        """The phase the kill landed in, from the status seen just before it
        and the coordinator's event times."""
        t = rec["t"]
        if st.job.state == PENDING:
            return "registration" if len(st.workers) < WORLD else "pending"
        vers = self._versions(job.id)
        target = job.pending_version
        if rec["aimed"] == "planning" and target is not None:
            rec_t = vers.get(target, (None,))[0]
            return "planning" if rec_t is None or rec_t > t else "push"
        # A version recorded before the kill, not yet active on every rank.
        for v, (rt, at) in vers.items():
            if rt < t and (at is None or at > t):
                return "push"
        first = min(vers.items(), key=lambda kv: kv[0]) if vers else None
        if first is None or first[1][0] > t:
            # No plan yet at the kill.
            if st.job.step >= WARMUP + 1:
                return "planning"
            return "warm-up"
        if st.job.step > 0 and st.job.step % self.every == 0:
            return "checkpoint"
        return "training"

    # -- the end

    def _finish(self):
        # Each launch to its end; one whose job has not moved (state, step,
        # restarts) for STUCK_S is left as it is: a hang, and the job lost.
        for job in self.jobs:
            if job.proc is None:
                continue
            last, since = None, time.monotonic()
            job.code = None
            while self.left() > 0:
                try:
                    job.code = job.proc.wait(timeout=1)
                    break
                except subprocess.TimeoutExpired:
                    pass
                st = self.get(job.id)
                now = (st.job.state, st.job.step, st.job.restarts) \
                    if st else last
                if now != last:
                    last, since = now, time.monotonic()
                elif time.monotonic() - since > STUCK_S:
                    job.stuck = "no change for %d s at %s" % (STUCK_S, now)
                    log("job %d: %s" % (job.index, job.stuck))
                    break
        self._stop.set()
        self.ledger.fetch_schedules(self.client)
        n_ev, ev_lost, n_sc, sc_lost = self.ledger.verify(self.client)
        watch_lost = []
        for job in self.jobs + [self.ref_job]:
            if job.id is None:
                continue
            got = self.get(job.id)
            if got is None or got.job.state not in TERMINAL:
                continue
            replay = {}
            try:
                for _, e in self.client.watch(job.id):
                    if e is not None:
                        replay[e.seq] = (e.time_unix_s, e.kind, e.message)
            except TandemError as e:
                watch_lost.append({"job": job.id, "error": e.message})
                continue
            shown = {e.seq: (e.time_unix_s, e.kind, e.message)
                     for e in got.events}
            if replay != shown:
                watch_lost.append({"job": job.id, "get": len(shown),
                                   "watch": len(replay)})
        jobs = []
        for job in self.jobs:
            r = {"job": job.id, "index": job.index,
                 "kills": ["%s@%s" % kp for kp in job.kills],
                 "launch_exit": getattr(job, "code", None),
                 "stuck": getattr(job, "stuck", None)}
            st = self.get(job.id) if job.id else None
            r["state"] = (job_pb2.JobState.Name(st.job.state) if st
                          else "unknown")
            r["restarts"] = st.job.restarts if st else None
            r["schedule_version"] = st.job.schedule_version if st else None
            mismatches = []
            final = True
            recomputed = 0
            for rank in range(WORLD):
                rows = job.losses(rank)
                steps = {s for s, _ in rows}
                recomputed += len(rows) - len(steps)
                if self.steps - 1 not in steps:
                    final = False
                for s, loss in rows:
                    want = self.reference[rank].get(s)
                    if loss != want:
                        mismatches.append((rank, s, loss, want))
            r["final_step_present"] = final
            r["loss_mismatches"] = mismatches[:10]
            r["n_loss_mismatches"] = len(mismatches)
            r["steps_recomputed"] = recomputed
            r["lost"] = bool(r["state"] != "JOB_STATE_SUCCEEDED"
                             or mismatches or not final)
            if r["lost"] and job.id:
                r["launch_tail"] = job.out_path.read_text()[-1500:]
                r["last_events"] = ["%s: %s" % (e.kind, e.message[:200])
                                    for e in st.events[-4:]] if st else []
                r["worker_processes"] = len(worker_pids(job.id))
            jobs.append(r)
        kills = [k for k in self.kill_records if k.get("killed")]
        restart_ev = sum(len(k.get("events_lost", [])) for k in kills)
        restart_sc = sum(len(k.get("schedules_lost", [])) for k in kills)
        summary = {
            "date": datetime.date.today().isoformat(),
            "commit": self.commit,
            "host": platform.node(), "cpus": os.cpu_count(),
            "load_avg_start": self.load_start,
            "load_avg_end": os.getloadavg(),
            "wall_s": time.monotonic() - self.t_start,
            "seed": self.seed, "jobs": self.n_jobs, "steps": self.steps,
            "every": self.every, "parallel": self.parallel,
            "slow_node_ms": self.slow_node_ms,
            "kills_planned": len(self.plan), "kills": len(kills),
            "coordinator_kills": sum(k["kind"] == "coordinator"
                                     for k in kills),
            "worker_kills": sum(k["kind"] == "worker" for k in kills),
            "phases_hit": sum(bool(k.get("hit")) for k in kills),
            "jobs_completed": sum(r["state"] == "JOB_STATE_SUCCEEDED"
                                  for r in jobs),
            "jobs_lost": sum(r["lost"] for r in jobs),
            "events_checked": n_ev,
            "events_lost": len(ev_lost) + restart_ev + len(watch_lost) +
            len(self.ledger.changed),
            "schedules_checked": n_sc,
            "schedules_lost": len(sc_lost) + restart_sc,
            "not_recovered": sum(k.get("recover_s") is None for k in kills),
            "launch_failures": sum(r["launch_exit"] != 0 for r in jobs),
        }
        details = {"events_lost_at_end": ev_lost,
                   "schedules_lost_at_end": sc_lost,
                   "watch_mismatch": watch_lost,
                   "events_changed": self.ledger.changed}
        table = []
        for kind in KINDS:
            for phase in PHASES:
                ks = [k for k in kills if k["kind"] == kind and
                      k["aimed"] == phase]
                if not ks:
                    continue
                rec = [k["recover_s"] for k in ks
                       if k.get("recover_s") is not None]
                row = {"kind": kind, "phase": phase, "kills": len(ks),
                       "hit": sum(bool(k.get("hit")) for k in ks),
                       "landed": [k["observed"] for k in ks],
                       "recover_mean_s": mean(rec),
                       "recover_max_s": max(rec) if rec else None}
                if kind == "coordinator":
                    row["down_mean_s"] = mean([k["down_s"] for k in ks])
                    after = [k["recover_after_serving_s"] for k in ks
                             if "recover_after_serving_s" in k]
                    row["after_serving_mean_s"] = mean(after)
                    row["after_serving_max_s"] = max(after) if after \
                        else None
                table.append(row)
        return {"summary": summary, "table": table, "jobs": jobs,
                "kills": self.kill_records, "details": details}

    def _cleanup(self):
        for job in self.jobs + [getattr(self, "ref_job", None)]:
            if job is None or job.proc is None:
                continue
            if job.proc.poll() is None:
                try:
                    os.killpg(job.proc.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
                try:
                    job.proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    job.proc.kill()
                    job.proc.wait()
            if job.id:
                for pid in worker_pids(job.id).values():
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
        if self.client is not None:
            self._channel.close()
        if self.coord is not None:
            self.coord.stop()


# ----------------------------------------------------------------- report

def fmt(x, digits=2):
    return "-" if x is None else ("%.*f" % (digits, x))


def print_report(res, out=sys.stdout):
    s = res["summary"]
    w = out.write
    w("\nchaos: %d jobs x %d steps (2 ranks, checkpoint.every %d), seed %d, "
      "%d kills (%d coordinator, %d worker), %d of them landed in the phase "
      "aimed at\n" % (s["jobs"], s["steps"], s["every"], s["seed"],
                      s["kills"], s["coordinator_kills"], s["worker_kills"],
                      s["phases_hit"]))
    w("jobs completed %d of %d; jobs lost %d; events lost %d of %d; "
      "schedules lost %d of %d; kills not recovered from %d\n\n" % (
          s["jobs_completed"], s["jobs"], s["jobs_lost"], s["events_lost"],
          s["events_checked"], s["schedules_lost"], s["schedules_checked"],
          s["not_recovered"]))
    w("| kill | phase | kills | landed there | recover mean s | max s | "
      "coordinator down s | after serving mean / max s |\n")
    w("|---|---|---:|---:|---:|---:|---:|---:|\n")
    for r in res["table"]:
        w("| %s | %s | %d | %d | %s | %s | %s | %s |\n" % (
            r["kind"], r["phase"], r["kills"], r["hit"],
            fmt(r["recover_mean_s"]), fmt(r["recover_max_s"]),
            fmt(r.get("down_mean_s")) if r["kind"] == "coordinator" else "",
            "%s / %s" % (fmt(r.get("after_serving_mean_s")),
                         fmt(r.get("after_serving_max_s")))
            if r["kind"] == "coordinator" else ""))
    for j in res["jobs"]:
        if j["lost"]:
            w("LOST job %s: %s, launch exit %s, %d loss mismatches %s, final "
              "step %s\n" % (j["job"], j["state"], j["launch_exit"],
                             j["n_loss_mismatches"], j["loss_mismatches"][:3],
                             j["final_step_present"]))
    for k in res["kills"]:
        if not k.get("killed") or k.get("recover_s") is None:
            w("kill %s@%s on %s: %s\n" % (k["kind"], k["aimed"], k["job"],
                                          k.get("note", "")))
    out.flush()


def ok(res):
    s = res["summary"]
    return (s["jobs_lost"] == 0 and s["events_lost"] == 0 and
            s["schedules_lost"] == 0 and s["not_recovered"] == 0 and
            s["jobs_completed"] == s["jobs"])


def main(argv=None):
    p = argparse.ArgumentParser(
        description="SIGKILL the coordinator and workers of running jobs "
        "at every phase and measure what is lost and how fast they recover")
    p.add_argument("--jobs", type=int, default=None,
                   help="jobs (default 6, or as many as --plan names)")
    p.add_argument("--kills", type=int, default=10,
                   help="kills in the random plan (default 10: every kind "
                   "at every phase)")
    p.add_argument("--seed", type=int, default=16,
                   help="the plan, the moments within each phase, the "
                   "victims and the coordinator's downtime (default 16)")
    p.add_argument("--steps", type=int, default=120,
                   help="train.steps of every job (default 120)")
    p.add_argument("--every", type=int, default=5,
                   help="checkpoint.every (default 5)")
    p.add_argument("--parallel", type=int, default=2,
                   help="jobs running at once (default 2)")
    p.add_argument("--slow-node-ms", type=int, default=8,
                   help="tandem-worker --slow-node-ms: a step long enough "
                   "to aim at (default 8: about 0.1 s)")
    p.add_argument("--build", default=None,
                   help="build directory (default $TANDEM_BUILD_DIR or "
                   "build/)")
    p.add_argument("--workdir", default=None,
                   help="keep the coordinator's db and the logs here "
                   "(default: a temporary directory, removed when nothing "
                   "was lost)")
    p.add_argument("--timeout", type=float, default=1800,
                   help="seconds for the whole run (default 1800)")
    p.add_argument("--out", default=None,
                   help="results: .json one object; otherwise JSON lines "
                   "(summary, table rows, jobs, kills)")
    p.add_argument("--settle", type=float, default=0.0, metavar="S",
                   help="kill no worker within S seconds of a coordinator "
                   "restart (default 0)")
    p.add_argument("--spare-endings", action="store_true",
                   help="start a job with a coordinator kill only once every "
                   "other job ended (coordinator kills then hit no other "
                   "job's last steps)")
    p.add_argument("--phases", default=",".join(PHASES),
                   help="the phases a random plan aims at (default all: "
                   "%s)" % ",".join(PHASES))
    p.add_argument("--plan", default=None,
                   help="the kills instead of a random plan: "
                   "JOB:KIND@PHASE,... (e.g. 0:coordinator@warm-up,"
                   "1:worker@checkpoint; JOB counts from 0)")
    a = p.parse_args(argv)
    plan = parse_plan(a.plan) if a.plan else None
    phases = tuple(x.strip() for x in a.phases.split(",") if x.strip())
    if not phases or any(x not in PHASES for x in phases):
        p.error("--phases: a comma-separated list of %s" % ", ".join(PHASES))
    if a.jobs is None:
        a.jobs = max(k[0] for k in plan) + 1 if plan else 6
    if plan and max(k[0] for k in plan) >= a.jobs:
        p.error("--plan names job %d of %d" % (max(k[0] for k in plan),
                                               a.jobs))
    chaos = Chaos(jobs=a.jobs, kills=a.kills, seed=a.seed, steps=a.steps,
                  every=a.every, parallel=a.parallel,
                  slow_node_ms=a.slow_node_ms, workdir=a.workdir,
                  build=a.build, timeout_s=a.timeout, plan=plan,
                  settle_s=a.settle, spare_endings=a.spare_endings,
                  phases=phases)
    log("kill plan: %s" % ", ".join("job %d %s@%s" % k for k in chaos.plan))
    res = chaos.run()
    print_report(res)
    if a.out:
        with open(a.out, "w") as f:
            if a.out.endswith(".json") and not a.out.endswith(".jsonl"):
                json.dump(res, f, indent=1, default=str)
            else:
                f.write(json.dumps({"summary": res["summary"]}) + "\n")
                for r in res["table"]:
                    f.write(json.dumps({"table": r}) + "\n")
                for r in res["jobs"]:
                    f.write(json.dumps({"job": r}, default=str) + "\n")
                for r in res["kills"]:
                    f.write(json.dumps({"kill": r}, default=str) + "\n")
                f.write(json.dumps({"details": res["details"]},
                                   default=str) + "\n")
    good = ok(res)
    if chaos._own_tmp and good:
        shutil.rmtree(chaos.workdir, ignore_errors=True)
    else:
        log("logs and database kept in %s" % chaos.workdir)
    return 0 if good else 1


if __name__ == "__main__":
    sys.exit(main())
