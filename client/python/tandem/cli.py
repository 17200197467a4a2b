"""The ``tandem`` command line.

    tandem [--coordinator ADDR] [--token T] [--tls-ca PEM] submit job.yaml
           [--watch] [-q]
    tandem status JOB [--spec] [--events N]
    tandem watch JOB
    tandem list [--state S] [--limit N]
    tandem join-secret JOB
    tandem cancel JOB [--reason R]
    tandem reoptimize JOB [--reason R]
    tandem schedule JOB [--version N] [--explain]   (--version 0: the baseline)
    tandem timeline JOB -o trace.json [--rank R]
    tandem report JOB -o report.html
    tandem launch --nproc N job.yaml | --nproc N --job JOB [--log-dir DIR]
    tandem export my_model.py:build [--example-batch FILE]
                  [--wrap A,B | --wrap-min-params N] [--dynamic NAME:DIM,...]
                  [--input-range NAME=LOW:HIGH] -o model.tandem
    tandem export-weights JOB_OR_CHECKPOINT -o model.safetensors [--step N]

Exit status: 0 on success (for watch: the job SUCCEEDED); 1 when the
coordinator refused or could not be reached, or a watched job FAILED or was
CANCELLED; 2 for usage errors, including a job spec file that does not fit
the JobSpec schema; 130 on Ctrl-C. `tandem export` needs no coordinator: 1
when the model cannot be captured, 2 for bad arguments. `tandem
export-weights` asks the coordinator only for a job id's checkpoint.dir: 1
when the checkpoint cannot be found, read or verified (or the coordinator
cannot be asked), 2 for bad arguments.
"""

import argparse
import json
import math
import os
import sys
import time

import grpc

from tandem import spec as spec_mod
from tandem.client import Client, default_address, is_terminal, state_name
from tandem.errors import TandemError
from tandem.progress import (ProgressView, describe_outcome,
                             describe_waiting, event_line, fmt_bytes,
                             fmt_time)
from tandem.v1 import job_pb2

EXIT_OK, EXIT_ERROR, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130


def _out(text=""):
    sys.stdout.write(text + "\n")


def _err(text):
    sys.stderr.write("tandem: %s\n" % text)
    sys.stderr.flush()


# ---------------------------------------------------------------- commands

def cmd_submit(client, args):
    spec = spec_mod.load_spec_file(args.spec)
    job = client.submit(spec)
    if args.quiet:
        _out(job.id)
    else:
        _out("submitted job %s: %s, waiting for %d workers" %
             (job.id, state_name(job.state), job.spec.parallel.world_size))
        if not args.watch:
            _out("  watch it with: tandem watch %s" % job.id)
    sys.stdout.flush()
    if args.watch:
        return watch_job(client, job.id, args)
    return EXIT_OK


def cmd_join_secret(client, args):
    secret = client.join_secret(args.job)
    if not secret:
        raise TandemError("the coordinator gave no join secret for job %s"
                          % args.job, code=grpc.StatusCode.UNIMPLEMENTED)
    _out(secret)
    return EXIT_OK


def _describe_spec(spec, job=None):
    """(model, batch) in words. The coordinator's description of the model
    (job.model_text: an exported model's units, params and inputs) when it
    gave one; otherwise the builtin model's shapes from the spec."""
    m, b, p = spec.model, spec.batch, spec.parallel
    dtype = spec_mod.enum_short_name(
        job_pb2.ModelSpec.DESCRIPTOR.fields_by_name["dtype"].enum_type, m.dtype)
    if job is not None and job.model_text:
        model = job.model_text
    else:
        model = "%s: %d layers, d_model %d, %d heads (%d kv), ffn %d, " \
            "vocab %d" % (m.preset, m.layers, m.d_model, m.heads, m.kv_heads,
                          m.ffn, m.vocab)
        if m.experts:
            model += ", %d experts (top %d)" % (m.experts, m.top_k)
    model += ", %s" % dtype
    if m.activation_checkpointing:
        model += ", activation checkpointing"
    unit, per_step = spec_mod.items_per_step(spec, job)
    if unit == "tokens":
        batch = "%d ranks x micro_batch %d x seq_len %d x grad_accum %d" % (
            p.world_size, b.micro_batch, b.seq_len, b.grad_accum)
    else:
        batch = "%d ranks x micro_batch %d x grad_accum %d" % (
            p.world_size, b.micro_batch, b.grad_accum)
    batch += " = {:,} {}/step".format(per_step, unit)
    return model, batch


