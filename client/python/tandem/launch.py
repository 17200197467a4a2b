"""``tandem launch``: torchrun for one host. Submits a job (or joins one with
``--job``), starts N local ``tandem-worker`` processes with their ranks,
``LOCAL_RANK`` and a log each, and follows the job like ``tandem watch``.
Ctrl-C or SIGTERM cancels the job ("stopped by tandem launch (SIGINT)"),
and the workers stop when the coordinator tells them; the workers die with
the launcher, whatever ends it (client/README.md, "Launch on one host").

Needs no torch: it runs the C++ worker binary."""

import os
import pathlib
import queue
import shutil
import signal
import subprocess
import threading
import time

from tandem.client import is_terminal
from tandem.errors import TandemError

# How long the workers get to stop on their own once the job ended (the
# coordinator tells them) or a signal was forwarded, before SIGKILL.
STOP_GRACE_S = 30.0

# How long a relaunch decision waits for an unreachable coordinator (one
# restarting, or the client's channel still backing off after it came back)
# before it starts the workers anyway: they wait for the coordinator
# themselves, and a job that ended turns them away.
COORDINATOR_PATIENCE_S = 30.0

# How long a cancel on Ctrl-C may take before the launcher stops the workers
# itself (SIGTERM: they tell the coordinator, which fails the job).
CANCEL_PATIENCE_S = 10.0

_TRANSIENT = ("UNAVAILABLE", "DEADLINE_EXCEEDED")


class _Spawner:
    """Starts every worker process from one thread that lives as long as the
    launcher. Each worker asks the kernel for SIGHUP when its parent goes
    (tandem-worker --exit-with-parent, PR_SET_PDEATHSIG), and the kernel
    means the thread that forked it: a worker started again from the
    monitor thread would otherwise be hung up on when that thread ends."""

    def __init__(self):
        self._requests = queue.Queue()
        threading.Thread(target=self._loop, name="tandem-spawner",
                         daemon=True).start()

    def _loop(self):
        while True:
            start, done, finished = self._requests.get()
            try:
                done.append((start(), None))
            except BaseException as e:  # handed to the caller
                done.append((None, e))
            finished.set()

    def run(self, start):
        """start() on the spawner's thread; its result, or its exception."""
        done, finished = [], threading.Event()
        self._requests.put((start, done, finished))
        finished.wait()
        result, error = done[0]
        if error is not None:
            raise error
        return result


_SPAWNER = None


def _spawner():
    global _SPAWNER
    if _SPAWNER is None:
        _SPAWNER = _Spawner()
    return _SPAWNER


def find_worker(explicit=None):
    """The tandem-worker binary: --worker, else $TANDEM_WORKER, else
    tandem-worker on PATH, else the source tree's build (build/worker/,
    or $TANDEM_BUILD_DIR/worker/). TandemError saying where it looked."""
    tried = []
    candidates = []
    if explicit:
        candidates.append(("--worker", explicit))
    elif os.environ.get("TANDEM_WORKER"):
        candidates.append(("$TANDEM_WORKER", os.environ["TANDEM_WORKER"]))
    else:
        on_path = shutil.which("tandem-worker")
        if on_path:
            candidates.append(("PATH", on_path))
        repo = pathlib.Path(__file__).resolve().parents[3]
        build = os.environ.get("TANDEM_BUILD_DIR")
        build = pathlib.Path(build) if build else repo / "build"
        if not build.is_absolute():
            build = repo / build
        candidates.append(("the build", str(build / "worker" /
                                            "tandem-worker")))
    for source, path in candidates:
        if os.path.isfile(path) and os.access(path, os.X_OK):
            return path
        tried.append("%s (%s)" % (path, source))
    raise TandemError("no tandem-worker binary at %s: pass --worker PATH, set "
                      "TANDEM_WORKER, or put tandem-worker on PATH"
                      % ", ".join(tried))


def make_log_dir(log_dir):
    """Creates the workers' log directory; TandemError saying what to do."""
    path = pathlib.Path(log_dir)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise TandemError("cannot make the log directory %s: %s; pass "
                          "another --log-dir" % (log_dir, e.strerror or e)
                          ) from None
    return path


