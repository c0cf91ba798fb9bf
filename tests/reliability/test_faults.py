"""Broker faults (issue 6): unreachable at start, missing topic, broker restart mid-stream.

Brokers that a test stops or kills are private (``private_broker``, its own KAFKA_LOCAL_DIR);
the shared broker of ``kafka_bootstrap`` is only used for topics that a test creates itself.
"""

from __future__ import annotations

import itertools
import re
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from consumers.admin import wait_for_topic
from consumers.errors import BrokerUnavailableError
from consumers.settings import ConsumerSettings
from streamer.input.simulator import produce
from tests.reliability.brokers import PrivateBroker, free_port
from tests.reliability.relutil import error_lines, http_get, metrics_base, start_worker
from tests.workerutil import (
    WorkerProcess,
    all_records,
    audit_lines,
    end_offsets,
    missing_and_extra,
    read_audit,
    summarize,
    worker_args,
)

pytestmark = pytest.mark.kafka

_RETRY = re.compile(
    r"^(\S+ \S+) INFO consumers\.admin: no Kafka broker answered at (\S+) "
    r"\(attempt (\d+)\); retrying in (\d+)s, for (\d+)s more",
    re.M,
)
_TOPIC_WAIT = re.compile(
    r"^(\S+ \S+) WARNING consumers\.admin: topic '([^']+)' does not exist", re.M
)


def _stamp(text: str) -> float:
    """Seconds of a log line's ``%(asctime)s`` (same day)."""
    hms, ms = text.split(" ")[1].split(",")
    h, m, s = (int(x) for x in hms.split(":"))
    return h * 3600 + m * 60 + s + int(ms) / 1000


def _closed_port() -> int:
    return free_port()  # bound and released at once: nothing listens there


# ---- broker unreachable at start ----------------------------------------------------------


def test_wait_for_topic_backs_off_between_a_bounded_number_of_attempts() -> None:
    bootstrap = f"127.0.0.1:{_closed_port()}"
    settings = ConsumerSettings(bootstrap_servers=bootstrap, topic="t", bootstrap_timeout_ms=500)
    sleeps: list[float] = []

    class Stop(threading.Event):
        def wait(self, timeout: float | None = None) -> bool:
            sleeps.append(float(timeout or 0))
            return super().wait(timeout)

    t0 = time.monotonic()
    with pytest.raises(BrokerUnavailableError) as info:
        wait_for_topic(settings, attempts=3, first_backoff_seconds=0.5, stop=Stop())
    elapsed = time.monotonic() - t0
    assert sleeps == [0.5, 1.0], sleeps  # exponential backoff between the 3 attempts
    # 3 probes of 0.5 s plus 1.5 s of backoff; never an immediate retry loop.
    assert 2.5 <= elapsed < 10, elapsed
    message = str(info.value)
    assert bootstrap in message and "gave up after 3 attempts" in message, message
    assert info.value.retriable


def test_stop_ends_the_wait_for_a_broker_at_once() -> None:
    settings = ConsumerSettings(
        bootstrap_servers=f"127.0.0.1:{_closed_port()}", topic="t", bootstrap_timeout_ms=300
    )
    stop = threading.Event()
    threading.Timer(1.0, stop.set).start()
    t0 = time.monotonic()
    with pytest.raises(BrokerUnavailableError):
        wait_for_topic(settings, attempts=50, first_backoff_seconds=30, stop=stop)
    assert time.monotonic() - t0 < 5


@pytest.mark.timeout(300)
def test_worker_gives_up_on_an_unreachable_broker_with_one_clear_error(tmp_path: Path) -> None:
    bootstrap = f"127.0.0.1:{_closed_port()}"
    t0 = time.monotonic()
    worker = start_worker(
        worker_args(bootstrap, "samples", "g-unreachable", None, stop_after_idle=None),
        tmp_path / "worker.log",
    )
    code = worker.wait(150)
    elapsed = time.monotonic() - t0
    log = worker.log()
    print(f"unreachable broker: exit {code} after {elapsed:.1f}s")
    assert code != 0, worker.tail()
    retries = _RETRY.findall(log)
    # Bounded retries with exponential backoff within --broker-wait-seconds (30 s): one INFO
    # line per retry, numbered from 1, announcing waits of 1, 2, 4, ... s.
    assert len(retries) >= 2, f"{retries}\n{worker.tail()}"
    attempts = [int(a) for _, _, a, _, _ in retries]
    waits = [int(w) for _, _, _, w, _ in retries]
    assert attempts == list(range(1, len(retries) + 1)), retries
    assert waits == [2**i for i in range(len(retries))], retries
    assert all(addr == bootstrap for _, addr, _, _, _ in retries)
    gaps = [_stamp(b[0]) - _stamp(a[0]) for a, b in itertools.pairwise(retries)]
    assert all(g >= w for g, w in zip(gaps, waits, strict=False)), (gaps, waits)
    errors = error_lines(log)
    assert len(errors) == 1, errors
    assert f"no Kafka broker answered at {bootstrap}" in errors[0], errors
    assert f"gave up after {len(retries) + 1} attempts" in errors[0], errors
    assert "--broker-wait-seconds 30" in errors[0], errors
    assert "Traceback" not in log, worker.tail()
    assert elapsed < 90, f"the retry budget took {elapsed:.0f}s"


