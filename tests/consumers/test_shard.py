"""consumers.shard's backpressure, without a broker: a full queue first holds the poller (the
client keeps its prefetch), pauses only when it stays full past the hold, and resumes at half."""

from __future__ import annotations

import threading
import time
from typing import Any, cast

import pytest

from consumers.block import RecordBlock
from consumers.clients.base import ConsumerClient
from consumers.hooks import ShardHooks
from consumers.settings import ConsumerSettings
from consumers.shard import HOLD_SECONDS, Shard


class PauseFlags:
    """The pause surface of a ConsumerClient (what ``_apply_backpressure`` calls)."""

    def __init__(self) -> None:
        self.flags: set[int] = set()
        self.calls: list[tuple[str, list[int]]] = []

    def pause(self, partitions: list[int]) -> None:
        self.calls.append(("pause", partitions))
        self.flags |= set(partitions)

    def resume(self, partitions: list[int]) -> None:
        self.calls.append(("resume", partitions))
        self.flags -= set(partitions)

    def paused(self) -> set[int]:
        return set(self.flags)


class PausedCounts(ShardHooks):
    def __init__(self) -> None:
        self.counts: list[int] = []

    def on_paused(self, shard_index: int, paused: int) -> None:
        self.counts.append(paused)


def block(offset: int) -> RecordBlock:
    return RecordBlock.from_columns("t", [b"x"], [0], [offset], [0])


def shard_with(max_blocks: int, **extra: Any) -> tuple[Shard, PauseFlags, PausedCounts]:
    settings = ConsumerSettings(
        bootstrap_servers="127.0.0.1:9",
        topic="t",
        mode="static",
        partitions=[0, 1, 2],
        queue_max_blocks=max_blocks,
        poll_timeout_ms=20,
        **extra,
    )
    hooks = PausedCounts()
    shard = Shard(settings, 0, 1, hooks=hooks)  # static partitions: joined, no barrier
    shard._assigned_set = {0, 1, 2}
    return shard, PauseFlags(), hooks


def backpressure(shard: Shard, client: PauseFlags) -> bool:
    return shard._apply_backpressure(cast(ConsumerClient, client))


def test_a_queue_with_room_polls_and_never_pauses() -> None:
    shard, client, hooks = shard_with(2)
    shard._queue.put(block(0))
    assert backpressure(shard, client) is False
    assert client.calls == [] and hooks.counts == []


def test_a_full_queue_holds_the_poller_without_pausing() -> None:
    """While the hold lasts the poller skips poll() and the client's prefetch is kept."""
    shard, client, hooks = shard_with(2)
    shard._hold_seconds = 5.0
    shard._queue.put(block(0))
    shard._queue.put(block(1))
    assert backpressure(shard, client) is True
    assert backpressure(shard, client) is True
    assert client.calls == [] and hooks.counts == []


def test_room_made_during_the_hold_lets_the_poller_poll_at_once() -> None:
    shard, client, _ = shard_with(2)
    shard._hold_seconds = 5.0
    shard._queue.put(block(0))
    shard._queue.put(block(1))
    taker = threading.Timer(0.005, lambda: shard._queue.get(0.0))
    taker.start()
    try:
        # Each round waits up to poll_timeout_ms (20 ms) for room; the hold lasts 5 s, so a
        # round that does not hold is the block taken, never a pause.
        deadline = time.monotonic() + 4.0
        while backpressure(shard, client):
            assert time.monotonic() < deadline, "room was made but the poller kept holding"
    finally:
        taker.join()
    assert client.calls == []
    assert shard._full_since is None


def test_a_queue_still_full_after_the_hold_pauses_and_resumes_at_half() -> None:
    shard, client, hooks = shard_with(4)
    shard._hold_seconds = 0.03
    for offset in range(4):
        shard._queue.put(block(offset))
    while backpressure(shard, client):  # holds for about 30 ms, then pauses
        pass
    assert client.calls == [("pause", [0, 1, 2])] and hooks.counts == [3]
    shard._queue.get(0.0)  # 3 of 4: not yet half empty, still paused
    assert backpressure(shard, client) is False
    assert client.flags == {0, 1, 2}
    shard._queue.get(0.0)  # 2 of 4: half empty, resumed
    assert backpressure(shard, client) is False
    assert client.calls[-1] == ("resume", [0, 1, 2]) and hooks.counts == [3, 0]
    assert shard._full_since is None


def test_a_shard_still_joining_pauses_without_holding() -> None:
    """Before its group's pass has joined a shard holds its partitions paused (no hold)."""
    shard, client, hooks = shard_with(4)
    shard._joined = False
    assert backpressure(shard, client) is False
    assert client.flags == {0, 1, 2} and hooks.counts == [3]


@pytest.mark.parametrize(("max_poll_interval_ms", "hold"), [(300_000, HOLD_SECONDS), (1_000, 0.25)])
def test_the_hold_stays_a_quarter_of_max_poll_interval_at_most(
    max_poll_interval_ms: int, hold: float
) -> None:
    shard, _, _ = shard_with(2, max_poll_interval_ms=max_poll_interval_ms)
    assert shard._hold_seconds == pytest.approx(hold)
