"""Security against a real broker (issue 6): SASL (SCRAM-SHA-256/512, PLAIN), TLS, no leaks.

A private broker (``secure_broker``, see conftest.py) has four listeners: PLAINTEXT (topics
are created and filled there), SASL_PLAINTEXT, SSL with client certificates required, and
SASL_SSL. The worker runs as a real ``streamer run`` process; the password only ever travels
in STREAMER_SASL_PASSWORD or a file named by STREAMER_SASL_PASSWORD_FILE.
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import pytest

from consumers.admin import wait_for_topic
from consumers.errors import AuthenticationError, TlsHandshakeError
from consumers.settings import ConsumerSettings, Secret, SecuritySettings
from streamer.simulator import produce
from tests.reliability.brokers import USERS, Certs, PrivateBroker, free_port
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
