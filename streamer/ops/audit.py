"""AuditLog: ``topic,partition,offset`` of every trained sample, never behind a commit."""

from __future__ import annotations

import os

import numpy as np

from consumers.errors import ConfigError

__all__ = ["AuditLog"]


class AuditLog:
    """Appends ``topic,partition,offset`` of every trained sample; fsynced on demand.

    Each step's lines reach the OS at once, before the step is acked: a commit can be sent by
    a shard's rebalance callback at any moment (not only by the worker, which fsyncs first),
    so only a log written before the ack is never behind a commit, even after ``kill -9``.
    """

    def __init__(self, path: str, topic: str) -> None:
        self.path = path
        self.topic = topic
        try:  # its folder is made, as the checkpoint and export folders are
            os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
            self._fh = open(path, "a", encoding="ascii")  # noqa: SIM115 - kept open for the run
        except OSError as exc:
            raise ConfigError(
                "audit_log", path, f"cannot be written ({exc.strerror or exc}); pick another path"
            ) from exc
        #: The log's size at its last ``flush`` (the last commit or checkpoint).
        self.synced = self._fh.tell()

    def add(self, partition: np.ndarray, offset: np.ndarray) -> None:
        prefix = self.topic + ","
        self._fh.write(
            "".join(
                f"{prefix}{p},{o}\n"
                for p, o in zip(partition.tolist(), offset.tolist(), strict=True)
            )
        )
        self._fh.flush()

    def flush(self) -> None:
        self._fh.flush()
        os.fsync(self._fh.fileno())
        self.synced = self._fh.tell()

    def truncate(self, size: int) -> int:
        """Drop the lines after ``size`` bytes (the model went back to a checkpoint: those
        records are no longer trained); the number of lines dropped."""
        self._fh.flush()
        with open(self.path, "rb") as fh:
            fh.seek(size)
            dropped = fh.read().count(b"\n")
        self._fh.truncate(size)
        self.flush()
        return dropped

    def close(self) -> None:
        """Flush to disk and close (again: nothing)."""
        if self._fh.closed:
            return
        self.flush()
        self._fh.close()
