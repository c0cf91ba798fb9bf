"""A shard whose group membership never becomes STABLE again recreates its consumer.

Pure logic: the watch reads only ``group_metadata()``, so a small stand-in gives it the states.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from kafka.structs import MemberState

from consumers.settings import ConsumerSettings
from consumers.shard import Shard


@dataclass
class _Meta:
    state: MemberState
    generation_id: int


class _Membership:
    def __init__(self) -> None:
        self.meta = _Meta(MemberState.STABLE, 1)

    def group_metadata(self) -> _Meta:
        return self.meta


def _shard(mode: str = "group") -> Shard:
    settings = ConsumerSettings(
        bootstrap_servers="127.0.0.1:9",
        topic="t",
        mode=mode,  # type: ignore[arg-type]
        partitions=(0, 1) if mode == "static" else None,
        session_timeout_ms=6000,
    )
    shard = Shard(settings, 0, 1)
    shard._stuck_after_s = 0.2
    return shard


def test_the_limit_is_the_session_timeout_plus_a_margin() -> None:
    settings = ConsumerSettings(bootstrap_servers="b:1", topic="t", session_timeout_ms=45_000)
    assert Shard(settings, 0, 1)._stuck_after_s == 55.0


def test_stuck_only_after_the_limit_without_a_stable_moment() -> None:
    shard, consumer = _shard(), _Membership()
    assert not shard._rebalance_stuck(consumer) and not shard.joining
    consumer.meta = _Meta(MemberState.REBALANCING, 1)
    assert not shard._rebalance_stuck(consumer)
    assert shard.joining  # the idle timeout of the pass does not run meanwhile
    time.sleep(0.1)
    assert not shard._rebalance_stuck(consumer)
    consumer.meta = _Meta(MemberState.STABLE, 2)  # a stable moment restarts the clock
    assert not shard._rebalance_stuck(consumer) and not shard.joining
    consumer.meta = _Meta(MemberState.UNJOINED, -1)
    assert not shard._rebalance_stuck(consumer)
    time.sleep(0.25)
    assert shard._rebalance_stuck(consumer)


def test_a_negative_generation_is_not_stable() -> None:
    shard, consumer = _shard(), _Membership()
    consumer.meta = _Meta(MemberState.STABLE, -1)
    assert not shard._rebalance_stuck(consumer)
    time.sleep(0.25)
    assert shard._rebalance_stuck(consumer)


def test_static_mode_is_never_stuck() -> None:
    shard, consumer = _shard("static"), _Membership()
    consumer.meta = _Meta(MemberState.UNJOINED, -1)
    shard._rebalance_stuck(consumer)
    time.sleep(0.25)
    assert not shard._rebalance_stuck(consumer)
