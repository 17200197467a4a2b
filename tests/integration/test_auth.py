"""Authentication and TLS on real processes (coordinator/README.md,
"Authentication"): certificates that openssl makes here, a token file, the
coordinator, the CLI, the Python client and real tandem-worker processes.
Every refusal the issue names is shown: no token, another user's job, a
wrong join secret, plaintext to a TLS port, a worker without a certificate
under mutual TLS, and a public address without protection."""

import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import types

import grpc
import pytest
import yaml

import tandem
from tandem.v1 import job_pb2
from tandem.v1 import worker_service_pb2 as wpb
from tandem.v1 import worker_service_pb2_grpc as wgrpc
import tandem_harness as harness
from tandem_harness import REPO, unique_name, wait_for, \
    worker_binary

CLIENT = REPO / "client" / "python"
ALICE = "alice-token-0123456789abcdef"
BOB = "bob-token-0123456789abcdefgh"
ROOT = "root-token-0123456789abcdefg"
CAROL = "carol-token-0123456789abcdef"


def openssl(*args, cwd):
    subprocess.run(["openssl", *args], cwd=str(cwd), check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    """A CA, a server certificate for 127.0.0.1/localhost, a worker client
    certificate, and a second CA that signed neither."""
    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed (scripts/setup.sh installs it)")
    d = tmp_path_factory.mktemp("pki")
    for ca in ("ca", "other-ca"):
        openssl("req", "-x509", "-newkey", "ec", "-pkeyopt",
                "ec_paramgen_curve:P-256", "-nodes", "-keyout", ca + ".key",
                "-out", ca + ".pem", "-days", "2", "-subj", "/CN=" + ca,
                cwd=d)
    (d / "server.ext").write_text(
        "subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    (d / "client.ext").write_text("extendedKeyUsage=clientAuth\n")
    for name, ext in (("server", "server.ext"), ("worker", "client.ext")):
        openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256",
                "-nodes", "-keyout", name + ".key", "-out", name + ".csr",
                "-subj", "/CN=" + name, cwd=d)
        openssl("x509", "-req", "-in", name + ".csr", "-CA", "ca.pem",
                "-CAkey", "ca.key", "-CAcreateserial", "-out", name + ".pem",
                "-days", "2", "-extfile", ext, cwd=d)
    return d


def write_tokens(path, lines):
    path.write_text("# test users\n" + "".join(l + "\n" for l in lines))
    return path


@pytest.fixture
def secure(cluster, pki, tmp_path):
    """A coordinator with TLS and tokens on loopback."""
    tokens = write_tokens(tmp_path / "tokens", [
        ALICE + " alice", BOB + " bob", ROOT + " root admin"])
    c = cluster.coordinator(extra=[
        "--tls-cert", pki / "server.pem", "--tls-key", pki / "server.key",
        "--auth-tokens", tokens])
    c.tokens = tokens
    return c


def client(coord, pki, token=None, tls=True):
    return tandem.Client(coord.address, timeout=10, token=token,
                         tls_ca=str(pki / "ca.pem") if tls else "")


def spec(steps=6, world=1):
    return {"name": unique_name(),
            "model": {"preset": "llama", "layers": 2, "d_model": 32,
                      "heads": 4, "ffn": 64, "vocab": 128},
            "batch": {"micro_batch": 2, "seq_len": 16},
            "parallel": {"world_size": world},
            "train": {"steps": steps},
            "optimize": {"warmup_steps": 3}}


def cli(coord, *args, env_extra=None):
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1",
               TANDEM_WORKER=str(worker_binary()))
    for name in ("TANDEM_TOKEN", "TANDEM_TLS_CA"):
        env.pop(name, None)
    env.update(env_extra or {})
    return subprocess.run(
        [sys.executable, "-m", "tandem", "--coordinator", coord.address]
        + [str(a) for a in args], cwd=str(CLIENT), env=env,
        capture_output=True, text=True, timeout=240)


