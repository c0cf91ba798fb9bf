"""RejectBreaker alone: the window, the minimum, judging, the caps on commits."""

from __future__ import annotations

from streamer.input.breaker import RejectBreaker, capped


def test_the_window_forgets_judged_records() -> None:
    b = RejectBreaker(0.5, window_records=100, min_records=10)
    assert not b.observe(50, [(0, o, "dtype") for o in range(20)])  # 20 of 50
    assert b.caps() == {0: 0}
    for _ in range(2):
        assert not b.observe(50, [])  # good blocks push the rejects out of the window
    assert b.caps() == {}  # judged: commits may pass them
    assert not b.tripped


def test_it_trips_past_the_share_and_then_holds_every_reject() -> None:
    b = RejectBreaker(0.5, window_records=1000, min_records=20)
    assert not b.observe(10, [(1, o, "shape") for o in range(10)])  # fewer than 20 seen
    assert b.observe(20, [(1, o, "shape") for o in range(10, 30)])
    assert b.tripped
    assert not b.observe(500, [(1, 900, "shape")])  # tripped once; keeps holding
    assert b.caps() == {1: 0}
    b.settle()  # a pass end does not clear a tripped breaker
    assert b.caps() == {1: 0} and b.summary().startswith("31 of the last 530 records")


def test_settle_judges_what_a_pass_saw() -> None:
    b = RejectBreaker(0.5, window_records=1000, min_records=20)
    b.observe(100, [(0, 7, "format")])
    assert b.caps() == {0: 7}
    b.settle()
    assert b.caps() == {} and not b.tripped


def test_one_turns_it_off() -> None:
    b = RejectBreaker(1.0)
    assert not b.observe(100, [(0, o, "schema") for o in range(100)])
    assert not b.tripped and b.caps() == {}


def test_capped_commit_points() -> None:
    assert capped({0: 100, 1: 5, 2: 9}, {0: 40, 2: 12}) == {0: 40, 1: 5, 2: 9}


def test_rejects_are_undecided_until_the_breaker_has_seen_enough_records() -> None:
    """A first block of one record, rejected, cannot be judged: the source keeps it (neither
    dead-lettered nor done) until the breaker has seen ``min_records`` or tripped."""
    b = RejectBreaker(0.5, window_records=100, min_records=20)
    assert not b.observe(1, [(0, 0, "shape")])
    assert b.undecided()
    assert b.observe(19, [(0, o, "shape") for o in range(1, 20)])  # a wrong schema: tripped
    assert not b.undecided()
    ok = RejectBreaker(0.5, window_records=100, min_records=20)
    ok.observe(1, [(0, 0, "format")])
    ok.observe(19, [])  # 1 in 20: judged, not tripped
    assert not ok.undecided() and not ok.tripped
    assert not RejectBreaker(1.0).undecided()  # disabled: nothing waits
