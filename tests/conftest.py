"""Shared fixtures: a real Kafka broker for the session, fresh topics and group ids per test."""

from __future__ import annotations

import fcntl
import os
import subprocess
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
KAFKA_SH = ROOT / "deploy" / "local" / "kafka.sh"


def _in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


#: Held shared by every test session of this checkout while it runs (its controlling
#: process): the last one out stops the broker the tests started.
_IN_USE = ROOT / ".local-kafka.inuse"
#: Written by the session whose fixture started the broker (not one found running).
_STARTED = ROOT / ".local-kafka.started-by-tests"
_in_use: list[object] = []


def pytest_sessionstart(session: pytest.Session) -> None:
    if hasattr(session.config, "workerinput"):  # an xdist worker: its controller holds it
        return
    fh = open(_IN_USE, "w")  # noqa: SIM115 - held until the session's end
    fcntl.flock(fh, fcntl.LOCK_SH)
    _in_use.append(fh)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Stop the test broker the tests started (a run of a few tests must not leave a 400 MB
    JVM behind) once no other session of this checkout uses it; one started by hand stays.
    STREAMER_KEEP_BROKER=1 keeps it for the next run (faster when iterating)."""
    if hasattr(session.config, "workerinput") or not _in_use:
        return
    fh = _in_use.pop()
    try:
        if not _STARTED.exists() or os.environ.get("KAFKA_BOOTSTRAP"):
            return
        if os.environ.get("STREAMER_KEEP_BROKER", "") in ("1", "true", "yes"):
            print(
                "\nthe test broker stays up (STREAMER_KEEP_BROKER); stop it with "
                "`bash deploy/local/kafka.sh stop`"
            )
            return
        try:  # another session of this checkout still runs: the last one out stops it
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)  # type: ignore[arg-type]
        except BlockingIOError:
            return
        with open(ROOT / ".local-kafka.lock", "w") as lock:  # never during a start
            fcntl.flock(lock, fcntl.LOCK_EX)
            subprocess.run(
                ["bash", str(KAFKA_SH), "stop"], capture_output=True, timeout=120, check=False
            )
            _STARTED.unlink(missing_ok=True)
    finally:
        fh.close()  # type: ignore[attr-defined]


@pytest.fixture(scope="session")
def kafka_bootstrap() -> Iterator[str]:
    """Bootstrap address of a real broker: $KAFKA_BOOTSTRAP, or one started by deploy/local/kafka.sh."""
    given = os.environ.get("KAFKA_BOOTSTRAP")
    if given:
        yield given
        return
    # Under pytest-xdist each worker process asks: one starts it, the others wait for that
    # start and find it running (kafka.sh start answers the running broker's address).
    with open(ROOT / ".local-kafka.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        proc = subprocess.run(
            ["bash", str(KAFKA_SH), "start"],
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
    print(proc.stderr, end="")
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        msg = f"could not start the local Kafka broker (exit {proc.returncode}):\n{proc.stderr[-3000:]}"
        if _in_ci():
            pytest.fail(msg, pytrace=False)
        pytest.skip(msg)
    address = lines[-1]
    if "starting Kafka" in proc.stderr:  # started here, not found running
        _STARTED.touch()
    os.environ["KAFKA_BOOTSTRAP_STARTED"] = address
    yield address
    # Stopped at the session's end if the session started it (pytest_sessionfinish).


@pytest.fixture
def kafka_admin(kafka_bootstrap: str) -> Iterator[object]:
    from kafka.admin import KafkaAdminClient

    admin = KafkaAdminClient(bootstrap_servers=kafka_bootstrap, client_id="streamer-tests")
    yield admin
    admin.close()


@pytest.fixture
def make_topic(kafka_bootstrap: str) -> Iterator[Callable[..., str]]:
    """Factory: a fresh topic with the given partition count, deleted after the test."""
    from kafka.admin import KafkaAdminClient

    admin = KafkaAdminClient(bootstrap_servers=kafka_bootstrap, client_id="streamer-tests-topics")
    created: list[str] = []

    def make(
        partitions: int = 1, *, prefix: str = "t", config: dict[str, str] | None = None
    ) -> str:
        name = f"{prefix}-{uuid.uuid4().hex[:12]}"
        spec: dict[str, object] = {"num_partitions": partitions, "replication_factor": 1}
        if config:
            spec["configs"] = (
                config  # kafka-python 3.x: "configs" (a "topic_configs" key is ignored)
            )
        admin.create_topics({name: spec}, wait_for_metadata=True)
        created.append(name)
        return name

    yield make
    try:
        if created:
            admin.delete_topics(created)
    except Exception as exc:  # a test may have deleted its topic itself
        print(f"topic clean-up: {exc}")
    finally:
        admin.close()


@pytest.fixture
def group_id() -> str:
    """A fresh consumer group id."""
    return f"g-{uuid.uuid4().hex[:12]}"


@pytest.fixture(autouse=True)
def _no_worker_left_behind() -> Iterator[None]:
    """A test that fails half-way leaves no worker process it started running into the next
    tests (workers of module-scoped fixtures were started before, and are theirs to stop)."""
    from tests.workerutil import WorkerProcess

    before = len(WorkerProcess.started)
    yield
    mine, WorkerProcess.started[before:] = WorkerProcess.started[before:], []
    for worker in mine:
        try:
            worker.kill()
        except Exception as exc:  # reaping is best effort
            print(f"could not kill worker {worker.pid}: {exc}")