def worker_stub(coord, pki, secret=None, cert=False):
    creds = grpc.ssl_channel_credentials(
        root_certificates=(pki / "ca.pem").read_bytes(),
        private_key=(pki / "worker.key").read_bytes() if cert else None,
        certificate_chain=(pki / "worker.pem").read_bytes() if cert else None)
    stub = wgrpc.WorkerServiceStub(grpc.secure_channel(coord.address, creds))
    metadata = [("tandem-join-secret", secret)] if secret else []
    return stub, metadata


def expect_refused(fn, code, text):
    with pytest.raises((tandem.TandemError, grpc.RpcError)) as info:
        fn()
    e = info.value
    got = e.code() if isinstance(e, grpc.RpcError) else e.code
    message = e.details() if isinstance(e, grpc.RpcError) else e.message
    assert got == code, (got, message)
    assert text in message, message
    return message


def test_users_see_and_steer_only_their_own_jobs(secure, pki):
    alice = client(secure, pki, ALICE)
    bob = client(secure, pki, BOB)
    root = client(secure, pki, ROOT)
    job = alice.submit(spec())
    assert job.owner == "alice"
    bobs = bob.submit(spec())
    assert bobs.owner == "bob"

    # No token, a malformed one, one not in the file.
    expect_refused(lambda: client(secure, pki).get(job.id),
                   grpc.StatusCode.UNAUTHENTICATED, "no token")
    expect_refused(lambda: client(secure, pki, "nobody-0123456789abcdef")
                   .list(), grpc.StatusCode.UNAUTHENTICATED, "unknown token")

    # Another user's job: every call on it gets the answer of a job that
    # does not exist (a stranger cannot tell which ids do), and List hides
    # it.
    missing = job.id + "x"
    for make in (lambda j: lambda: bob.get(j), lambda j: lambda: bob.cancel(j),
                 lambda j: lambda: bob.reoptimize(j),
                 lambda j: lambda: bob.schedule(j),
                 lambda j: lambda: bob.report(j),
                 lambda j: lambda: bob.timeline(j),
                 lambda j: lambda: bob.join_secret(j),
                 lambda j: lambda: next(iter(bob.watch(j)))):
        theirs = expect_refused(make(job.id), grpc.StatusCode.NOT_FOUND,
                                "no job '%s' on this coordinator" % job.id)
        none = expect_refused(make(missing), grpc.StatusCode.NOT_FOUND,
                              "no job '%s' on this coordinator" % missing)
        assert theirs.replace(job.id, "ID") == none.replace(missing, "ID")
    assert [j.id for j in bob.list()] == [bobs.id]
    assert [j.id for j in alice.list()] == [job.id]
    # An admin sees and steers every job.
    assert {j.id for j in root.list()} >= {job.id, bobs.id}
    assert root.get(job.id).job.owner == "alice"
    assert root.cancel(bobs.id, "admin").state == job_pb2.JOB_STATE_CANCELLED
    assert alice.cancel(job.id).owner == "alice"


def test_cli_passes_token_and_ca_and_says_what_is_missing(secure, pki):
    path = secure.tokens.parent / "job.yaml"
    path.write_text(yaml.safe_dump(spec()))
    ok = cli(secure, "--token", ALICE, "--tls-ca", pki / "ca.pem", "submit",
             "-q", path)
    assert ok.returncode == 0, ok.stderr
    job_id = ok.stdout.strip()
    # From the environment too.
    status = cli(secure, "status", job_id, env_extra={
        "TANDEM_TOKEN": ALICE, "TANDEM_TLS_CA": str(pki / "ca.pem")})
    assert status.returncode == 0, status.stderr
    assert "owner      alice" in status.stdout
    secret = cli(secure, "--token", ALICE, "--tls-ca", pki / "ca.pem",
                 "join-secret", job_id)
    assert secret.returncode == 0 and secret.stdout.startswith("tjs-")

    no_token = cli(secure, "--tls-ca", pki / "ca.pem", "status", job_id)
    assert no_token.returncode == 1
    assert "no token" in no_token.stderr and "TANDEM_TOKEN" in no_token.stderr
    other = cli(secure, "--token", BOB, "--tls-ca", pki / "ca.pem", "cancel",
                job_id)
    assert other.returncode == 1
    assert "no job '%s' on this coordinator" % job_id in other.stderr
    # Plaintext to the TLS port: no answer, and the hint names --tls-ca.
    plain = cli(secure, "--token", ALICE, "--timeout", "3", "status", job_id)
    assert plain.returncode == 1
    assert "--tls-ca" in plain.stderr, plain.stderr
    bad_ca = cli(secure, "--tls-ca", pki / "missing.pem", "list")
    assert bad_ca.returncode == 2 and "missing.pem" in bad_ca.stderr


