#!/usr/bin/env python3
"""bench/load/hostile.py: the coordinator under hostile load (issue 36,
bench/README.md "hostile").

One coordinator with tokens on a temporary database, a real two-rank job
training on it (tandem-worker, agent mode, CPU), and a user who submits,
cancels and lists every 100 ms. Then quiet and hostile phases, interleaved
(the order swapped every round, each phase the same length), and in the
hostile ones a separate attacker process that holds at once:

  - --sessions worker sessions that never say hello (anonymous: no join
    secret is needed before the hello). Each is reopened when the
    coordinator ends it; one refused at a cap is retried after --retry-s.
  - --kv-gets rendezvous gets for keys that never come, spread over three
    jobs of the attacker's own (a get needs that job's join secret), each
    re-issued when it times out.
  - --watches watch streams with the attacker's token (refused past the
    per-user cap, retried after --retry-s).
  - --slow-http connections to the metrics port from another loopback
    address that send their request one byte a second (closed by the port
    at its request deadline; reopened).

Per phase: the user's Submit and List latencies (p50, p99), the real job's
median step time (its rank 0's own iteration_s over the phase's steps), the
coordinator's threads and RSS (max over one-second samples), its stream
gauges from /metrics, and what the attacker held. The hostile/quiet step
ratio is reported per round with its min-max. JSON to --out.

--attacker-nice N runs the attacker at that nice value: on a machine too
small to give it cores of its own (this 2-core VM, where the job's two
ranks take both), nice 19 leaves it the CPU the job and the coordinator do
not use, so the job's step measures what the coordinator's load costs it
rather than what the attacker's own Python costs the cores; what it held
says whether it still reached its load.

  /usr/bin/python3 bench/load/hostile.py [--build build] [--rounds 2]
      [--phase-s 40] [--sessions 10000] [--kv-gets 10000] [--watches 1000]
      [--slow-http 1000] [--out bench/load/results-hostile-DATE.json]
"""

import argparse
import asyncio
import json
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "client" / "python"))

USER_TOKEN = "user-token-0123456789abcdef"
ATTACKER_TOKEN = "mallory-token-0123456789abcd"
ADMIN_TOKEN = "ops-token-0123456789abcdefgh"


def log(*args):
    print("[hostile %s]" % time.strftime("%H:%M:%S"), *args, file=sys.stderr,
          flush=True)


# ---------------------------------------------------------------- attacker

