"""The client interface: what a shard needs of a Kafka consumer, whichever library provides it.

A shard (``consumers.shard``) owns one ``ConsumerClient`` and calls it from its poller thread
only: every library call happens there (kafka-python is not thread-safe; confluent-kafka 2.16
serializes calls across threads and can starve a second caller). Rebalance callbacks reach
the shard through a ``RebalanceListener`` on whatever thread the library runs them (kafka-python:
its IO thread; confluent-kafka: inside ``poll()``, on the poller thread). The adapter turns the
library's errors into the exceptions below and ours (``consumers.errors``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Literal, Protocol

from consumers.block import RecordBlock
from consumers.errors import StreamerError

__all__ = [
    "ClientName",
    "CommitCallback",
    "ConsumerClient",
    "GroupCommit",
    "GroupState",
    "NoCommittedOffset",
    "OffsetsOutOfRange",
    "RebalanceListener",
    "RefusedBatch",
    "RetriableClientError",
    "ShardContext",
    "UnreadableBatchError",
]

from consumers.types import ClientName, KafkaErrorType

#: ``callback(offsets, error)``: a commit finished (``error`` None) or failed.
CommitCallback = Callable[[dict[int, int], BaseException | None], None]


@dataclass(frozen=True, slots=True)
class GroupState:
    """Where the consumer stands in its group (always stable, generation 0, without a group)."""

    stable: bool
    generation: int | None  # None while not in a stable generation


@dataclass(frozen=True, slots=True)
class GroupCommit:
    """A partition's committed offset in the group, and the metadata stored with it (who
    committed it: a worker writes ``streamer-worker ...``; Kafka's tools and ``reset-group``
    write their own or none)."""

    offset: int
    metadata: str = ""


class NoCommittedOffset(StreamerError):
    """``poll()``: these partitions have no committed offset; the shard applies its reset policy."""

    retriable = True

    def __init__(self, partitions: Iterable[int]) -> None:
        self.partitions = sorted(partitions)
        super().__init__(f"no committed offset for partitions {self.partitions}")


class OffsetsOutOfRange(StreamerError):
    """``poll()``: the position of these partitions (partition -> offset) is not in the log."""

    retriable = True

    def __init__(self, offsets: dict[int, int]) -> None:
        self.offsets = dict(offsets)
        super().__init__(f"offsets out of range: {self.offsets}")


class RetriableClientError(StreamerError):
    """``poll()`` failed in a way that waiting can fix (broker down, leader moving)."""

    retriable = True


@dataclass(frozen=True, slots=True)
class RefusedBatch:
    """A record batch the client did not inflate: it inflates past ``bound`` bytes.

    Fetch limits count compressed bytes: one batch of ~1 MB can inflate to gigabytes (a
    decompression bomb). The client skipped the batch (its position is past ``last_offset``);
    its records are neither handed over nor trained, and the commit point moves past them.
    """

    topic: str
    partition: int
    base_offset: int
    last_offset: int
    #: The batch's compressed records, and how many records its header claims.
    compressed_bytes: int
    records: int
    codec: str
    bound: int

    def __str__(self) -> str:
        return (
            f"record batch of {self.topic} partition {self.partition}, offsets "
            f"{self.base_offset}-{self.last_offset} ({self.records} records, "
            f"{self.compressed_bytes} bytes of {self.codec}), inflates past "
            f"max_batch_inflated_bytes={self.bound} (--max-batch-inflated-bytes): skipped "
            "without inflating it; its records are not trained and the commit moves past them "
            "(a decompression bomb, or a producer batch larger than the bound)"
        )


class UnreadableBatchError(StreamerError):
    """A record batch the client can neither inflate within the bound nor skip: stop loudly
    rather than stall on it (or crash on it) for ever."""

    def __init__(self, topic: str, partition: int, offset: int, detail: str) -> None:
        self.topic = topic
        self.partition = partition
        self.offset = offset
        super().__init__(
            f"the record batch at offset {offset} of {topic} partition {partition} cannot be "
            f"read: {detail}"
        )


class RebalanceListener(Protocol):
    """The shard's side of a rebalance (it may run on the library's IO thread: it blocks only
    for the hand-over of revoked partitions, bounded, see ``Shard._on_revoked``)."""

    def assigned(
        self, partitions: list[int], group: dict[int, GroupCommit] | None = None
    ) -> dict[int, int]:
        """Partitions were added to the assignment (all of it with an eager protocol, those
        that moved with a cooperative one), with the group's committed offsets of them as
        read in the callback (None: they could not be read); returns {partition: offset} to
        start them at."""
        ...

    def revoked(self, partitions: list[int], *, lost: bool) -> None:
        """Partitions are taken away: revoked (commit allowed) or lost (fenced, evicted)."""
        ...


class ShardContext(Protocol):
    """What an adapter's upkeep may ask of its shard (``ConsumerClient.upkeep``)."""

    shard_index: int

    def flush_commits(self, timeout_ms: int) -> None:
        """Send the commit requests waiting, synchronously."""
        ...

    def report_error(self, kind: KafkaErrorType, exc: BaseException) -> None:
        """Count an error of ``kind`` (a ``streamer_kafka_errors_total`` type)."""
        ...