def test_plaintext_and_a_foreign_ca_get_no_service(secure, pki):
    expect_refused(lambda: client(secure, pki, ALICE, tls=False).list(),
                   grpc.StatusCode.UNAVAILABLE, "--tls-ca")
    foreign = tandem.Client(secure.address, timeout=5, token=ALICE,
                            tls_ca=str(pki / "other-ca.pem"))
    expect_refused(foreign.list, grpc.StatusCode.UNAVAILABLE, "")


def test_workers_need_the_join_secret_of_their_job(secure, pki):
    alice = client(secure, pki, ALICE)
    a = alice.submit(spec())
    b = alice.submit(spec())
    secret_a = alice.join_secret(a.id)
    assert secret_a.startswith("tjs-") and secret_a != alice.join_secret(b.id)
    req = wpb.RegisterRequest(job_id=a.id, incarnation="i-1", hostname="h",
                              requested_rank=0, device="cpu")

    stub, md = worker_stub(secure, pki)
    expect_refused(lambda: stub.Register(req, metadata=md, timeout=10),
                   grpc.StatusCode.UNAUTHENTICATED, "no join secret")
    stub, md = worker_stub(secure, pki, alice.join_secret(b.id))
    expect_refused(lambda: stub.Register(req, metadata=md, timeout=10),
                   grpc.StatusCode.PERMISSION_DENIED,
                   "wrong join secret for job %s" % a.id)
    # A user's token is not a join secret.
    stub, md = worker_stub(secure, pki, ALICE)
    expect_refused(lambda: stub.Register(req, metadata=md, timeout=10),
                   grpc.StatusCode.PERMISSION_DENIED, "wrong join secret")

    # The right secret opens only its own job's rendezvous keys.
    stub, md = worker_stub(secure, pki, secret_a)
    stub.KvSet(wpb.KvSetRequest(key="jobs/%s/x" % a.id, value=b"1"),
               metadata=md, timeout=10)
    expect_refused(lambda: stub.KvSet(wpb.KvSetRequest(
        key="jobs/%s/x" % b.id, value=b"1"), metadata=md, timeout=10),
        grpc.StatusCode.PERMISSION_DENIED, "wrong join secret for job %s"
        % b.id)
    expect_refused(lambda: stub.KvGet(wpb.KvGetRequest(key="global"),
                                      metadata=md, timeout=10),
                   grpc.StatusCode.PERMISSION_DENIED, "outside every job")
    expect_refused(lambda: stub.KvNumKeys(wpb.KvNumKeysRequest(prefix=""),
                                          metadata=md, timeout=10),
                   grpc.StatusCode.PERMISSION_DENIED, "outside every job")
    # A session needs it too.
    stub, md = worker_stub(secure, pki)
    hello = wpb.WorkerMessage(hello=wpb.SessionHello(
        job_id=a.id, rank=0, incarnation="i-1"))
    expect_refused(lambda: list(stub.Session(iter([hello]), metadata=md,
                                             timeout=10)),
                   grpc.StatusCode.UNAUTHENTICATED, "no join secret")
    assert alice.get(a.id).job.state == job_pb2.JOB_STATE_PENDING


