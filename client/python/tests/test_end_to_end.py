"""A job driven to its end by scripted sessions (WorkerService from Python),
and followed by `tandem watch`: on a terminal (progress bar redrawn with
\\r), in plain lines, across a coordinator restart, and to a failure."""

import os
import pty
import re
import subprocess
import sys
import threading
import time

import pytest

import tandem
from tandem_harness import (PY_ROOT, run_cli, small_spec, wait_for, wait_for_state)
from tandem.v1 import job_pb2, worker_service_pb2 as wpb


class Cli:
    """`python3 -m tandem ARGS` running with stdout on a pty (tty=True) or a
    pipe, read as it comes."""

    def __init__(self, args, tty):
        env = dict(os.environ, PYTHONPATH=str(PY_ROOT), COLUMNS="160")
        cmd = [sys.executable, "-m", "tandem"] + [str(a) for a in args]
        if tty:
            self._fd, slave = pty.openpty()
            self.proc = subprocess.Popen(cmd, stdout=slave,
                                         stderr=subprocess.PIPE, env=env)
            os.close(slave)
        else:
            self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE,
                                         stderr=subprocess.PIPE, env=env)
            self._fd = self.proc.stdout.fileno()
        self._chunks = []
        self._reader = threading.Thread(target=self._pump, daemon=True)
        self._reader.start()

    def _pump(self):
        while True:
            try:
                data = os.read(self._fd, 4096)
            except OSError:  # EIO: the child closed the terminal
                break
            if not data:
                break
            self._chunks.append(data)

    def output(self):
        return b"".join(self._chunks).decode(errors="replace")

    def wait_output(self, text, timeout=30):
        """Waits until stdout shows `text` (e.g. the watch is connected)."""
        wait_for(lambda: text in self.output() or self.proc.poll() is not None,
                 timeout=timeout, what="%r from the CLI" % text)
        assert text in self.output(), (self.output(), self.proc.stderr.read())

    def finish(self, timeout=60):
        """Waits for the end; returns (stdout, stderr)."""
        self.proc.wait(timeout=timeout)
        self._reader.join(timeout=5)
        err = self.proc.stderr.read().decode()
        if self.proc.stdout is None:
            os.close(self._fd)
        return self.output(), err

    @property
    def returncode(self):
        return self.proc.returncode


def drive_to_success(workers, steps, delay=0.15):
    """Both ranks report every step (rank 0 last, so the job's step is
    current when the last rank finishes)."""
    for step in range(1, steps + 1):
        time.sleep(delay)
        for w in reversed(workers):
            w.progress(step, loss=4.0 - 0.25 * step, iteration_s=delay)


def test_watch_tty_progress_bar_to_success(coordinator, client,
                                           scripted_sessions):
    steps = 6
    job = client.submit(small_spec(world_size=2, steps=steps))
    cli = Cli(["--coordinator", coordinator.address, "watch", job.id],
              tty=True)
    cli.wait_output("state: PENDING")  # connected
    workers = scripted_sessions(coordinator.address, job.id, 2)
    assert sorted(w.rank for w in workers) == [0, 1]
    wait_for_state(client, job.id, job_pb2.JOB_STATE_RUNNING)
    drive_to_success(workers, steps)
    out, err = cli.finish()
    assert cli.returncode == 0, (out, err)

    final = client.get(job.id).job
    assert final.state == job_pb2.JOB_STATE_SUCCEEDED
    assert final.step == steps and final.loss == pytest.approx(2.5)

    assert "\r" in out  # redrawn in place
    assert "state: RUNNING: all 2 workers registered" in out
    assert "state: SUCCEEDED: all 2 ranks finished %d steps" % steps in out
    assert "job %s SUCCEEDED after %d steps" % (job.id, steps) in out
    # the bar: step/total, loss, tokens/s (2 ranks x 2 x 32 tokens a step at
    # ~6.7 steps/s, so some hundreds), schedule version
    bar = [seg for seg in re.split(r"[\r\n]", out)
           if "step %d/%d" % (steps, steps) in seg]
    assert bar, out
    assert re.search(r"\[#{24}\]", bar[-1])
    assert "loss 2.5000" in bar[-1]
    m = re.search(r"([0-9.]+)(k?) tok/s", bar[-1])
    assert m, bar[-1]
    tps = float(m.group(1)) * (1000 if m.group(2) else 1)
    assert 50 < tps < 5000, bar[-1]
    assert "schedule baseline" in bar[-1]

    # the coordinator told the workers to stop
    wait_for(lambda: all(any(c.kind == wpb.Command.KIND_STOP
                             for c in w.commands()) for w in workers),
             what="a stop command on every rank")


