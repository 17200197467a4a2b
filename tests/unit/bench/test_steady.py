"""bench/drift/steady.py's stop_processes: workers and the coordinator end,
one that ignores SIGTERM too (killed after its grace)."""

import os
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "..", "bench", "drift"))
import steady  # noqa: E402


def test_stop_processes_ends_workers_and_coordinator(monkeypatch):
    stubborn = ("import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                "print('ready', flush=True); time.sleep(60)")
    workers = [subprocess.Popen(["sleep", "60"]),
               subprocess.Popen([sys.executable, "-c", stubborn], stdout=subprocess.PIPE)]
    workers[1].stdout.readline()  # its handler is in place
    coord = subprocess.Popen(["sleep", "60"])
    done = subprocess.Popen(["true"])
    done.wait()
    # A short grace, so the stubborn worker is killed quickly.
    real_wait = subprocess.Popen.wait
    monkeypatch.setattr(subprocess.Popen, "wait",
                        lambda self, timeout=None: real_wait(self, None if timeout is None
                                                             else min(timeout, 1)))
    start = time.monotonic()
    steady.stop_processes(workers + [done], coord)
    assert time.monotonic() - start < 10
    assert workers[0].returncode == -signal.SIGTERM
    assert workers[1].returncode == -signal.SIGKILL
    assert coord.returncode == -signal.SIGTERM
