"""DeadLetterWriter: records that fail to decode go to a dead-letter topic, done once acknowledged."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

__all__ = ["HEADER_OFFSET", "HEADER_PARTITION", "HEADER_REASON", "HEADER_TOPIC", "DeadLetterWriter"]

log = logging.getLogger(__name__)

HEADER_TOPIC = "streamer.source.topic"
HEADER_PARTITION = "streamer.source.partition"
HEADER_OFFSET = "streamer.source.offset"
HEADER_REASON = "streamer.reason"

Done = Callable[[int, int], None]


class DeadLetterWriter:
    """Writes rejected records to ``topic`` with headers naming their origin and the reason.

    ``on_done(partition, offset)`` is called only after the broker acknowledged the write: only
    then may the source record count as done for committing. A write that still fails after the
    producer's retries leaves the record not done (the commit point stays below it) and is
    reported through ``on_failure``.
    """

    def __init__(
        self,
        bootstrap_servers: str,
        topic: str,
        *,
        on_done: Done,
        on_failure: Callable[[BaseException], None] | None = None,
        security: dict[str, Any] | None = None,
        producer_factory: Callable[..., Any] | None = None,
    ) -> None:
        from kafka import KafkaProducer

        factory = producer_factory or KafkaProducer
        self.topic = topic
        self._on_done = on_done
        self._on_failure = on_failure
        self._lock = threading.Lock()
        self.pending = 0
        self.written = 0
        self.failed = 0
        self._producer = factory(
            bootstrap_servers=bootstrap_servers,
            client_id="streamer-dead-letter",
            acks="all",
            retries=10,
            linger_ms=20,
            max_request_size=16 * 1024 * 1024,
            **(security or {}),
        )

    def send(
        self, value: bytes, source_topic: str, partition: int, offset: int, reason: str
    ) -> None:
        headers = [
            (HEADER_TOPIC, source_topic.encode()),
            (HEADER_PARTITION, str(partition).encode()),
            (HEADER_OFFSET, str(offset).encode()),
            (HEADER_REASON, reason.encode()),
        ]
        with self._lock:
            self.pending += 1
        future = self._producer.send(self.topic, value=value, headers=headers)

        def ok(_meta: Any) -> None:
            with self._lock:
                self.pending -= 1
                self.written += 1
            self._on_done(partition, offset)

        def failed(exc: BaseException) -> None:
            with self._lock:
                self.pending -= 1
                self.failed += 1
            log.error(
                "dead-letter write for %s/%d@%d failed: %s; the record stays uncommitted",
                source_topic,
                partition,
                offset,
                type(exc).__name__,
            )
            if self._on_failure is not None:
                self._on_failure(exc)

        future.add_callback(ok)
        future.add_errback(failed)

    def flush(self, timeout: float = 30.0) -> None:
        self._producer.flush(timeout=timeout)

    def close(self, timeout: float = 30.0) -> None:
        try:
            self._producer.flush(timeout=timeout)
        finally:
            self._producer.close(timeout=timeout)