async def attack(args):
    import grpc
    from tandem.v1 import job_service_pb2 as jpb
    from tandem.v1 import job_service_pb2_grpc as jgrpc
    from tandem.v1 import worker_service_pb2 as wpb
    from tandem.v1 import worker_service_pb2_grpc as wgrpc

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    counts = {k: 0 for k in (
        "session_attempts", "session_refused", "sessions_ended",
        "kv_attempts", "kv_refused", "watch_attempts", "watch_refused",
        "http_attempts", "http_refused", "http_closed")}
    # Several connections, as several clients would open.
    channels = [grpc.aio.insecure_channel(
        args.address, options=[("grpc.use_local_subchannel_pool", 1)])
        for _ in range(8)]

    async def pause(seconds):
        try:
            await asyncio.wait_for(stop.wait(), seconds)
        except asyncio.TimeoutError:
            pass

    async def until_stop(call, awaitable):
        """How `awaitable` (the call's end) came out: "stopped" when the
        attack was told to stop first (the call is cancelled), else the
        call's status code."""
        waiter = asyncio.ensure_future(stop.wait())
        task = asyncio.ensure_future(awaitable)
        done, _ = await asyncio.wait({waiter, task},
                                     return_when=asyncio.FIRST_COMPLETED)
        waiter.cancel()
        if task not in done:
            call.cancel()
            # Its ending (CANCELLED) is of no interest; retrieved, so that
            # asyncio does not print it.
            task.add_done_callback(lambda t: t.cancelled() or t.exception())
            return "stopped"
        try:
            task.result()
            return grpc.StatusCode.OK
        except grpc.aio.AioRpcError as e:
            return e.code()

    async def drain(call):
        async for _ in call:
            pass

    async def session(i):
        stub = wgrpc.WorkerServiceStub(channels[i % len(channels)])
        while not stop.is_set():
            counts["session_attempts"] += 1
            call = stub.Session()
            code = await until_stop(call, drain(call))
            if code == "stopped":
                return
            if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
                counts["session_refused"] += 1
                await pause(args.retry_s * random.uniform(0.5, 1.5))
            else:
                counts["sessions_ended"] += 1
                if code not in (grpc.StatusCode.CANCELLED,
                                grpc.StatusCode.DEADLINE_EXCEEDED):
                    key = "session_" + code.name
                    counts[key] = counts.get(key, 0) + 1
                    await pause(1.0)

    async def kv_get(i, prefix, secret):
        stub = wgrpc.WorkerServiceStub(channels[i % len(channels)])
        md = (("tandem-join-secret", secret),)
        while not stop.is_set():
            counts["kv_attempts"] += 1
            call = stub.KvGet(wpb.KvGetRequest(key="%s/never-%d" % (prefix, i),
                                               timeout_ms=60000), metadata=md)
            code = await until_stop(call, call)
            if code == "stopped":
                return
            if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
                counts["kv_refused"] += 1
                await pause(args.retry_s)
            elif code != grpc.StatusCode.OK:
                counts["kv_" + code.name] = counts.get("kv_" + code.name, 0) + 1
                await pause(1.0)

    async def watch(i, job_id):
        stub = jgrpc.JobServiceStub(channels[i % len(channels)])
        md = (("authorization", "Bearer " + ATTACKER_TOKEN),)
        while not stop.is_set():
            counts["watch_attempts"] += 1
            call = stub.Watch(jpb.WatchJobRequest(job_id=job_id), metadata=md)
            code = await until_stop(call, drain(call))
            if code == "stopped":
                return
            if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
                counts["watch_refused"] += 1
            else:
                key = "watch_" + code.name
                counts[key] = counts.get(key, 0) + 1
            await pause(args.retry_s * random.uniform(0.5, 1.5))

    async def slow_http(i):
        request = b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"
        while not stop.is_set():
            counts["http_attempts"] += 1
            try:
                reader, writer = await asyncio.open_connection(
                    "127.0.0.1", args.metrics_port,
                    local_addr=("127.0.0.2", 0))
            except OSError:
                await pause(1.0)
                continue
            data = b""
            try:
                # One byte a second; any answer (a 503 at a cap) or the
                # port closing the connection ends the attempt.
                for b in request:
                    if stop.is_set():
                        break
                    writer.write(bytes([b]))
                    await writer.drain()
                    try:
                        data = await asyncio.wait_for(reader.read(256), 1.0)
                    except asyncio.TimeoutError:
                        continue
                    break
            except OSError:
                pass
            finally:
                writer.close()
            counts["http_closed"] += 1
            if b" 503 " in data:
                counts["http_refused"] += 1
                await pause(args.retry_s * random.uniform(0.5, 1.5))

    secrets = [s.split("=", 1) for s in args.secrets.split(",") if s]
    tasks = [asyncio.ensure_future(session(i)) for i in range(args.sessions)]
    for i in range(args.kv_gets):
        job_id, secret = secrets[i % len(secrets)]
        tasks.append(asyncio.ensure_future(
            kv_get(i, "jobs/%s" % job_id, secret)))
    tasks += [asyncio.ensure_future(watch(i, secrets[i % len(secrets)][0]))
              for i in range(args.watches)]
    tasks += [asyncio.ensure_future(slow_http(i))
              for i in range(args.slow_http)]
    print("ready", flush=True)
    await stop.wait()
    await asyncio.wait(tasks, timeout=20)
    for ch in channels:
        await ch.close()
    print(json.dumps(counts), flush=True)