class LocalWorkers:
    """N tandem-worker processes of one job on this host: rank r (when
    given) with LOCAL_RANK=r, stdout (a JSON line per step) to
    LOG_DIR/rankR.out and stderr to LOG_DIR/rankR.log. Each runs in a
    process group of its own, so a Ctrl-C at the terminal reaches only the
    launcher, which cancels the job; and each exits when the launcher does
    (``--exit-with-parent``: SIGHUP from the kernel, which the worker reports
    to the coordinator), so a killed launcher leaves no worker behind."""

    def __init__(self, worker, address, job_id, nproc, log_dir, ranks=True,
                 threads=0, extra_args=(), join_secret="", tls_ca=None):
        """``join_secret``: the job's, for an authenticating coordinator
        (handed over in $TANDEM_JOIN_SECRET, not on the command line, which
        every user of the host can read); ``tls_ca``: the coordinator's CA
        for TLS."""
        self.log_dir = make_log_dir(log_dir)
        self.procs = []
        self._commands = []
        self.launches = []
        self.crashes = []  # exits other than 75, by worker
        for r in range(nproc):
            cmd = [worker, "--coordinator", address, "--job", job_id,
                   "--exit-with-parent"]
            if ranks:
                cmd += ["--rank", str(r)]
            if threads:
                cmd += ["--threads", str(threads)]
            if tls_ca:
                cmd += ["--tls-ca", os.path.abspath(tls_ca)]
            cmd += list(extra_args)
            # The parent the worker checks is still there once it has
            # asked for SIGHUP (the launcher may die before that).
            env = dict(os.environ, LOCAL_RANK=str(r),
                       TANDEM_LAUNCHER_PID=str(os.getpid()))
            env.pop("TANDEM_TOKEN", None)  # the user's; workers never need it
            if join_secret:
                env["TANDEM_JOIN_SECRET"] = join_secret
            # The worker takes RANK/WORLD_SIZE as defaults; these are ours.
            for name in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
                env.pop(name, None)
            self._commands.append((cmd, env))
            self.procs.append(None)
            self.launches.append(0)
            self.crashes.append(0)
            try:
                self._start(r, append=False)
            except TandemError:
                self.signal(signal.SIGKILL)
                raise

    def _start(self, r, append):
        cmd, env = self._commands[r]
        mode = "ab" if append else "wb"
        out = open(self.log_dir / ("rank%d.out" % r), mode)
        err = open(self.log_dir / ("rank%d.log" % r), mode)
        try:
            self.procs[r] = _spawner().run(lambda: subprocess.Popen(
                cmd, stdout=out, stderr=err, env=env, start_new_session=True))
        except OSError as e:
            raise TandemError("cannot start %s: %s" % (cmd[0], e)) from None
        finally:
            out.close()
            err.close()
        self.launches[r] += 1

    def relaunch(self, r):
        """Starts local worker r again (its job restarted), appending to its
        logs."""
        self._start(r, append=True)

    def log_path(self, r):
        return self.log_dir / ("rank%d.log" % r)

    def log_tail(self, r, lines=5):
        try:
            text = self.log_path(r).read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def exited(self):
        """[(local index, exit code)] of the processes that ended."""
        return [(r, p.returncode) for r, p in enumerate(self.procs)
                if p is not None and p.poll() is not None]

    def running(self):
        return sum(p is not None and p.poll() is None for p in self.procs)

    def signal(self, signum):
        for p in self.procs:
            if p is not None and p.poll() is None:
                try:
                    p.send_signal(signum)
                except ProcessLookupError:
                    pass

    def wait(self, timeout):
        """Waits up to `timeout` seconds for every process, then kills the
        rest. Returns their exit codes."""
        deadline = time.monotonic() + timeout
        for p in self.procs:
            if p is None:
                continue
            try:
                p.wait(timeout=max(deadline - time.monotonic(), 0.01))
            except subprocess.TimeoutExpired:
                pass
        for p in self.procs:
            if p is not None and p.poll() is None:
                p.kill()
                p.wait()
        return [p.returncode if p is not None else None for p in self.procs]


# A worker whose job restarts exits with this status (tandem-worker,
# Command KIND_RESTART).
EXIT_RESTART = 75


