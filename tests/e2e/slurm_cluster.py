"""A real Slurm cluster on this machine, for the launcher's end-to-end tests.

munged, slurmctld and two slurmd daemons run as root in the foreground
(no systemd), with proctrack/linuxproc and task/none, all state under one
temporary directory and free loopback ports. The two nodes, node1 and node2,
are two slurmd processes on this host (`slurmd -N nodeX`, each with its own
Port=), so `sbatch -N2` spans two Slurm nodes. stop() cancels every job,
waits for them to leave, and stops every daemon it started, in reverse
order.
"""

import os
import shutil
import signal
import socket
import subprocess
import time

from tandem_harness import free_port

NODES = ("node1", "node2")
# Seconds between SIGTERM and SIGKILL when Slurm ends a job (scancel, time
# limit): the workers' stop grace must fit in it.
KILL_WAIT_S = 10
TERMINAL_STATES = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL",
                   "OUT_OF_MEMORY", "PREEMPTED", "BOOT_FAIL", "DEADLINE")


def missing_tools():
    return [t for t in ("munged", "slurmctld", "slurmd", "sbatch", "squeue",
                        "scancel", "scontrol", "sinfo")
            if shutil.which(t) is None]


SLURM_CONF = """\
ClusterName=tandem-e2e
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={munge_socket}
StateSaveLocation={d}/state
SlurmdSpoolDir={d}/spool/%n
SlurmctldPidFile={d}/slurmctld.pid
SlurmdPidFile={d}/slurmd-%n.pid
SlurmctldLogFile={d}/log/slurmctld.log
SlurmdLogFile={d}/log/slurmd-%n.log
MailProg=/bin/true
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
ReturnToService=2
SlurmdParameters=config_overrides
KillWait={kill_wait}
MinJobAge=600
{nodes}
PartitionName=e2e Nodes={node_list} Default=YES MaxTime=INFINITE State=UP
"""


class SlurmCluster:
    def __init__(self, workdir):
        self.dir = workdir
        self.conf = workdir / "slurm.conf"
        self.env = dict(os.environ, SLURM_CONF=str(self.conf))
        # Daemons in start order; stop() walks it backwards.
        self.procs = []

    # ------------------------------------------------------------ lifecycle

    def start(self, timeout=30):
        d = self.dir
        for sub in ["state", "log"] + ["spool/" + n for n in NODES]:
            (d / sub).mkdir(parents=True, exist_ok=True)
        key = d / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        self.munge_socket = d / "munge.sock"
        self._daemon("munged", [
            "munged", "--foreground", "--force",
            "--socket=%s" % self.munge_socket, "--key-file=%s" % key,
            "--log-file=%s" % (d / "log" / "munged.log"),
            "--pid-file=%s" % (d / "munged.pid"),
            "--seed-file=%s" % (d / "munged.seed")])
        self._wait(lambda: self.munge_socket.exists(), timeout, "munged")

        host = socket.gethostname().split(".")[0]
        nodes = "\n".join(
            "NodeName=%s NodeHostname=%s NodeAddr=127.0.0.1 Port=%d CPUs=2 "
            "State=UNKNOWN" % (n, host, free_port()) for n in NODES)
        self.conf.write_text(SLURM_CONF.format(
            host=host, ctld_port=free_port(), munge_socket=self.munge_socket,
            d=d, kill_wait=KILL_WAIT_S, nodes=nodes,
            node_list=",".join(NODES)))
        self._daemon("slurmctld", ["slurmctld", "-D", "-i"])
        self._wait(lambda: self._run(["scontrol", "ping"], check=False)
                   .returncode == 0, timeout, "slurmctld")
        for n in NODES:
            self._daemon("slurmd-" + n, ["slurmd", "-D", "-N", n])
        self._wait(lambda: self._idle_nodes() == len(NODES), timeout,
                   "both slurmd nodes idle")
        return self

    def stop(self):
        """Cancels every job, waits for it to end, stops the daemons."""
        if any(p.poll() is None for _, p in self.procs):
            try:
                self._run(["scancel", "--full", "--partition=e2e"],
                          check=False)
                deadline = time.monotonic() + KILL_WAIT_S + 20
                while self.jobs() and time.monotonic() < deadline:
                    time.sleep(0.5)
            except (OSError, subprocess.SubprocessError):
                pass
        for _, p in reversed(self.procs):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
                try:
                    p.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
        self.procs = []

    # ---------------------------------------------------------------- jobs

    def sbatch(self, script, args=(), env=None):
        out = self._run(["sbatch", "--parsable", *args, str(script)],
                        env=dict(self.env, **(env or {})))
        return out.stdout.strip().split(";")[0]

    def scancel(self, job_id, *args):
        self._run(["scancel", *args, job_id])

    def job(self, job_id):
        """scontrol's fields of a job (JobState, ExitCode, NodeList...)."""
        out = self._run(["scontrol", "-o", "show", "job", job_id],
                        check=False)
        fields = {}
        for token in out.stdout.split():
            k, _, v = token.partition("=")
            fields[k] = v
        return fields

    def jobs(self):
        out = self._run(["squeue", "-h", "-o", "%i"], check=False)
        return out.stdout.split()

    def wait_job_end(self, job_id, timeout):
        """Waits until the job is over (its processes gone) and returns its
        fields."""
        deadline = time.monotonic() + timeout
        while True:
            info = self.job(job_id)
            if info.get("JobState") in TERMINAL_STATES:
                return info
            if time.monotonic() > deadline:
                raise AssertionError("Slurm job %s still %s after %d s;\n%s"
                                     % (job_id, info.get("JobState"), timeout,
                                        self.logs()))
            time.sleep(0.5)

    def logs(self):
        parts = []
        for f in sorted((self.dir / "log").glob("*")):
            parts.append("== %s\n%s" % (f.name, f.read_text()[-3000:]))
        return "\n".join(parts)

    # ------------------------------------------------------------- helpers

    def _run(self, cmd, check=True, env=None):
        return subprocess.run(cmd, env=env or self.env, capture_output=True,
                              text=True, timeout=30, check=check)

    def _daemon(self, name, cmd):
        log = open(self.dir / "log" / (name + ".out"), "w")
        p = subprocess.Popen(cmd, env=self.env, stdout=log,
                             stderr=subprocess.STDOUT,
                             stdin=subprocess.DEVNULL)
        log.close()
        self.procs.append((name, p))

    def _idle_nodes(self):
        out = self._run(["sinfo", "-h", "-N", "-o", "%N %T"], check=False)
        return sum(1 for line in out.stdout.splitlines()
                   if line.split()[-1:] == ["idle"])

    def _wait(self, predicate, timeout, what):
        deadline = time.monotonic() + timeout
        while not predicate():
            for name, p in self.procs:
                if p.poll() is not None:
                    raise RuntimeError("%s exited (%s) while waiting for %s;\n%s"
                                       % (name, p.returncode, what,
                                          self.logs()))
            if time.monotonic() > deadline:
                raise RuntimeError("timed out waiting for %s;\n%s"
                                   % (what, self.logs()))
            time.sleep(0.2)
