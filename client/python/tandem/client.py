"""``tandem.Client``: the coordinator's JobService from Python."""

import collections
import os

import grpc

from tandem import spec as spec_mod
from tandem.errors import SpecError, TandemError
from tandem.v1 import (job_pb2, job_service_pb2, job_service_pb2_grpc,
                       schedule_pb2)

DEFAULT_ADDRESS = "127.0.0.1:50051"
ENV_ADDRESS = "TANDEM_COORDINATOR"
# Credentials for an authenticating coordinator (coordinator/README.md,
# "Authentication"): the user's bearer token, and the CA its TLS
# certificate chains to.
ENV_TOKEN = "TANDEM_TOKEN"
ENV_TLS_CA = "TANDEM_TLS_CA"

# get(): the job and every event recorded for it, oldest first.
class JobStatus(collections.namedtuple("JobStatus", ["job", "events"])):
    """A job and its events (``job, events = client.get(id)``), and its
    ranks as ``.workers``, outside the tuple so that two-name unpacking
    keeps working."""

    def __new__(cls, job, events, workers=()):
        self = super().__new__(cls, job, events)
        self.workers = list(workers)
        return self
# schedule(): the readable text form and the tandem.v1.Schedule proto.
ScheduleResult = collections.namedtuple("ScheduleResult", ["text", "schedule"])
# explain(): why a schedule is what it is (common/README.md, "Explanation"):
# the planner's decisions in the order applied, each with its simulated gain.
# The gains add up to baseline_iteration_s - plan_iteration_s; `text` is the
# readable table `tandem schedule JOB --explain` prints.
Explanation = collections.namedtuple("Explanation", [
    "version", "baseline_iteration_s", "baseline_exposed_comm_s",
    "baseline_peak_bytes", "plan_iteration_s", "plan_exposed_comm_s",
    "decisions", "text"])
# One decision: kind ("prefetch", "fuse", "keep", "persist", "offload",
# "return", "zero1-buckets", "pass", "policy", "least-memory"), the pass that
# made it, what it did, its simulated gain in seconds (iteration time and
# exposed communication), the bytes it holds or moves, its change of the
# simulated peak, the binding constraint, and the ids it concerns (node_id:
# None when it has none).
Decision = collections.namedtuple("Decision", [
    "kind", "pass_name", "what", "gain_s", "exposed_gain_s", "held_bytes",
    "peak_delta_bytes", "binding", "group_ids", "param_ids", "offload_ids",
    "node_id"])
# What binds a decision: kind "none", "memory" (the peak `bytes` at node
# `node_id` against `limit_bytes`), "link" or "host-link".
Binding = collections.namedtuple("Binding", [
    "kind", "node_id", "bytes", "limit_bytes"])

TERMINAL_STATES = (job_pb2.JOB_STATE_SUCCEEDED, job_pb2.JOB_STATE_FAILED,
                   job_pb2.JOB_STATE_CANCELLED)


def _kind_name(enum_desc, number):
    """``DECISION_KIND_ZERO1_BUCKETS`` → ``zero1-buckets``."""
    return spec_mod.enum_short_name(enum_desc, number).replace("_", "-")


def explanation_from_proto(schedule, text=""):
    """An ``Explanation`` from a ``tandem.v1.Schedule``."""
    e = schedule.explanation
    decisions = []
    for d in e.decisions:
        b = d.binding
        decisions.append(Decision(
            kind=_kind_name(schedule_pb2.DecisionKind.DESCRIPTOR, d.kind),
            pass_name=getattr(d, "pass"), what=d.what, gain_s=d.gain_s,
            exposed_gain_s=d.exposed_gain_s, held_bytes=d.held_bytes,
            peak_delta_bytes=d.peak_delta_bytes,
            binding=Binding(
                kind=("none" if b.kind == schedule_pb2.BINDING_KIND_UNSPECIFIED
                      else _kind_name(schedule_pb2.BindingKind.DESCRIPTOR,
                                      b.kind)),
                node_id=b.node_id if b.HasField("node_id") else None,
                bytes=b.bytes, limit_bytes=b.limit_bytes),
            group_ids=list(d.group_ids), param_ids=list(d.param_ids),
            offload_ids=list(d.offload_ids),
            node_id=d.node_id if d.HasField("node_id") else None))
    return Explanation(
        version=schedule.version,
        baseline_iteration_s=e.baseline_iteration_s,
        baseline_exposed_comm_s=e.baseline_exposed_comm_s,
        baseline_peak_bytes=e.baseline_peak_bytes,
        plan_iteration_s=schedule.prediction.iteration_s,
        plan_exposed_comm_s=schedule.prediction.exposed_comm_s,
        decisions=decisions, text=text)


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


class _Details(collections.namedtuple(
        "_Details", ["method", "timeout", "metadata", "credentials",
                     "wait_for_ready", "compression"]),
        grpc.ClientCallDetails):
    pass


