"""Security against a real broker (issue 6): SASL (SCRAM-SHA-256/512, PLAIN), TLS, no leaks.

A private broker (``secure_broker``, see conftest.py) has four listeners: PLAINTEXT (topics
are created and filled there), SASL_PLAINTEXT, SSL with client certificates required, and
SASL_SSL. The worker runs as a real ``streamer run`` process; the password only ever travels
in STREAMER_SASL_PASSWORD or a file named by STREAMER_SASL_PASSWORD_FILE.
"""

from __future__ import annotations

import base64
import json
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from consumers.admin import wait_for_topic
from consumers.errors import AuthenticationError, TlsHandshakeError
from consumers.settings import ConsumerSettings, Secret, SecuritySettings
from streamer.input.simulator import produce
from tests.reliability.brokers import ROOT, USERS, Certs, PrivateBroker, free_port
from tests.reliability.relutil import (
    error_lines,
    http_get,
    metrics_base,
    run_cli,
    start_worker,
)
from tests.workerutil import (
    WorkerProcess,
    all_records,
    committed_offsets,
    end_offsets,
    missing_and_extra,
    read_audit,
    summarize,
    worker_args,
)

pytestmark = pytest.mark.kafka

RECORDS = 600
PARTITIONS = 2
FAIL_FAST_S = 30  # the budget for a refused login or certificate, worker start included


def _topic(broker: PrivateBroker, records: int = RECORDS) -> str:
    topic = f"sec-{uuid.uuid4().hex[:10]}"
    produce(broker.plaintext, topic, records, partitions=PARTITIONS)
    return topic


def _failed_auths(broker: PrivateBroker) -> int:
    """The broker's count of refused logins and TLS handshakes so far (INFO lines)."""
    return broker.server_log().count("Failed authentication with")


def _sasl_flags(mechanism: str, user: str) -> list[str]:
    return [
        "--security-protocol",
        "SASL_PLAINTEXT",
        "--sasl-mechanism",
        mechanism,
        "--sasl-username",
        user,
    ]


def _assert_trained_everything(
    broker: PrivateBroker, topic: str, audit: Path, worker: WorkerProcess
) -> None:
    code = worker.wait(180)
    assert code == 0, f"worker exited {code}\n{worker.tail()}"
    expected = all_records(end_offsets(broker.plaintext, topic))
    assert len(expected) == RECORDS
    missing, extra = missing_and_extra(read_audit(audit, topic), expected)
    assert not missing, f"never trained: {summarize(missing)}\n{worker.tail()}"
    assert not extra, f"trained but never produced: {summarize(extra)}"


# ---- SASL: the worker trains over every mechanism ------------------------------------------


@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    ("user", "password_from", "client"),
    [
        ("alice", "env", "kafka-python"),
        ("bob", "file", "kafka-python"),
        ("carol", "env", "kafka-python"),
        ("bob", "file", "confluent"),
        ("carol", "env", "confluent"),
    ],
    ids=[
        "scram-sha-256-env",
        "scram-sha-512-file",
        "plain-env",
        "confluent-scram-sha-512-file",
        "confluent-plain-env",
    ],
)
def test_worker_trains_over_sasl(
    secure_broker: PrivateBroker, tmp_path: Path, user: str, password_from: str, client: str
) -> None:
    mechanism, password = USERS[user]
    topic = _topic(secure_broker)
    audit = tmp_path / "audit.csv"
    if password_from == "file":
        secret_file = tmp_path / "sasl-password"
        secret_file.write_text(password + "\n")  # a trailing newline, as in most secret files
        env = {"STREAMER_SASL_PASSWORD_FILE": str(secret_file)}
    else:
        env = {"STREAMER_SASL_PASSWORD": password}
    args = worker_args(
        secure_broker.listeners["SASL_PLAINTEXT"],
        topic,
        f"g-{uuid.uuid4().hex[:8]}",
        audit,
        shards=2,
        batch_size=64,
        stop_after_idle=3,
        extra=[*_sasl_flags(mechanism, user), "--kafka-client", client],
    )
    worker = start_worker(args, tmp_path / "worker.log", env)
    _assert_trained_everything(secure_broker, topic, audit, worker)
    assert password not in worker.log()


# ---- SASL: a wrong password fails fast, typed, once ----------------------------------------


