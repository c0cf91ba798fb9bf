"""The input pipeline against the real broker: shards, passes, cleanup, bad records, backpressure."""

from __future__ import annotations

import gc
import os
import threading
import time
import uuid
from collections.abc import Callable

import msgpack
import numpy as np
import pytest
from kafka import KafkaConsumer, KafkaProducer
from prometheus_client import CollectorRegistry

from consumers.settings import ConsumerSettings
from streamer.input.deadletter import (
    HEADER_OFFSET,
    HEADER_PARTITION,
    HEADER_REASON,
    DeadLetterWriter,
)
from streamer.input.pipeline import PipelineSettings
from streamer.input.simulator import SimulatorTask
from streamer.input.source import StreamSource
from streamer.ops.metrics import Metrics

pytestmark = pytest.mark.kafka

TASK = SimulatorTask()
SCHEMA = TASK.schema()
BASE_TS = int(time.time() * 1000) - 3_600_000  # recent: older records fall to retention


def produce_known(
    bootstrap: str, topic: str, partitions: int, per_partition: int
) -> dict[int, list[int]]:
    """Produce simulator records with known partition and timestamp; returns partition -> timestamps."""
    producer = KafkaProducer(bootstrap_servers=bootstrap, linger_ms=10)
    rng = np.random.default_rng(7)
    stamps: dict[int, list[int]] = {}
    for p in range(partitions):
        values = TASK.records(per_partition, rng)
        stamps[p] = [BASE_TS + p * 1_000_000 + i for i in range(per_partition)]
        for v, ts in zip(values, stamps[p], strict=True):
            producer.send(topic, value=v, partition=p, timestamp_ms=ts)
    producer.flush(30)
    producer.close()
    return stamps


def consumer_settings(
    bootstrap: str, topic: str, group: str, shards: int, **kw: object
) -> ConsumerSettings:
    return ConsumerSettings(
        bootstrap_servers=bootstrap,
        topic=topic,
        group_id=group,
        num_shards=shards,
        worker_id=f"w-{uuid.uuid4().hex[:8]}",
        heartbeat_interval_ms=500,
        session_timeout_ms=10_000,
        **kw,  # type: ignore[arg-type]
    )


def run_pass(source: StreamSource, ack: bool = True) -> dict[str, np.ndarray]:
    cols: dict[str, list[np.ndarray]] = {"partition": [], "offset": [], "timestamp": [], "y": []}
    for batch in source.dataset():
        for k in cols:
            cols[k].append(batch[k].numpy())
        if ack:
            source.tracker.ack(batch["partition"].numpy(), batch["offset"].numpy())
    return {k: np.concatenate(v) if v else np.array([]) for k, v in cols.items()}


def shard_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("streamer-shard-")]


def our_threads() -> set[int | None]:
    """Python threads, less the "Dummy" entries Python makes for TensorFlow's own pool threads."""
    return {t.ident for t in threading.enumerate() if not isinstance(t, threading._DummyThread)}


def broker_sockets(bootstrap: str) -> int:
    """Open TCP sockets of this process to the broker's port (from /proc/net/tcp)."""
    port = int(bootstrap.rsplit(":", 1)[1])
    inodes = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    count = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as fh:
            next(fh)
            for line in fh:
                parts = line.split()
                remote_port = int(parts[2].split(":")[1], 16)
                state = parts[3]
                if remote_port == port and parts[9] in inodes and state == "01":
                    count += 1
    return count


@pytest.mark.parametrize("mode", ["group", "static"])
@pytest.mark.parametrize("partitions", [2, 4, 6])
def test_one_pass_delivers_every_record_once(
    kafka_bootstrap: str, make_topic: Callable[..., str], group_id: str, partitions: int, mode: str
) -> None:
    shards = 4  # P < N, P = N, P > N
    topic = make_topic(partitions)
    per = 300
    stamps = produce_known(kafka_bootstrap, topic, partitions, per)
    extra = {"mode": "static", "partitions": tuple(range(partitions))} if mode == "static" else {}
    cs = consumer_settings(kafka_bootstrap, topic, group_id, shards, **extra)
    source = StreamSource(
        SCHEMA,
        PipelineSettings(num_shards=shards, batch_size=128, idle_timeout_seconds=3),
        consumer=cs,
    )
    cols = run_pass(source)
    assert len(cols["offset"]) == partitions * per
    pairs = set(zip(cols["partition"].tolist(), cols["offset"].tolist(), strict=True))
    assert pairs == {(p, o) for p in range(partitions) for o in range(per)}
    for p in range(partitions):
        mask = cols["partition"] == p
        order = np.argsort(cols["offset"][mask])
        assert cols["timestamp"][mask][order].tolist() == stamps[p]
    assert cols["y"].dtype == np.float32
    assert source.open_shards == 0
    assert not shard_threads()


