"""``tandem.Client``: the coordinator's JobService from Python."""

import collections
import os

import grpc

from tandem import spec as spec_mod
from tandem.errors import SpecError, TandemError
from tandem.v1 import job_pb2, job_service_pb2, job_service_pb2_grpc

DEFAULT_ADDRESS = "127.0.0.1:50051"
ENV_ADDRESS = "TANDEM_COORDINATOR"

# get(): the job and every event recorded for it, oldest first.
JobStatus = collections.namedtuple("JobStatus", ["job", "events"])
# schedule(): the readable text form and the tandem.v1.Schedule proto.
ScheduleResult = collections.namedtuple("ScheduleResult", ["text", "schedule"])

TERMINAL_STATES = (job_pb2.JOB_STATE_SUCCEEDED, job_pb2.JOB_STATE_FAILED,
                   job_pb2.JOB_STATE_CANCELLED)


def default_address():
    """$TANDEM_COORDINATOR, else 127.0.0.1:50051."""
    return os.environ.get(ENV_ADDRESS) or DEFAULT_ADDRESS


def state_name(state):
    """``JOB_STATE_RUNNING`` (or its number) → ``"RUNNING"``."""
    return spec_mod.enum_short_name(job_pb2.JobState.DESCRIPTOR, state).upper()


def parse_state(value):
    """``"running"``, ``"RUNNING"``, ``"JOB_STATE_RUNNING"`` or a number →
    the JobState number; ``TandemError`` listing the states otherwise."""
    try:
        return spec_mod.parse_enum(job_pb2.JobState.DESCRIPTOR, value, "state")
    except SpecError:
        raise TandemError("unknown job state %r; use one of %s" % (
            value, ", ".join(s.upper() for s in spec_mod.enum_choices(
                job_pb2.JobState.DESCRIPTOR)))) from None


def is_terminal(state):
    return state in TERMINAL_STATES


class Client:
    """A connection to a tandem coordinator.

    >>> c = tandem.Client("127.0.0.1:50051")
    >>> job = c.submit("deploy/local/tiny-llama.yaml")
    >>> for job, event in c.watch(job.id): ...

    Every method raises ``tandem.TandemError`` on failure, carrying the
    coordinator's message and the gRPC status code; job specs that do not fit
    ``tandem.v1.JobSpec`` raise ``tandem.SpecError`` before any call.
    """

    def __init__(self, address=None, timeout=30.0, channel=None):
        self.address = address or default_address()
        self.timeout = timeout
        self._owns_channel = channel is None
        self._channel = channel or grpc.insecure_channel(
            self.address,
            options=[("grpc.max_receive_message_length", 64 << 20),
                     ("grpc.max_send_message_length", 64 << 20)])
        self._jobs = job_service_pb2_grpc.JobServiceStub(self._channel)

    # -- plumbing

    def close(self):
        if self._owns_channel:
            self._channel.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _hint(self):
        return ("Is tandem-coordinator running there? Start one with "
                "`tandem-coordinator --listen %s --db tandem.db`, or point "
                "the client at a running one with --coordinator HOST:PORT "
                "(or $%s)" % (self.address, ENV_ADDRESS))

    def _error(self, err):
        code = err.code() if hasattr(err, "code") else grpc.StatusCode.UNKNOWN
        details = (err.details() if hasattr(err, "details") else "") or ""
        if code == grpc.StatusCode.UNAVAILABLE:
            msg = "cannot reach the tandem coordinator at %s (%s). %s" % (
                self.address, details or "unavailable", self._hint())
        elif code == grpc.StatusCode.DEADLINE_EXCEEDED:
            msg = ("the tandem coordinator at %s did not answer within %gs "
                   "(%s). %s" %
                   (self.address, self.timeout or 0, details, self._hint()))
        else:
            msg = details or code.name
        return TandemError(msg, code=code, address=self.address)

    def _call(self, method, request):
        try:
            return method(request, timeout=self.timeout)
        except grpc.RpcError as e:
            raise self._error(e) from None

    # -- JobService

    def submit(self, spec):
        """Submits a job; ``spec`` is a ``tandem.v1.JobSpec``, a dict shaped
        like the YAML, or the path of a YAML file. Returns the ``Job``
        (PENDING, with the coordinator's defaults filled in)."""
        request = job_service_pb2.SubmitJobRequest(
            spec=spec_mod.to_job_spec(spec))
        return self._call(self._jobs.Submit, request).job

    def get(self, job_id):
        """``JobStatus(job, events)``: the job and all its events."""
        r = self._call(self._jobs.Get, job_service_pb2.GetJobRequest(
            job_id=job_id))
        return JobStatus(r.job, list(r.events))

    def list(self, states=None, limit=100):
        """Jobs, newest first; ``states`` filters (names such as
        ``"RUNNING"`` or JobState numbers; one or a list)."""
        if states is None:
            states = []
        elif isinstance(states, (str, int)):
            states = [states]
        request = job_service_pb2.ListJobsRequest(
            states=[parse_state(s) for s in states], limit=limit)
        return list(self._call(self._jobs.List, request).jobs)

    def cancel(self, job_id, reason=""):
        """Cancels a job; returns it, CANCELLED."""
        return self._call(self._jobs.Cancel, job_service_pb2.CancelJobRequest(
            job_id=job_id, reason=reason)).job

    def reoptimize(self, job_id, reason=""):
        """Asks for a re-plan now; returns the version that will be planned
        next."""
        return self._call(
            self._jobs.Reoptimize,
            job_service_pb2.ReoptimizeRequest(job_id=job_id, reason=reason)
        ).next_version

    def watch(self, job_id, after_seq=0):
        """Yields ``(job, event)`` as the job changes, until it ends: first
        the job as it is (event None), then each event after ``after_seq``
        (replayed), and progress updates (event None). Closing the generator
        hangs up."""
        call = self._jobs.Watch(job_service_pb2.WatchJobRequest(
            job_id=job_id, after_seq=after_seq))
        try:
            for r in call:
                yield r.job, (r.event if r.HasField("event") else None)
        except grpc.RpcError as e:
            raise self._error(e) from None
        finally:
            call.cancel()

    def timeline(self, job_id, ranks=None):
        """The latest iteration trace of each rank (``RankTimeline``: rank,
        step, schedule_version, trace_json), by rank; ``ranks`` limits it to
        some. Ranks send one with each profile window."""
        r = self._call(self._jobs.GetTimeline,
                       job_service_pb2.GetTimelineRequest(
                           job_id=job_id, ranks=list(ranks or [])))
        return list(r.timelines)

    def schedule(self, job_id, version=0):
        """``ScheduleResult(text, schedule)`` of a version (0: the active
        one)."""
        r = self._call(self._jobs.GetSchedule,
                       job_service_pb2.GetScheduleRequest(job_id=job_id,
                                                          version=version))
        return ScheduleResult(r.text, r.schedule)