@pytest.mark.timeout(300)
def test_wrong_password_fails_fast_with_one_clear_error_and_no_retry_storm(
    secure_broker: PrivateBroker, tmp_path: Path
) -> None:
    topic = _topic(secure_broker, 10)
    wrong = "wr0ng-Pa55-" + uuid.uuid4().hex[:8]
    bootstrap = secure_broker.listeners["SASL_PLAINTEXT"]
    before = _failed_auths(secure_broker)
    t0 = time.monotonic()
    worker = start_worker(
        worker_args(bootstrap, topic, "g-wrong", None, extra=_sasl_flags("SCRAM-SHA-256", "alice")),
        tmp_path / "worker.log",
        {"STREAMER_SASL_PASSWORD": wrong},
    )
    code = worker.wait(FAIL_FAST_S + 30)
    elapsed = time.monotonic() - t0
    log = worker.log()
    print(f"wrong password: exit {code} after {elapsed:.1f}s")
    assert code != 0, worker.tail()
    assert elapsed < FAIL_FAST_S, f"took {elapsed:.1f}s to give up\n{worker.tail()}"
    errors = error_lines(log)
    assert len(errors) == 1, f"want exactly one error line, got {errors}"
    assert f"authentication with {bootstrap} failed" in errors[0], errors
    assert "SCRAM-SHA-256" in errors[0] or "credentials" in errors[0], errors
    assert "Traceback" not in log, worker.tail()
    assert wrong not in log
    assert "no Kafka broker answered" not in log  # not mistaken for an unreachable broker
    assert "retrying in" not in log  # no second probe round: a refused login is final
    # No retry storm: one or two refused logins at the broker (kafka-python often loses the
    # broker's error response; two hang-ups mid-login end the probe, see consumers/admin.py).
    time.sleep(2)
    attempts = _failed_auths(secure_broker) - before
    print(f"wrong password: {attempts} refused logins at the broker")
    assert 1 <= attempts <= 3, f"{attempts} refused logins at the broker"
    time.sleep(2)
    assert _failed_auths(secure_broker) - before == attempts, "logins went on after the exit"


@pytest.mark.timeout(120)
@pytest.mark.parametrize("user", ["alice", "bob", "carol"])
def test_wrong_password_is_an_authentication_error_at_once(
    secure_broker: PrivateBroker, user: str
) -> None:
    mechanism, _ = USERS[user]
    wrong = "n0pe-" + uuid.uuid4().hex[:10]
    bootstrap = secure_broker.listeners["SASL_PLAINTEXT"]
    settings = ConsumerSettings(
        bootstrap_servers=bootstrap,
        topic="any",
        security=SecuritySettings(
            security_protocol="SASL_PLAINTEXT",
            sasl_mechanism=mechanism,  # type: ignore[arg-type]
            sasl_plain_username=user,
            sasl_plain_password=Secret(wrong),
        ),
    )
    t0 = time.monotonic()
    with pytest.raises(AuthenticationError) as info:
        wait_for_topic(settings, attempts=6)
    elapsed = time.monotonic() - t0
    assert elapsed < 5, f"{elapsed:.1f}s"  # not bootstrap_timeout_ms (10 s) per attempt
    assert not isinstance(info.value, TlsHandshakeError)
    assert info.value.bootstrap_servers == bootstrap
    text = f"{info.value} {info.value!r} {info.value.__cause__!r}"
    assert bootstrap in str(info.value)
    assert wrong not in text


def test_unknown_user_is_an_authentication_error(secure_broker: PrivateBroker) -> None:
    settings = ConsumerSettings(
        bootstrap_servers=secure_broker.listeners["SASL_PLAINTEXT"],
        topic="any",
        security=SecuritySettings(
            security_protocol="SASL_PLAINTEXT",
            sasl_mechanism="SCRAM-SHA-512",
            sasl_plain_username="mallory",
            sasl_plain_password=Secret("whatever-123"),
        ),
    )
    with pytest.raises(AuthenticationError):
        wait_for_topic(settings)


# ---- TLS ------------------------------------------------------------------------------------


def _tls_security(certs: Certs, **overrides: object) -> SecuritySettings:
    kw: dict[str, object] = {
        "security_protocol": "SSL",
        "ssl_cafile": str(certs.ca),
        "ssl_certfile": str(certs.client_cert),
        "ssl_keyfile": str(certs.client_key),
    }
    kw.update(overrides)
    return SecuritySettings(**kw)  # type: ignore[arg-type]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("client", ["kafka-python", "confluent"])