def test_second_pass_resumes_from_commits_and_nothing_is_left_open(
    kafka_bootstrap: str, make_topic: Callable[..., str], group_id: str
) -> None:
    topic = make_topic(3)
    produce_known(kafka_bootstrap, topic, 3, 200)
    threads_before = our_threads()
    sockets_before = broker_sockets(kafka_bootstrap)  # the fixture's admin client holds some
    cs = consumer_settings(kafka_bootstrap, topic, group_id, 2)
    settings = PipelineSettings(num_shards=2, batch_size=100, idle_timeout_seconds=3, linger=True)
    source = StreamSource(SCHEMA, settings, consumer=cs)

    first = run_pass(source)
    assert len(first["offset"]) == 600
    source.commit(source.tracker.commit_points())
    source.end_pass()
    assert source.open_shards == 0
    time.sleep(0.5)
    assert not shard_threads()
    leftover = our_threads() - threads_before
    assert not leftover, [t.name for t in threading.enumerate() if t.ident in leftover]
    assert broker_sockets(kafka_bootstrap) == sockets_before

    # The group committed the end of every partition.
    probe = KafkaConsumer(
        bootstrap_servers=kafka_bootstrap, group_id=group_id, enable_auto_commit=False
    )
    from kafka import TopicPartition

    committed = {p: probe.committed(TopicPartition(topic, p)) for p in range(3)}
    probe.close()
    assert committed == {0: 200, 1: 200, 2: 200}

    produce_known(kafka_bootstrap, topic, 3, 50)
    second = run_pass(source)
    source.commit(source.tracker.commit_points())
    source.end_pass()
    assert sorted(
        set(zip(second["partition"].tolist(), second["offset"].tolist(), strict=True))
    ) == [(p, o) for p in range(3) for o in range(200, 250)]
    assert source.open_shards == 0
    assert not shard_threads()


def test_iterator_deleted_mid_pass_closes_its_shards(
    kafka_bootstrap: str, make_topic: Callable[..., str], group_id: str
) -> None:
    topic = make_topic(2)
    produce_known(kafka_bootstrap, topic, 2, 2000)
    cs = consumer_settings(kafka_bootstrap, topic, group_id, 2)
    source = StreamSource(SCHEMA, PipelineSettings(num_shards=2, batch_size=50), consumer=cs)
    it = iter(source.dataset())
    next(it)
    assert source.open_shards == 2
    assert len(shard_threads()) == 2
    del it
    gc.collect()
    deadline = time.monotonic() + 20
    while (source.open_shards or shard_threads()) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert source.open_shards == 0
    assert not shard_threads()


def test_a_pass_stopped_before_it_began_opens_no_shard(
    kafka_bootstrap: str, make_topic: Callable[..., str], group_id: str
) -> None:
    """A stop that lands as a pass begins: the pass ends at once without opening a consumer
    (one that joined only to leave would cost the group two rebalances, and on a cluster
    after faults its joining outlasted the stop's timeout); the records wait for the next."""
    topic = make_topic(2)
    produce_known(kafka_bootstrap, topic, 2, 100)
    cs = consumer_settings(kafka_bootstrap, topic, group_id, 2)
    opened: list[int] = []
    source = StreamSource(
        SCHEMA, PipelineSettings(num_shards=2, batch_size=50, idle_timeout_seconds=3), consumer=cs
    )
    factory = source._factory

    def counting(k: int, n: int, router: object) -> object:
        opened.append(k)
        return factory(k, n, router)  # type: ignore[arg-type]

    source._factory = counting  # type: ignore[assignment]
    source.stop()
    started = time.monotonic()
    assert len(run_pass(source)["offset"]) == 0
    assert time.monotonic() - started < 10
    assert opened == []
    assert source.open_shards == 0
    source.resume()
    assert len(run_pass(source)["offset"]) == 200
    assert sorted(opened) == [0, 1]


def test_stop_condition_pass_records_ends_the_pass(
    kafka_bootstrap: str, make_topic: Callable[..., str], group_id: str
) -> None:
    topic = make_topic(2)
    produce_known(kafka_bootstrap, topic, 2, 3000)
    cs = consumer_settings(kafka_bootstrap, topic, group_id, 2, max_poll_records=200)
    settings = PipelineSettings(
        num_shards=2, batch_size=100, pass_records=1000, idle_timeout_seconds=10
    )
    source = StreamSource(SCHEMA, settings, consumer=cs)
    cols = run_pass(source)
    # The budget ended the pass: far from all 6000 records were read, and at least 1000.
    assert 1000 <= len(cols["offset"]) < 6000
    assert source.open_shards == 0


