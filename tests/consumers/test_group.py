"""The join barrier and the rejoin watch: pure rules, driven by an injected clock."""

from __future__ import annotations

from consumers.group import JoinBarrier, RejoinWatch


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_the_barrier_releases_when_every_shard_held_one_generation_for_the_settle_time() -> None:
    clock = Clock()
    barrier = JoinBarrier(3, settle_seconds=1.5, timeout_seconds=30.0, clock=clock)
    assert not barrier.report(0, 4)
    assert not barrier.report(1, 4)
    clock.now += 5
    assert not barrier.report(2, None)  # one shard still rebalancing
    assert not barrier.report(2, 4)  # all agree from now on
    clock.now += 1.0
    assert not barrier.report(0, 4)
    clock.now += 0.6
    assert barrier.report(1, 4) and barrier.released
    assert barrier.report(2, 7)  # released stays released


def test_a_new_generation_restarts_the_settle_time() -> None:
    clock = Clock()
    barrier = JoinBarrier(2, settle_seconds=1.0, clock=clock)
    barrier.report(0, 1)
    barrier.report(1, 1)
    clock.now += 0.9
    barrier.report(0, 2)  # the leader rejoined: a rebalance
    clock.now += 0.5
    assert not barrier.report(1, 2)
    clock.now += 1.0
    assert barrier.report(0, 2)


def test_the_barrier_gives_up_waiting_at_its_deadline() -> None:
    clock = Clock()
    barrier = JoinBarrier(2, settle_seconds=1.0, timeout_seconds=30.0, clock=clock)
    assert not barrier.report(0, 1)  # the other shard never reports (another worker churns)
    clock.now += 31
    assert barrier.report(0, 1)


def test_the_rejoin_watch_nudges_then_gives_up_after_its_limit() -> None:
    clock = Clock()
    watch = RejoinWatch(stuck_after_seconds=55.0, nudge_after_seconds=1.0, clock=clock)
    assert watch.observe(True) == "ok" and not watch.unstable
    assert watch.observe(False) == "ok" and watch.unstable  # the pass is joining, not idle
    clock.now += 0.5
    assert watch.observe(False) == "ok"
    clock.now += 1.0
    assert watch.observe(False) == "nudge"
    clock.now += 30
    assert watch.observe(True) == "ok"  # a stable moment restarts the clock
    assert watch.observe(False) == "ok"
    clock.now += 54
    assert watch.observe(False) == "nudge"
    clock.now += 1
    assert watch.observe(False) == "stuck"
    watch.reset()
    assert not watch.unstable