def test_worker_trains_over_sasl_ssl(
    secure_broker: PrivateBroker, certs: Certs, tmp_path: Path, client: str
) -> None:
    mechanism, password = USERS["alice"]
    topic = _topic(secure_broker)
    audit = tmp_path / "audit.csv"
    args = worker_args(
        secure_broker.listeners["SASL_SSL"],
        topic,
        f"g-{uuid.uuid4().hex[:8]}",
        audit,
        shards=2,
        batch_size=64,
        stop_after_idle=3,
        extra=[
            *_sasl_flags(mechanism, "alice"),
            "--security-protocol",
            "SASL_SSL",
            "--ssl-cafile",
            str(certs.ca),
            "--kafka-client",
            client,
        ],
    )
    worker = start_worker(args, tmp_path / "worker.log", {"STREAMER_SASL_PASSWORD": password})
    _assert_trained_everything(secure_broker, topic, audit, worker)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("client", ["kafka-python", "confluent"])
def test_worker_trains_over_ssl_with_a_client_certificate(
    secure_broker: PrivateBroker, certs: Certs, tmp_path: Path, client: str
) -> None:
    topic = _topic(secure_broker)
    audit = tmp_path / "audit.csv"
    args = worker_args(
        secure_broker.listeners["SSL"],
        topic,
        f"g-{uuid.uuid4().hex[:8]}",
        audit,
        shards=2,
        batch_size=64,
        stop_after_idle=3,
        extra=[
            "--security-protocol",
            "SSL",
            "--ssl-cafile",
            str(certs.ca),
            "--ssl-certfile",
            str(certs.client_cert),
            "--ssl-keyfile",
            str(certs.client_key),
            "--kafka-client",
            client,
        ],
    )
    worker = start_worker(args, tmp_path / "worker.log")
    _assert_trained_everything(secure_broker, topic, audit, worker)


@pytest.mark.timeout(300)
def test_untrusted_broker_certificate_fails_fast_in_the_worker(
    secure_broker: PrivateBroker, certs: Certs, tmp_path: Path
) -> None:
    mechanism, password = USERS["alice"]
    bootstrap = secure_broker.listeners["SASL_SSL"]
    t0 = time.monotonic()
    worker = start_worker(
        worker_args(
            bootstrap,
            "any-topic",
            "g-untrusted",
            None,
            extra=[
                *_sasl_flags(mechanism, "alice"),
                "--security-protocol",
                "SASL_SSL",
                "--ssl-cafile",
                str(certs.other_ca),
            ],
        ),
        tmp_path / "worker.log",
        {"STREAMER_SASL_PASSWORD": password},
    )
    code = worker.wait(FAIL_FAST_S + 30)
    elapsed = time.monotonic() - t0
    print(f"untrusted CA: exit {code} after {elapsed:.1f}s")
    assert code != 0
    assert elapsed < FAIL_FAST_S, worker.tail()
    errors = error_lines(worker.log())
    assert len(errors) == 1, errors
    assert f"TLS handshake with {bootstrap} failed" in errors[0], errors
    assert "CERTIFICATE_VERIFY_FAILED" in errors[0], errors
    assert password not in worker.log()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("case", ["untrusted-ca", "no-client-cert", "client-cert-from-another-ca"])
def test_tls_failures_are_typed_and_immediate(
    secure_broker: PrivateBroker, certs: Certs, case: str
) -> None:
    bootstrap = secure_broker.listeners["SSL"]
    if case == "untrusted-ca":
        security = _tls_security(certs, ssl_cafile=str(certs.other_ca))
    elif case == "no-client-cert":  # the SSL listener requires one
        security = _tls_security(certs, ssl_certfile=None, ssl_keyfile=None)
    else:
        security = _tls_security(
            certs, ssl_certfile=str(certs.rogue_cert), ssl_keyfile=str(certs.rogue_key)
        )
    settings = ConsumerSettings(bootstrap_servers=bootstrap, topic="any", security=security)
    t0 = time.monotonic()
    with pytest.raises(TlsHandshakeError) as info:
        wait_for_topic(settings, attempts=6)
    elapsed = time.monotonic() - t0
    assert elapsed < 5, f"{elapsed:.1f}s"
    assert isinstance(info.value, AuthenticationError)  # callers catching auth failures see it
    assert bootstrap in str(info.value)


