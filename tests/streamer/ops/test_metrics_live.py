"""Issue 5 end to end: /metrics, /healthz and /readyz of a real worker process on a real broker.

One worker (``streamer run --shards 2 --stop-after-idle 15``) trains a 3-partition topic while a
background thread scrapes its /metrics ten times a second and a real Prometheus server scrapes
it every second. The tests judge the exposition from the outside against independent truth:
the audit log (one ``topic,partition,offset`` line per trained sample), the broker's end offsets
and the group's committed offsets (``streamer lag``). The outage test stops and restarts a
PRIVATE broker (its own ``KAFKA_LOCAL_DIR``), never the shared one.

The lag checks account for a scrape not being atomic: families are collected one after another
while the trainer keeps updating them, so a single body need not satisfy ``lag = high watermark
- trained`` exactly. Within one assignment the high watermark, trained and committed offsets
only grow and are collected before the lag, so two consecutive scrapes k, k+1 bracket it:
``hw[k] - floor[k+1] <= lag[k] <= hw[k+1] - floor[k]`` with ``floor = max(trained, committed)``
(DESIGN section 5 and ``Metrics``: committed is a floor, equal to trained in normal operation).
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
import threading
import time
import urllib.parse
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

import pytest

from streamer.input.simulator import produce
from streamer.ops.metrics import DECODE_ERROR_REASONS, KAFKA_ERROR_TYPES
from tests.reliability.brokers import PrivateBroker, need_tools, serve
from tests.workerutil import (
    RateProducer,
    WorkerProcess,
    audit_lines,
    end_offsets,
    free_port,
    http_get,
    metric_types,
    parse_metrics,
    read_audit,
    worker_args,
)

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(300)]

PARTITIONS = 3
RECORDS = 5000
SHARDS = 2
BATCH = 256
IDLE_S = 15  # --stop-after-idle of the live worker
START_S = 120  # TensorFlow import + group join on a loaded machine
PROM_RATE = 1000.0  # records/s produced while Prometheus watches
PROM_PRODUCE_S = 8.0
SCRAPE_EVERY_S = 0.1

# DESIGN section 5: every family, its type and its label names (besides "le" of histograms).
COUNTERS = {
    "records_polled_total": {"topic"},
    "bytes_polled_total": {"topic"},
    "records_decoded_total": {"topic"},
    "samples_trained_total": {"topic"},
    "train_steps_total": set(),
    "decode_errors_total": {"topic", "reason"},
    "records_dead_lettered_total": {"topic"},
    "offset_commits_total": {"result"},
    "rebalances_total": {"event"},
    "kafka_errors_total": {"type"},
    "checkpoints_total": {"result"},
    "padded_rows_total": set(),
    "idle_steps_total": set(),
    "rollbacks_total": set(),
}
PER_PARTITION = {
    "partition_high_watermark_offset",
    "partition_position_offset",
    "partition_trained_offset",
    "partition_committed_offset",
    "consumer_lag_records",
    "partition_last_trained_timestamp_seconds",
}
GAUGES = {
    **{name: {"topic", "partition"} for name in PER_PARTITION},
    "queue_depth_records": {"stage"},
    "queue_capacity_records": {"stage"},
    "paused_partitions": set(),
    "last_poll_timestamp_seconds": set(),
    "assigned_partitions": set(),
    "last_checkpoint_timestamp_seconds": set(),
    "cluster_workers": set(),
    "build_info": {"version", "tensorflow", "kafka_python"},
}
HISTOGRAMS = {
    "record_age_at_train_seconds",
    "input_wait_seconds",
    "train_step_seconds",
    "commit_duration_seconds",
}
# Series that must exist (at 0) from start-up, before any partition is assigned.
STARTUP_LABEL_VALUES = {
    "decode_errors_total": ("reason", set(DECODE_ERROR_REASONS)),
    "kafka_errors_total": ("type", set(KAFKA_ERROR_TYPES)),
    "offset_commits_total": ("result", {"success", "failure"}),
    "checkpoints_total": ("result", {"success", "failure"}),
    "rebalances_total": ("event", {"assigned", "revoked", "lost"}),
    "queue_depth_records": ("stage", {"shard", "prefetch", "dead_letter"}),
    # Only the shard queues have a fixed capacity (no false 0 for autotuned buffers).
    "queue_capacity_records": ("stage", {"shard"}),
}


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


def wait_until(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(0.2)


# ---- one /metrics body ----------------------------------------------------------------------


class Scrape:
    """One /metrics body, fetched at Unix time ``t``; parsed on first use."""

    def __init__(self, t: float, body: str) -> None:
        self.t = t
        self.body = body

    @cached_property
    def samples(self) -> dict[str, list[tuple[dict[str, str], float]]]:
        return parse_metrics(self.body)

    def value(self, name: str, **labels: str) -> float | None:
        for have, v in self.samples.get(f"streamer_{name}", []):
            if all(have.get(k) == want for k, want in labels.items()):
                return v
        return None

    def total(self, name: str) -> float:
        return sum(v for _, v in self.samples.get(f"streamer_{name}", []))

    def per_partition(self, name: str) -> dict[int, float]:
        return {int(lab["partition"]): v for lab, v in self.samples.get(f"streamer_{name}", [])}


@dataclass(frozen=True)
class LagView:
    """Per-partition (high watermark, trained, committed, lag) of one scrape, and the number of
    rebalance callbacks so far (an assignment epoch changes it)."""

    t: float
    rebalances: float
    parts: dict[int, tuple[float, float, float, float]]


_LAG_FAMILIES = (
    "partition_high_watermark_offset",
    "partition_trained_offset",
    "partition_committed_offset",
    "consumer_lag_records",
)


def lag_view(s: Scrape) -> LagView:
    cols = [s.per_partition(name) for name in _LAG_FAMILIES]
    common = set.intersection(*(set(c) for c in cols))
    parts = {p: (cols[0][p], cols[1][p], cols[2][p], cols[3][p]) for p in common}
    return LagView(s.t, s.total("rebalances_total"), parts)


def lag_bracket_violations(views: list[LagView]) -> tuple[list[str], int, int]:
    """(violations, pairs checked, checked pairs whose lag was > 0); see the module docstring.

    A pair is skipped when a rebalance callback ran around it or a value went down (a new
    assignment epoch starts the per-partition series again at 0).
    """
    bad: list[str] = []
    checked = nonzero = 0
    for k in range(1, len(views) - 1):
        before, cur, after = views[k - 1], views[k], views[k + 1]
        if not before.rebalances == cur.rebalances == after.rebalances:
            continue
        for p in sorted(cur.parts.keys() & after.parts.keys() & before.parts.keys()):
            hw0, tr0, c0, lag = cur.parts[p]
            hw1, tr1, c1, _ = after.parts[p]
            f0, f1 = max(tr0, c0), max(tr1, c1)
            if hw1 < hw0 or f1 < f0:
                continue
            lo, hi = max(0.0, hw0 - f1), max(0.0, hw1 - f0)
            checked += 1
            nonzero += lag > 0
            if not lo <= lag <= hi:
                bad.append(
                    f"t={cur.t:.3f} partition {p}: lag {lag:g} outside [{lo:g}, {hi:g}] "
                    f"(hw {hw0:g}->{hw1:g}, trained {tr0:g}->{tr1:g}, committed {c0:g}->{c1:g})"
                )
    return bad, checked, nonzero


# ---- the live worker --------------------------------------------------------------------------


@dataclass
class LiveRun:
    bootstrap: str
    topic: str
    group: str
    port: int
    audit: Path
    worker: WorkerProcess
    produced: int
    started: float = field(default_factory=time.monotonic)
    scrapes: list[Scrape] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def snapshot(self) -> list[Scrape]:
        with self.lock:
            return list(self.scrapes)

    def wait_scrape(self, predicate: Callable[[Scrape], bool], timeout: float, what: str) -> Scrape:
        """The first scrape (oldest first) that satisfies ``predicate``, waiting for new ones."""
        seen = 0
        deadline = time.monotonic() + timeout
        while True:
            alive = self.worker.alive()
            if not alive:
                time.sleep(3 * SCRAPE_EVERY_S)  # let the scraper store its last body
            scrapes = self.snapshot()
            for s in scrapes[seen:]:
                if predicate(s):
                    return s
            seen = len(scrapes)
            if not alive:
                raise AssertionError(
                    f"worker exited (code {self.worker.proc.returncode}) before {what}\n"
                    f"{self.worker.tail()}"
                )
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"timed out after {timeout:.0f}s waiting for {what}\n{self.worker.tail()}"
                )
            time.sleep(SCRAPE_EVERY_S)

    def trained_everything(self, s: Scrape) -> bool:
        return s.value("samples_trained_total", topic=self.topic) == self.produced


def _scrape_loop(run: LiveRun, stop: threading.Event) -> None:
    while not stop.is_set():
        status, body = http_get(run.url("/metrics"), timeout=5)
        if status == 200:
            with run.lock:
                run.scrapes.append(Scrape(time.time(), body))
        elif not run.worker.alive():
            return
        stop.wait(SCRAPE_EVERY_S)


def _delete_topic(bootstrap: str, topic: str) -> None:
    from kafka.admin import KafkaAdminClient

    admin = KafkaAdminClient(bootstrap_servers=bootstrap, client_id="streamer-tests-topics")
    try:
        admin.delete_topics([topic])
    except Exception as exc:
        print(f"topic clean-up: {exc}")
    finally:
        admin.close()


@pytest.fixture(scope="module")
def live(kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveRun]:
    """A worker training a 3-partition topic of 5,000 records, scraped 10x a second."""
    d = tmp_path_factory.mktemp("metrics-live")
    topic = f"metrics-live-{uuid.uuid4().hex[:12]}"
    group = f"g-{uuid.uuid4().hex[:12]}"
    produce(kafka_bootstrap, topic, RECORDS, partitions=PARTITIONS)
    port = free_port()
    audit = d / "audit.log"
    args = worker_args(
        kafka_bootstrap,
        topic,
        group,
        audit,
        shards=SHARDS,
        batch_size=BATCH,
        stop_after_idle=IDLE_S,
        extra=["--metrics-port", str(port)],
    )
    worker = WorkerProcess.start(args, d / "worker.log")
    run = LiveRun(kafka_bootstrap, topic, group, port, audit, worker, RECORDS)
    stop = threading.Event()
    scraper = threading.Thread(target=_scrape_loop, args=(run, stop), daemon=True)
    scraper.start()
    try:
        worker.wait_for(
            lambda: http_get(run.url("/readyz"))[0] == 200, START_S, "/readyz to answer 200"
        )
        yield run
    finally:
        if worker.alive():
            worker.terminate()
            try:
                worker.wait(40)
            except AssertionError as exc:
                print(exc)
        stop.set()
        scraper.join(10)
        scrapes = run.snapshot()
        if scrapes:  # for people: the first body, and the last one with per-partition series
            (d / "first.prom").write_text(scrapes[0].body)
            rich = [s for s in scrapes if s.per_partition("consumer_lag_records")]
            if rich:
                (d / "last-assigned.prom").write_text(rich[-1].body)
        _delete_topic(kafka_bootstrap, topic)


# ---- a real Prometheus server -----------------------------------------------------------------


@dataclass
class Prometheus:
    url: str
    target_port: int
    proc: subprocess.Popen[bytes]
    log_path: Path

    def api(self, path: str, **params: str) -> object:
        query = urllib.parse.urlencode(params)
        status, body = http_get(f"{self.url}/api/v1/{path}?{query}", timeout=10)
        assert status == 200, f"prometheus {path} {params}: HTTP {status}: {body[:2000]}"
        data = json.loads(body)
        assert data["status"] == "success", data
        return data["data"]

    def query(self, q: str) -> list[dict[str, object]]:
        data = self.api("query", query=q)
        assert isinstance(data, dict)
        result: list[dict[str, object]] = data["result"]
        return result

    def scalar_values(self, q: str) -> list[tuple[dict[str, str], float]]:
        """An instant vector query: [(labels, value), ...]."""
        out = []
        for r in self.query(q):
            labels, (_, value) = r["metric"], r["value"]  # type: ignore[misc]
            out.append((dict(labels), float(value)))  # type: ignore[arg-type]
        return out

    def raw(self, q: str) -> list[tuple[dict[str, str], list[tuple[float, float]]]]:
        """A range vector selector: every stored sample of every series."""
        out = []
        for r in self.query(q):
            values = [(float(t), float(v)) for t, v in r["values"]]  # type: ignore[attr-defined]
            out.append((dict(r["metric"]), values))  # type: ignore[call-overload]
        return out

    def target_up(self) -> bool:
        status, body = http_get(f"{self.url}/api/v1/targets")
        if status != 200:
            return False
        targets = json.loads(body)["data"]["activeTargets"]
        return any(
            t["health"] == "up" and t["scrapeUrl"].endswith(f":{self.target_port}/metrics")
            for t in targets
        )

    def lag_views(self, topic: str, window: str) -> list[LagView]:
        """The stored scrapes (one timestamp each) of the per-partition lag families."""
        by_ts: dict[float, dict[int, dict[str, float]]] = {}
        for name in _LAG_FAMILIES:
            for labels, values in self.raw(f'streamer_{name}{{topic="{topic}"}}[{window}]'):
                p = int(labels["partition"])
                for ts, v in values:
                    by_ts.setdefault(ts, {}).setdefault(p, {})[name] = v
        rebalances: dict[float, float] = {}
        for _, values in self.raw(f"streamer_rebalances_total[{window}]"):
            for ts, v in values:
                rebalances[ts] = rebalances.get(ts, 0.0) + v
        views = []
        for ts, parts in sorted(by_ts.items()):
            full = {
                p: tuple(cols[name] for name in _LAG_FAMILIES)
                for p, cols in parts.items()
                if len(cols) == len(_LAG_FAMILIES)
            }
            views.append(LagView(ts, rebalances.get(ts, math.nan), full))  # type: ignore[arg-type]
        return views

    def tail(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-3000:]
        except FileNotFoundError:
            return ""


@pytest.fixture(scope="module")
def prometheus(live: LiveRun, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Prometheus]:
    exe = shutil.which("prometheus")
    if exe is None:
        msg = "prometheus is not on PATH (apt-get install prometheus)"
        if in_ci():
            pytest.fail(msg, pytrace=False)
        pytest.skip(msg)
    d = tmp_path_factory.mktemp("prometheus")
    config = d / "prometheus.yml"
    config.write_text(
        "global:\n"
        "  scrape_interval: 1s\n"
        "  scrape_timeout: 1s\n"
        "  evaluation_interval: 1s\n"
        "scrape_configs:\n"
        "  - job_name: streamer\n"
        "    static_configs:\n"
        f"      - targets: ['127.0.0.1:{live.port}']\n"
    )
    port = free_port()
    log_path = d / "prometheus.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [
                exe,
                f"--config.file={config}",
                f"--storage.tsdb.path={d / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{port}",
            ],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
        )
    prom = Prometheus(f"http://127.0.0.1:{port}", live.port, proc, log_path)
    try:
        deadline = time.monotonic() + 60
        while http_get(f"{prom.url}/-/ready")[0] != 200:
            assert proc.poll() is None, f"prometheus exited ({proc.returncode}):\n{prom.tail()}"
            assert time.monotonic() < deadline, f"prometheus not ready in 60s:\n{prom.tail()}"
            time.sleep(0.2)
        yield prom
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


# ---- the tests ---------------------------------------------------------------------------------


def test_prometheus_scrapes_the_live_worker(live: LiveRun, prometheus: Prometheus) -> None:
    """A real Prometheus scrapes the worker: trained samples, their rate while records keep
    coming, and one lag series per partition consistent with its inputs at every scrape."""
    sel = f'{{topic="{live.topic}"}}'
    producer = RateProducer(live.bootstrap, live.topic, rate=PROM_RATE, seed=1)
    producer.start()
    t0 = time.monotonic()
    try:
        wait_until(prometheus.target_up, 30, f"prometheus to scrape :{live.port}")
        rate_q = f"rate(streamer_samples_trained_total{sel}[10s])"
        wait_until(
            lambda: any(v > 0 for _, v in prometheus.scalar_values(rate_q)),
            30,
            f"{rate_q} > 0 while producing",
        )
        assert producer.is_alive(), "the rate must be seen while records are still produced"
        [(labels, rate)] = prometheus.scalar_values(rate_q)
        assert labels["topic"] == live.topic and rate > 0
        [(labels, trained)] = prometheus.scalar_values(f"streamer_samples_trained_total{sel}")
        assert labels["job"] == "streamer" and labels["instance"] == f"127.0.0.1:{live.port}"
        assert trained > 0
        time.sleep(max(0.0, PROM_PRODUCE_S - (time.monotonic() - t0)))
    finally:
        live.produced += producer.stop()

    # Everything produced gets trained (the last partial batch when the pass ends at idle).
    def trained_all() -> bool:
        values = prometheus.scalar_values(f"streamer_samples_trained_total{sel}")
        return [v for _, v in values] == [live.produced]

    wait_until(trained_all, 60, f"prometheus to see samples_trained_total == {live.produced}")
    assert audit_lines(live.audit) == live.produced

    ends = end_offsets(live.bootstrap, live.topic)
    assert sum(ends.values()) == live.produced
    lag_series = prometheus.raw(f"streamer_consumer_lag_records{sel}[5m]")
    assert sorted(int(labels["partition"]) for labels, _ in lag_series) == list(range(PARTITIONS))
    for labels, values in lag_series:
        assert labels["topic"] == live.topic and labels["job"] == "streamer", labels
        assert all(0 <= v <= ends[int(labels["partition"])] for _, v in values), (labels, values)
    hw_max = {
        int(labels["partition"]): max(v for _, v in values)
        for labels, values in prometheus.raw(f"streamer_partition_high_watermark_offset{sel}[5m]")
    }
    assert hw_max == ends, "the high watermark Prometheus saw must reach the broker's end offsets"
    views = prometheus.lag_views(live.topic, "5m")
    bad, checked, nonzero = lag_bracket_violations(views)
    assert not bad, "lag != high watermark - trained in Prometheus:\n" + "\n".join(bad[:20])
    assert checked >= 20 and nonzero >= 1, (checked, nonzero, len(views))


def test_metrics_of_the_live_worker(live: LiveRun) -> None:
    """/metrics while training and once everything is trained: promtool-valid, every DESIGN
    family present (at 0 from start-up), counters equal to the audit log, lag consistent."""
    final = live.wait_scrape(
        live.trained_everything, 90, f"samples_trained_total == {live.produced}"
    )
    assert audit_lines(live.audit) == live.produced
    scrapes = live.snapshot()
    first = scrapes[0]
    assigned = [s for s in scrapes if len(s.per_partition("consumer_lag_records")) == PARTITIONS]
    assert assigned, "no scrape showed the per-partition series of all 3 partitions"
    mid = next(
        (s for s in assigned if sum(s.per_partition("consumer_lag_records").values()) > 0), None
    )
    assert mid is not None, "no scrape caught the worker with a lag > 0"
    assert mid.total("samples_trained_total") < live.produced

    # promtool on a body from the middle of training and on the one after it.
    for s in (mid, final):
        check = subprocess.run(
            ["promtool", "check", "metrics"],
            input=s.body.encode(),
            capture_output=True,
            timeout=60,
            check=False,
        )
        assert check.returncode == 0, check.stdout.decode() + check.stderr.decode()

    # Every family of DESIGN section 5, with its type and labels; all but the per-partition
    # ones already in the first body the server gave (before training, at 0).
    for s, expect_per_partition in ((first, False), (mid, True), (final, False)):
        types = metric_types(s.body)
        for name in COUNTERS:
            assert types.get(f"streamer_{name.removesuffix('_total')}") == "counter", name
        for name in GAUGES:
            if name in PER_PARTITION and not expect_per_partition:
                continue
            assert types.get(f"streamer_{name}") == "gauge", name
        for name in HISTOGRAMS:
            assert types.get(f"streamer_{name}") == "histogram", name
            for suffix in ("_bucket", "_count", "_sum"):
                assert s.samples.get(f"streamer_{name}{suffix}"), f"{name}{suffix}"
        for name, labels in {**COUNTERS, **GAUGES}.items():
            for have, _ in s.samples.get(f"streamer_{name}", []):
                assert set(have) == labels, (name, have)
    for name, (label, values) in STARTUP_LABEL_VALUES.items():
        got = {lab[label]: v for lab, v in first.samples[f"streamer_{name}"]}
        assert set(got) == values, (name, got)
    for name in ("records_polled_total", "samples_trained_total", "records_dead_lettered_total"):
        assert first.value(name, topic=live.topic) is not None, name
    if first.total("assigned_partitions") == 0:
        assert first.total("samples_trained_total") == 0

    # Counters of the idle body against the audit log and each other.
    trained = final.value("samples_trained_total", topic=live.topic)
    assert trained == live.produced == audit_lines(live.audit)
    assert final.value("record_age_at_train_seconds_count") == trained
    steps = final.value("train_steps_total")
    assert (
        steps == final.value("train_step_seconds_count") == final.value("input_wait_seconds_count")
    )
    assert steps is not None and steps >= math.ceil(live.produced / BATCH)
    assert final.value("records_decoded_total", topic=live.topic) >= trained  # type: ignore[operator]
    assert final.value("records_polled_total", topic=live.topic) >= live.produced  # type: ignore[operator]
    assert final.value("bytes_polled_total", topic=live.topic) > 0  # type: ignore[operator]
    assert final.total("decode_errors_total") == 0
    assert final.value("offset_commits_total", result="success") >= 1  # type: ignore[operator]
    assert final.value("offset_commits_total", result="failure") == 0
    assert final.value("commit_duration_seconds_count") >= 1  # type: ignore[operator]
    assert final.value("rebalances_total", event="assigned") >= 1  # type: ignore[operator]
    assert abs(final.total("last_poll_timestamp_seconds") - final.t) < 30
    [(build, one)] = final.samples["streamer_build_info"]
    assert one == 1 and all(build[k] for k in ("version", "tensorflow", "kafka_python")), build
    stamps = mid.per_partition("partition_last_trained_timestamp_seconds")
    assert all(v == 0 or abs(v - mid.t) < 600 for v in stamps.values()), stamps

    # Lag at every scrape, and the high watermark the worker saw against the broker.
    ends = end_offsets(live.bootstrap, live.topic)
    assert sum(ends.values()) == live.produced
    hw_max: dict[int, float] = {}
    for s in scrapes:
        for p, v in s.per_partition("partition_high_watermark_offset").items():
            hw_max[p] = max(hw_max.get(p, 0.0), v)
    assert hw_max == ends
    audited = read_audit(live.audit, live.topic)
    top = {p: max(o for q, o in audited if q == p) + 1 for p in range(PARTITIONS)}
    for s in scrapes:
        for p, v in s.per_partition("partition_trained_offset").items():
            assert v <= top[p], (p, v, top[p])
    bad, checked, nonzero = lag_bracket_violations([lag_view(s) for s in scrapes])
    assert not bad, "lag != high watermark - trained in /metrics:\n" + "\n".join(bad[:20])
    assert checked >= 20 and nonzero >= 1, (checked, nonzero, len(scrapes))


def test_lag_is_zero_at_idle(live: LiveRun) -> None:
    """Once every record is trained (and committed), consumer_lag_records per partition equals
    end offset - (max audited offset + 1) = 0, also after the pass that ends at idle has
    re-assigned the partitions."""
    done = live.wait_scrape(
        live.trained_everything, 90, f"samples_trained_total == {live.produced}"
    )
    ends = end_offsets(live.bootstrap, live.topic)
    audited = read_audit(live.audit, live.topic)
    assert sum(audited.values()) == live.produced
    trained = {p: max(o for q, o in audited if q == p) + 1 for p in range(PARTITIONS)}
    expected = {p: float(ends[p] - trained[p]) for p in range(PARTITIONS)}
    assert set(expected.values()) == {0.0}, (ends, trained)
    rebalances_then = done.total("rebalances_total")

    def at_end(s: Scrape) -> bool:
        return s.per_partition("partition_high_watermark_offset") == {
            p: float(e) for p, e in ends.items()
        }

    # The pass ends IDLE_TIMEOUT (10 s) after the last record: wait for the next assignment to
    # fetch the end offsets again (the worker only stops at a later pass end).
    live.wait_scrape(
        lambda s: s.total("rebalances_total") > rebalances_then and at_end(s),
        60,
        "a re-assignment after everything was trained",
    )
    scrapes = live.snapshot()
    idle = [s for s in scrapes[scrapes.index(done) :] if at_end(s)]
    wrong = [
        (
            round(s.t - done.t, 1),
            s.per_partition("consumer_lag_records"),
            s.per_partition("partition_committed_offset"),
        )
        for s in idle
        if s.per_partition("consumer_lag_records") != expected
    ]
    assert not wrong, (
        f"{len(wrong)} of {len(idle)} idle scrapes (high watermark = end offsets {ends}) show a "
        f"lag other than {expected}: (seconds after the last step, lag, committed gauge) "
        f"first {wrong[0]}, last {wrong[-1]}"
    )


def test_lag_command_after_the_run(live: LiveRun) -> None:
    """``streamer lag`` once the worker stopped at idle: committed = end offsets, lag 0."""
    assert live.worker.wait(120) == 0, live.worker.tail()
    stopped = live.worker.stopped()
    assert stopped is not None and stopped[0] == f"idle for {IDLE_S}s", live.worker.tail()
    ends = end_offsets(live.bootstrap, live.topic)
    assert sum(ends.values()) == live.produced
    base = [sys.executable, "-m", "streamer.cli", "lag", "--bootstrap", live.bootstrap]
    base += ["--group", live.group, "--topic", live.topic]
    out = subprocess.run([*base, "--json"], capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert data["group"] == live.group
    rows = {r["partition"]: r for r in data["partitions"]}
    assert sorted(rows) == list(range(PARTITIONS)), data
    for p, r in rows.items():
        assert r == {
            "topic": live.topic,
            "partition": p,
            "committed": ends[p],
            "end": ends[p],
            "lag": 0,
        }

    table = subprocess.run(base, capture_output=True, text=True, timeout=60, check=False)
    assert table.returncode == 0, table.stderr
    lines = table.stdout.strip().splitlines()
    assert lines[0].split() == ["TOPIC", "PARTITION", "COMMITTED", "END", "LAG"], lines
    body = [line.split() for line in lines[1:-1]]
    assert body == [[live.topic, str(p), str(ends[p]), str(ends[p]), "0"] for p in sorted(ends)]
    assert lines[-1].split() == ["TOTAL", "0"], lines


# ---- broker outage on a private broker ---------------------------------------------------------


@pytest.fixture(scope="module")
def private_kafka(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrivateBroker]:
    need_tools("java", "bash")
    broker = PrivateBroker(tmp_path_factory.mktemp("kafka-metrics-outage"))
    yield from serve(broker)


@pytest.fixture
def outage_broker(private_kafka: PrivateBroker) -> PrivateBroker:
    """A private broker (own KAFKA_LOCAL_DIR) that this test may stop and start again."""
    if not private_kafka.running():
        private_kafka.start()
    return private_kafka


@dataclass
class Probe:
    """/healthz and /readyz of one worker, every answer kept: (t, phase, healthz, readyz, body)."""

    base: str
    phase: str = "up"
    seen: list[tuple[float, str, int, int, str]] = field(default_factory=list)

    def readyz_is(self, code: int) -> bool:
        health, _ = http_get(f"{self.base}/healthz")
        ready, body = http_get(f"{self.base}/readyz")
        self.seen.append((time.monotonic(), self.phase, health, ready, body.strip()))
        return ready == code

    def not_live(self) -> list[tuple[float, str, int, int, str]]:
        """Answers other than 200 from /healthz once it first answered (start-up excluded)."""
        first = next((i for i, s in enumerate(self.seen) if s[2] == 200), len(self.seen))
        return [s for s in self.seen[first:] if s[2] != 200]


def start_outage_worker(
    bootstrap: str, tmp_path: Path, idle_timeout: float | None
) -> tuple[WorkerProcess, Probe]:
    topic = f"metrics-outage-{uuid.uuid4().hex[:12]}"
    produce(bootstrap, topic, 600, partitions=2)
    port = free_port()
    args = worker_args(
        bootstrap,
        topic,
        f"g-{uuid.uuid4().hex[:12]}",
        tmp_path / "audit.log",
        shards=SHARDS,
        batch_size=BATCH,
        stop_after_idle=600,
        extra=["--metrics-port", str(port)]
        + ([] if idle_timeout is None else ["--idle-timeout", str(idle_timeout)]),
    )
    worker = WorkerProcess.start(args, tmp_path / "worker.log")
    probe = Probe(f"http://127.0.0.1:{port}")
    worker.wait_for(lambda: probe.readyz_is(200), START_S, "/readyz 200 with the broker up")
    return worker, probe


def test_healthz_stays_up_and_readyz_follows_the_broker(
    outage_broker: PrivateBroker, tmp_path: Path
) -> None:
    """/healthz stays 200 while the broker is down; /readyz goes 503 within 10 s of the stop and
    back to 200 when the broker returns; SIGTERM then stops the worker cleanly (exit 0).

    --idle-timeout 600 keeps one pass open through the outage (see the next test for a pass
    that has to start while the broker is down)."""
    worker, probe = start_outage_worker(outage_broker.plaintext, tmp_path, idle_timeout=600)
    try:
        assert http_get(f"{probe.base}/healthz") == (200, "ok\n")
        outage_broker.stop()
        probe.phase = "down"
        stopped = time.monotonic()
        worker.wait_for(lambda: probe.readyz_is(503), 10, "/readyz 503 after the broker stopped")
        while time.monotonic() - stopped < 5:  # stay down a while: alive, not ready
            probe.readyz_is(503)
            time.sleep(0.2)
        outage_broker.start()  # same ports and data
        probe.phase = "back"
        worker.wait_for(lambda: probe.readyz_is(200), 90, "/readyz 200 after the broker returned")
        assert http_get(f"{probe.base}/healthz") == (200, "ok\n")
    finally:
        worker.terminate()
        code = worker.wait(60)
    assert code == 0, worker.tail()
    assert not probe.not_live(), f"/healthz failed: {probe.not_live()[:5]}\n{worker.tail()}"
    down = [s for s in probe.seen if s[1] == "down"]
    first_503 = next(i for i, s in enumerate(down) if s[3] == 503)
    assert all(s[3] == 503 for s in down[first_503:]), down
    reasons = {s[4] for s in down if s[3] == 503}
    assert reasons == {f"no broker reachable at {outage_broker.plaintext}"}, reasons


def test_worker_survives_a_pass_starting_while_the_broker_is_down(
    outage_broker: PrivateBroker, tmp_path: Path
) -> None:
    """The broker stops once the first pass trained (its join settled): that pass ends after
    --idle-timeout 3 s without records, its final commit times out (10 s), and the next pass
    has to open its consumers while the broker is still down (35 s in all). The worker keeps
    going (live, not ready), is ready again once the broker is back, and stops cleanly on
    SIGTERM."""
    worker, probe = start_outage_worker(outage_broker.plaintext, tmp_path, idle_timeout=3)
    try:

        def trained() -> float:
            status, body = http_get(probe.base + "/metrics")
            return Scrape(0, body).total("samples_trained_total") if status == 200 else 0.0

        worker.wait_for(lambda: trained() >= 2 * BATCH, 60, "two full batches trained")
        outage_broker.stop()
        probe.phase = "down"
        stopped = time.monotonic()
        while time.monotonic() - stopped < 35:
            assert worker.alive(), f"the worker died while the broker was down\n{worker.tail()}"
            probe.readyz_is(503)
            time.sleep(0.2)
        outage_broker.start()
        probe.phase = "back"
        worker.wait_for(lambda: probe.readyz_is(200), 90, "/readyz 200 after the broker returned")
    finally:
        worker.terminate()
        code = worker.wait(60)
    assert code == 0, worker.tail()
    assert not probe.not_live(), f"/healthz failed: {probe.not_live()[:5]}\n{worker.tail()}"
