"""A group whose stored assignment no longer matches its topic is made to rebalance.

Static members (a stable ``group_instance_id`` per shard, DESIGN §3) that rejoin a stable
group get their stored assignment back without a rebalance, and kafka-python then has no
member watching the topic. Without the repair, partitions added while the worker was down
are never consumed, and a topic deleted and created again stays assigned to nobody (both
seen here with plain kafka-python consumers). Real broker, real shards.
"""

from __future__ import annotations

import dataclasses
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from kafka import KafkaConsumer
from kafka.admin import NewPartitions
from kafka.coordinator.assignors.cooperative_sticky import CooperativeStickyAssignor

from consumers.group import JoinBarrier
from consumers.hooks import ShardHooks
from consumers.process import ProcessShard
from consumers.settings import ConsumerSettings
from consumers.shard import Shard
from streamer.input.simulator import produce

pytestmark = pytest.mark.kafka

SHARDS = 2


class _Errors(ShardHooks):
    def __init__(self) -> None:
        self.kinds: list[str] = []

    def on_error(self, kind: str, exc: BaseException) -> None:
        self.kinds.append(kind)


def _settings(bootstrap: str, topic: str, group: str, worker: str) -> ConsumerSettings:
    return ConsumerSettings(
        bootstrap_servers=bootstrap,
        topic=topic,
        group_id=group,
        worker_id=worker,
        mode="group",
        session_timeout_ms=10_000,
    )


def _leave_stale_assignment(
    settings: ConsumerSettings, until: Callable[[list[Any]], bool], what: str
) -> None:
    """Run the shards' static members as plain consumers until ``until`` holds, then close
    them (static members do not leave the group on close: the group keeps their assignment)."""
    consumers = []
    for k in range(SHARDS):
        c = KafkaConsumer(
            bootstrap_servers=settings.bootstrap_servers,
            group_id=settings.group_id,
            group_instance_id=settings.group_instance_id(k),
            enable_auto_commit=False,
            heartbeat_interval_ms=1000,
            session_timeout_ms=settings.session_timeout_ms,
            # The protocol the shards speak (a group takes one).
            partition_assignment_strategy=[CooperativeStickyAssignor],
        )
        c.subscribe([settings.topic])
        consumers.append(c)
    # One thread per consumer, polling back to back: kafka-python 3.0.12 can leave a join
    # unfinished when it completes while no poll() awaits it (see kafka_python_internals.await_join).
    stop = threading.Event()

    def poll(c: Any) -> None:
        while not stop.is_set():
            c.poll(timeout_ms=500)

    pollers = [threading.Thread(target=poll, args=(c,), daemon=True) for c in consumers]
    for t in pollers:
        t.start()
    try:
        deadline = time.monotonic() + 90
        while not until(consumers):
            assert time.monotonic() < deadline, f"timed out waiting for {what}"
            time.sleep(0.1)
    finally:
        stop.set()
        for t in pollers:
            t.join(5)
        for c in consumers:
            c.close(autocommit=False)


def _assigned(consumers: list[Any]) -> list[set[int]]:
    return [{tp.partition for tp in c.assignment()} for c in consumers]


def _drain(
    settings: ConsumerSettings,
    runtime: str,
    hooks: ShardHooks,
    expected: int,
    timeout: float,
    midway: tuple[int, Callable[[], None]] | None = None,
) -> set[tuple[int, int]]:
    """Open the pass's shards, take blocks until ``expected`` records came (or ``timeout``);
    ``midway``: (n, action) runs the action once n records came."""
    barrier = JoinBarrier(SHARDS, settle_seconds=1.5)
    cls: Any = ProcessShard if runtime == "process" else Shard
    shards = [cls(settings, k, SHARDS, hooks=hooks, barrier=barrier).start() for k in range(SHARDS)]
    seen: set[tuple[int, int]] = set()
    lock = threading.Lock()
    try:
        deadline = time.monotonic() + timeout
        while len(seen) < expected and time.monotonic() < deadline:
            for shard in shards:
                _ = shard.joining  # process shards: lets the parent's barrier release
                block = shard.get(0.1)
                if block is None:
                    continue
                with lock:
                    seen.update(
                        (int(p), int(o)) for p, o in zip(block.partition, block.offset, strict=True)
                    )
                shard.commit(block.next_offsets())
                if midway is not None and len(seen) >= midway[0]:
                    midway[1]()
                    midway = None
    finally:
        for shard in shards:
            shard.close()
    return seen