def test_good_tls_settings_reach_the_topic(secure_broker: PrivateBroker, certs: Certs) -> None:
    topic = _topic(secure_broker, 10)
    settings = ConsumerSettings(
        bootstrap_servers=secure_broker.listeners["SSL"],
        topic=topic,
        security=_tls_security(certs),
    )
    assert wait_for_topic(settings, attempts=1) == list(range(PARTITIONS))


# ---- confluent-kafka: credentials refused after start-up ------------------------------------


def _poll_until_error(settings: ConsumerSettings, seconds: float = 30) -> BaseException:
    """Open the shard's confluent client and poll until it raises (the error, typed)."""
    from consumers.clients import open_client

    client = open_client(settings, 0)
    try:
        client.assign([0, 1])
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            try:
                client.poll(200, 0)
            except Exception as exc:  # the test looks at what it is
                return exc
        raise AssertionError(f"no error within {seconds}s")
    finally:
        client.close(1000)


@pytest.mark.timeout(120)
def test_confluent_client_turns_a_refused_login_into_an_authentication_error(
    secure_broker: PrivateBroker,
) -> None:
    # The start-up probe (kafka-python) catches bad credentials first; this is the shard's
    # own client meeting them (a password rotated while the worker runs).
    wrong = "n0pe-" + uuid.uuid4().hex[:10]
    bootstrap = secure_broker.listeners["SASL_PLAINTEXT"]
    settings = ConsumerSettings(
        bootstrap_servers=bootstrap,
        topic=_topic(secure_broker, 10),
        client="confluent",
        mode="static",
        partitions=(0, 1),
        security=SecuritySettings(
            security_protocol="SASL_PLAINTEXT",
            sasl_mechanism="SCRAM-SHA-256",
            sasl_plain_username="alice",
            sasl_plain_password=Secret(wrong),
        ),
    )
    error = _poll_until_error(settings)
    assert type(error) is AuthenticationError, repr(error)
    assert bootstrap in str(error)
    assert wrong not in f"{error} {error!r}"


@pytest.mark.timeout(120)
def test_confluent_client_turns_an_untrusted_certificate_into_a_tls_error(
    secure_broker: PrivateBroker, certs: Certs
) -> None:
    bootstrap = secure_broker.listeners["SSL"]
    settings = ConsumerSettings(
        bootstrap_servers=bootstrap,
        topic="any",
        client="confluent",
        mode="static",
        partitions=(0, 1),
        security=_tls_security(certs, ssl_cafile=str(certs.other_ca)),
    )
    error = _poll_until_error(settings)
    assert isinstance(error, TlsHandshakeError), repr(error)
    assert bootstrap in str(error)


# ---- no secret anywhere ---------------------------------------------------------------------


@pytest.mark.timeout(300)
def test_no_secret_in_logs_metrics_help_or_errors(
    secure_broker: PrivateBroker, tmp_path: Path
) -> None:
    mechanism, password = USERS["alice"]
    # The broker knows alice's real password; ours is distinctive, and is also used as the
    # TLS key password (ignored by PLAINTEXT-less SASL, but loaded into the settings).
    topic = _topic(secure_broker, 3000)
    ssl_secret = "ssl-" + uuid.uuid4().hex
    env = {"STREAMER_SASL_PASSWORD": password, "STREAMER_SSL_PASSWORD": ssl_secret}
    port = free_port()
    args = worker_args(
        secure_broker.listeners["SASL_PLAINTEXT"],
        topic,
        f"g-{uuid.uuid4().hex[:8]}",
        None,
        shards=2,
        batch_size=32,
        stop_after_idle=None,
        extra=[
            *_sasl_flags(mechanism, "alice"),
            "--log-level",
            "DEBUG",
            "--metrics-port",
            str(port),
        ],
    )
    worker = start_worker(args, tmp_path / "worker.log", env)
    try:
        base = metrics_base(worker)
        worker.wait_for(lambda: worker.samples_trained() > 0, 120, "training over SASL")
        pages = {path: http_get(base + path) for path in ("/metrics", "/healthz", "/readyz")}
    finally:
        worker.terminate()
    assert worker.wait(60) == 0, worker.tail()
    status, body = pages["/metrics"]
    assert status == 200 and "streamer_samples_trained_total" in body, body[:500]
    outputs = {"worker log (stdout+stderr, DEBUG)": worker.log()}
    outputs.update({f"GET {p}": b for p, (_, b) in pages.items()})
    help_run = run_cli(["run", "--help"], env=env)
    assert help_run.returncode == 0, help_run.stderr
    assert "STREAMER_SASL_PASSWORD" in help_run.stdout
    outputs["streamer run --help"] = help_run.stdout + help_run.stderr
    for name, text in outputs.items():
        for secret in (password, ssl_secret):
            assert secret not in text, f"a secret appears in the {name}"