class _BearerToken(grpc.UnaryUnaryClientInterceptor,
                   grpc.UnaryStreamClientInterceptor):
    """Adds ``authorization: Bearer TOKEN`` to every call. An interceptor,
    not call credentials, so that it works over plaintext on loopback
    too."""

    def __init__(self, token):
        self._header = ("authorization", "Bearer " + token)

    def _details(self, d):
        metadata = list(d.metadata or []) + [self._header]
        return _Details(d.method, d.timeout, metadata, d.credentials,
                        getattr(d, "wait_for_ready", None),
                        getattr(d, "compression", None))

    def intercept_unary_unary(self, continuation, details, request):
        return continuation(self._details(details), request)

    def intercept_unary_stream(self, continuation, details, request):
        return continuation(self._details(details), request)


def _read_tls_ca(path):
    try:
        with open(path, "rb") as f:
            pem = f.read()
    except OSError as e:
        raise TandemError("cannot read the TLS CA file %s (--tls-ca or $%s): "
                          "%s" % (path, ENV_TLS_CA, e.strerror)) from None
    if b"-----BEGIN " not in pem:
        raise TandemError("the TLS CA file %s (--tls-ca or $%s) is not PEM "
                          "(no '-----BEGIN' line)" % (path, ENV_TLS_CA))
    return pem


class Client:
    """A connection to a tandem coordinator.

    >>> c = tandem.Client("127.0.0.1:50051")
    >>> job = c.submit("deploy/local/tiny-llama.yaml")
    >>> for job, event in c.watch(job.id): ...

    Every method raises ``tandem.TandemError`` on failure, carrying the
    coordinator's message and the gRPC status code; job specs that do not fit
    ``tandem.v1.JobSpec`` raise ``tandem.SpecError`` before any call.
    """

    def __init__(self, address=None, timeout=30.0, channel=None, token=None,
                 tls_ca=None):
        """``token``: the bearer token of a coordinator that authenticates
        (default: ``$TANDEM_TOKEN``); ``tls_ca``: the PEM file of the CA
        its TLS certificate chains to (default: ``$TANDEM_TLS_CA``; unset:
        plaintext)."""
        self.address = address or default_address()
        self.timeout = timeout
        if token is None:
            token = os.environ.get(ENV_TOKEN) or None
        if tls_ca is None:
            tls_ca = os.environ.get(ENV_TLS_CA) or None
        self.tls = bool(tls_ca)
        self.tls_ca = tls_ca or None
        self._owns_channel = channel is None
        if channel is None:
            options = [("grpc.max_receive_message_length", 64 << 20),
                       ("grpc.max_send_message_length", 64 << 20)]
            if tls_ca:
                channel = grpc.secure_channel(
                    self.address, grpc.ssl_channel_credentials(
                        root_certificates=_read_tls_ca(tls_ca)), options)
            else:
                channel = grpc.insecure_channel(self.address, options)
        self._raw_channel = channel
        if token:
            token = token.strip()
            if not token or any(c.isspace() for c in token):
                raise TandemError("the token (--token or $%s) must be one "
                                  "word without spaces" % ENV_TOKEN)
            channel = grpc.intercept_channel(channel, _BearerToken(token))
        self._channel = channel
        self._jobs = job_service_pb2_grpc.JobServiceStub(self._channel)

    # -- plumbing

    def close(self):
        if self._owns_channel:
            self._raw_channel.close()

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
            if not self.tls:
                msg += (". If it serves TLS, pass --tls-ca CA.pem (or set "
                        "$%s)" % ENV_TLS_CA)
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
        """``JobStatus(job, events, workers)``: the job, all its events, and
        every rank that registered (``WorkerStatus``: rank, hostname,
        incarnation, device, connected, last_heartbeat_unix_s, step)."""
        r = self._call(self._jobs.Get, job_service_pb2.GetJobRequest(
            job_id=job_id))
        return JobStatus(r.job, list(r.events), list(r.workers))

    def join_secret(self, job_id):
        """The job's join secret: what its workers present to an
        authenticating coordinator (``tandem-worker --join-secret-file`` or
        ``$TANDEM_JOIN_SECRET``). Only the job's owner or an admin gets
        it."""
        return self._call(self._jobs.Get, job_service_pb2.GetJobRequest(
            job_id=job_id)).join_secret

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

    def report(self, job_id):
        """The job's report (coordinator/README.md, "Job report"): one
        self-contained HTML page with inline SVG charts and no script, the
        page the coordinator also serves at ``/jobs/JOB`` on its metrics
        port. A job that has not run yet gets a report that says so."""
        r = self._call(self._jobs.GetReport,
                       job_service_pb2.GetReportRequest(job_id=job_id))
        return r.html

    def _get_schedule(self, job_id, version):
        request = job_service_pb2.GetScheduleRequest(job_id=job_id)
        if version is not None:
            request.version = version
        return self._call(self._jobs.GetSchedule, request)

    def schedule(self, job_id, version=None):
        """``ScheduleResult(text, schedule)`` of a version: None (the
        default) for the active one, 0 for the baseline every job starts
        on, N for version N (an unknown one raises NOT_FOUND naming those
        there are)."""
        r = self._get_schedule(job_id, version)
        return ScheduleResult(r.text, r.schedule)

    def explain(self, job_id, version=None):
        """``Explanation`` of a schedule version (None: the active one): the
        planner's decisions, stored with the schedule, so a restarted
        coordinator still has them."""
        r = self._get_schedule(job_id, version)
        return explanation_from_proto(r.schedule, r.explanation)