def test_watch_plain_lines_and_python_watch(coordinator, client,
                                            scripted_sessions):
    steps = 4
    job = client.submit(small_spec(world_size=2, steps=steps))
    cli = Cli(["watch", job.id, "--coordinator", coordinator.address],
              tty=False)
    cli.wait_output("state: PENDING")
    updates = []
    follower = threading.Thread(
        target=lambda: updates.extend(client.watch(job.id)), daemon=True)
    follower.start()
    workers = scripted_sessions(coordinator.address, job.id, 2)
    wait_for_state(client, job.id, job_pb2.JOB_STATE_RUNNING)
    drive_to_success(workers, steps, delay=0.3)
    out, err = cli.finish()
    follower.join(10)
    assert cli.returncode == 0, (out, err)
    assert "\r" not in out and "\x1b" not in out
    lines = out.splitlines()
    # the last step comes with RUNNING, or with SUCCEEDED when the final
    # progress and the state change reach the watch together
    assert any(re.match(r"(RUNNING|SUCCEEDED)  step %d/%d \(100%%\)  "
                        r"loss 3\.0000  \S+ tok/s  schedule baseline$" %
                        (steps, steps), l) for l in lines), out
    assert lines[-1] == "job %s SUCCEEDED after %d steps" % (job.id, steps)

    # the Python generator saw the same story
    states = [j.state for j, _ in updates]
    assert states[-1] == job_pb2.JOB_STATE_SUCCEEDED
    steps_seen = sorted({j.step for j, _ in updates})
    assert steps_seen[-1] == steps and len(steps_seen) >= 3
    kinds = [(e.kind, e.message.split(":")[0]) for _, e in updates if e]
    assert [k for k in kinds if k[0] == "state"] == [
        ("state", "PENDING"), ("state", "RUNNING"), ("state", "SUCCEEDED")]
    # While PENDING, what the job waits for as the ranks come: before it
    # runs, and nothing else.
    running = kinds.index(("state", "RUNNING"))
    assert all(k == ("worker", "waiting") for k in kinds[1:running]), kinds
    assert all(k[0] == "state" for k in kinds[running:]), kinds


def test_fatal_worker_error_fails_job_and_watch_exits_1(coordinator, client,
                                                        scripted_sessions):
    job = client.submit(small_spec(world_size=2, steps=10))
    workers = scripted_sessions(coordinator.address, job.id, 2)
    wait_for_state(client, job.id, job_pb2.JOB_STATE_RUNNING)
    workers[0].progress(1, loss=3.0)
    workers[1].send(error=wpb.WorkerError(message="out of memory", fatal=True))
    wait_for_state(client, job.id, job_pb2.JOB_STATE_FAILED)
    r = run_cli("watch", job.id, address=coordinator.address, timeout=30)
    assert r.returncode == 1
    assert "state: FAILED: rank 1 (fake-1): out of memory" in r.stdout
    assert "job %s FAILED: rank 1 (fake-1): out of memory" % job.id in r.stderr
    r = run_cli("status", job.id, address=coordinator.address)
    assert re.search(r"^error\s+rank 1 \(fake-1\): out of memory$", r.stdout,
                     re.M)


def test_watch_reconnects_across_a_coordinator_restart(new_coordinator,
                                                       scripted_sessions):
    coord = new_coordinator()
    address, port = coord.address, coord.port
    with tandem.Client(address, timeout=10) as c:
        job = c.submit(small_spec(world_size=1, steps=3))
    cli = Cli(["--coordinator", address, "watch", job.id, "--reconnect-s",
               "30"], tty=False)
    cli.wait_output("state: PENDING")  # connected
    coord.kill()  # a crash
    time.sleep(1.0)
    coord.start(port=port)  # same port, same --db
    with tandem.Client(address, timeout=10) as c:
        assert c.get(job.id).job.state == job_pb2.JOB_STATE_PENDING
        (w,) = scripted_sessions(address, job.id, 1)
        wait_for_state(c, job.id, job_pb2.JOB_STATE_RUNNING)
        for step in (1, 2, 3):
            w.progress(step, loss=1.0)
            time.sleep(0.1)
        wait_for_state(c, job.id, job_pb2.JOB_STATE_SUCCEEDED)
    out, err = cli.finish()
    assert cli.returncode == 0, (out, err)
    assert "lost the coordinator at %s; reconnecting" % address in out
    assert out.count("state: PENDING") == 1  # no event printed twice
    assert "state: RUNNING" in out and "state: SUCCEEDED" in out


def test_watch_gives_up_when_the_coordinator_stays_away(new_coordinator):
    coord = new_coordinator()
    with tandem.Client(coord.address, timeout=10) as c:
        job = c.submit(small_spec(world_size=1, steps=3))
    cli = Cli(["--coordinator", coord.address, "watch", job.id,
               "--reconnect-s", "1"], tty=False)
    cli.wait_output("state: PENDING")
    coord.kill()
    out, err = cli.finish(timeout=30)
    assert cli.returncode == 1
    assert "reconnecting for up to 1s" in out
    assert "cannot reach the tandem coordinator at %s" % coord.address in err


def test_launch_relaunch_waits_out_a_coordinator_restart(new_coordinator):
    """`tandem launch` deciding whether to start a dead worker again asks the
    coordinator for the job; one that is restarting (and the client's
    channel backing off after it) is waited for, not taken for a "no"."""
    from tandem.launch import Launch

    coord = new_coordinator()
    address, port = coord.address, coord.port
    with tandem.Client(address, timeout=10) as c:
        job = c.submit(small_spec(world_size=1, steps=3))
        said = []
        launch = Launch(c, job.id, workers=None, out=said.append,
                        max_restarts=1)
        coord.kill()
        restarter = threading.Timer(2.0, lambda: coord.start(port=port))
        restarter.start()
        t0 = time.monotonic()
        got = launch._job_when_reachable(patience_s=30)
        restarter.join()
        assert got is not None and got is not False, said
        assert got.id == job.id and time.monotonic() - t0 >= 1.5
        # Away for longer than the patience: relaunch anyway (None).
        coord.kill()
        assert launch._job_when_reachable(patience_s=1) is None
        assert "the coordinator is unreachable" in said[-1]
        coord.start(port=port)
        # A refusal is an answer: no relaunch.
        other = Launch(c, "no-such-job", workers=None, out=said.append,
                       max_restarts=1)
        assert other._job_when_reachable(patience_s=5) is False
