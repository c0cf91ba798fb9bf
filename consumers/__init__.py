"""Kafka consumer shards: polling RecordBlocks with backpressure and commits (no TensorFlow here).

Importing this package is light: the modules that load a Kafka library (``shard``,
``process``, ``clients``, ``admin``, ``positions``) are imported when first used, so pure code
(``consumers.errors``, ``consumers.settings``, ``consumers.block``) can be imported anywhere.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from consumers.block import RecordBlock
from consumers.errors import (
    AuthenticationError,
    BrokerUnavailableError,
    ConfigError,
    FencedError,
    OffsetResetError,
    ShardFailedError,
    StreamerError,
    TopicCreateError,
    TopicNotFoundError,
)
from consumers.group import JoinBarrier
from consumers.hooks import ShardHooks, ShardLike
from consumers.settings import ConsumerSettings, Secret, SecuritySettings

if TYPE_CHECKING:
    from consumers.group import Barrier

__all__ = [
    "AuthenticationError",
    "BrokerUnavailableError",
    "ConfigError",
    "ConsumerSettings",
    "FencedError",
    "JoinBarrier",
    "OffsetResetError",
    "RecordBlock",
    "Secret",
    "SecuritySettings",
    "ShardFailedError",
    "ShardHooks",
    "ShardLike",
    "StreamerError",
    "TopicCreateError",
    "TopicNotFoundError",
    "open_shard",
]


def open_shard(
    settings: ConsumerSettings,
    shard_index: int,
    num_shards: int,
    *,
    hooks: ShardHooks | None = None,
    barrier: Barrier | None = None,
    restore: dict[int, int] | None = None,
    prepare: Callable[[RecordBlock], Any] | None = None,
) -> ShardLike:
    """Shard ``shard_index`` of ``num_shards`` in ``settings.shard_runtime`` (not started).

    ``restore``: where partitions start as the owner knows it now: a process shard's child
    asks its parent at each assignment (``ShardHooks.on_assigned``) and uses these only if
    the parent does not answer in time; a thread shard asks its hooks directly.
    ``prepare``: what a process shard's child does to each block before it sends it (the
    owner's decode, on the child's core); a thread shard leaves that to the owner.
    """
    if settings.shard_runtime == "process":
        from consumers.process import ProcessShard

        return ProcessShard(
            settings,
            shard_index,
            num_shards,
            hooks=hooks,
            barrier=barrier,
            restore=restore,
            prepare=prepare,
        )
    from consumers.shard import Shard

    return Shard(settings, shard_index, num_shards, hooks=hooks, barrier=barrier)