def test_launch_trains_over_tls_with_tokens_and_join_secrets(secure, pki,
                                                             tmp_path):
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(spec(steps=6, world=2)))
    run = cli(secure, "--token", ALICE, "--tls-ca", pki / "ca.pem", "launch",
              "--nproc", 2, "--threads", 1, "--log-dir", tmp_path / "logs",
              path)
    assert run.returncode == 0, (run.stdout, run.stderr)
    assert "SUCCEEDED after 6 steps" in run.stdout, run.stdout
    # The secret reached the workers through the environment, not argv.
    log = (tmp_path / "logs" / "rank0.log").read_text()
    assert "tjs-" not in log


def test_worker_without_secret_is_refused_and_says_how_to_fix(
        cluster, secure, pki):
    alice = client(secure, pki, ALICE)
    job = alice.submit(spec())
    w = cluster.worker(secure, job.id, 0, extra=["--tls-ca", pki / "ca.pem"])
    assert w.wait(timeout=60) == 1
    assert "no join secret" in w.log() and "--join-secret-file" in w.log()
    w = cluster.worker(secure, job.id, 0, extra=["--tls-ca", pki / "ca.pem"],
                       env={"TANDEM_JOIN_SECRET": alice.join_secret(job.id)})
    assert w.wait(timeout=120) == 0, w.log()
    assert alice.get(job.id).job.state == job_pb2.JOB_STATE_SUCCEEDED


def test_worker_registers_over_a_slow_tls_link(cluster, secure, pki):
    """Through a link with a 600 ms round trip (a proxy that delays each
    direction 300 ms), a worker's TLS handshake takes a few round trips.
    Its first attempt must get through (gRPC's 20 s connect timeout), be
    refused for its missing secret at once, and with the secret train
    the job. With the agent's old 100 ms connect timeout no handshake ever
    finished (worker/README.md, "Persistence and faults")."""
    alice = client(secure, pki, ALICE)
    job = alice.submit(spec(steps=3))
    proxy = harness.DelayProxy(secure.address, 0.3)
    try:
        via = types.SimpleNamespace(address=proxy.address)
        w = cluster.worker(via, job.id, 0, extra=["--tls-ca", pki / "ca.pem"])
        assert w.wait(timeout=60) == 1, w.log()
        assert "no join secret" in w.log(), w.log()
        assert "retrying registration" not in w.log(), w.log()
        w = cluster.worker(via, job.id, 0, extra=["--tls-ca", pki / "ca.pem"],
                           env={"TANDEM_JOIN_SECRET":
                                alice.join_secret(job.id)})
        assert w.wait(timeout=120) == 0, w.log()
        assert "retrying registration" not in w.log(), w.log()
        assert alice.get(job.id).job.state == job_pb2.JOB_STATE_SUCCEEDED
    finally:
        proxy.close()


def test_mutual_tls_requires_a_worker_certificate(cluster, pki, tmp_path):
    tokens = write_tokens(tmp_path / "tokens", [ALICE + " alice"])
    c = cluster.coordinator(extra=[
        "--tls-cert", pki / "server.pem", "--tls-key", pki / "server.key",
        "--tls-client-ca", pki / "ca.pem", "--auth-tokens", tokens])
    alice = client(c, pki, ALICE)  # users need no certificate
    job = alice.submit(spec())
    secret = alice.join_secret(job.id)
    stub, md = worker_stub(c, pki, secret)
    req = wpb.RegisterRequest(job_id=job.id, incarnation="i-1", hostname="h",
                              requested_rank=0, device="cpu")
    expect_refused(lambda: stub.Register(req, metadata=md, timeout=10),
                   grpc.StatusCode.UNAUTHENTICATED, "client certificate")
    w = cluster.worker(c, job.id, 0, env={"TANDEM_JOIN_SECRET": secret},
                       extra=["--tls-ca", pki / "ca.pem",
                              "--tls-cert", pki / "worker.pem",
                              "--tls-key", pki / "worker.key"])
    assert w.wait(timeout=120) == 0, w.log()
    assert alice.get(job.id).job.state == job_pb2.JOB_STATE_SUCCEEDED


