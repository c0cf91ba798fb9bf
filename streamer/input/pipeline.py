"""PipelineSettings: the tf.data side of the input pipeline (no TensorFlow import here)."""

from __future__ import annotations

from dataclasses import dataclass

from consumers.errors import ConfigError

__all__ = ["PipelineSettings"]


@dataclass(frozen=True, slots=True)
class PipelineSettings:
    """The tf.data side: shard count, batch size and when a pass ends.

    A pass ends when ``pass_records`` records were emitted, ``pass_seconds`` passed, every shard
    saw no record for ``idle_timeout_seconds``, or ``StreamSource.stop()`` was called.
    """

    num_shards: int = 2
    batch_size: int = 256
    pass_records: int | None = None
    pass_seconds: float | None = None
    idle_timeout_seconds: float = 10.0
    get_timeout_seconds: float = 0.2
    prefetch_batches: int = -1  # tf.data.AUTOTUNE
    drop_remainder: bool = False
    linger: bool = False
    shuffle_buffer: int = 0
    start_from: str | int = "committed"
    stop_at: str | int | None = None  # replay: stop before the first record at/after this time
    log_rejects_per_second: float = 20.0
    max_reject_fraction: float = 0.5  # streamer.input.breaker; 1.0 turns the breaker off
    decoder: str = "auto"  # --decoder: python turns the compiled fast path off

    def __post_init__(self) -> None:
        if not 1 <= self.num_shards <= 256:
            raise ConfigError("shards", self.num_shards, "an integer from 1 to 256")
        if self.batch_size < 1:
            raise ConfigError("batch_size", self.batch_size, "a positive integer")
        if self.pass_records is not None and self.pass_records < 1:
            raise ConfigError("pass_records", self.pass_records, "a positive integer or unset")
        if self.pass_seconds is not None and self.pass_seconds <= 0:
            raise ConfigError("pass_seconds", self.pass_seconds, "a positive number or unset")
        if self.shuffle_buffer < 0:
            raise ConfigError(
                "shuffle_buffer", self.shuffle_buffer, "0 (off) or a number of records"
            )
        if self.decoder not in ("auto", "python"):
            raise ConfigError("decoder", self.decoder, "auto or python")
        if not 0.0 < self.max_reject_fraction <= 1.0:
            raise ConfigError(
                "max_reject_fraction",
                self.max_reject_fraction,
                "a share of records in (0, 1]; 1 turns the reject breaker off",
            )
        if self.idle_timeout_seconds <= 0:
            raise ConfigError(
                "idle_timeout_seconds", self.idle_timeout_seconds, "a positive number"
            )
