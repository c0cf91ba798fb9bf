"""Tests for streamer.ops.health: Health rules and a real MetricsServer spoken to over HTTP."""

from __future__ import annotations

import contextlib
import http.client
import os
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Iterator

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import CONTENT_TYPE_LATEST, CONTENT_TYPE_PLAIN_0_0_4
from prometheus_client.openmetrics.parser import (
    text_string_to_metric_families as openmetrics_families,
)
from prometheus_client.parser import text_string_to_metric_families

from consumers.errors import ConfigError
from streamer.ops.health import Health, MetricsServer
from streamer.ops.metrics import Metrics

TOPIC = "rollouts"


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def get(
    server: MetricsServer, path: str, accept: str | None = None
) -> tuple[int, dict[str, str], bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    try:
        conn.request("GET", path, headers={"Accept": accept} if accept else {})
        response = conn.getresponse()
        return response.status, dict(response.getheaders()), response.read()
    finally:
        conn.close()


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


@pytest.fixture
def metrics() -> Metrics:
    return Metrics(
        TOPIC,
        CollectorRegistry(),
        version="0.1.0",
        tensorflow_version="2.21.0",
        kafka_python_version="3.0.12",
    )


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def health(clock: FakeClock) -> Health:
    return Health(stale_after_seconds=30, clock=clock)


@pytest.fixture
def server(metrics: Metrics, health: Health) -> Iterator[MetricsServer]:
    with MetricsServer(metrics.registry, health, host="127.0.0.1", port=0) as srv:
        yield srv


# -- Health rules -------------------------------------------------------------------------------


def test_live_with_no_components_and_while_components_beat(
    health: Health, clock: FakeClock
) -> None:
    assert health.liveness() == (True, "ok")
    health.beat("poller")
    health.beat("trainer")
    clock.now += 29
    health.beat("poller")
    assert health.liveness() == (True, "ok")


def test_stale_component_is_not_live_and_named(health: Health, clock: FakeClock) -> None:
    health.beat("poller")
    health.beat("trainer")
    clock.now += 31
    health.beat("poller")
    live, reason = health.liveness()
    assert not live
    assert reason == "trainer made no progress for 31s (limit 30s)"
    health.beat("trainer")
    assert health.liveness() == (True, "ok")


def test_registered_component_that_never_beats_goes_stale(health: Health, clock: FakeClock) -> None:
    health.register("trainer")
    assert health.liveness()[0]
    clock.now += 31
    assert not health.liveness()[0]
    health.unregister("trainer")
    assert health.liveness() == (True, "ok")


def test_waiting_component_stays_live_until_its_next_beat(health: Health, clock: FakeClock) -> None:
    # The broker is down: the poller still beats on every empty poll(), the trainer waits.
    health.beat("poller")
    health.beat("trainer")
    health.waiting("trainer", "waiting for input")
    for _ in range(10):
        clock.now += 29
        health.beat("poller")
        assert health.liveness() == (True, "ok")
    health.beat("trainer")  # a step finished: no longer waiting
    clock.now += 31
    health.beat("poller")
    assert not health.liveness()[0]


def test_readiness_transitions(health: Health) -> None:
    assert health.readiness() == (False, "starting")
    health.set_ready(True, "partitions assigned, model built")
    assert health.readiness() == (True, "partitions assigned, model built")
    health.set_ready(False, "no partitions assigned")
    assert health.readiness() == (False, "no partitions assigned")


def test_stale_after_must_be_positive() -> None:
    with pytest.raises(ConfigError, match="stale_after_seconds"):
        Health(stale_after_seconds=0)


def test_default_clock_is_real_time() -> None:
    health = Health()
    assert health.stale_after_seconds == 120.0
    health.beat("poller")
    assert health.liveness() == (True, "ok")


# -- HTTP ---------------------------------------------------------------------------------------


def test_metrics_endpoint_serves_the_registry(server: MetricsServer, metrics: Metrics) -> None:
    assert server.port > 0
    metrics.partitions_assigned([0])
    metrics.set_high_watermark(0, 7)
    status, headers, body = get(server, "/metrics")
    assert status == 200
    assert headers["Content-Type"] == CONTENT_TYPE_PLAIN_0_0_4
    families = {f.name: f for f in text_string_to_metric_families(body.decode())}
    assert families["streamer_records_polled"].type == "counter"
    assert families["streamer_record_age_at_train_seconds"].type == "histogram"
    lag = [s for s in families["streamer_consumer_lag_records"].samples]
    assert [(s.labels, s.value) for s in lag] == [({"topic": TOPIC, "partition": "0"}, 7.0)]
    build = families["streamer_build_info"].samples[0]
    assert build.value == 1.0 and build.labels["kafka_python"] == "3.0.12"


def test_metrics_endpoint_negotiates_like_prometheus_client(server: MetricsServer) -> None:
    status, headers, body = get(server, "/metrics?x=1", accept="text/plain;version=1.0.0")
    assert status == 200
    assert headers["Content-Type"].startswith(CONTENT_TYPE_LATEST)
    assert "streamer_train_steps_total 0.0" in body.decode()
    accept = "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5"
    status, headers, body = get(server, "/metrics", accept=accept)
    assert headers["Content-Type"].startswith("application/openmetrics-text")
    names = {f.name for f in openmetrics_families(body.decode())}
    assert "streamer_offset_commits" in names


def test_metrics_body_passes_promtool(server: MetricsServer, metrics: Metrics) -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        if in_ci():
            pytest.fail("promtool is not on PATH (apt-get install prometheus)")
        pytest.skip("promtool is not on PATH (apt-get install prometheus)")
    metrics.partitions_assigned([0, 1])
    metrics.observe_trained([0, 1], [3, 4], [1_700_000_000_000] * 2, 1_700_000_001.0)
    metrics.observe_step(2, 0.01, 0.001, 0.3)
    _, _, body = get(server, "/metrics")
    result = subprocess.run(
        [promtool, "check", "metrics"], input=body, capture_output=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stdout.decode() + result.stderr.decode()
    assert result.stdout.strip() == b"" and result.stderr.strip() == b""


def test_healthz_and_readyz_transitions(
    server: MetricsServer, health: Health, clock: FakeClock
) -> None:
    assert get(server, "/healthz")[::2] == (200, b"ok\n")
    assert get(server, "/readyz")[::2] == (503, b"starting\n")
    health.set_ready(True, "partitions assigned, model built")
    assert get(server, "/readyz")[::2] == (200, b"ok\n")
    health.set_ready(False, "all partitions revoked")
    assert get(server, "/readyz")[::2] == (503, b"all partitions revoked\n")

    health.beat("poller")
    health.beat("trainer")
    clock.now += 45
    health.beat("poller")
    status, headers, body = get(server, "/healthz")
    assert (status, body) == (503, b"trainer made no progress for 45s (limit 30s)\n")
    assert headers["Content-Type"] == "text/plain; charset=utf-8"
    health.beat("trainer")
    assert get(server, "/healthz")[0] == 200


def test_unknown_path_is_404(server: MetricsServer) -> None:
    assert get(server, "/")[0] == 404
    assert get(server, "/metrics/extra")[0] == 404


def test_requests_are_not_logged_to_stderr(
    server: MetricsServer, capfd: pytest.CaptureFixture[str]
) -> None:
    get(server, "/metrics")
    get(server, "/nope")
    assert capfd.readouterr().err == ""


def test_port_in_use_is_a_config_error(metrics: Metrics, health: Health) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        with pytest.raises(ConfigError, match="address in use") as info:
            MetricsServer(metrics.registry, health, host="127.0.0.1", port=port)
    assert info.value.setting == "metrics_port"
    assert info.value.value == port
    assert isinstance(info.value.__cause__, OSError)


def test_close_is_idempotent_and_joins_the_thread(metrics: Metrics, health: Health) -> None:
    before = threading.active_count()
    srv = MetricsServer(metrics.registry, health).start()
    srv.start()  # a second start is a no-op
    assert get(srv, "/healthz")[0] == 200
    srv.close()
    srv.close()
    # close() joins the serving thread; the GET's handler thread (a daemon) ends by itself
    # right after its response, so wait a moment for it rather than race it.
    assert f"metrics-http-{srv.port}" not in {t.name for t in threading.enumerate()}
    deadline = time.monotonic() + 5
    while threading.active_count() > before and time.monotonic() < deadline:
        time.sleep(0.02)
    assert threading.active_count() <= before
    with pytest.raises(ConnectionRefusedError):
        get(srv, "/healthz")
    with pytest.raises(RuntimeError, match="after close"):
        srv.start()


def test_close_without_start_releases_the_port(metrics: Metrics, health: Health) -> None:
    srv = MetricsServer(metrics.registry, health)
    port = srv.port
    srv.close()
    again = MetricsServer(metrics.registry, health, port=port)
    again.close()


def test_idle_and_slow_clients_hold_no_thread_and_health_is_answered_at_once(
    server: MetricsServer,
) -> None:
    """Connections that send nothing, or a byte every second (slowloris), hold a few bytes of
    buffer, never a handler thread: /healthz is answered while 300 of them are open, and a
    connection whose headers are not in within the deadline is closed."""
    from streamer.ops.health import HEADER_DEADLINE_SECONDS, MAX_PENDING

    before = threading.active_count()
    idle = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(MAX_PENDING - 6)]
    slow = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(4)]
    try:
        for conn in slow:
            conn.sendall(b"G")
        t0 = time.monotonic()
        for _ in range(5):  # as a probe would, while the slow ones trickle
            status, _, body = get(server, "/healthz")
            assert status == 200 and body == b"ok\n"
            for conn in slow:
                conn.sendall(b"E")
            time.sleep(0.5)
        assert threading.active_count() <= before + 2  # no thread per connection
        # Past the deadline the slow ones are closed however they trickle.
        for conn in slow:
            conn.settimeout(HEADER_DEADLINE_SECONDS + 10)
            with contextlib.suppress(ConnectionResetError):
                assert conn.recv(100) == b""
        assert time.monotonic() - t0 < HEADER_DEADLINE_SECONDS + 10
    finally:
        for conn in idle + slow:
            conn.close()


def test_answers_are_capped_and_the_one_too_many_is_told_so(
    server: MetricsServer, caplog: pytest.LogCaptureFixture
) -> None:
    """At most MAX_CONNECTIONS answers at once (clients that do not read theirs hold one
    each, up to the handler's timeout); one more is told 503 at once."""
    from streamer.ops.health import MAX_CONNECTIONS

    slots = server._server._slots
    for _ in range(MAX_CONNECTIONS):
        assert slots.acquire(blocking=False)
    try:
        with caplog.at_level("WARNING", logger="streamer.ops.health"):
            status, _, body = get(server, "/metrics")
        assert status == 503 and b"too many connections" in body
        assert "refusing more" in caplog.text
    finally:
        for _ in range(MAX_CONNECTIONS):
            slots.release()
    assert get(server, "/metrics")[0] == 200
