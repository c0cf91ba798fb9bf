"""Where a partition starts when it is assigned: the rule that keeps a record from being
trained twice across restarts, moves, outages and pauses (pure: no Kafka, no TensorFlow).

Three things are known at an assignment: this worker's own position (what it trained: its
checkpoint at start, then what it trained and committed since), the group's committed offset
with its metadata (who committed it), and an operator's deliberate start (``--start-from``,
a replay's ``--from``). The rule:

- an operator's start wins (this run's first pass; it says so);
- the group's commit wins when it is ahead of this worker's position: another member
  trained those records since (a deploy moved the partition away and back);
- this worker's position wins when the group's commit is behind it and was made by a worker
  (``streamer-worker`` metadata): our own commit lagged or failed (an outage, a crash
  between checkpoint and commit, a session that expired before the commit);
- the group's commit wins when it is behind and was made by anything else (``reset-group``,
  Kafka's ``kafka-consumer-groups --reset-offsets``): an operator rewound the group.

>>> from consumers.clients.base import GroupCommit
>>> choose_start(mine=100, group=GroupCommit(250, "streamer-worker b")).offset
250
>>> choose_start(mine=100, group=GroupCommit(40, "streamer-worker a")).offset
100
>>> choose_start(mine=100, group=GroupCommit(0, "")).offset
0
"""

from __future__ import annotations

from dataclasses import dataclass

from consumers.clients.base import GroupCommit
from consumers.settings import WORKER_COMMIT

__all__ = ["Start", "choose_start"]


@dataclass(frozen=True, slots=True)
class Start:
    """Where a partition starts (None: where the client starts it: the group's commit, else
    ``auto_offset_reset``), why, and whether the log should say so at INFO."""

    offset: int | None
    why: str
    notable: bool = False


def choose_start(
    *,
    mine: int | None,
    group: GroupCommit | None,
    group_known: bool = True,
    forced: tuple[int, str] | None = None,
) -> Start:
    """The start of one partition; see the module's rule.

    ``mine``: this worker's position (None: it never had the partition); ``group``: the
    group's commit (None: none); ``group_known``: False when it could not be read (then this
    worker's position, as before there was a rule); ``forced``: an operator's (offset, why).

    >>> choose_start(mine=None, group=None)
    Start(offset=None, why='the group has no commit (auto_offset_reset applies)', notable=False)
    >>> choose_start(mine=5, group=GroupCommit(9, "streamer-worker x"), forced=(0, "--start-from earliest")).why
    '--start-from earliest'
    """
    if forced is not None:
        return Start(forced[0], forced[1], True)
    if not group_known:
        if mine is None:
            return Start(None, "the group's commit could not be read; the client's own start")
        return Start(mine, "this worker's position (the group's commit could not be read)", True)
    if group is None:
        if mine is None:
            return Start(None, "the group has no commit (auto_offset_reset applies)")
        return Start(mine, "this worker's position (the group has no commit)")
    g = group.offset
    if mine is None or g == mine:
        return Start(g, "the group's commit")
    if g > mine:
        return Start(
            g,
            f"the group committed {g}, past this worker's position {mine}: another member "
            f"trained {g - mine} records since; starting from the group's commit",
            True,
        )
    if group.metadata.startswith(WORKER_COMMIT):
        return Start(
            mine,
            f"this worker trained up to {mine}; the group's commit {g} lagged behind it "
            "(a commit that failed or was not sent yet)",
            True,
        )
    who = repr(group.metadata) if group.metadata else "no metadata"
    return Start(
        g,
        f"the group's commit {g} is behind this worker's position {mine} and was not made "
        f"by a worker ({who}: reset-group or Kafka's tools): an operator's rewind wins",
        True,
    )