class ConsumerClient(Protocol):
    """One Kafka consumer of one topic, as a shard uses it (see the module docstring)."""

    #: Which library: "kafka-python" or "confluent".
    name: str

    def subscribe(self, listener: RebalanceListener) -> None:
        """Join the group (group mode); the listener hears every assignment and revocation."""
        ...

    def assign(self, partitions: list[int], starts: dict[int, int] | None = None) -> None:
        """Consume exactly these partitions (static mode, no group membership), each from
        ``starts[p]`` where given, else from the group's commit."""
        ...

    def poll(self, timeout_ms: int, serial: int) -> RecordBlock | None:
        """Records fetched, as one block (``serial`` stamped on it), or None when none came.

        Raises ``NoCommittedOffset``, ``OffsetsOutOfRange``, ``RetriableClientError``, and our
        ``FencedError`` / ``AuthenticationError``; anything else is a bug or fatal.
        """
        ...

    def refused_batches(self) -> list[RefusedBatch]:
        """The record batches skipped since the last call for inflating past the bound
        (``ConsumerSettings.inflate_bound``); the client's position is already past them."""
        ...

    def positions(self) -> dict[int, int]:
        """The next offset to fetch per assigned partition, where known (no network call)."""
        ...

    def highwaters(self) -> dict[int, int]:
        """The high watermark per assigned partition, as last fetched (no network call)."""
        ...

    def stable_offsets(self) -> dict[int, int] | None:
        """The end of what the isolation level reads per assigned partition (the last stable
        offset under read_committed; the high watermark otherwise, where the client has a
        reading of its own), when a fresh reading is available (None otherwise); may make one
        bounded network call now and then."""
        ...

    def committed(self, partitions: list[int], timeout_ms: int) -> dict[int, GroupCommit]:
        """The group's committed offsets of these partitions (those that have one), with
        their metadata. Raises ``RetriableClientError`` when they could not be read.

        Called from the poller thread, and from within the assignment callback (on whatever
        thread the library runs it: the adapter must not block its own IO thread there).
        """
        ...

    def pause(self, partitions: list[int]) -> None: ...

    def resume(self, partitions: list[int]) -> None: ...

    def paused(self) -> set[int]: ...

    def seek(self, partition: int, offset: int) -> None: ...

    def seek_to(self, partitions: list[int], where: Literal["earliest", "latest"]) -> None: ...

    def commit(
        self,
        offsets: dict[int, int],
        *,
        callback: CommitCallback | None = None,
        timeout_ms: int | None = None,
    ) -> None:
        """Commit {partition: next offset}: asynchronously with ``callback``, else synchronously
        (raising on failure)."""
        ...

    def group_state(self) -> GroupState: ...

    def topic_partitions(self, *, refresh: bool = False) -> frozenset[int] | None:
        """The topic's partitions in the client's metadata; None while the topic is unknown.

        ``refresh`` asks the broker first (a blocking metadata request): a group leader
        without the topic's metadata would assign nothing.
        """
        ...

    def topic_gone(self) -> bool:
        """The topic was deleted: the metadata has lacked it across a fresh refresh."""
        ...

    def before_poll(self) -> None:
        """Library upkeep before each poll (e.g. awaiting a group join)."""
        ...

    def upkeep(self, shard: ShardContext) -> None:
        """Library upkeep after each poll (e.g. repairing a stale group assignment)."""
        ...

    def repair_rejoin(self) -> None:
        """The member has not been stable for a while: nudge a join the library left pending."""
        ...

    def detach(self) -> None:
        """Stop calling the listener (the shard is discarding this client)."""
        ...

    def close(self, timeout_ms: int) -> None: ...
