"""Log quieting for the Kafka client libraries: repeated lines rate-limited, librdkafka's
connection noise kept at WARNING (the shard's own lines say what happened and what it does)."""

from __future__ import annotations

import logging
import re
import threading
import time

__all__ = ["RepeatFilter", "quiet"]

_DIGITS = re.compile(r"\d+")


class RepeatFilter(logging.Filter):
    """Lets an identical WARNING/ERROR record through at most once per ``every_seconds``.

    Records differ in their arguments (or, with ``fold_numbers``, in their text without its
    numbers): distinct errors still all get through. ``max_level`` caps the level of what a
    library logs (librdkafka logs a refused connection during a broker restart at ERROR).
    """

    def __init__(
        self,
        every_seconds: float = 10.0,
        *,
        fold_numbers: bool = False,
        max_level: int = logging.CRITICAL,
    ) -> None:
        super().__init__()
        self.every_seconds = every_seconds
        self.fold_numbers = fold_numbers
        self.max_level = max_level
        self._seen: dict[tuple[str, str], float] = {}
        self._lock = threading.Lock()

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno > self.max_level:
            record.levelno, record.levelname = self.max_level, logging.getLevelName(self.max_level)
        if record.levelno < logging.WARNING:
            return True
        if self.fold_numbers:
            key = (_DIGITS.sub("#", record.getMessage()), "")
        else:
            key = (str(record.msg), repr(record.args))
        now = time.monotonic()
        with self._lock:
            last = self._seen.get(key)
            if last is not None and now - last < self.every_seconds:
                return False
            if len(self._seen) > 1000:
                self._seen.clear()
            self._seen[key] = now
        return True


def quiet(name: str, **options: object) -> None:
    """Install a ``RepeatFilter`` on logger ``name`` (once)."""
    logger = logging.getLogger(name)
    if not any(isinstance(f, RepeatFilter) for f in logger.filters):
        logger.addFilter(RepeatFilter(**options))  # type: ignore[arg-type]