def test_sighup_rereads_the_token_file(secure, pki):
    assert client(secure, pki, BOB).list() is not None
    write_tokens(secure.tokens, [ALICE + " alice", CAROL + " carol"])
    secure.proc.send_signal(signal.SIGHUP)
    wait_for(lambda: _refused(client(secure, pki, BOB)), timeout=10)
    assert client(secure, pki, CAROL).list() == []
    # A broken file is refused and the tokens in force stay.
    secure.tokens.write_text("garbage\n")
    secure.proc.send_signal(signal.SIGHUP)
    wait_for(lambda: "kept the old tokens" in
             secure.log_path.read_text(), timeout=10)
    assert client(secure, pki, CAROL).list() == []


def test_revoking_a_token_ends_its_open_watch(secure, pki):
    """A Watch opened before its token was revoked ends within a second of
    the token file's re-read (SIGHUP), UNAUTHENTICATED, as a new call
    would be."""
    bob = client(secure, pki, BOB)
    job = bob.submit(spec())
    updates = iter(bob.watch(job.id))
    assert next(updates)[0].id == job.id  # the stream is open
    write_tokens(secure.tokens, [ALICE + " alice", ROOT + " root admin"])
    secure.proc.send_signal(signal.SIGHUP)
    wait_for(lambda: "SIGHUP" in secure.log_path.read_text(), timeout=10)
    revoked = time.monotonic()
    with pytest.raises(tandem.TandemError) as e:
        for _ in updates:
            pass
    assert e.value.code == grpc.StatusCode.UNAUTHENTICATED, e.value
    assert "unknown token" in e.value.message
    assert time.monotonic() - revoked < 2.0


def _refused(c):
    try:
        c.list()
        return False
    except tandem.TandemError as e:
        return e.code == grpc.StatusCode.UNAUTHENTICATED


def test_public_address_needs_tls_and_tokens_or_insecure(cluster, pki,
                                                        tmp_path):
    binary = str(harness.coordinator_binary())
    db = str(tmp_path / "public.db")
    refused = subprocess.run([binary, "--listen", "0.0.0.0:0", "--db", db],
                             capture_output=True, text=True, timeout=30)
    assert refused.returncode == 2
    assert "--listen 0.0.0.0:0 is not a loopback address" in refused.stderr
    assert "--tls-cert and --tls-key and --auth-tokens" in refused.stderr
    metrics = subprocess.run(
        [binary, "--db", db, "--metrics-listen", "0.0.0.0:0"],
        capture_output=True, text=True, timeout=30)
    assert metrics.returncode == 2
    assert "--metrics-listen 0.0.0.0:0" in metrics.stderr
    tokens = write_tokens(tmp_path / "tokens", [ALICE + " alice"])
    tls_only = subprocess.run(
        [binary, "--listen", "0.0.0.0:0", "--db", db, "--tls-cert",
         str(pki / "server.pem"), "--tls-key", str(pki / "server.key")],
        capture_output=True, text=True, timeout=30)
    assert tls_only.returncode == 2 and "Add --auth-tokens" in tls_only.stderr
    # Protected, or explicitly insecure, it serves.
    c = cluster.coordinator(host="0.0.0.0", extra=[
        "--tls-cert", pki / "server.pem", "--tls-key", pki / "server.key",
        "--auth-tokens", tokens])
    assert client(c, pki, ALICE).list() == []
    c = cluster.coordinator(host="0.0.0.0", extra=["--insecure"])
    assert tandem.Client(c.address, timeout=10).list() == []
    # The worker's metrics exporter has no TLS: loopback or --insecure.
    w = subprocess.run([str(worker_binary()), "--coordinator",
                        "127.0.0.1:1", "--job", "j", "--metrics-listen",
                        "0.0.0.0:0"], capture_output=True, text=True,
                       timeout=30)
    assert w.returncode == 2 and "--insecure" in w.stderr