# ---- topic missing at start ---------------------------------------------------------------


@pytest.mark.timeout(300)
def test_worker_waits_for_a_missing_topic_then_trains_it(
    kafka_bootstrap: str, kafka_admin: object, tmp_path: Path
) -> None:
    topic = f"late-{uuid.uuid4().hex[:10]}"
    audit = tmp_path / "audit.csv"
    args = worker_args(
        kafka_bootstrap,
        topic,
        f"g-{uuid.uuid4().hex[:8]}",
        audit,
        shards=2,
        batch_size=64,
        stop_after_idle=None,  # the test stops it once everything is trained
        extra=["--metrics-port", str(free_port()), "--idle-timeout", "3"],
    )
    worker = start_worker(args, tmp_path / "worker.log")
    try:
        base = metrics_base(worker)
        worker.wait_for(
            lambda: len(_TOPIC_WAIT.findall(worker.log())) >= 3, 120, "three topic-wait lines"
        )
        waits = _TOPIC_WAIT.findall(worker.log())
        assert all(name == topic for _, name in waits)
        gaps = [_stamp(b[0]) - _stamp(a[0]) for a, b in itertools.pairwise(waits)]
        assert gaps[0] >= 0.9 and gaps[1] >= 1.8, f"no backoff between checks: {gaps}"
        status, body = http_get(base + "/readyz")
        assert status == 503 and topic in body, (status, body)
        assert http_get(base + "/healthz")[0] == 200  # waiting is not dead
        assert audit_lines(audit) == 0
        produce(kafka_bootstrap, topic, 1000, partitions=3)
        worker.wait_for(lambda: audit_lines(audit) >= 1000, 150, "the 1000 late records")
        worker.terminate()
        code = worker.wait(60)
        expected = all_records(end_offsets(kafka_bootstrap, topic))
    finally:
        worker.kill()
        kafka_admin.delete_topics([topic])  # type: ignore[attr-defined]
    assert code == 0, worker.tail()
    waits = _TOPIC_WAIT.findall(worker.log())
    assert len(waits) <= 8, f"{len(waits)} checks: a tight loop\n{worker.tail()}"
    assert "exists now" in worker.log()
    assert len(expected) == 1000
    missing, extra = missing_and_extra(read_audit(audit, topic), expected)
    assert not missing, f"never trained: {summarize(missing)}\n{worker.tail()}"
    assert not extra, summarize(extra)


# ---- broker restart mid-stream ------------------------------------------------------------


#: A shard of a new pass that could not reach the broker (``consumers.shard``).
_BOOTSTRAP_FAILED = re.compile(r"consumers\.shard: shard \d+: no Kafka broker answered")


def _trained(audit: Path) -> set[tuple[int, int]]:
    """(partition, offset) of every complete audit line (the worker may be mid-write)."""
    try:
        text = audit.read_text(encoding="ascii")
    except FileNotFoundError:
        return set()
    lines = text.split("\n")[:-1]  # the last element is "" or a partial line
    return {(int(p), int(o)) for _, p, o in (line.rsplit(",", 2) for line in lines)}


def _wait_trained(worker: WorkerProcess, audit: Path, n: int, what: str) -> None:
    worker.wait_for(lambda: len(_trained(audit)) >= n, 180, what)


