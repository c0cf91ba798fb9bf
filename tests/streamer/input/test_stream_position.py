"""streamer.input.stream_position: where the run started, what was committed since and what
is done now, overlaid in order of recency (the committer's tests drive it through commits)."""

from __future__ import annotations

import threading

from streamer.input.stream_position import StreamPosition


def test_without_a_checkpoint_nothing_is_known() -> None:
    pos = StreamPosition()
    assert pos.restored == {} and pos.current() == {}
    assert StreamPosition(None).current({}) == {}


def test_the_restored_offsets_are_a_copy_in_and_out() -> None:
    """Neither the caller's dict nor the one handed out can change where the run started."""
    given = {0: 10, 1: 20}
    pos = StreamPosition(given)
    given[0] = 999
    out = pos.restored
    out[1] = 999
    assert pos.restored == {0: 10, 1: 20}
    assert pos.current() == {0: 10, 1: 20}


def test_commits_overlay_the_restored_offsets_and_never_change_them() -> None:
    pos = StreamPosition({0: 100, 1: 50})
    pos.commit({0: 120, 2: 7})
    assert pos.current() == {0: 120, 1: 50, 2: 7}
    assert pos.restored == {0: 100, 1: 50}  # where this run started stays as it was


def test_done_points_overlay_commits_and_become_known() -> None:
    """The tracker's points passed to current() win over older commits, and are remembered:
    a later current() without them (a new pass's tracker starts empty) still has them."""
    pos = StreamPosition({0: 100})
    pos.commit({0: 120, 1: 5})
    assert pos.current({1: 9, 3: 1}) == {0: 120, 1: 9, 3: 1}
    assert pos.current() == {0: 120, 1: 9, 3: 1}
    assert pos.current(None) == {0: 120, 1: 9, 3: 1}


def test_the_most_recent_source_wins_even_when_it_is_lower() -> None:
    """Recency, not the maximum: a position that moved back (a group reset, a replay) is
    the position from then on."""
    pos = StreamPosition({0: 500})
    pos.commit({0: 300})
    assert pos.current() == {0: 300}
    assert pos.current({0: 200}) == {0: 200}
    pos.commit({0: 250})
    assert pos.current() == {0: 250}


def test_current_hands_out_a_copy() -> None:
    pos = StreamPosition({0: 1})
    out = pos.current({1: 2})
    out[0] = out[1] = out[5] = 999
    assert pos.current() == {0: 1, 1: 2}


def test_commits_from_many_threads_are_all_kept() -> None:
    """commit() and current() run from the committer's and the trainer's threads at once:
    every partition's point ends up known, none lost to a race."""
    pos = StreamPosition({p: 0 for p in range(8)})
    start = threading.Barrier(8)

    def work(p: int) -> None:
        start.wait()
        for o in range(1, 201):
            pos.commit({p: o})
            pos.current({100 + p: o})

    threads = [threading.Thread(target=work, args=(p,)) for p in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=10)
    assert not any(t.is_alive() for t in threads)
    final = pos.current()
    assert final == {**{p: 200 for p in range(8)}, **{100 + p: 200 for p in range(8)}}
