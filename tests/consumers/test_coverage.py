"""consumers.coverage: where a partition's position moved past the records handed over (the
commit point may follow it), never below them, and starting over on a seek or an assignment."""

from __future__ import annotations

import pytest

from consumers.coverage import Coverage


def test_the_first_position_after_an_assignment_only_marks_the_start() -> None:
    """A partition assigned at 500 (a committed offset) reports no end for 0..499."""
    c = Coverage()
    assert c.ends({}, {0: 500, 1: 7}) == {}
    assert c.ends({}, {0: 500, 1: 7}) == {}  # nothing moved since
    assert c.ends({}, {0: 503}) == {0: 503}  # three markers/compacted offsets skipped


def test_a_position_right_after_the_records_handed_over_is_no_end() -> None:
    """The records fill those offsets themselves: their own commit moves the point."""
    c = Coverage()
    c.ends({}, {0: 10})
    assert c.ends({0: 15}, {0: 15}) == {}
    assert c.ends({0: 20}, {}) == {}  # no position read this time
    assert c.ends({}, {0: 20}) == {}


@pytest.mark.parametrize(
    ("last", "position", "end"),
    [
        (15, 16, 16),  # a commit marker after the records
        (15, 30, 30),  # an aborted transaction's records skipped
        (15, 15, None),
        (15, 14, None),  # a position read before the fetch caught up: never an end below
    ],
)
def test_an_end_is_where_the_position_moved_past_the_last_record(
    last: int, position: int, end: int | None
) -> None:
    c = Coverage()
    c.ends({}, {0: 10})
    assert c.ends({0: last}, {0: position}) == ({0: end} if end is not None else {})


def test_an_end_is_reported_once_and_never_moves_back() -> None:
    c = Coverage()
    c.ends({}, {0: 10})
    assert c.ends({}, {0: 21}) == {0: 21}
    assert c.ends({}, {0: 21}) == {}
    assert c.ends({}, {0: 18}) == {}  # a stale position
    assert c.ends({0: 19}, {}) == {}  # stale records: below what is covered
    assert c.ends({}, {0: 21}) == {}
    assert c.ends({}, {0: 22}) == {0: 22}


def test_records_handed_over_before_any_position_count_as_covered() -> None:
    c = Coverage()
    assert c.ends({0: 40}, {}) == {}
    assert c.ends({}, {0: 40}) == {}
    assert c.ends({}, {0: 42}) == {0: 42}


def test_partitions_are_independent_and_only_those_that_moved_are_returned() -> None:
    c = Coverage()
    c.ends({}, {0: 0, 1: 100, 2: 50})
    assert c.ends({0: 5, 1: 110}, {0: 6, 1: 110, 2: 50}) == {0: 6}
    assert c.ends({2: 60}, {0: 6, 1: 112, 2: 61}) == {1: 112, 2: 61}


def test_forget_starts_a_partition_over_after_a_seek() -> None:
    """Sought back to 5 after covering up to 21: the position after the seek is a new start,
    not an end, and ends after it are counted from there (they can be below the old ones)."""
    c = Coverage()
    c.ends({}, {0: 10, 1: 10})
    assert c.ends({}, {0: 21, 1: 12}) == {0: 21, 1: 12}
    c.forget(0)
    assert c.ends({}, {0: 5, 1: 12}) == {}
    assert c.ends({0: 8}, {0: 9}) == {0: 9}
    assert c.ends({}, {1: 13}) == {1: 13}  # the other partition kept its coverage


def test_forget_of_an_unknown_partition_and_clear() -> None:
    c = Coverage()
    c.forget(3)  # never seen: nothing to forget
    c.ends({}, {0: 10, 1: 10})
    c.clear()
    assert c.ends({}, {0: 30, 1: 40}) == {}  # every partition starts over
    assert c.ends({}, {0: 31, 1: 40}) == {0: 31}
