"""The start rule (streamer.input.starts) alone: every case of where a partition starts."""

from __future__ import annotations

import pytest

from consumers.clients.base import GroupCommit
from streamer.input.starts import choose_start

OURS = "streamer-worker a"
OTHER_WORKER = "streamer-worker b"


@pytest.mark.parametrize(
    ("mine", "group", "known", "forced", "start", "notable"),
    [
        # An operator's start wins over everything.
        (500, GroupCommit(900, OURS), True, (100, "--start-from x"), 100, True),
        # Never had it, the group has a commit: the group's.
        (None, GroupCommit(900, OURS), True, None, 900, False),
        # Nothing anywhere: the client's auto_offset_reset.
        (None, None, True, None, None, False),
        # Our position, no commit (a new group): ours.
        (500, None, True, None, 500, False),
        # The group could not be read: ours, as before there was a rule.
        (500, None, False, None, 500, True),
        (None, None, False, None, None, False),
        # Equal: nothing to say.
        (500, GroupCommit(500, OURS), True, None, 500, False),
        # Ahead of ours, whoever committed: another member trained them since.
        (500, GroupCommit(900, OTHER_WORKER), True, None, 900, True),
        (500, GroupCommit(900, ""), True, None, 900, True),
        # Behind ours and a worker's: a lagging commit; ours wins.
        (500, GroupCommit(300, OURS), True, None, 500, True),
        (500, GroupCommit(300, OTHER_WORKER), True, None, 500, True),
        # Behind ours and not a worker's (reset-group, Kafka's tool, a replay): the operator's.
        (500, GroupCommit(300, ""), True, None, 300, True),
        (500, GroupCommit(300, "streamer-replay from=a to=b"), True, None, 300, True),
    ],
)
def test_where_a_partition_starts(
    mine: int | None,
    group: GroupCommit | None,
    known: bool,
    forced: tuple[int, str] | None,
    start: int | None,
    notable: bool,
) -> None:
    chosen = choose_start(mine=mine, group=group, group_known=known, forced=forced)
    assert chosen.offset == start
    assert chosen.notable is notable
    assert chosen.why
