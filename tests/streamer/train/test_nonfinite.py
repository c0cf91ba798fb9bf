"""streamer.train.nonfinite: the run of skipped (non-finite) steps, the batches it holds and the
limit; the log's description of a batch's offsets (the lifecycle's tests drive it end to end)."""

from __future__ import annotations

import numpy as np
import pytest

from streamer.train.nonfinite import NonFiniteSteps, describe_offsets


def _batch(part: list[int], off: list[int]) -> tuple[np.ndarray, np.ndarray]:
    return np.array(part, np.int32), np.array(off, np.int64)


@pytest.mark.parametrize(
    ("partition", "offset", "text"),
    [
        ([0], [42], "0:42-42"),
        ([3, 3, 3], [9, 7, 8], "3:7-9"),  # the range, whatever the order in the batch
        ([5, 1, 5, 1], [100, 2, 50, 1], "1:1-2 5:50-100"),  # partitions in ascending order
        ([0, 10, 2], [1, 1, 1], "0:1-1 2:1-1 10:1-1"),  # numeric order, not text order
        ([1], [2**62], f"1:{2**62}-{2**62}"),  # int64 offsets as they are
    ],
)
def test_describe_offsets_gives_each_partitions_range(
    partition: list[int], offset: list[int], text: str
) -> None:
    assert describe_offsets(*_batch(partition, offset)) == text


def test_describe_offsets_of_an_empty_batch_is_empty() -> None:
    """No rows (an all-padding batch): an empty string, which the log line shows as "-"."""
    assert describe_offsets(*_batch([], [])) == ""


def test_a_limit_of_one_stops_at_the_first_skipped_step() -> None:
    guard = NonFiniteSteps(limit=1)
    assert guard.skipped(*_batch([0], [1])) is True


def test_the_limit_counts_steps_in_a_row_and_an_applied_step_resets_it() -> None:
    guard = NonFiniteSteps(limit=3)
    assert [guard.skipped(*_batch([0], [i])) for i in range(2)] == [False, False]
    guard.applied()
    # Two more after a good step are not three in a row.
    assert [guard.skipped(*_batch([0], [i])) for i in range(2, 4)] == [False, False]
    assert guard.skipped(*_batch([0], [4])) is True
    assert (guard.in_a_row, guard.total) == (3, 5)  # the total is never reset


def test_past_the_limit_every_further_skip_still_says_stop() -> None:
    guard = NonFiniteSteps(limit=2)
    results = [guard.skipped(*_batch([0], [i])) for i in range(4)]
    assert results == [False, True, True, True]


def test_held_batches_are_handed_out_once_in_order_with_their_records() -> None:
    """An applied step releases every batch of the run, oldest first, and holds none after."""
    guard = NonFiniteSteps(limit=10)
    first, second = _batch([0, 1], [5, 9]), _batch([2], [40])
    guard.skipped(*first)
    guard.skipped(*second)
    assert guard.held_records == 3
    held = guard.applied()
    assert [(p.tolist(), o.tolist()) for p, o in held] == [([0, 1], [5, 9]), ([2], [40])]
    assert guard.held_records == 0 and guard.in_a_row == 0
    assert guard.applied() == []  # nothing twice


def test_held_records_count_rows_not_batches() -> None:
    guard = NonFiniteSteps(limit=10)
    guard.skipped(*_batch([], []))  # an all-padding batch holds no record
    guard.skipped(*_batch([0] * 7, list(range(7))))
    assert guard.held_records == 7
    assert len(guard.applied()) == 2