def attacker_main(argv):
    p = argparse.ArgumentParser(prog="hostile.py attack")
    p.add_argument("--address", required=True)
    p.add_argument("--metrics-port", type=int, required=True)
    p.add_argument("--secrets", required=True, help="JOB=SECRET,...")
    p.add_argument("--sessions", type=int, default=10000)
    p.add_argument("--kv-gets", type=int, default=10000)
    p.add_argument("--watches", type=int, default=1000)
    p.add_argument("--slow-http", type=int, default=1000)
    p.add_argument("--retry-s", type=float, default=30.0)
    args = p.parse_args(argv)
    asyncio.run(attack(args))


# ------------------------------------------------------------------ driver

def percentile(values, q):
    if not values:
        return None
    s = sorted(values)
    return s[min(len(s) - 1, int(round(q * (len(s) - 1))))]


def proc_status(pid):
    threads = rss = 0
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("Threads:"):
                threads = int(line.split()[1])
            elif line.startswith("VmRSS:"):
                rss = int(line.split()[1]) * 1024
    return threads, rss


def cpu_s(pid):
    """User plus system CPU seconds of a process so far."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def scrape(port, names):
    req = urllib.request.Request(
        "http://127.0.0.1:%d/metrics" % port,
        headers={"Authorization": "Bearer " + ADMIN_TOKEN})
    with urllib.request.urlopen(req, timeout=10) as r:
        body = r.read().decode()
    out = {}
    for line in body.splitlines():
        for n in names:
            if line.startswith(n):
                key, value = line.rsplit(" ", 1)
                out[key] = float(value)
    return out


def start_coordinator(build, work):
    tokens = work / "tokens"
    tokens.write_text("%s user\n%s mallory\n%s ops admin\n" % (
        USER_TOKEN, ATTACKER_TOKEN, ADMIN_TOKEN))
    log_path = work / "coordinator.log"
    proc = subprocess.Popen(
        [str(build / "coordinator" / "tandem-coordinator"),
         "--listen", "127.0.0.1:0", "--db", str(work / "tandem.db"),
         "--metrics-listen", "127.0.0.1:0", "--auth-tokens", str(tokens)],
        stdout=subprocess.PIPE, stderr=open(log_path, "w"), text=True)
    for line in proc.stdout:
        if "listening on port" in line:
            port = int(line.split("listening on port")[1].split()[0]
                       .rstrip(","))
            metrics = int(line.split("metrics on port")[1].split()[0])
            threading.Thread(target=lambda: [None for _ in proc.stdout],
                             daemon=True).start()
            return proc, "127.0.0.1:%d" % port, metrics
    raise SystemExit("the coordinator did not start:\n" + log_path.read_text())


def job_spec(name, world, steps):
    return {"name": name,
            "model": {"preset": "llama", "layers": 4, "d_model": 128,
                      "heads": 4, "ffn": 512, "vocab": 1024},
            "batch": {"micro_batch": 4, "seq_len": 64},
            "parallel": {"world_size": world},
            "train": {"steps": steps},
            "optimize": {"policy": "fsdp"}}


def step_times(path, first, last):
    """rank 0's iteration_s for steps in [first, last)."""
    out = []
    with open(path) as f:
        for line in f:
            try:
                r = json.loads(line)
            except ValueError:
                continue
            if "iteration_s" in r and first <= r.get("step", -1) < last:
                out.append(r["iteration_s"])
    return out


def run_phase(kind, args, ctx):
    attacker_slot = []  # the phase's attacker, once started
    try:
        return measure_phase(kind, args, ctx, attacker_slot)
    finally:
        for attacker in attacker_slot:
            if attacker.poll() is None:
                attacker.kill()
                attacker.wait()


