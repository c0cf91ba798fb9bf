"""PassRules alone: record budget, clock, idle, a replay's range."""

from __future__ import annotations

from streamer.input.passes import PassRules


def test_budget_clock_and_idle() -> None:
    now = [0.0]
    rules = PassRules(
        pass_records=10, pass_seconds=5.0, idle_timeout_seconds=2.0, clock=lambda: now[0]
    )
    rules.begin()
    assert rules.take(6) and not rules.take(6) and not rules.budget_left()
    rules.begin()
    assert rules.budget_left() and not rules.out_of_time()
    now[0] = 5.0
    assert rules.out_of_time()
    assert rules.idle(since=3.0) and not rules.idle(since=3.5)


def test_a_replay_is_finished_when_every_partition_reached_its_stop() -> None:
    rules = PassRules(stop_offsets={0: 10, 1: 5}, start_offsets={1: 5})
    assert rules.bounded and rules.reached() == {1}  # started at its stop: nothing to read
    assert not rules.finished
