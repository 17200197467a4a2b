"""The live view of ``tandem watch``: a progress bar on a terminal, plain
lines otherwise."""

import collections
import shutil
import sys
import time

from tandem import spec as spec_mod
from tandem.v1 import job_pb2


def describe_outcome(job):
    """What the active schedule bought, as `tandem status` prints it."""
    if job.measured_iteration_s <= 0:
        if job.schedule_version > 0 and job.predicted_iteration_s > 0:
            return ("v%d not measured yet (too few steps); predicted %.4f "
                    "s/iter" % (job.schedule_version,
                                job.predicted_iteration_s))
        return "- (not measured yet)"
    parts = []
    if job.schedule_version == 0:
        parts.append("baseline")
    elif job.speedup_text:
        # The coordinator's words: the figure with its interval and basis,
        # measured interleaved with the baseline, or why there is none yet.
        parts.append(job.speedup_text)
    else:
        parts.append("speedup not measured")
    line = ", ".join(parts) + "; measured %.4f s/iter" % job.measured_iteration_s
    if job.predicted_iteration_s > 0:
        line += ", predicted %.4f (%+.1f%%)" % (
            job.predicted_iteration_s,
            100.0 * (job.predicted_iteration_s / job.measured_iteration_s - 1))
    return line


def describe_waiting(job, now_unix=None):
    """What a PENDING job waits for, and for how long: "waiting 35 s: 1 of
    2 ranks registered (rank 0 on a); missing rank 1: start it with ..."
    (the coordinator's words, Job.waiting)."""
    what = job.waiting or "waiting for %d workers" % \
        job.spec.parallel.world_size
    since = job.waiting_since_unix_s
    if not since:
        return what
    now = time.time() if now_unix is None else now_unix
    return "waiting %s: %s" % (fmt_duration(max(now - since, 0.0)), what)