@pytest.mark.timeout(240)
def test_partitions_added_while_down_are_consumed_after_a_static_rejoin(
    kafka_bootstrap: str, make_topic: Callable[..., str], group_id: str, kafka_admin: Any
) -> None:
    topic = make_topic(2)
    settings = _settings(kafka_bootstrap, topic, group_id, f"w-{uuid.uuid4().hex[:6]}")
    _leave_stale_assignment(
        settings, lambda cs: sorted(map(sorted, _assigned(cs))) == [[0], [1]], "[0] and [1]"
    )
    kafka_admin.create_partitions({topic: NewPartitions(total_count=4)})
    produce(kafka_bootstrap, topic, 400, partitions=4)
    hooks = _Errors()
    seen = _drain(settings, "thread", hooks, 400, timeout=90)
    partitions = {p for p, _ in seen}
    assert partitions == {0, 1, 2, 3}, f"consumed partitions {sorted(partitions)} of 4"
    assert len(seen) == 400
    assert hooks.kinds.count("stale_assignment") == 1, hooks.kinds


@pytest.mark.timeout(240)
def test_partitions_added_mid_pass_are_consumed_when_no_member_watches_the_topic(
    kafka_bootstrap: str, make_topic: Callable[..., str], group_id: str, kafka_admin: Any
) -> None:
    """After a static rejoin no member watches the topic; shard 0 notices the new partitions
    at its next metadata refresh (``metadata_max_age_ms``) and repairs the assignment."""
    topic = make_topic(2)
    settings = dataclasses.replace(
        _settings(kafka_bootstrap, topic, group_id, f"w-{uuid.uuid4().hex[:6]}"),
        metadata_max_age_ms=2000,
    )
    _leave_stale_assignment(
        settings, lambda cs: sorted(map(sorted, _assigned(cs))) == [[0], [1]], "[0] and [1]"
    )
    produce(kafka_bootstrap, topic, 100, partitions=2)

    def grow() -> None:
        kafka_admin.create_partitions({topic: NewPartitions(total_count=4)})
        produce(kafka_bootstrap, topic, 400, partitions=4, seed=1)

    hooks = _Errors()
    seen = _drain(settings, "thread", hooks, 500, timeout=120, midway=(100, grow))
    partitions = {p for p, _ in seen}
    assert partitions == {0, 1, 2, 3}, f"consumed partitions {sorted(partitions)} of 4"
    assert len(seen) == 500
    assert hooks.kinds.count("stale_assignment") == 1, hooks.kinds


@pytest.mark.timeout(240)
@pytest.mark.parametrize("runtime", ["thread", "process"])
def test_a_recreated_topic_assigned_to_nobody_is_consumed_after_a_static_rejoin(
    kafka_bootstrap: str, group_id: str, kafka_admin: Any, runtime: str
) -> None:
    topic = f"recreated-{uuid.uuid4().hex[:10]}"
    produce(kafka_bootstrap, topic, 10, partitions=2)
    settings = _settings(kafka_bootstrap, topic, group_id, f"w-{uuid.uuid4().hex[:6]}")
    deleted = threading.Event()
    checked = [0.0]

    def assigned_nothing(consumers: list[Any]) -> bool:
        if not deleted.is_set():
            if sorted(map(sorted, _assigned(consumers))) == [[0], [1]]:
                kafka_admin.delete_topics([topic])  # the leader reassigns: nothing
                deleted.set()
            return False
        if time.monotonic() - checked[0] < 0.5:
            return False
        checked[0] = time.monotonic()
        group = kafka_admin.describe_groups([group_id])[group_id]
        held = [m["member_assignment"]["assigned_partitions"] for m in group["members"]]
        return group["group_state"] == "Stable" and len(held) == SHARDS and not any(held)

    _leave_stale_assignment(settings, assigned_nothing, "an empty assignment")
    produce(kafka_bootstrap, topic, 300, partitions=2)
    try:
        hooks = _Errors()
        seen = _drain(settings, runtime, hooks, 300, timeout=90)
        assert len(seen) == 300, f"{len(seen)} of the recreated topic's 300 records consumed"
        assert hooks.kinds.count("stale_assignment") == 1, hooks.kinds
    finally:
        kafka_admin.delete_topics([topic])


@pytest.mark.timeout(240)
def test_a_new_group_joins_without_a_false_stale_assignment_or_an_extra_rebalance(
    kafka_bootstrap: str, make_topic: Callable[..., str], tmp_path: Any
) -> None:
    """A brand-new group assigns in steps (a cooperative rebalance revokes, then assigns): the
    partial assignment of that moment is not taken for a stale one, and each shard is
    assigned partitions once."""
    from tests.workerutil import WorkerProcess, worker_args

    topic = make_topic(4)
    produce(kafka_bootstrap, topic, 4000, partitions=4)
    group = f"fresh-{uuid.uuid4().hex[:8]}"
    args = worker_args(kafka_bootstrap, topic, group, None, shards=4, stop_after_idle=6)
    worker = WorkerProcess.start(args, tmp_path / "w.log")
    assert worker.wait(180) == 0, worker.tail()
    log = worker.log()
    assert "assignment kept from before" not in log, log[-3000:]
    assert "made the group rebalance" not in log
    assert "WARNING" not in log, [x for x in log.splitlines() if "WARNING" in x]
    for k in range(4):  # each member assigned once: no rebalance beyond the join's own
        assert log.count(f"shard {k}: assigned partitions") == 1, log[-3000:]