def http_get(port, path, token=None):
    import urllib.error
    import urllib.request
    req = urllib.request.Request(
        "http://127.0.0.1:%d%s" % (port, path),
        headers={"Authorization": "Bearer " + token} if token else {})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def test_metrics_port_asks_for_tokens(cluster, pki, tmp_path):
    tokens = write_tokens(tmp_path / "tokens", [ALICE + " alice",
                                                BOB + " bob"])
    c = cluster.coordinator(extra=[
        "--tls-cert", pki / "server.pem", "--tls-key", pki / "server.key",
        "--auth-tokens", tokens, "--metrics-listen", "127.0.0.1:0"])
    job = client(c, pki, ALICE).submit(spec())

    def get(path, token=None):
        return http_get(c.metrics_port, path, token)

    status, body = get("/metrics")
    assert status == 401 and "no token" in body
    assert get("/metrics", "nobody-0123456789abcdef")[0] == 401
    status, body = get("/metrics", BOB)
    assert status == 200 and "tandem_jobs" in body
    status, body = get("/jobs/" + job.id, BOB)
    assert status == 404 and job.id in body, (status, body)
    assert "on this coordinator" in body, body
    missing_status, missing_body = get("/jobs/" + job.id + "x", BOB)
    assert (status, body.replace(job.id, "ID")) == (
        missing_status, missing_body.replace(job.id + "x", "ID"))
    status, body = get("/jobs/" + job.id, ALICE)
    assert status == 200 and job.id in body


def test_metrics_show_a_user_only_their_own_jobs_series(cluster, pki,
                                                        tmp_path):
    """Issue 36 item 8: /metrics showed every user's job ids to any token
    holder. A job's series (here its connected workers, once its worker's
    session is open) reach its owner and an admin, never another user."""
    tokens = write_tokens(tmp_path / "tokens", [
        ALICE + " alice", BOB + " bob", ROOT + " root admin"])
    c = cluster.coordinator(extra=[
        "--tls-cert", pki / "server.pem", "--tls-key", pki / "server.key",
        "--auth-tokens", tokens, "--metrics-listen", "127.0.0.1:0"])
    alice = client(c, pki, ALICE)
    job = alice.submit(spec())
    stub, md = worker_stub(c, pki, alice.join_secret(job.id))
    stub.Register(wpb.RegisterRequest(job_id=job.id, incarnation="i-1",
                                      hostname="h", requested_rank=0,
                                      device="cpu"), metadata=md, timeout=10)
    release = threading.Event()

    def messages():
        yield wpb.WorkerMessage(hello=wpb.SessionHello(
            job_id=job.id, rank=0, incarnation="i-1"))
        release.wait()

    call = stub.Session(messages(), metadata=md, timeout=60)
    series = 'tandem_workers_connected{job="%s"} 1' % job.id
    try:
        wait_for(lambda: series in http_get(c.metrics_port, "/metrics",
                                            ALICE)[1],
                 timeout=20, what="alice's job's series")
        assert series in http_get(c.metrics_port, "/metrics", ROOT)[1]
        status, body = http_get(c.metrics_port, "/metrics", BOB)
        assert status == 200 and "tandem_jobs{" in body, body
        assert job.id not in body, body
    finally:
        release.set()
        call.cancel()


def test_health_check_over_tls(secure, pki):
    health = harness.build_dir() / "coordinator" / "tandem-health"
    ok = subprocess.run([str(health), "--tls-ca", str(pki / "ca.pem"),
                         secure.address], capture_output=True, text=True,
                        timeout=30)
    assert ok.returncode == 0 and "SERVING" in ok.stdout, ok.stderr
    plain = subprocess.run([str(health), "--timeout", "2", secure.address],
                           capture_output=True, text=True, timeout=30)
    assert plain.returncode == 1
