"""BrokerProbe: a background TCP check of the bootstrap servers, for readiness (not liveness)."""

from __future__ import annotations

import logging
import socket
import threading
from collections.abc import Callable

__all__ = ["BrokerProbe"]

log = logging.getLogger(__name__)


class BrokerProbe:
    """Checks every ``interval_seconds`` that at least one bootstrap server accepts a TCP connection.

    kafka-python reconnects silently while a broker is down, so the consumers alone cannot tell
    readiness that the broker is gone; this probe can. ``on_change(up)`` is called from the
    probe thread when the state flips.

    >>> probe = BrokerProbe("127.0.0.1:9092", on_change=print).start()   # doctest: +SKIP
    >>> probe.up  # doctest: +SKIP
    True
    """

    def __init__(
        self,
        bootstrap_servers: str,
        *,
        interval_seconds: float = 2.0,
        timeout_seconds: float = 2.0,
        on_change: Callable[[bool], None] | None = None,
    ) -> None:
        self._servers: list[tuple[str, int]] = []
        for item in bootstrap_servers.split(","):
            host, _, port = item.strip().rpartition(":")
            self._servers.append((host.strip("[]"), int(port)))
        self.bootstrap_servers = bootstrap_servers
        self.interval_seconds = interval_seconds
        self.timeout_seconds = timeout_seconds
        self._on_change = on_change
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.up = False  # until start() has checked (a constructor does no I/O)

    def check(self) -> bool:
        for host, port in self._servers:
            try:
                with socket.create_connection((host, port), timeout=self.timeout_seconds):
                    return True
            except OSError:
                continue
        return False

    def start(self) -> BrokerProbe:
        """Check once now (``up``), then every ``interval_seconds`` on a daemon thread."""
        self.up = self.check()
        self._thread = threading.Thread(target=self._run, name="streamer-broker-probe", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.interval_seconds):
            up = self.check()
            if up != self.up:
                self.up = up
                if up:
                    log.info("broker at %s is reachable again", self.bootstrap_servers)
                else:
                    log.warning("no broker reachable at %s", self.bootstrap_servers)
                if self._on_change is not None:
                    self._on_change(up)

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(self.timeout_seconds + self.interval_seconds)
