"""One writer per checkpoint directory: a lease its holder renews.

Two workers writing one ``--checkpoint-dir`` (a second ``streamer run`` started by mistake on
one host, two pods given one volume) restore each other's checkpoints and train the same
records again and again. So the worker that writes a directory holds a lease on it: the file
``streamer-lease.json`` there names the holder (host, pid, a token of this run) and when it
was last renewed (every third of ``ttl_seconds``). A worker that finds the lease renewed
within ``ttl_seconds`` by another holder refuses to start, before it joins the group
(``CheckpointDirInUseError``, exit 2). The lease does not lock the directory out for good:

- on the holder's own host, a holder whose process is gone frees it at once (a restarted
  container, often pid 1 again, reads its predecessor's lease as stale);
- across hosts (a shared filesystem: ``flock`` does not reach over NFS), a lease not renewed for
  ``ttl_seconds`` is stale and taken over.

A holder that finds its lease taken (it was paused or cut off for longer than ``ttl_seconds``,
and another worker took over) must not train on: ``Lease.lost`` is then set, and the training
loop stops at its next step with ``CheckpointLeaseLostError`` (exit 1), writing no checkpoint.
Renewals compare wall clocks of different hosts: keep their skew well under ``ttl_seconds``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import threading
import time
import uuid
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import Any, Final

from consumers.errors import StreamerError

__all__ = [
    "LEASE_FILE",
    "CheckpointDirInUseError",
    "CheckpointLeaseLostError",
    "Holder",
    "Lease",
]

log = logging.getLogger(__name__)

LEASE_FILE: Final = "streamer-lease.json"
DEFAULT_TTL_SECONDS: Final = 30.0
#: After taking over a stale lease, how long to wait before reading it back (another worker
#: taking it over at the same moment: the last writer wins, the other refuses).
_SETTLE_SECONDS: Final = 0.5


@dataclass(frozen=True, slots=True)
class Holder:
    """Who holds a lease, as its file says."""

    host: str
    pid: int
    token: str
    since: float  # wall-clock seconds
    renewed: float
    ttl_seconds: float

    def describe(self, now: float | None = None) -> str:
        now = time.time() if now is None else now
        return (
            f"host {self.host}, pid {self.pid}, since {_utc(self.since)}, renewed "
            f"{max(now - self.renewed, 0.0):.0f}s ago"
        )


def _utc(t: float) -> str:
    return datetime.fromtimestamp(t, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class CheckpointDirInUseError(StreamerError):
    """Another live worker holds the checkpoint directory's lease."""

    exit_code = 2

    def __init__(self, directory: str, holder: Holder) -> None:
        self.directory, self.holder = directory, holder
        super().__init__(
            f"--checkpoint-dir {directory} is in use by another worker ({holder.describe()}): "
            "two workers writing one directory would restore each other's checkpoints and "
            "train the same records again. Give each worker its own directory, or stop the "
            f"other one (its lease, {os.path.join(directory, LEASE_FILE)}, lapses "
            f"{holder.ttl_seconds:.0f}s after its last renewal)"
        )

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.directory, self.holder))


class CheckpointLeaseLostError(StreamerError):
    """This worker's lease on its checkpoint directory was taken over by another."""

    def __init__(self, directory: str, holder: Holder | None) -> None:
        self.directory, self.holder = directory, holder
        who = holder.describe() if holder is not None else "its file was removed or unreadable"
        super().__init__(
            f"lost the lease on --checkpoint-dir {directory} to another worker ({who}): this "
            "worker was paused or cut off for longer than the lease lasts. Stopping without a "
            "checkpoint or a commit; the other worker goes on from the last checkpoint"
        )

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.directory, self.holder))


def _read(path: str) -> Holder | None:
    """The lease's holder, or None when there is no lease (or an unreadable one: a write
    interrupted before the atomic rename never leaves one, so it is not a live holder's)."""
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
        return Holder(
            host=str(data["host"]),
            pid=int(data["pid"]),
            token=str(data["token"]),
            since=float(data["since"]),
            renewed=float(data["renewed"]),
            ttl_seconds=float(data["ttl_seconds"]),
        )
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        log.warning("checkpoint lease %s unreadable (%s): treated as absent", path, exc)
        return None


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process
    return True


