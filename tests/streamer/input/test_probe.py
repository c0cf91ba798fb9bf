"""streamer.input.probe: readiness's TCP check of the bootstrap servers, against real sockets
on 127.0.0.1 (a listening one and a closed port); no Kafka needed."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator

import pytest

from streamer.input.probe import BrokerProbe


@pytest.fixture
def listening() -> Iterator[socket.socket]:
    server = socket.create_server(("127.0.0.1", 0))
    yield server
    server.close()


def closed_port() -> int:
    """A port nothing listens on (bound, then released)."""
    with socket.create_server(("127.0.0.1", 0)) as s:
        return int(s.getsockname()[1])


def test_the_constructor_does_no_io_and_start_checks(listening: socket.socket) -> None:
    port = listening.getsockname()[1]
    probe = BrokerProbe(f"127.0.0.1:{port}", interval_seconds=60)
    assert probe.up is False  # nothing checked yet
    try:
        assert probe.start().up is True
    finally:
        probe.close()


def test_any_reachable_server_of_the_list_is_enough(listening: socket.socket) -> None:
    port = listening.getsockname()[1]
    probe = BrokerProbe(f"127.0.0.1:{closed_port()}, 127.0.0.1:{port}", timeout_seconds=1)
    assert probe.check() is True
    assert BrokerProbe(f"127.0.0.1:{closed_port()}", timeout_seconds=1).check() is False


def test_ipv6_brackets_are_stripped() -> None:
    probe = BrokerProbe("[::1]:9092")
    assert probe._servers == [("::1", 9092)]


def test_a_flip_is_reported_once_from_the_probe_thread() -> None:
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]
    flips: list[bool] = []
    flipped = threading.Event()

    def on_change(up: bool) -> None:
        flips.append(up)
        flipped.set()

    probe = BrokerProbe(
        f"127.0.0.1:{port}", interval_seconds=0.02, timeout_seconds=1, on_change=on_change
    ).start()
    try:
        assert probe.up is True
        server.close()  # the "broker" goes away
        assert flipped.wait(10), "the probe never noticed the server was gone"
        assert probe.up is False
    finally:
        probe.close()
    assert flips == [False]