@pytest.mark.timeout(120)
def test_no_secret_in_exception_text_or_settings_repr(secure_broker: PrivateBroker) -> None:
    from streamer.config import load_config

    secret = "exc-" + uuid.uuid4().hex
    bootstrap = secure_broker.listeners["SASL_PLAINTEXT"]
    env = {"STREAMER_SASL_PASSWORD": secret, "STREAMER_SSL_PASSWORD": secret}
    config = load_config(
        {
            "bootstrap": bootstrap,
            "security_protocol": "SASL_PLAINTEXT",
            "sasl_mechanism": "PLAIN",
            "sasl_username": "carol",
        },
        env=env,
    )
    consumer = config.consumer_settings()
    texts = [repr(config), str(config.describe()), repr(consumer), str(consumer.describe())]
    with pytest.raises(AuthenticationError) as info:
        wait_for_topic(consumer)
    exc: BaseException | None = info.value
    while exc is not None:  # the whole chain: our error and kafka-python's under it
        texts += [str(exc), repr(exc), repr(exc.args)]
        exc = exc.__cause__ or exc.__context__
    # A password that the broker echoes would be masked too (defence in depth).
    for text in texts:
        assert secret not in text, text


# ---- no secret in DEBUG records, when an application embeds the package -----------------------

# An application that embeds the package and logs everything at DEBUG (root logger, the client
# libraries' loggers left alone), run as its own process: stderr, stdout and a handler on the
# root logger that writes each record whole (``record.__dict__``: template, args, traceback)
# are what the test searches. ``control`` builds kafka-python's admin client directly (as no
# code of ours does), so the same capture must see the password: the search can fail.
_EMBEDDING_APP = """
import json, logging, sys, time

p = json.loads(sys.argv[1])


class Capture(logging.Handler):
    def __init__(self, path):
        super().__init__(logging.DEBUG)
        self.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
        self.out = open(path, "w", encoding="utf-8")
        self.count = 0

    def emit(self, record):
        self.count += 1
        self.out.write(self.format(record) + "\\n" + repr(record.__dict__) + "\\n")
        self.out.flush()


capture = Capture(p["capture"])
logging.basicConfig(level=logging.DEBUG, stream=sys.stderr,
                    format="%(asctime)s %(levelname)s %(name)s: %(message)s")
root = logging.getLogger()
root.addHandler(capture)
summary = {}
if p["mode"] == "control":
    root.handlers[:] = [capture]  # the leak goes to the capture file only
    from kafka.admin import KafkaAdminClient

    admin = KafkaAdminClient(
        bootstrap_servers=p["bootstrap"], security_protocol="SASL_SSL", sasl_mechanism="PLAIN",
        sasl_plain_username=p["user"], sasl_plain_password=p["password"], ssl_cafile=p["ca"],
        ssl_password=p["ssl_password"])
    summary["topics"] = len(admin.list_topics())
    admin.close()
else:
    from consumers.admin import ensure_topic, group_lag, wait_for_topic
    from consumers.clients import open_client
    from consumers.settings import ConsumerSettings, Secret, SecuritySettings
    from streamer.input.deadletter import DeadLetterWriter

    if p["mode"] == "confluent":  # librdkafka's own debug output, all of it
        import consumers.clients.confluent as adapter

        config = adapter.consumer_config
        adapter.consumer_config = lambda s, i: {**config(s, i), "debug": "all"}
    security = SecuritySettings(
        security_protocol="SASL_SSL", sasl_mechanism="PLAIN", sasl_plain_username=p["user"],
        sasl_plain_password=Secret(p["password"]), ssl_cafile=p["ca"],
        ssl_password=Secret(p["ssl_password"]))
    settings = ConsumerSettings(
        bootstrap_servers=p["bootstrap"], topic=p["topic"], group_id=p["group"],
        mode="static", partitions=(0, 1), client=p["mode"], security=security)
    wait_for_topic(settings, attempts=2)  # the start-up probe (kafka-python)
    client = open_client(settings, 0)  # the shard's consumer
    try:
        client.assign([0, 1], {0: 0, 1: 0})
        read, ends, deadline = 0, {}, time.monotonic() + 60
        while read < p["records"] and time.monotonic() < deadline:
            block = client.poll(200, 0)
            if block is not None:
                read += len(block)
                ends.update(block.next_offsets())
        client.commit(ends, timeout_ms=10000)
        summary["read"] = read
    finally:
        client.close(5000)
    summary["lag"] = len(group_lag(p["bootstrap"], p["group"], p["topic"], security=security))
    ensure_topic(settings, p["topic"] + "-dlq", partitions=1)  # admin
    done = []
    writer = DeadLetterWriter(  # the dead-letter producer, as the worker builds it
        p["bootstrap"], p["topic"] + "-dlq", on_done=lambda part, off: done.append(off),
        security=security.kafka_config())
    writer.send(b"bad record", p["topic"], 0, 0, "test")
    writer.close(30)
    summary["dead_letters"] = len(done)
summary["records"] = capture.count
print(json.dumps(summary))
"""