@pytest.mark.timeout(420)
@pytest.mark.parametrize(
    ("how", "pass_boundary", "client", "checkpoints"),
    [
        # A SIGKILL within one pass is covered by the SIGTERM case (the consumers reconnect
        # by themselves) and the SIGKILL ones across a pass boundary (70 s of CI saved).
        ("sigterm", False, "kafka-python", None),
        ("sigkill", True, "kafka-python", "steady"),
        ("sigkill", True, "confluent", "early"),
    ],
    ids=["sigterm", "sigkill-across-a-pass-boundary", "confluent-sigkill-pass"],
)
def test_worker_survives_a_broker_restart_without_losing_records(
    private_broker: PrivateBroker,
    tmp_path: Path,
    how: str,
    pass_boundary: bool,
    client: str,
    checkpoints: str | None,
) -> None:
    """The same worker process trains on after the broker comes back; nothing is lost, and
    nothing is trained twice.

    Without ``pass_boundary`` the pass outlives the outage (--idle-timeout 120): the shards'
    consumers reconnect by themselves. With it (--idle-timeout 3, an outage of 16 s or more,
    past the 10 s session) a new pass opens its shards while the broker is still down, for
    longer than bootstrap_timeout_ms. ``checkpoints``: with a --checkpoint-dir, written every
    second ("steady": the outage comes in a steady stream of checkpoints) or never before the
    outage ("early": only the state the run began in; a lost partition goes back to it).
    """
    broker = private_broker
    if not broker.running():
        broker.start()
    bootstrap = broker.plaintext
    topic = f"restart-{uuid.uuid4().hex[:8]}"
    audit = tmp_path / "audit.csv"
    produce(bootstrap, topic, 2000, partitions=4)
    idle_timeout = "3" if pass_boundary else "120"
    args = worker_args(
        bootstrap,
        topic,
        f"g-{uuid.uuid4().hex[:8]}",
        audit,
        shards=2,
        # Batches of 1: no partial batch waits for the end of a pass.
        batch_size=1,
        stop_after_idle=None,  # the outage must not end the run; the test stops it
        extra=[
            *("--idle-timeout", idle_timeout, "--commit-every-seconds", "1"),
            *("--kafka-client", client),
            *("--session-timeout-ms", "10000"),
            *(
                []
                if checkpoints is None
                else [
                    *("--checkpoint-dir", str(tmp_path / "ckpt")),
                    *("--checkpoint-every-seconds", "1" if checkpoints == "steady" else "3600"),
                    *("--checkpoint-every-steps", "1000000"),
                ]
            ),
        ],
    )
    worker = start_worker(args, tmp_path / "worker.log")
    try:
        _wait_trained(worker, audit, 1000, "the first 1000 records")
        pid = worker.pid  # mid-stream: about half of the first 2000 records are trained
        if how == "sigterm":
            broker.stop()
        else:
            broker.kill()
        if pass_boundary:
            # Until a pass ended idle (3 s), its shards gave up their final commit and a new
            # pass failed to bootstrap its consumers (10 s each): seen in the log, not guessed.
            worker.wait_for(
                lambda: _BOOTSTRAP_FAILED.search(worker.log()) is not None,
                90,
                "a new pass's shards failing to reach the broker",
            )
        else:
            time.sleep(5)
        assert worker.alive(), f"worker died while the broker was down\n{worker.tail()}"
        broker.start()
        t_back = time.monotonic()
        produce(bootstrap, topic, 2000, partitions=4)
        _wait_trained(worker, audit, 4000, "the records produced after the restart")
        print(f"{how}: all records trained {time.monotonic() - t_back:.1f}s after the restart")
        assert worker.pid == pid and worker.alive()
        errors = error_lines(worker.log())
    finally:
        # SIGKILL, not SIGTERM: the audit log reaches the OS at every step, and a SIGTERM
        # waits for the blocked input wait of a long idle pass (reported separately).
        worker.kill()
        if not broker.running():
            broker.start()  # leave it up for the next test of this module
    expected = all_records(end_offsets(bootstrap, topic))
    assert len(expected) == 4000
    trained = _trained(audit)
    missing, extra = sorted(expected - trained), sorted(trained - expected)
    assert not missing, f"never trained: {summarize(missing)}\n{worker.tail()}"
    assert not extra, summarize(extra)
    assert not errors, errors
    # The pass after the outage starts from what this worker trained, not from the group's
    # commit that the outage left behind (streamer.input.starts): nothing trained twice.
    twice = sorted(r for r, n in read_audit(audit, topic).items() if n > 1)
    assert not twice, f"{len(twice)} trained twice: {summarize(twice)}\n{worker.tail()}"


# ---- SIGTERM while the trainer waits for input (acted on by the wakeup-fd thread) --------------------------


@pytest.mark.timeout(180)
def test_sigterm_while_waiting_for_input_stops_within_the_shutdown_timeout(
    kafka_bootstrap: str, make_topic: Callable[..., str], tmp_path: Path
) -> None:
    topic = make_topic(1)
    args = worker_args(
        kafka_bootstrap,
        topic,
        f"g-{uuid.uuid4().hex[:8]}",
        None,
        shards=1,
        stop_after_idle=None,
        extra=["--idle-timeout", "60", "--shutdown-timeout", "5"],
    )
    worker = start_worker(args, tmp_path / "worker.log")
    try:
        worker.wait_for(lambda: "assigned partitions" in worker.log(), 120, "the assignment")
        time.sleep(3)  # the trainer is now blocked waiting for the first batch
        t0 = time.monotonic()
        worker.terminate()
        code = worker.wait(20)  # fails (and kills) if the signal is not acted upon in time
        elapsed = time.monotonic() - t0
    finally:
        worker.kill()
    assert code == 0, worker.tail()
    assert elapsed < 10, f"{elapsed:.1f}s"