def is_live(holder: Holder, now: float, host: str) -> bool:
    """Whether ``holder`` still holds its lease, as seen from ``host`` at ``now``.

    >>> h = Holder("a", 10, "t", 0.0, 100.0, 30.0)
    >>> is_live(h, 120.0, "b"), is_live(h, 131.0, "b")
    (True, False)
    """
    if now - holder.renewed > holder.ttl_seconds:
        return False
    if holder.host != host:
        return True
    # The same host: its process must still run, and not be this one (a restarted container
    # is often pid 1 again, as its predecessor was).
    return holder.pid != os.getpid() and _pid_alive(holder.pid)


class Lease:
    """The lease of one checkpoint directory (``acquire`` it; ``close`` releases it)."""

    def __init__(self, directory: str, ttl_seconds: float = DEFAULT_TTL_SECONDS) -> None:
        if not ttl_seconds > 0:
            raise ValueError(f"a lease's ttl must be positive, got {ttl_seconds}")
        self.directory = directory
        self.path = os.path.join(directory, LEASE_FILE)
        self.ttl_seconds = ttl_seconds
        now = time.time()
        self.holder = Holder(
            socket.gethostname(), os.getpid(), uuid.uuid4().hex, now, now, ttl_seconds
        )
        #: Set when another worker took the lease over: the training loop must stop.
        self.lost: CheckpointLeaseLostError | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._write_failed = False

    @classmethod
    def acquire(cls, directory: str, ttl_seconds: float = DEFAULT_TTL_SECONDS) -> Lease:
        """Take the directory's lease and start renewing it, or raise
        ``CheckpointDirInUseError`` naming the live holder."""
        lease = cls(directory, ttl_seconds)
        lease._take()
        lease._thread = threading.Thread(
            target=lease._renew_loop, name="streamer-checkpoint-lease", daemon=True
        )
        lease._thread.start()
        return lease

    def _take(self) -> None:
        os.makedirs(self.directory, exist_ok=True)
        me = self.holder
        for _ in range(5):
            holder = _read(self.path)
            if holder is not None and is_live(holder, time.time(), me.host):
                raise CheckpointDirInUseError(self.directory, holder)
            if holder is None:
                try:
                    fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
                except FileExistsError:
                    continue  # another worker created it just now: look at it again
                with os.fdopen(fd, "w", encoding="utf-8") as f:
                    json.dump(asdict(me), f)
                return
            log.warning(
                "checkpoint dir %s: taking over a lease that lapsed (%s)",
                self.directory,
                holder.describe(),
            )
            self._write()
            time.sleep(_SETTLE_SECONDS)
            now_holder = _read(self.path)
            if now_holder is not None and now_holder.token == me.token:
                return
            # Another worker took it over at the same time and wrote last: it is the holder.
        holder = _read(self.path)
        if holder is not None:
            raise CheckpointDirInUseError(self.directory, holder)
        raise StreamerError(f"could not take the lease on --checkpoint-dir {self.directory}")

    def _write(self) -> None:
        """Write the lease as this holder, renewed now (atomically: a temporary, renamed)."""
        me = self.holder = Holder(**{**asdict(self.holder), "renewed": time.time()})
        tmp = f"{self.path}.{me.token}.tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(asdict(me), f)
        os.replace(tmp, self.path)

    def renew(self) -> None:
        """Renew the lease, or mark it ``lost`` when another worker holds it now."""
        if self.lost is not None:
            return
        holder = _read(self.path)
        if holder is not None and holder.token != self.holder.token:
            self.lost = CheckpointLeaseLostError(self.directory, holder)
            log.error("%s", self.lost)
            return
        try:
            self._write()  # also when the file went missing: this worker still holds it
        except OSError as exc:
            if not self._write_failed:  # a full or read-only disk: said once, retried
                log.warning("checkpoint lease %s not renewed: %s", self.path, exc)
            self._write_failed = True
            return
        if self._write_failed:
            log.info("checkpoint lease %s renewed again", self.path)
            self._write_failed = False

    def check(self) -> None:
        """Raise ``CheckpointLeaseLostError`` when another worker took the lease over."""
        if self.lost is not None:
            raise self.lost

    def _renew_loop(self) -> None:
        while not self._stop.wait(self.ttl_seconds / 3):
            self.renew()

    def close(self) -> None:
        """Stop renewing and remove the lease (unless another worker holds it now)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
        holder = _read(self.path)
        if holder is not None and holder.token == self.holder.token:
            with contextlib.suppress(OSError):
                os.remove(self.path)