def _shown_forms(user: str, password: str) -> dict[str, str]:
    """The ways a log line could show the password: plain, PLAIN's auth bytes (repr, base64,
    hex) and the password's own base64."""
    auth = f"{user}\0{user}\0{password}".encode()  # kafka-python's: authzid, authcid, password
    return {
        "the password": password,
        "PLAIN auth bytes (repr)": repr(auth)[2:-1],
        "PLAIN auth bytes (base64)": base64.b64encode(auth).decode(),
        "PLAIN auth bytes (hex)": auth.hex(),
        "the password (base64)": base64.b64encode(password.encode()).decode(),
    }


def _embedded_run(
    mode: str, params: dict[str, object], tmp_path: Path
) -> tuple[dict[str, int], dict[str, str]]:
    capture = tmp_path / f"{mode}-records.txt"
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            _EMBEDDING_APP,
            json.dumps({**params, "mode": mode, "capture": str(capture)}),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=150,
        check=False,
    )
    assert proc.returncode == 0, f"{mode} run exited {proc.returncode}\n{proc.stderr[-4000:]}"
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    texts = {
        "stdout": proc.stdout,
        "stderr (root at DEBUG, librdkafka's own output)": proc.stderr,
        "records on the root logger (whole)": capture.read_text(encoding="utf-8"),
    }
    return summary, texts


@pytest.mark.timeout(300)
@pytest.mark.parametrize("client", ["kafka-python", "confluent"])
def test_no_secret_in_any_debug_record_of_an_embedding_application(
    secure_broker: PrivateBroker, certs: Certs, tmp_path: Path, client: str
) -> None:
    user = "carol"  # PLAIN: the auth bytes hold the password itself
    _, password = USERS[user]
    ssl_secret = "sslpw-" + uuid.uuid4().hex  # the TLS key password, in every config dump
    params: dict[str, object] = {
        "bootstrap": secure_broker.listeners["SASL_SSL"],
        "ca": str(certs.ca),
        "user": user,
        "password": password,
        "ssl_password": ssl_secret,
        "topic": _topic(secure_broker, 200),
        "group": f"g-{uuid.uuid4().hex[:8]}",
        "records": 200,
    }
    forms = {**_shown_forms(user, password), "the TLS key password": ssl_secret}
    if client == "kafka-python":
        # The control: the capture sees kafka-python's DEBUG leak when nothing redacts it.
        summary, texts = _embedded_run("control", params, tmp_path)
        leaked = texts["records on the root logger (whole)"]
        assert summary["topics"] >= 1 and summary["records"] > 20, summary
        assert password in leaked and ssl_secret in leaked, "the control run leaked nothing"
        assert forms["PLAIN auth bytes (repr)"] in leaked
    summary, texts = _embedded_run(client, params, tmp_path)
    print(f"{client}: {summary}")
    assert summary["read"] == 200 and summary["dead_letters"] == 1, summary
    assert summary["lag"] == 2, summary
    for where, text in texts.items():
        for form, needle in forms.items():
            at = text.find(needle)
            assert at < 0, f"{form} appears in the {where}: ...{text[max(0, at - 200) : at]}"
    records = texts["records on the root logger (whole)"]
    # DEBUG was on and the lines that used to leak were logged (masked).
    assert summary["records"] > 200, summary
    assert "SaslAuthenticateRequest(" in records and "auth_bytes=b'***'" in records
    assert "Starting KafkaAdminClient with configuration" in records
    assert "'sasl_plain_password': '***'" in records and "'ssl_password': '***'" in records
    if client == "confluent":
        librdkafka = [
            line for line in records.splitlines() if line.startswith("DEBUG confluent_kafka")
        ]
        assert len(librdkafka) > 50, "no librdkafka debug records"
        assert any("SASL" in line for line in librdkafka), librdkafka[:20]
        # librdkafka masks its own secrets in its configuration dump (debug "conf").
        assert "sasl.password = [redacted]" in records
        assert "ssl.key.password = [redacted]" in records