def measure_phase(kind, args, ctx, attacker_slot):
    import tandem
    user = ctx["user"]
    attacker = None
    if kind == "hostile":
        attacker = subprocess.Popen(
            [sys.executable, __file__, "attack", "--address", ctx["address"],
             "--metrics-port", str(ctx["metrics_port"]),
             "--secrets", ctx["secrets"], "--sessions", str(args.sessions),
             "--kv-gets", str(args.kv_gets), "--watches", str(args.watches),
             "--slow-http", str(args.slow_http),
             "--retry-s", str(args.retry_s)],
            stdout=subprocess.PIPE, text=True,
            preexec_fn=(lambda: os.nice(args.attacker_nice))
            if args.attacker_nice else None)
        attacker_slot.append(attacker)
        assert attacker.stdout.readline().strip() == "ready"
        time.sleep(args.ramp_s)  # let it open what it can
    submit_s, list_s, samples, errors = [], [], [], []
    first_step = user.get(ctx["job"]).job.step
    cpu0 = {"coordinator": cpu_s(ctx["coordinator"].pid),
            "attacker": cpu_s(attacker.pid) if attacker else 0.0}
    end = time.monotonic() + args.phase_s
    next_sample = 0.0
    while time.monotonic() < end:
        now = time.monotonic()
        if now >= next_sample:
            samples.append(proc_status(ctx["coordinator"].pid))
            next_sample = now + 1.0
        try:
            t0 = time.monotonic()
            job = user.submit(job_spec("probe", 1, 1))
            submit_s.append(time.monotonic() - t0)
            user.cancel(job.id)
            t0 = time.monotonic()
            user.list(limit=100)
            list_s.append(time.monotonic() - t0)
        except tandem.TandemError as e:
            errors.append("%s: %s" % (e.code_name, e.message[:200]))
        time.sleep(0.1)
    last_step = user.get(ctx["job"]).job.step
    # Cores each used over the phase: on a small machine the attacker's own
    # CPU competes with the job's ranks, the coordinator's is what it costs.
    cores = {"coordinator": (cpu_s(ctx["coordinator"].pid) -
                             cpu0["coordinator"]) / args.phase_s,
             "attacker": ((cpu_s(attacker.pid) - cpu0["attacker"]) /
                          args.phase_s) if attacker else 0.0}
    gauges = scrape(ctx["metrics_port"], ("tandem_open_streams",
                                          "tandem_waiting_kv_gets",
                                          "tandem_http_connections",
                                          "tandem_http_refused_total"))
    held = None
    if attacker is not None:
        attacker.send_signal(signal.SIGTERM)
        try:
            out, _ = attacker.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            attacker.kill()
            out, _ = attacker.communicate()
        lines = [l for l in out.splitlines() if l.startswith("{")]
        held = json.loads(lines[-1]) if lines else None
    steps = step_times(ctx["rank0_out"], first_step + 1, last_step)
    row = {
        "phase": kind,
        "seconds": args.phase_s,
        "submit_p50_s": percentile(submit_s, 0.5),
        "submit_p99_s": percentile(submit_s, 0.99),
        "list_p50_s": percentile(list_s, 0.5),
        "list_p99_s": percentile(list_s, 0.99),
        "calls": len(submit_s) + len(list_s),
        "errors": errors[:5],
        "error_count": len(errors),
        "threads_max": max(t for t, _ in samples),
        "rss_max_bytes": max(r for _, r in samples),
        "steps": len(steps),
        "step_median_s": statistics.median(steps) if steps else None,
        "gauges_at_end": gauges,
        "cores_used": cores,
        "attacker": held,
    }
    log(kind, json.dumps({k: row[k] for k in (
        "submit_p99_s", "list_p99_s", "threads_max", "rss_max_bytes",
        "step_median_s", "steps", "error_count", "cores_used")}))
    return row


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "attack":
        attacker_main(sys.argv[2:])
        return
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--build", default=str(REPO / "build"))
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--phase-s", type=float, default=40.0)
    p.add_argument("--ramp-s", type=float, default=10.0)
    p.add_argument("--sessions", type=int, default=10000)
    p.add_argument("--kv-gets", type=int, default=10000)
    p.add_argument("--watches", type=int, default=1000)
    p.add_argument("--slow-http", type=int, default=1000)
    p.add_argument("--retry-s", type=float, default=30.0)
    p.add_argument("--attacker-nice", type=int, default=0,
                   help="the attacker's nice value (19: it gets only the "
                   "CPU the job and the coordinator leave)")
    p.add_argument("--out", default=str(
        REPO / "bench" / "load" /
        ("results-hostile-%s.json" % time.strftime("%Y-%m-%d"))))
    args = p.parse_args()
    import tandem

    build = Path(args.build)
    for b in (build / "coordinator" / "tandem-coordinator",
              build / "worker" / "tandem-worker"):
        if not b.is_file():
            raise SystemExit("hostile.py: %s is not built (cmake --build %s)"
                             % (b, build))
    try:
        import resource
        hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    except (ValueError, OSError):
        pass
    work = Path(tempfile.mkdtemp(prefix="tandem-hostile."))
    coordinator, address, metrics_port = start_coordinator(build, work)
    workers = []
    try:
        user = tandem.Client(address, token=USER_TOKEN, timeout=30)
        mallory = tandem.Client(address, token=ATTACKER_TOKEN, timeout=30)
        job = user.submit(job_spec("trains", 2, 10 ** 6))
        secret = user.join_secret(job.id)
        env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1",
                   TANDEM_JOIN_SECRET=secret)
        for rank in range(2):
            workers.append(subprocess.Popen(
                [str(build / "worker" / "tandem-worker"), "--coordinator",
                 address, "--job", job.id, "--rank", str(rank),
                 "--threads", "1"],
                stdout=open(work / ("rank%d.jsonl" % rank), "w"),
                stderr=open(work / ("rank%d.log" % rank), "w"), env=env))
        deadline = time.monotonic() + 300
        while user.get(job.id).job.step < 30:
            if time.monotonic() > deadline:
                raise SystemExit("the job did not reach step 30; see " +
                                 str(work))
            time.sleep(1)
        theirs = [mallory.submit(job_spec("mallory-%d" % i, 1, 1))
                  for i in range(3)]
        secrets = ",".join("%s=%s" % (j.id, mallory.join_secret(j.id))
                           for j in theirs)
        ctx = {"user": user, "job": job.id, "address": address,
               "metrics_port": metrics_port, "coordinator": coordinator,
               "secrets": secrets, "rank0_out": work / "rank0.jsonl"}
        rows = []
        for r in range(args.rounds):
            order = ("quiet", "hostile") if r % 2 == 0 else ("hostile",
                                                             "quiet")
            for kind in order:
                row = run_phase(kind, args, ctx)
                row["round"] = r
                rows.append(row)
        ratios = []
        for r in range(args.rounds):
            q = [x for x in rows if x["round"] == r and x["phase"] == "quiet"]
            h = [x for x in rows if x["round"] == r and x["phase"] == "hostile"]
            if q and h and q[0]["step_median_s"] and h[0]["step_median_s"]:
                ratios.append(h[0]["step_median_s"] / q[0]["step_median_s"])
        hostile = [x for x in rows if x["phase"] == "hostile"]
        summary = {
            "step_ratio_hostile_over_quiet": statistics.median(ratios)
            if ratios else None,
            "step_ratio_min": min(ratios) if ratios else None,
            "step_ratio_max": max(ratios) if ratios else None,
            "hostile_submit_p99_s": max(x["submit_p99_s"] for x in hostile),
            "hostile_list_p99_s": max(x["list_p99_s"] for x in hostile),
            "hostile_threads_max": max(x["threads_max"] for x in hostile),
            "hostile_rss_max_bytes": max(x["rss_max_bytes"] for x in hostile),
        }
        commit = subprocess.run(["git", "-C", str(REPO), "rev-parse",
                                 "--short", "HEAD"], capture_output=True,
                                text=True).stdout.strip()
        result = {"bench": "hostile", "commit": commit,
                  "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                  "args": vars(args), "machine_cpus": os.cpu_count(),
                  "summary": summary, "phases": rows}
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
        log("summary", json.dumps(summary))
        log("wrote", args.out)
    finally:
        for w in workers:
            if w.poll() is None:
                w.kill()
                w.wait()
        if coordinator.poll() is None:
            coordinator.send_signal(signal.SIGTERM)
            try:
                coordinator.wait(timeout=20)
            except subprocess.TimeoutExpired:
                coordinator.kill()
        log("work directory", work)


if __name__ == "__main__":
    main()