def fmt_duration(seconds):
    """35 s, 4 min 10 s, 2 h 5 min."""
    s = int(round(seconds))
    if s < 60:
        return "%d s" % s
    if s < 3600:
        return "%d min %d s" % (s // 60, s % 60)
    return "%d h %d min" % (s // 3600, s % 3600 // 60)


def fmt_time(unix_s, with_date=False):
    if not unix_s:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S" if with_date else "%H:%M:%S",
                         time.localtime(unix_s))


def fmt_count(x):
    """1234567 → '1.23M'; small numbers as integers."""
    for div, unit in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if x >= div:
            return "%.3g%s" % (x / div, unit)
    return "%.0f" % x


def fmt_bytes(n):
    """A byte count as people read it: 512 B, 3.5 KiB, 161.25 MiB, 1.5 GiB
    (binary units, as the job spec writes budgets)."""
    n = float(n)
    for div, unit in ((1 << 40, "TiB"), (1 << 30, "GiB"), (1 << 20, "MiB"),
                      (1 << 10, "KiB")):
        if abs(n) >= div:
            return "%.4g %s" % (n / div, unit)
    return "%d B" % n


def state_name(state):
    return spec_mod.enum_short_name(job_pb2.JobState.DESCRIPTOR, state).upper()


# A short event line's message: its first clause, at most this long.
SHORT_MESSAGE = 160


def short_message(message):
    """The first clause of an event's message: the coordinator writes the
    headline first and the planner's detail (passes, calibration, what was
    assumed, the runner-up) after "; ". Cut at SHORT_MESSAGE characters."""
    head = message.split("; ", 1)[0]
    if len(head) > SHORT_MESSAGE:
        head = head[:SHORT_MESSAGE - 3].rstrip() + "..."
    elif len(head) < len(message):
        head += " [...]"
    return head


def event_line(event, verbose=True):
    """One event; `verbose` False keeps it to one short line (the headline
    of the message; ``tandem watch --verbose`` and ``tandem status`` print
    it whole)."""
    message = event.message if verbose else short_message(event.message)
    return "[%s] %s: %s" % (fmt_time(event.time_unix_s), event.kind, message)


class StepRate:
    """Optimizer steps per second over a sliding window of observations."""

    def __init__(self, window_s=30.0, clock=time.monotonic):
        self.window_s = window_s
        self.clock = clock
        self.samples = collections.deque()
        self._last = None

    def observe(self, step):
        """Records the job's step as seen now. The first observation is only
        a baseline: when that step completed is unknown, so timing starts at
        the first change seen."""
        now = self.clock()
        if self._last is None or step < self._last:
            self._last = step  # first sight, or a restarted job: start over
            self.samples.clear()
            return
        if step == self._last:
            return
        self._last = step
        self.samples.append((now, step))
        while len(self.samples) > 2 and now - self.samples[0][0] > self.window_s:
            self.samples.popleft()

    def rate(self):
        """Steps per second, or None before two distinct steps were seen."""
        if len(self.samples) < 2:
            return None
        (t0, s0), (t1, s1) = self.samples[0], self.samples[-1]
        if t1 <= t0:
            return None
        return (s1 - s0) / (t1 - t0)


class ProgressView:
    """Renders watch updates. On a TTY the bar is redrawn in place with \\r
    and events are printed above it; otherwise each event is a line and
    progress is a line at most every ``min_interval`` seconds (and at the
    last step)."""

    BAR_WIDTH = 24

    def __init__(self, out=None, tty=None, min_interval=1.0,
                 clock=time.monotonic, verbose=False):
        self.out = out or sys.stdout
        self.verbose = verbose
        self.tty = self.out.isatty() if tty is None else tty
        self.min_interval = min_interval
        self.clock = clock
        self.rate = StepRate(clock=clock)
        self.job = None
        self._bar_shown = False
        self._last_plain = None  # (time, step) of the last plain line

    # -- formatting

    def tokens_per_s(self, job):
        """Tokens (or samples, for a model fed named inputs) per second."""
        r = self.rate.rate()
        if r is None:
            return None
        return r * spec_mod.items_per_step(job.spec, job)[1]

    def status_text(self, job, bar=True):
        total = job.spec.train.steps
        parts = [state_name(job.state)]
        if job.state == job_pb2.JOB_STATE_PENDING:
            parts.append(describe_waiting(job))
            return "  ".join(parts)
        if bar:
            frac = min(max(job.step / total, 0.0), 1.0) if total > 0 else 0.0
            filled = int(round(frac * self.BAR_WIDTH))
            parts.append("[" + "#" * filled + "." * (self.BAR_WIDTH - filled)
                         + "]")
        pct = (100.0 * job.step / total) if total > 0 else 0.0
        parts.append("step %d/%d (%d%%)" % (job.step, total, pct))
        parts.append("loss %.4f" % job.loss if job.step > 0 else "loss -")
        tps = self.tokens_per_s(job)
        unit = spec_mod.items_per_step(job.spec, job)[0]
        parts.append("%s %s/s" % (fmt_count(tps) if tps is not None else "-",
                                  "tok" if unit == "tokens" else unit))
        parts.append("schedule v%d" % job.schedule_version
                     if job.schedule_version > 0 else "schedule baseline")
        if job.schedule_version > 0 and job.measured_speedup > 0:
            parts.append("%.2fx (%.2f-%.2f) vs baseline" % (
                job.measured_speedup, job.speedup_low, job.speedup_high))
        return "  ".join(parts)

    # -- output

    def _write(self, text):
        self.out.write(text)
        self.out.flush()

    def _clear_bar(self):
        if self.tty and self._bar_shown:
            self._write("\r\x1b[K")
            self._bar_shown = False

    def _draw_bar(self):
        if self.job is None:
            return
        text = self.status_text(self.job, bar=True)
        cols = shutil.get_terminal_size((100, 24)).columns
        if len(text) > cols - 1:  # a wrapped line cannot be redrawn with \r
            text = text[:max(cols - 1, 10)]
        self._write("\r" + text + "\x1b[K")
        self._bar_shown = True

    def _plain_progress(self, force=False):
        job = self.job
        if job is None or job.step == 0:
            return
        last = self._last_plain
        if last is not None and last[1] == job.step:
            return  # this step is printed already
        now = self.clock()
        total = job.spec.train.steps
        at_end = total > 0 and job.step >= total
        if force or at_end or last is None or \
                now - last[0] >= self.min_interval:
            self._write(self.status_text(job, bar=False) + "\n")
            self._last_plain = (now, job.step)

    def update(self, job):
        """A new view of the job (progress, or the first message)."""
        self.job = job
        self.rate.observe(job.step)
        if self.tty:
            self._draw_bar()
        else:
            self._plain_progress()

    def event(self, job, event):
        self.job = job
        self.rate.observe(job.step)
        if self.tty:
            self._clear_bar()
            self._write(event_line(event, self.verbose) + "\n")
            self._draw_bar()
        else:
            self._plain_progress()
            self._write(event_line(event, self.verbose) + "\n")

    def note(self, text):
        """A message of the client's own (e.g. reconnecting)."""
        self._clear_bar()
        self._write(text + "\n")
        if self.tty:
            self._draw_bar()

    def finish(self):
        if self.tty:
            if self.job is not None and not self._bar_shown:
                self._draw_bar()
            self._write("\n")
            self._bar_shown = False
        else:
            self._plain_progress(force=True)