# The CLI: kafka's loggers stay at WARNING even with --log-level DEBUG, and its handler masks
# the registered secrets in every record (a logger made later, a record factory replaced).
_CLI_LOGGING = """
import logging, sys
from consumers.redact import protect
from consumers.settings import Secret, SecuritySettings
from streamer.cli.logs import configure_logging

password = sys.argv[1]
configure_logging("DEBUG")
assert logging.getLogger("kafka").getEffectiveLevel() == logging.WARNING
assert logging.getLogger("kafka.net.connection").getEffectiveLevel() == logging.WARNING
assert logging.getLogger("confluent_kafka").getEffectiveLevel() == logging.WARNING
protect(SecuritySettings(security_protocol="SASL_SSL", sasl_mechanism="PLAIN",
                         sasl_plain_username="carol", sasl_plain_password=Secret(password)))
logging.getLogger("kafka.made.later").warning("config %s", {"sasl_plain_password": password})
logging.getLogger("streamer.app").error("failed: %r", RuntimeError("login " + password))
logging.setLogRecordFactory(logging.LogRecord)  # an application resetting the factory
logging.getLogger("kafka.made.even.later").warning("auth %s", password.encode().hex())
"""


def test_cli_logging_keeps_kafka_at_warning_and_masks_secrets_in_every_record() -> None:
    password = "cli-" + uuid.uuid4().hex
    proc = subprocess.run(
        [sys.executable, "-c", _CLI_LOGGING, password],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 3 and all("***" in line for line in lines), proc.stderr
    assert "'sasl_plain_password': '***'" in lines[0]
    assert password not in proc.stderr and password.encode().hex() not in proc.stderr


# ---- The operations tools reach a secured cluster (issue 22) -------------------------------


@pytest.mark.timeout(300)
@pytest.mark.parametrize("how", ["SASL_SSL from STREAMER_*", "SSL from --config"])
def test_simulate_lag_and_reset_group_reach_a_secured_cluster(
    secure_broker: PrivateBroker, certs: Certs, tmp_path: Path, how: str
) -> None:
    """``simulate`` fills a topic, ``reset-group`` moves a group to its end and back, ``lag``
    reads it: each over the secured listener, with the settings ``run`` takes; the plaintext
    listener confirms what they did."""
    topic, group = f"sec-ops-{uuid.uuid4().hex[:10]}", f"g-{uuid.uuid4().hex[:8]}"
    mechanism, password = USERS["alice"]
    env: dict[str, str] = {}
    flags: list[str] = []
    if how.startswith("SASL_SSL"):
        env = {
            "STREAMER_BOOTSTRAP": secure_broker.listeners["SASL_SSL"],
            "STREAMER_SECURITY_PROTOCOL": "SASL_SSL",
            "STREAMER_SASL_MECHANISM": mechanism,
            "STREAMER_SASL_USERNAME": "alice",
            "STREAMER_SASL_PASSWORD": password,
            "STREAMER_SSL_CAFILE": str(certs.ca),
        }
    else:
        config = tmp_path / "streamer.toml"
        config.write_text(
            f'bootstrap = "{secure_broker.listeners["SSL"]}"\n'
            'security_protocol = "SSL"\n'
            f'ssl_cafile = "{certs.ca}"\n'
            f'ssl_certfile = "{certs.client_cert}"\n'
            f'ssl_keyfile = "{certs.client_key}"\n',
            encoding="utf-8",
        )
        flags = ["--config", str(config)]

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        done = run_cli([args[0], *flags, *args[1:]], env)
        assert done.returncode == 0, f"streamer {args[0]}: exit {done.returncode}\n{done.stderr}"
        assert password not in done.stdout + done.stderr
        return done

    def lag() -> dict[int, tuple[int | None, int]]:
        rows = json.loads(cli("lag", "--group", group, "--topic", topic, "--json").stdout)
        return {r["partition"]: (r["committed"], r["lag"]) for r in rows["partitions"]}

    cli("simulate", "--topic", topic, "--records", "300", "--partitions", "2")
    ends = end_offsets(secure_broker.plaintext, topic)
    assert sum(ends.values()) == 300 and len(ends) == PARTITIONS
    assert lag() == {p: (None, end) for p, end in ends.items()}  # no commits yet: the whole topic
    cli("reset-group", "--group", group, "--topic", topic, "--to", "latest", "--execute")
    assert committed_offsets(secure_broker.plaintext, group, topic) == ends
    assert lag() == {p: (end, 0) for p, end in ends.items()}
    cli("reset-group", "--group", group, "--topic", topic, "--to", "earliest", "--execute")
    assert committed_offsets(secure_broker.plaintext, group, topic) == dict.fromkeys(ends, 0)
    assert lag() == {p: (0, end) for p, end in ends.items()}
    if not env:
        return
    # streamer bench fills a topic of its own and reads it with each client and the worker.
    modes = "raw,pipeline@1,raw-confluent,pipeline-confluent@1,worker"
    args = ("--records", "400", "--repeats", "1", "--modes", modes, "--json")
    out = json.loads(cli("bench", *args).stdout)
    assert set(out["modes"]) == set(modes.split(","))
    assert all(m["records_per_second_median"] > 0 for m in out["modes"].values()), out


@pytest.mark.timeout(300)
def test_the_operations_tools_turn_a_wrong_password_into_one_clear_error(
    secure_broker: PrivateBroker,
) -> None:
    """``simulate``, ``lag``, ``reset-group`` and ``replay`` with a wrong password: exit 1
    within the fail-fast budget, one error line naming the authentication, no traceback, no
    password, no library noise."""
    topic = _topic(secure_broker, 10)
    wrong = "wr0ng-Pa55-" + uuid.uuid4().hex[:8]
    env = {
        "STREAMER_BOOTSTRAP": secure_broker.listeners["SASL_PLAINTEXT"],
        "STREAMER_SECURITY_PROTOCOL": "SASL_PLAINTEXT",
        "STREAMER_SASL_MECHANISM": "SCRAM-SHA-256",
        "STREAMER_SASL_USERNAME": "alice",
        "STREAMER_SASL_PASSWORD": wrong,
    }
    for args in (
        ["simulate", "--topic", topic, "--records", "10"],
        ["lag", "--group", "g-wrong", "--topic", topic],
        ["reset-group", "--group", "g-wrong", "--topic", topic, "--to", "latest"],
        ["replay", "--topic", topic, "--from", "earliest", "--to", "latest"],
    ):
        t0 = time.monotonic()
        done = run_cli(args, env, timeout=FAIL_FAST_S + 60)
        elapsed = time.monotonic() - t0
        lines = [line for line in done.stderr.splitlines() if line.strip()]
        noisy = [line for line in lines if " WARNING " in line or " ERROR " in line]
        print(f"{args[0]}: exit {done.returncode} after {elapsed:.1f}s, {len(lines)} lines")
        assert done.returncode == 1, f"{args[0]}: exit {done.returncode}\n{done.stderr}"
        assert elapsed < FAIL_FAST_S, f"{args[0]} took {elapsed:.1f}s\n{done.stderr}"
        assert f"authentication with {env['STREAMER_BOOTSTRAP']} failed" in done.stderr, done.stderr
        assert "Traceback" not in done.stderr and wrong not in done.stdout + done.stderr
        assert len(noisy) <= 1, f"{args[0]}: library noise\n{done.stderr}"