def fmt_ago(unix_s, now=None):
    """'3s ago', '4m ago', '2h ago'; '-' for never."""
    if not unix_s:
        return "-"
    ago = max((now if now is not None else time.time()) - unix_s, 0)
    for div, unit in ((86400, "d"), (3600, "h"), (60, "m")):
        if ago >= div:
            return "%d%s ago" % (ago // div, unit)
    return "%ds ago" % ago


def worker_rows(workers, now=None):
    """The ranks as a table: a header and one row each."""
    rows = [("RANK", "HOST", "DEVICE", "INCARNATION", "STEP", "SESSION",
             "LAST HEARD")]
    for w in workers:
        rows.append(("%d" % w.rank, w.hostname or "-", w.device or "-",
                     w.incarnation or "-", "%d" % w.step,
                     "connected" if w.connected else "closed",
                     fmt_ago(w.last_heartbeat_unix_s, now)))
    return rows


def _table(rows, indent=""):
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        _out(indent + "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())


def _loss_text(job, events):
    """The loss, or for a diverged one what the job's events say about it
    ("NaN: loss became NaN at step 12")."""
    if math.isfinite(job.loss):
        return "%.4f" % job.loss
    said = [e.message for e in events if e.kind == "diverged"]
    name = "NaN" if math.isnan(job.loss) else ("inf" if job.loss > 0 else "-inf")
    return name + (": " + said[-1] if said else " (training diverged)")


def cmd_status(client, args):
    status = client.get(args.job)
    job, events = status
    total = job.spec.train.steps
    model, batch = _describe_spec(job.spec, job)
    rows = [
        ("job", job.id),
        ("state", state_name(job.state)),
        ("step", "%d/%d" % (job.step, total)),
        ("loss", _loss_text(job, events) if job.step > 0 else "-"),
        ("schedule", "v%d" % job.schedule_version if job.schedule_version
         else "baseline (v0)"),
        ("bought", describe_outcome(job)),
        ("submitted", fmt_time(job.submitted_unix_s, with_date=True)),
    ]
    if job.owner:
        rows.append(("owner", job.owner))
    if job.restarts:
        rows.append(("restarts", "%d of %d" % (
            job.restarts, job.spec.restart.max_restarts)))
    if job.loss_scale or job.skipped_steps:
        rows.append(("loss scale", "%g, %d step%s skipped (a gradient held "
                     "inf or NaN)" % (job.loss_scale, job.skipped_steps,
                                      "" if job.skipped_steps == 1 else "s")))
    if job.submitted_world_size:
        rows.append(("world", "%d ranks, resumed smaller: submitted with %d "
                     "(restart.min_world %d)" % (
                         job.spec.parallel.world_size,
                         job.submitted_world_size,
                         job.spec.restart.min_world)))
    if job.state == job_pb2.JOB_STATE_PENDING:
        rows.append(("waiting", describe_waiting(job)))
    if job.error:
        rows.append(("error", job.error))
    rows += [("model", model), ("batch", batch),
             ("zero", "stage %d" % job.spec.parallel.zero_stage),
             ("plan", "passes " + ", ".join(job.spec.optimize.passes)
              if job.spec.optimize.passes
              else "policy " + (job.spec.optimize.policy or "tandem"))]
    for k, v in rows:
        _out("%-10s %s" % (k, v))
    if args.spec:
        _out("spec:")
        for line in spec_mod.spec_to_yaml(job.spec).splitlines():
            _out("  " + line)
    if status.workers:
        _out("workers:")
        _table(worker_rows(status.workers), indent="  ")
    else:
        _out("workers:   none registered yet")
    n = max(args.events, 0)
    shown = events[-n:] if n else []
    if len(shown) < len(events):
        _out("events (the last %d of %d; --events N for more):" %
             (len(shown), len(events)))
    else:
        _out("events:")
    for e in shown:
        _out("  " + event_line(e))
    return EXIT_OK


def cmd_list(client, args):
    states = []
    for s in args.state or []:
        states += [x for x in s.split(",") if x.strip()]
    jobs = client.list(states=states, limit=args.limit)
    if not jobs:
        _out("no jobs" + (" in state %s" % ", ".join(states) if states else ""))
        return EXIT_OK
    rows = [("JOB", "STATE", "STEP", "SCHEDULE", "SUBMITTED")]
    for j in jobs:
        rows.append((j.id, state_name(j.state),
                     "%d/%d" % (j.step, j.spec.train.steps),
                     "v%d" % j.schedule_version,
                     fmt_time(j.submitted_unix_s, with_date=True)))
    _table(rows)
    return EXIT_OK


def cmd_cancel(client, args):
    job = client.cancel(args.job, reason=args.reason)
    _out("job %s %s%s" % (job.id, state_name(job.state),
                          ": " + job.error if job.error else ""))
    return EXIT_OK


def cmd_reoptimize(client, args):
    version = client.reoptimize(args.job, reason=args.reason)
    _out("job %s: re-plan requested; schedule v%d will be planned next" %
         (args.job, version))
    return EXIT_OK


def cmd_schedule(client, args):
    if args.explain:
        e = client.explain(args.job, version=args.version)
        _out("# schedule v%d of job %s: %d decisions" %
             (e.version, args.job, len(e.decisions)))
        sys.stdout.write(e.text if e.text.endswith("\n") else e.text + "\n")
        return EXIT_OK
    result = client.schedule(args.job, version=args.version)
    text = result.text
    sys.stdout.write(text if text.endswith("\n") else text + "\n")
    return EXIT_OK


def merge_timelines(timelines):
    """One Chrome trace of every rank's latest iteration: each rank is a
    process (pid = rank) with its compute, communication and copy
    streams."""
    events, ranks = [], {}
    for t in timelines:
        trace = json.loads(t.trace_json)
        events.extend(trace.get("traceEvents", []))
        info = dict(trace.get("otherData", {}))
        info.update(step=t.step, schedule_version=t.schedule_version)
        ranks[str(t.rank)] = info
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "otherData": {"ranks": ranks}}


def cmd_timeline(client, args):
    timelines = client.timeline(args.job, ranks=args.rank)
    merged = merge_timelines(timelines)
    with open(args.output, "w") as f:
        json.dump(merged, f)
    steps = ", ".join("rank %d: step %d (schedule v%d)" %
                      (t.rank, t.step, t.schedule_version) for t in timelines)
    _out("wrote %d trace events to %s (%s)" %
         (len(merged["traceEvents"]), args.output, steps))
    _out("  open it in https://ui.perfetto.dev or chrome://tracing")
    return EXIT_OK


def cmd_report(client, args):
    html = client.report(args.job)
    # Replaced only once the whole page is written.
    tmp = args.output + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(html)
    os.replace(tmp, args.output)
    _out("wrote the report of job %s to %s (%s)" %
         (args.job, args.output, fmt_bytes(len(html.encode("utf-8")))))
    _out("  open it in a browser: one page, no script, nothing fetched")
    return EXIT_OK


def cmd_launch(client, args):
    from tandem import launch as launch_mod
    if args.nproc < 1:
        raise TandemError("--nproc must be >= 1, got %d" % args.nproc)
    if bool(args.spec) == bool(args.job):
        raise TandemError("give a job spec to submit, or --job JOB to join "
                          "one, not %s" % ("both" if args.spec else "neither"))
    worker = launch_mod.find_worker(args.worker)
    if args.log_dir:
        launch_mod.make_log_dir(args.log_dir)  # before a job is submitted
    if args.job:
        job, _ = client.get(args.job)
        if is_terminal(job.state):
            raise TandemError("job %s already ended %s; submit a new one" %
                              (job.id, state_name(job.state)),
                              code=grpc.StatusCode.FAILED_PRECONDITION)
        # Ranks are the coordinator's to assign: other hosts may join too.
        assign_ranks = False
        what = "joining job %s (world %d)" % (job.id,
                                               job.spec.parallel.world_size)
    else:
        spec = spec_mod.load_spec_file(args.spec)
        world = spec.parallel.world_size
        if world == 0:
            spec.parallel.world_size = args.nproc
        elif world != args.nproc:
            raise TandemError(
                "%s: parallel.world_size is %d but --nproc is %d; launch "
                "--nproc %d here, or start the other ranks on other hosts "
                "with `tandem launch --nproc N --job JOB`"
                % (args.spec, world, args.nproc, world))
        job = client.submit(spec)
        assign_ranks = True
        what = "submitted job %s" % job.id
    log_dir = args.log_dir or os.path.join("tandem-logs", job.id)
    workers = launch_mod.LocalWorkers(
        worker, client.address, job.id, args.nproc, log_dir,
        ranks=assign_ranks, threads=args.threads,
        join_secret=client.join_secret(job.id), tls_ca=client.tls_ca)
    _out("%s; started %d workers (%s), logs in %s" %
         (what, args.nproc, worker, launch_mod.describe_logs(workers)))
    sys.stdout.flush()
    run = launch_mod.Launch(client, job.id, workers, _out,
                            max_restarts=job.spec.restart.max_restarts)
    run.install_signal_handlers()
    run.start_monitor()
    try:
        code = watch_job(client, job.id, args)
    finally:
        run.stop_monitor()
        workers.wait(launch_mod.STOP_GRACE_S)
    if run.failure:
        _err(run.failure)
        return EXIT_ERROR
    if run.signals:
        return 128 + run.signals[0]
    return code


def cmd_watch(client, args):
    return watch_job(client, args.job, args)


def watch_job(client, job_id, args):
    """Follows a job to its end; reconnects (replaying missed events) when
    the coordinator goes away for less than --reconnect-s."""
    view = ProgressView(verbose=getattr(args, "verbose", False))
    last_seq = 0
    job = None
    lost_since = None
    while True:
        try:
            for job, event in client.watch(job_id, after_seq=last_seq):
                lost_since = None
                if event is not None:
                    last_seq = max(last_seq, event.seq)
                    view.event(job, event)
                else:
                    view.update(job)
            if job is not None and is_terminal(job.state):
                break
            raise TandemError("the watch stream ended early",
                              code=grpc.StatusCode.UNAVAILABLE)
        except TandemError as e:
            retriable = e.code in (grpc.StatusCode.UNAVAILABLE,
                                   grpc.StatusCode.CANCELLED)
            if job is None or not retriable or args.reconnect_s <= 0:
                view.finish()
                raise
            now = time.monotonic()
            if lost_since is None:
                lost_since = now
                view.note("lost the coordinator at %s; reconnecting for up "
                          "to %gs" % (client.address, args.reconnect_s))
            elif now - lost_since > args.reconnect_s:
                view.finish()
                raise
            time.sleep(0.5)
    view.finish()
    if job.state == job_pb2.JOB_STATE_SUCCEEDED:
        _out("job %s SUCCEEDED after %d steps" % (job.id, job.step))
        return EXIT_OK
    _err("job %s %s%s" % (job.id, state_name(job.state),
                          ": " + job.error if job.error else ""))
    return EXIT_ERROR


# ---------------------------------------------------------------- export

def _load_build(target):
    """Calls FILE.py:FUNCTION and returns what it returns."""
    import importlib.util
    import os

    path, sep, fn_name = target.rpartition(":")
    if not sep or not path or not fn_name:
        raise TandemError("expected FILE.py:FUNCTION (e.g. my_model.py:build), "
                          "got %r" % target)
    if not os.path.isfile(path):
        raise TandemError("%s: no such file (from %r)" % (path, target))
    directory = os.path.dirname(os.path.abspath(path))
    if directory not in sys.path:
        sys.path.insert(0, directory)
    mod_name = "tandem_user_model_" + "".join(
        c if c.isalnum() else "_" for c in os.path.basename(path)[:-3])
    spec = importlib.util.spec_from_file_location(mod_name, path)
    if spec is None:
        raise TandemError("%s is not a Python file" % path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[mod_name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as e:  # noqa: BLE001 -- the user's own code
        raise _UserCodeError("importing %s failed" % path, e)
    fn = getattr(module, fn_name, None)
    if not callable(fn):
        names = sorted(n for n, v in vars(module).items()
                       if callable(v) and not n.startswith("_") and
                       getattr(v, "__module__", None) == mod_name)
        raise TandemError("%s has no function %r%s" % (
            path, fn_name,
            " (it has: %s)" % ", ".join(names[:12]) if names else ""))
    try:
        return fn()
    except Exception as e:  # noqa: BLE001 -- the user's own code
        raise _UserCodeError("%s() in %s failed" % (fn_name, path), e)


class _UserCodeError(Exception):
    def __init__(self, what, error):
        import traceback
        frames = traceback.extract_tb(error.__traceback__)
        where = ""
        if frames:
            fr = frames[-1]
            where = "\n  at %s:%d: %s" % (fr.filename, fr.lineno,
                                          (fr.line or "").strip())
        super().__init__("%s: %s: %s%s" % (what, type(error).__name__, error,
                                           where))


def _parse_dynamic(values):
    dims = {}
    for value in values or []:
        for item in value.split(","):
            item = item.strip()
            if not item:
                continue
            name, sep, dim = item.rpartition(":")
            if not sep or not name or not dim.lstrip("-").isdigit():
                raise TandemError("--dynamic takes NAME:DIM[,NAME:DIM...] "
                                  "(e.g. input_ids:1,labels:1), got %r" % item)
            dims.setdefault(name, []).append(int(dim))
    return dims


def _parse_input_ranges(values):
    ranges = {}
    for value in values or []:
        name, sep, span = value.partition("=")
        low, sep2, high = span.partition(":")
        try:
            if not (sep and sep2 and name):
                raise ValueError
            ranges[name.strip()] = (int(low), int(high))
        except ValueError:
            raise TandemError("--input-range takes NAME=LOW:HIGH (e.g. "
                              "labels=0:9), got %r" % value)
    return ranges


def _resolve_wrap(module, names):
    classes = {}
    for m in module.modules():
        c = type(m)
        for key in (c.__name__, c.__qualname__,
                    "%s.%s" % (c.__module__, c.__qualname__)):
            classes.setdefault(key, c)
    out = []
    for name in names.split(","):
        name = name.strip()
        if not name:
            continue
        if name not in classes:
            known = sorted({c.__name__ for c in classes.values()})
            raise TandemError("--wrap %s: the model has no module of class "
                              "%r; its classes: %s" %
                              (names, name, ", ".join(known[:20])))
        out.append(classes[name])
    if not out:
        raise TandemError("--wrap takes class names, e.g. --wrap Block")
    return out


def cmd_export(args):
    import os

    try:
        from tandem import export as export_mod
    except ImportError as e:
        raise TandemError("tandem export needs PyTorch (%s); run it with "
                          "Debian's /usr/bin/python3 and python3-torch" % e)
    built = _load_build(args.target)
    batch = None
    if isinstance(built, tuple):
        if len(built) != 2:
            raise TandemError("%s returned a tuple of %d; return the module, "
                              "or (module, example_batch)" %
                              (args.target, len(built)))
        built, batch = built
    if args.example_batch:
        try:
            with open(args.example_batch, "rb") as f:
                data = f.read()
        except OSError as e:
            raise TandemError("cannot read --example-batch %s: %s" %
                              (args.example_batch, e.strerror or e))
        batch = export_mod.read_safetensors(data, args.example_batch)
    if batch is None:
        raise TandemError("%s returned only the module; pass --example-batch "
                          "FILE (a safetensors file of the named tensors "
                          "forward takes), or return (module, example_batch)"
                          % args.target)
    wrap = None
    if args.wrap:
        wrap = _resolve_wrap(built, args.wrap)
    elif args.wrap_min_params is not None:
        wrap = args.wrap_min_params
    manifest = export_mod.export(
        built, batch, wrap=wrap, path=args.output, name=args.name,
        dynamic_dims=_parse_dynamic(args.dynamic) or None,
        input_ranges=_parse_input_ranges(args.input_range) or None,
        source=args.target)
    _out(export_mod.describe(manifest, args.output,
                             os.path.getsize(args.output)))
    return EXIT_OK


def run_export(args):
    try:
        return cmd_export(args)
    except _UserCodeError as e:
        _err(str(e))
        return EXIT_ERROR
    except TandemError as e:
        _err(e.message)
        return EXIT_USAGE if getattr(e, "usage", True) else EXIT_ERROR
    except KeyboardInterrupt:
        sys.stdout.write("\n")
        return EXIT_INTERRUPTED


# ---------------------------------------------------------------- weights

def run_export_weights(args):
    """`tandem export-weights`: reads the checkpoint files itself (pure
    Python, tandem.weights); the coordinator is asked only for a job id's
    checkpoint.dir."""
    from tandem import weights

    # The coordinator is reached through tandem.Client, which reads these.
    if getattr(args, "token", None):
        os.environ["TANDEM_TOKEN"] = args.token
    if getattr(args, "tls_ca", None):
        os.environ["TANDEM_TLS_CA"] = args.tls_ca
    try:
        summary = weights.export_weights(
            args.source, args.output, step=args.step,
            verify=not args.no_verify,
            coordinator=args.coordinator or default_address(),
            timeout=args.timeout)
    except TandemError as e:
        _err(e.message)
        return EXIT_ERROR
    except KeyboardInterrupt:
        sys.stdout.write("\n")
        return EXIT_INTERRUPTED
    _out(weights.describe(summary))
    return EXIT_OK


# ---------------------------------------------------------------- parser

class _Parser(argparse.ArgumentParser):
    def error(self, message):
        self.print_usage(sys.stderr)
        self.exit(EXIT_USAGE, "%s: error: %s\n" % (self.prog, message))


def build_parser():
    # --coordinator and --timeout work before or after the command; given
    # after it, they override.
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--coordinator", metavar="ADDR",
                        default=argparse.SUPPRESS,
                        help="coordinator address HOST:PORT (default: "
                             "$TANDEM_COORDINATOR or 127.0.0.1:50051)")
    common.add_argument("--timeout", type=float, metavar="S",
                        default=argparse.SUPPRESS,
                        help="seconds to wait for each call (default 30)")
    common.add_argument("--token", metavar="TOKEN", default=argparse.SUPPRESS,
                        help="bearer token for a coordinator that "
                             "authenticates (default: $TANDEM_TOKEN)")
    common.add_argument("--tls-ca", metavar="PEM", default=argparse.SUPPRESS,
                        help="reach the coordinator over TLS, trusting this "
                             "CA (default: $TANDEM_TLS_CA)")

    p = _Parser(prog="tandem",
                description="Submit, watch and steer tandem training jobs.",
                epilog="Exit status: 0 ok; 1 coordinator error, unreachable "
                       "coordinator, or watched job FAILED/CANCELLED; "
                       "2 usage error or bad job spec file.")
    p.add_argument("--coordinator", metavar="ADDR", default=None,
                   help="coordinator address HOST:PORT (default: "
                        "$TANDEM_COORDINATOR or 127.0.0.1:50051)")
    p.add_argument("--timeout", type=float, metavar="S", default=30.0,
                   help="seconds to wait for each call (default 30)")
    p.add_argument("--token", metavar="TOKEN", default=None,
                   help="bearer token for a coordinator that authenticates "
                        "(default: $TANDEM_TOKEN)")
    p.add_argument("--tls-ca", metavar="PEM", default=None,
                   help="reach the coordinator over TLS, trusting this CA "
                        "(default: $TANDEM_TLS_CA)")
    sub = p.add_subparsers(dest="command", metavar="COMMAND",
                           parser_class=_Parser)

    def add(name, fn, help_text):
        sp = sub.add_parser(name, parents=[common], help=help_text,
                            description=help_text)
        sp.set_defaults(fn=fn)
        return sp

    def add_watch_flags(sp):
        sp.add_argument("--reconnect-s", type=float, default=60.0,
                        metavar="S",
                        help="keep retrying this long when the coordinator "
                             "goes away (default 60; 0: give up at once)")
        sp.add_argument("--verbose", "-v", action="store_true",
                        help="print each event whole (the planner's passes, "
                             "calibration and runner-up); default: its "
                             "first clause")

    sp = add("submit", cmd_submit, "submit a job from a YAML job spec")
    sp.add_argument("spec", metavar="job.yaml", help="YAML job spec")
    sp.add_argument("--watch", "-w", action="store_true",
                    help="then watch it to the end")
    sp.add_argument("--quiet", "-q", action="store_true",
                    help="print only the job id")
    add_watch_flags(sp)

    sp = add("status", cmd_status, "show a job and its events")
    sp.add_argument("job", metavar="JOB")
    sp.add_argument("--spec", action="store_true",
                    help="also print the full job spec, defaults applied")
    sp.add_argument("--events", type=int, metavar="N", default=20,
                    help="show the last N events (default 20; 0: none)")

    sp = add("launch", cmd_launch,
             "like torchrun for one host: submit a job spec (or join --job), "
             "start N local tandem-worker processes with their ranks and "
             "logs, follow the job to its end, and forward Ctrl-C and "
             "SIGTERM to the workers")
    sp.add_argument("spec", metavar="job.yaml", nargs="?",
                    help="the job spec to submit (its parallel.world_size, "
                         "if set, must equal --nproc)")
    sp.add_argument("--nproc", type=int, required=True, metavar="N",
                    help="worker processes to start here (LOCAL_RANK 0..N-1)")
    sp.add_argument("--job", metavar="JOB",
                    help="join this job instead of submitting one (the "
                         "coordinator assigns the ranks)")
    sp.add_argument("--worker", metavar="PATH",
                    help="the tandem-worker binary (default: "
                         "$TANDEM_WORKER, PATH, then the source tree's "
                         "build/worker/tandem-worker)")
    sp.add_argument("--log-dir", metavar="DIR",
                    help="rankR.log (stderr) and rankR.out (a JSON line per "
                         "step) per worker (default: tandem-logs/JOB)")
    sp.add_argument("--threads", type=int, default=0, metavar="N",
                    help="compute threads per worker (default: libtorch's)")
    add_watch_flags(sp)

    sp = add("watch", cmd_watch,
             "follow a job until it ends (exit 0 if it SUCCEEDED, 1 if it "
             "FAILED or was CANCELLED)")
    sp.add_argument("job", metavar="JOB")
    add_watch_flags(sp)

    sp = add("list", cmd_list, "list jobs, newest first")
    sp.add_argument("--state", action="append", metavar="S",
                    help="only jobs in this state (PENDING, RUNNING, "
                         "SUCCEEDED, FAILED, CANCELLED); repeat or "
                         "comma-separate for several")
    sp.add_argument("--limit", type=int, default=100,
                    help="at most this many (default 100)")

    sp = add("join-secret", cmd_join_secret,
             "print a job's join secret: what its workers present to a "
             "coordinator that authenticates (tandem-worker "
             "--join-secret-file, or $TANDEM_JOIN_SECRET); only the job's "
             "owner or an admin gets it")
    sp.add_argument("job", metavar="JOB")

    sp = add("cancel", cmd_cancel, "cancel a job")
    sp.add_argument("job", metavar="JOB")
    sp.add_argument("--reason", default="", help="recorded with the job")

    sp = add("reoptimize", cmd_reoptimize,
             "re-plan a running job now, drift or not")
    sp.add_argument("job", metavar="JOB")
    sp.add_argument("--reason", default="", help="recorded as an event")

    sp = add("schedule", cmd_schedule, "print a schedule in its text form")
    sp.add_argument("job", metavar="JOB")
    sp.add_argument("--version", type=int, default=None,
                    help="schedule version: 0 is the baseline every job "
                         "starts on (default: the active one)")
    sp.add_argument("--explain", action="store_true",
                    help="print the planner's decisions instead: what each "
                    "decided, the pass, its simulated gain and cost, and "
                    "what binds it")

    sp = add("timeline", cmd_timeline,
             "write the latest iteration of each rank as a Chrome/Perfetto "
             "trace (compute, communication and copy streams)")
    sp.add_argument("job", metavar="JOB")
    sp.add_argument("-o", "--output", required=True, metavar="FILE",
                    help="trace file to write (JSON trace events)")
    sp.add_argument("--rank", type=int, action="append", metavar="R",
                    help="only this rank (repeat for several; default all)")

    sp = add("report", cmd_report,
             "write the job's report as one HTML file: loss and iteration "
             "time by step, predicted against measured per schedule "
             "version, overlap per rank, memory against the budget, one "
             "iteration's streams, and the planner's decisions")
    sp.add_argument("job", metavar="JOB")
    sp.add_argument("-o", "--output", required=True, metavar="FILE",
                    help="the HTML file to write (replaced only on success)")

    sp = sub.add_parser(
        "export", help="capture a PyTorch model into a model archive",
        description="Capture a torch.nn.Module into a model archive the "
                    "workers run (client/README.md, \"Exporting your own "
                    "model\"). Needs PyTorch; no coordinator.")
    sp.set_defaults(fn=None, export=True)
    sp.add_argument("target", metavar="FILE.py:FUNCTION",
                    help="a function returning the module, or (module, "
                         "example_batch)")
    sp.add_argument("-o", "--output", required=True, metavar="FILE",
                    help="the archive to write (replaced only on success)")
    sp.add_argument("--example-batch", metavar="FILE",
                    help="a safetensors file of the named tensors forward "
                         "takes (default: the batch FUNCTION returns)")
    group = sp.add_mutually_exclusive_group()
    group.add_argument("--wrap", metavar="CLASS,...",
                       help="each module of these classes is a unit "
                            "(default: every block of an nn.ModuleList or "
                            "nn.Sequential)")
    group.add_argument("--wrap-min-params", type=int, metavar="N",
                       help="the smallest modules with at least N params "
                            "are units")
    sp.add_argument("--dynamic", action="append", metavar="NAME:DIM,...",
                    help="dims that vary from batch to batch (default: every "
                         "dim >= 1 of every input; dim 0 always varies)")
    sp.add_argument("--input-range", action="append", metavar="NAME=LOW:HIGH",
                    help="the values data.kind synthetic draws for an "
                         "integer input, both included (default: the "
                         "example batch's smallest and largest), e.g. "
                         "labels=0:9")
    sp.add_argument("--name", help="the model's name (default: its class)")

    sp = sub.add_parser(
        "export-weights", parents=[common],
        help="write a checkpoint's full weights as one safetensors file",
        description="Write the full, unsharded weights of a job's checkpoint "
                    "as one safetensors file (Hugging Face names for the "
                    "built-in models). Reads the checkpoint files itself: "
                    "run it where the workers' shared checkpoint directory "
                    "is readable. No torch needed; the coordinator is asked "
                    "only for a job id's checkpoint.dir.")
    sp.set_defaults(fn=None, export_weights=True)
    sp.add_argument("source", metavar="JOB_OR_CHECKPOINT",
                    help="a job's checkpoint.dir (its newest complete "
                         "checkpoint), one of its step-NNNNNNNN directories, "
                         "or a job id")
    sp.add_argument("-o", "--output", required=True, metavar="FILE",
                    help="the safetensors file to write (replaced only on "
                         "success)")
    sp.add_argument("--step", type=int, metavar="N",
                    help="the checkpoint taken after N steps (default: the "
                         "newest complete one)")
    sp.add_argument("--no-verify", action="store_true",
                    help="skip the rank files' checksums (lengths and "
                         "structure are still checked); checksumming runs "
                         "at about 100 MB/s per CPU")
    return p


def main(argv=None):
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "export", False):
        return run_export(args)
    if getattr(args, "export_weights", False):
        if args.timeout is not None and args.timeout <= 0:
            parser.error("--timeout must be > 0")
        return run_export_weights(args)
    if not getattr(args, "fn", None):
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    if args.timeout is not None and args.timeout <= 0:
        parser.error("--timeout must be > 0")
    try:
        client = Client(args.coordinator or default_address(),
                        timeout=args.timeout, token=args.token,
                        tls_ca=args.tls_ca)
    except TandemError as e:
        _err(e.message)
        return EXIT_USAGE
    try:
        return args.fn(client, args)
    except TandemError as e:
        _err(e.message)
        # Found before any call (a bad spec file, an unknown state): usage.
        return EXIT_USAGE if e.code is None else EXIT_ERROR
    except KeyboardInterrupt:
        sys.stdout.write("\n")
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        sys.stderr.close()  # `tandem list | head`: nothing more to say
        return EXIT_OK
    finally:
        client.close()