BAD_RECORDS: list[tuple[bytes, str]] = [
    (b"\xc1\xc1\xc1 not msgpack", "format"),
    (msgpack.packb({"x": b"\x00" * 64, "y": 1.0})[:-3], "truncated"),
    (msgpack.packb({"x": b"\x00" * 64, "y": 1.0}) + b"\x01", "extra_data"),
    (msgpack.packb({"x": [True] * 16, "y": 1.0}), "dtype"),
    (msgpack.packb({"x": [1.5] * 16, "y": "a string"}), "schema"),
    (msgpack.packb({"x": b"\x00" * 60, "y": 1.0}), "shape"),
    # Over the schema's record cap, under the broker's 1 MB message limit.
    (msgpack.packb({"x": b"\x00" * 64, "y": 1.0, "blob": b"\x00" * 300_000}), "too_large"),
    (msgpack.packb({"x": b"\x00" * 64, "y": [[[[[[[[[[[[1]]]]]]]]]]]]}), "too_deep"),
    (msgpack.packb({"x": b"\x00" * 64, "y": msgpack.ExtType(42, b"hi")}), "format"),
    (msgpack.packb({"y": 1.0}), "schema"),
    (b"", "truncated"),
]


def test_bad_records_are_counted_and_dead_lettered_good_ones_all_arrive(
    kafka_bootstrap: str, make_topic: Callable[..., str], group_id: str
) -> None:
    topic = make_topic(2)
    dlq = make_topic(1, prefix="dlq")
    producer = KafkaProducer(
        bootstrap_servers=kafka_bootstrap, linger_ms=5, max_request_size=8_000_000
    )
    rng = np.random.default_rng(1)
    expected_bad: dict[tuple[int, int], str] = {}
    good: set[tuple[int, int]] = set()
    next_offset = {0: 0, 1: 0}
    for i in range(300):
        p = i % 2
        if i % 10 == 3:
            value, reason = BAD_RECORDS[(i // 10) % len(BAD_RECORDS)]
            expected_bad[(p, next_offset[p])] = reason
        else:
            value = TASK.records(1, rng)[0]
            good.add((p, next_offset[p]))
        meta = producer.send(topic, value=value, partition=p).get(timeout=30)
        assert meta.offset == next_offset[p]
        next_offset[p] += 1
    producer.flush(30)
    producer.close()

    registry = CollectorRegistry()
    metrics = Metrics(
        topic, registry, version="t", tensorflow_version="t", kafka_python_version="t"
    )
    cs = consumer_settings(
        kafka_bootstrap,
        topic,
        group_id,
        2,
        fetch_max_bytes=8_000_000,
        max_partition_fetch_bytes=4_000_000,
    )
    source_holder: list[StreamSource] = []

    def done(p: int, o: int) -> None:
        source_holder[0].tracker.ack(np.array([p], np.int32), np.array([o], np.int64))

    writer = DeadLetterWriter(kafka_bootstrap, dlq, on_done=done)
    source = StreamSource(
        SCHEMA,
        PipelineSettings(num_shards=2, batch_size=64, idle_timeout_seconds=3, linger=True),
        consumer=cs,
        metrics=metrics,
        dead_letter=writer,
    )
    source_holder.append(source)
    cols = run_pass(source)
    writer.flush()
    assert set(zip(cols["partition"].tolist(), cols["offset"].tolist(), strict=True)) == good
    assert len(cols["offset"]) == len(good)

    by_reason: dict[str, int] = {}
    for reason in expected_bad.values():
        by_reason[reason] = by_reason.get(reason, 0) + 1
    for reason, n in by_reason.items():
        got = registry.get_sample_value(
            "streamer_decode_errors_total", {"topic": topic, "reason": reason}
        )
        assert got == n, reason

    # Every bad record is in the dead-letter topic with headers naming its origin and reason.
    dl = KafkaConsumer(
        dlq,
        bootstrap_servers=kafka_bootstrap,
        auto_offset_reset="earliest",
        consumer_timeout_ms=5000,
    )
    seen: dict[tuple[int, int], str] = {}
    for rec in dl:
        h = {k: v.decode() for k, v in rec.headers}
        seen[(int(h[HEADER_PARTITION]), int(h[HEADER_OFFSET]))] = h[HEADER_REASON]
        if len(seen) == len(expected_bad):
            break
    dl.close()
    assert seen == expected_bad

    # Dead-lettered records count as done: the commit point reaches the end of each partition.
    assert source.tracker.commit_points() == {0: 150, 1: 150}
    source.close()


def test_slow_consumer_pauses_partitions_without_rebalance(
    kafka_bootstrap: str, make_topic: Callable[..., str], group_id: str
) -> None:
    topic = make_topic(2)
    produce_known(kafka_bootstrap, topic, 2, 3000)
    registry = CollectorRegistry()
    metrics = Metrics(
        topic, registry, version="t", tensorflow_version="t", kafka_python_version="t"
    )
    cs = consumer_settings(
        kafka_bootstrap,
        topic,
        group_id,
        1,
        max_poll_interval_ms=2000,
        poll_timeout_ms=100,
        max_poll_records=100,
        queue_max_blocks=2,
    )
    source = StreamSource(
        SCHEMA,
        PipelineSettings(num_shards=1, batch_size=100, prefetch_batches=1),
        consumer=cs,
        metrics=metrics,
    )
    it = iter(source.dataset())
    max_queued = 0
    paused_seen = 0.0

    def rebalances() -> float:
        return sum(
            registry.get_sample_value("streamer_rebalances_total", {"event": e}) or 0
            for e in ("assigned", "revoked", "lost")
        )

    next(it)  # joined and consuming: count rebalances from here
    before = rebalances()
    for _ in range(4):
        next(it)
        time.sleep(3.0)  # longer than max_poll_interval_ms
        paused_seen = max(paused_seen, registry.get_sample_value("streamer_paused_partitions") or 0)
        max_queued = max(max_queued, source.queued_records())
    # Read before closing: closing the consumer revokes its partitions on purpose.
    during = rebalances() - before
    del it
    gc.collect()
    assert paused_seen == 2
    assert during == 0
    # The queue never holds more than its cap (+1 block in flight from the poll that filled it).
    assert max_queued <= (cs.queue_max_blocks + 1) * cs.max_poll_records


def test_a_pass_end_reads_its_pipeline_out_and_never_waits_past_its_bound() -> None:
    """``end_iterator`` stops the generators, reads what is left (dropped), deletes the
    iterator, and waits for that at most its bound; one that ends in time is waited for."""
    import threading
    import time

    from streamer.input.source import end_iterator

    release = threading.Event()
    gone: list[str] = []

    class Pipeline:
        """An iterator of 3 batches; ``hang``: its last one does not come until released."""

        def __init__(self, name: str, hang: bool) -> None:
            self.name, self.hang, self.left = name, hang, 3

        def __iter__(self) -> Pipeline:
            return self

        def __next__(self) -> int:
            if self.left == 0:
                raise StopIteration
            if self.hang and self.left == 1:
                release.wait(30)
            self.left -= 1
            return self.left

        def __del__(self) -> None:
            gone.append(f"{self.name}:{self.left}")

    stops: list[int] = []
    t0 = time.monotonic()
    assert end_iterator([Pipeline("quick", hang=False)], lambda: stops.append(1), seconds=5.0)
    assert gone == ["quick:0"] and stops == [1]  # stopped first, read to its end, deleted
    assert time.monotonic() - t0 < 5.0
    t0 = time.monotonic()
    assert not end_iterator([Pipeline("stuck", hang=True)], lambda: stops.append(2), seconds=0.5)
    assert 0.4 < time.monotonic() - t0 < 3.0 and gone == ["quick:0"] and stops == [1, 2]
    release.set()  # the teardown goes on behind and finishes
    deadline = time.monotonic() + 5
    while len(gone) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert gone == ["quick:0", "stuck:0"]


def test_a_pass_end_does_not_warn_when_only_the_release_of_a_run_out_pipeline_is_slow(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A pipeline that ran out but whose deletion waits (tf.data joining its own threads on a
    starved machine) ends the pass in time: True, and no warning; the release goes on."""
    import logging
    import threading
    import time

    from streamer.input.source import end_iterator

    release = threading.Event()
    freed: list[int] = []

    class SlowToFree:
        def __iter__(self) -> SlowToFree:
            return self

        def __next__(self) -> int:
            raise StopIteration

        def __del__(self) -> None:
            release.wait(30)
            freed.append(1)

    t0 = time.monotonic()
    with caplog.at_level(logging.DEBUG, logger="streamer.input.source"):
        assert end_iterator([SlowToFree()], lambda: None, seconds=0.5)
    assert 0.4 < time.monotonic() - t0 < 3.0 and freed == []
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert "releases it behind" in caplog.text
    release.set()
    deadline = time.monotonic() + 5
    while not freed and time.monotonic() < deadline:
        time.sleep(0.01)
    assert freed == [1]