class Launch:
    """Runs one launch: the workers, a monitor, and signal forwarding. When a
    worker dies before the job ended, the monitor starts it again if the job
    may restart (`max_restarts`, the spec's restart.max_restarts: the
    coordinator restarts the job from its newest checkpoint, and every rank
    exits with status 75 to be started again), and otherwise cancels the
    job (else it would wait for the worker forever)."""

    def __init__(self, client, job_id, workers, out, max_restarts=0):
        self.client = client
        self.job_id = job_id
        self.workers = workers
        self.out = out
        self.max_restarts = max_restarts
        self.signals = []
        self.failure = None
        self._done = threading.Event()
        self._monitor = threading.Thread(target=self._watch_processes,
                                         daemon=True)

    def install_signal_handlers(self):
        """SIGINT or SIGTERM: the job is cancelled, "stopped by tandem
        launch (SIGINT)", and the workers stop when the coordinator tells
        them (the watch then sees the job CANCELLED). When the coordinator
        cannot be told within CANCEL_PATIENCE_S, the workers get SIGTERM
        (they report it, and the job fails). A second signal kills them."""
        def stop(signum, frame):
            self.signals.append(signum)
            name = signal.Signals(signum).name
            if len(self.signals) == 1:
                self.out("%s: cancelling job %s; the %d workers stop when "
                         "the coordinator tells them (again to kill them)"
                         % (name, self.job_id, self.workers.running()))
                threading.Thread(target=self._cancel, args=(name,),
                                 daemon=True).start()
            else:
                self.workers.signal(signal.SIGKILL)
                raise KeyboardInterrupt
        signal.signal(signal.SIGINT, stop)
        signal.signal(signal.SIGTERM, stop)

    def _cancel(self, name):
        reason = "stopped by tandem launch (%s)" % name
        deadline = time.monotonic() + CANCEL_PATIENCE_S
        while True:
            try:
                job, _ = self.client.get(self.job_id)
                if not is_terminal(job.state):
                    self.client.cancel(self.job_id, reason=reason)
                return
            except TandemError as e:
                if e.code_name not in _TRANSIENT or \
                        time.monotonic() >= deadline:
                    self.out("cannot cancel job %s (%s); stopping the "
                             "workers" % (self.job_id, e.message))
                    self.workers.signal(signal.SIGTERM)
                    return
                time.sleep(0.5)

    def start_monitor(self):
        self._monitor.start()

    def stop_monitor(self):
        self._done.set()

    def _relaunch(self, dead):
        """Starts the dead workers again while the job may restart; False
        when it may not (or they used up their launches)."""
        if self.max_restarts <= 0:
            return False
        # A crash counts against the restarts; exit 75 is the coordinator's
        # own order (a restart it counted, or a resume at a smaller world,
        # restart.min_world), so it never exhausts the launches.
        crashes = [r for r, code in dead if code != EXIT_RESTART]
        if any(self.workers.crashes[r] >= self.max_restarts for r in crashes):
            return False
        job = self._job_when_reachable()
        if job is False or (job is not None and is_terminal(job.state)):
            return False
        for r, code in dead:
            if code != EXIT_RESTART:
                self.workers.crashes[r] += 1
            self.out("worker %d exited with code %d%s; starting it again "
                     "(launch %d; the job restarts from its newest "
                     "checkpoint, restart.max_restarts %d)"
                     % (r, code, " (the job restarts)" if code == EXIT_RESTART
                        else "", self.workers.launches[r] + 1,
                        self.max_restarts))
            self.workers.relaunch(r)
        return True

    def _job_when_reachable(self, patience_s=None):
        """The job, retrying while the coordinator is unreachable; None when
        it stayed so for `patience_s` (COORDINATOR_PATIENCE_S), False when
        the coordinator refused the call (an unknown job, no permission)."""
        patience_s = COORDINATOR_PATIENCE_S if patience_s is None \
            else patience_s
        deadline = time.monotonic() + patience_s
        while True:
            try:
                job, _ = self.client.get(self.job_id)
                return job
            except TandemError as e:
                if e.code_name not in _TRANSIENT:
                    return False
                if time.monotonic() >= deadline:
                    self.out("the coordinator is unreachable (%s); starting "
                             "the workers again anyway" % e.message)
                    return None
                if self._done.wait(0.5):
                    return False  # the launch is ending

    def _watch_processes(self):
        while not self._done.wait(0.5):
            if self.signals:
                continue  # they were told to stop
            dead = [(r, code) for r, code in self.workers.exited()
                    if code != 0]
            if not dead:
                continue
            try:
                if self._relaunch(dead):
                    continue
            except TandemError as e:
                self.failure = "cannot start a worker again: %s" % e.message
                return
            r, code = dead[0]
            tail = self.workers.log_tail(r)
            self.failure = (
                "worker %d exited with code %d before the job ended (log: "
                "%s)%s" % (r, code, self.workers.log_path(r),
                           "\n  " + tail.replace("\n", "\n  ") if tail
                           else ""))
            self.workers.signal(signal.SIGTERM)
            try:
                job, _ = self.client.get(self.job_id)
                if not is_terminal(job.state):
                    self.client.cancel(
                        self.job_id,
                        reason="tandem launch: worker %d exited with code "
                        "%d before the job ended" % (r, code))
            except TandemError:
                pass
            return


def describe_logs(workers):
    return "%s/rank{0..%d}.{log,out}" % (workers.log_dir,
                                          len(workers.procs) - 1)
