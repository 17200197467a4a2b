"""Real processes for the end-to-end tests: the built binaries (from the
shared harness, tests/harness/tandem_harness.py), a child process whose
stderr goes to a log file, and polling helpers."""

import re
import subprocess
import urllib.request

import tandem_harness as harness
from tandem_harness import REPO, build_dir, free_port  # noqa: F401

COORDINATOR = build_dir() / "coordinator" / "tandem-coordinator"
WORKER = build_dir() / "worker" / "tandem-worker"


def wait_for(predicate, timeout, what):
    """The harness's wait_for (tests/harness/tandem_harness.py), polling
    every 0.2 s."""
    return harness.wait_for(predicate, timeout=timeout, interval=0.2,
                            what=what)


def http_get(url, timeout=10):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.read().decode()


class Process:
    """A child process whose stderr goes to a log file."""

    def __init__(self, args, log_path, stdout=subprocess.DEVNULL, env=None):
        self.log_path = log_path
        self.proc = subprocess.Popen(
            [str(a) for a in args], stdout=stdout,
            stderr=open(log_path, "w"), env=env)

    def log(self):
        return self.log_path.read_text()[-4000:]

    def wait_log(self, pattern, timeout=30):
        def find():
            if self.proc.poll() is not None:
                raise AssertionError("%s exited: %s" % (self.proc.args[0],
                                                        self.log()))
            m = re.search(pattern, self.log_path.read_text())
            return m
        return wait_for(find, timeout, pattern)

    def stop(self):
        harness.terminate(self.proc)


def start_coordinator(work):
    """A coordinator on free loopback ports with its metrics (and report
    pages) listener: (process, gRPC address, metrics HOST:PORT)."""
    out_path = work / "coordinator.out"
    coordinator = Process(
        [COORDINATOR, "--listen", "127.0.0.1:0", "--db", work / "tandem.db",
         "--metrics-listen", "127.0.0.1:0"],
        work / "coordinator.log", stdout=open(out_path, "w"))
    try:
        out = wait_for(lambda: re.search(
            r"listening on port (\d+), metrics on port (\d+)",
            out_path.read_text()), 20, "coordinator")
    except AssertionError:
        coordinator.stop()
        raise
    return (coordinator, "127.0.0.1:%s" % out.group(1),
            "127.0.0.1:%s" % out.group(2))
