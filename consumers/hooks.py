"""The two sides of a shard: ShardHooks (what it tells its owner) and ShardLike (what the owner
may ask of it), the same for thread shards, process shards and the simulator's shards."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from consumers.block import RecordBlock
from consumers.clients.base import GroupCommit
from consumers.types import KafkaErrorType

__all__ = ["Claim", "ShardHooks", "ShardLike"]

#: The owner registering a block's records as in flight (``ShardLike.get``).
Claim = Callable[[RecordBlock], RecordBlock]


class ShardHooks:
    """Callbacks a shard makes into its owner. Every method is optional (no-op by default).

    Rebalance callbacks may run on a Kafka client's IO thread: they must not block, but for
    ``on_revoking``, which waits (bounded) for what the owner took of the partitions.
    """

    def on_assigned(
        self,
        shard_index: int,
        partitions: list[int],
        group: dict[int, GroupCommit] | None = None,
    ) -> dict[int, int]:
        """Partitions were assigned, with the group's committed offsets of them (None: they
        could not be read; a static assignment has no group); return {partition: offset} to
        start them at (the owner's start rule: streamer.input.starts)."""
        return {}

    def on_revoking(self, shard_index: int, partitions: list[int]) -> None:
        """Partitions are about to be revoked (not lost): the owner settles what it took of
        them, so that ``on_revoked`` reports exactly what was done. May block, briefly."""

    def on_revoked(self, shard_index: int, partitions: list[int]) -> dict[int, int]:
        """Partitions are being revoked; return {partition: next offset} to commit (async)."""
        return {}

    def on_lost(self, shard_index: int, partitions: list[int]) -> None:
        """Partitions were lost without a chance to commit (fenced or evicted)."""

    def on_poll(
        self,
        shard_index: int,
        records: int,
        nbytes: int,
        highwater: dict[int, int],
        position: dict[int, int],
    ) -> None:
        """A poll returned (records may be 0); high watermarks and positions per partition."""

    def on_stable_offsets(self, shard_index: int, offsets: dict[int, int]) -> None:
        """read_committed: the last stable offset per assigned partition (read every few s)."""

    def on_commit(
        self, offsets: dict[int, int], ok: bool, seconds: float, error: str | None
    ) -> None:
        """A commit finished."""

    def on_error(self, kind: KafkaErrorType, exc: BaseException) -> None:
        """A Kafka error was seen (kind: connection, authentication, fenced, commit, other, ...)."""

    def on_paused(self, shard_index: int, paused: int) -> None:
        """The number of paused partitions of this shard changed."""

    def on_group_committed(self, shard_index: int, offsets: dict[int, int]) -> None:
        """The group's committed offsets of newly assigned partitions (where this shard starts)."""

    def on_topic_missing(self, shard_index: int, missing: bool) -> None:
        """The topic stopped (True) or started again (False) to exist for this shard."""


class ShardLike(Protocol):
    """What an owner (``streamer.input.source``) needs of a shard, whatever runs it."""

    #: When a record last arrived, and when the shard's assignment last changed (monotonic).
    last_record_monotonic: float
    last_rebalance_monotonic: float

    def start(self) -> ShardLike: ...

    def get(self, timeout: float, claim: Claim | None = None) -> RecordBlock | None:
        """The next block, claimed (see ``consumers.queue``), or None after ``timeout``.

        Raises ``ShardFailedError`` once the shard failed.
        """
        ...

    def commit(self, offsets: dict[int, int]) -> None:
        """Ask for {partition: next offset} to be committed (owned partitions only)."""
        ...

    def close(self, timeout: float = 10.0) -> None: ...

    @property
    def assigned(self) -> frozenset[int]: ...

    @property
    def joining(self) -> bool:
        """Waiting for the group (the pass's join, or a rebalance): not idle."""
        ...

    @property
    def failed(self) -> BaseException | None: ...

    @property
    def queued_records(self) -> int: ...

    @property
    def topic_missing(self) -> bool: ...
