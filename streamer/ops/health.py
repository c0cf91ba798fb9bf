"""Liveness and readiness state, and the HTTP server for /metrics, /healthz and /readyz."""

from __future__ import annotations

import contextlib
import errno
import io
import logging
import selectors
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder

from consumers.errors import ConfigError

__all__ = ["DEFAULT_STALE_AFTER_SECONDS", "Health", "MetricsServer"]

_log = logging.getLogger(__name__)

DEFAULT_STALE_AFTER_SECONDS = 120.0


@dataclass
class _Component:
    last_beat: float
    waiting: str | None = None


class Health:
    """Thread-safe liveness and readiness of the worker.

    Example::

        health = Health(stale_after_seconds=120)
        health.beat("poller")              # every poll() call, records or not
        health.waiting("trainer", "waiting for input")   # before blocking on the input
        health.beat("trainer")             # after every step (clears "waiting")
        health.set_ready(True, "partitions assigned, model built")
        health.liveness()  # (True, "ok")

    Live while every registered component beat within ``stale_after_seconds`` or declared
    itself waiting (for the broker, for input). A broker outage alone never makes the worker
    dead: the poller keeps calling poll() and beats on every call, and the trainer blocked on
    an empty input declares itself waiting. A component registers on its first ``beat`` (or
    ``register``) and leaves with ``unregister`` (a shard closed at the end of a pass).

    Ready only after ``set_ready(True, ...)``; starts not ready ("starting").
    ``clock`` is monotonic seconds; ``now`` arguments are on the same clock.
    """

    def __init__(
        self,
        stale_after_seconds: float = DEFAULT_STALE_AFTER_SECONDS,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not stale_after_seconds > 0:
            raise ConfigError(
                "stale_after_seconds", stale_after_seconds, "must be a positive number of seconds"
            )
        self.stale_after_seconds = float(stale_after_seconds)
        self._clock = clock
        self._lock = threading.Lock()
        self._components: dict[str, _Component] = {}
        self._ready = False
        self._ready_reason = "starting"

    def register(self, component: str, now: float | None = None) -> None:
        """Start watching ``component``: it must beat within ``stale_after_seconds`` from now."""
        t = self._clock() if now is None else now
        with self._lock:
            self._components.setdefault(component, _Component(last_beat=t))

    def unregister(self, component: str) -> None:
        with self._lock:
            self._components.pop(component, None)

    def beat(self, component: str, now: float | None = None) -> None:
        """``component`` made progress (and is no longer waiting)."""
        t = self._clock() if now is None else now
        with self._lock:
            state = self._components.get(component)
            if state is None:
                self._components[component] = _Component(last_beat=t)
            else:
                state.last_beat = t
                state.waiting = None

    def waiting(self, component: str, reason: str) -> None:
        """``component`` is blocked on something outside it (broker, input) until its next beat."""
        t = self._clock()
        with self._lock:
            state = self._components.setdefault(component, _Component(last_beat=t))
            state.waiting = reason

    def set_ready(self, flag: bool, reason: str) -> None:
        with self._lock:
            if flag != self._ready:
                _log.info("readiness %s: %s", "ready" if flag else "not ready", reason)
            self._ready = flag
            self._ready_reason = reason

    def liveness(self, now: float | None = None) -> tuple[bool, str]:
        """``(live, reason)``; the reason names every stale component."""
        t = self._clock() if now is None else now
        with self._lock:
            stale = [
                f"{name} made no progress for {t - state.last_beat:.0f}s "
                f"(limit {self.stale_after_seconds:.0f}s)"
                for name, state in sorted(self._components.items())
                if state.waiting is None and t - state.last_beat > self.stale_after_seconds
            ]
        return (False, "; ".join(stale)) if stale else (True, "ok")

    def readiness(self) -> tuple[bool, str]:
        with self._lock:
            return self._ready, self._ready_reason


#: Connections served at once; one more is answered 503 at once and closed (3,000 idle
#: connections once held 660 threads).
MAX_CONNECTIONS = 32
_REFUSED = (
    b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain; charset=utf-8\r\n"
    b"Connection: close\r\nContent-Length: 21\r\n\r\ntoo many connections\n"
)


#: A connection has this long to send its request's headers, however it trickles them in: a
#: client that sends a byte every few seconds (slowloris) is cut off, not waited for.
HEADER_DEADLINE_SECONDS = 5.0
#: The most a request's headers may take; a longer one is closed.
MAX_HEADER_BYTES = 16 * 1024
#: Connections whose headers are still coming in; past it the oldest is closed.
MAX_PENDING = 256


class _Pending:
    """Reads each connection's request headers on one selector thread, with a deadline, and
    hands a connection to a handler thread only once its headers are in. So a slow client
    holds a few bytes of buffer, never a handler thread: /healthz and /readyz are answered as
    soon as their own request arrives, whatever else is connected (32 clients each sending a
    byte every 4 s once kept /healthz at 503 for a minute, and a liveness probe restarts a
    pod for less)."""

    def __init__(self, dispatch: Callable[[socket.socket, Any, bytes], None]) -> None:
        self._dispatch = dispatch
        self._selector = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)  # a full wake pipe already says "wake up"
        self._selector.register(self._wake_r, selectors.EVENT_READ, None)
        self._lock = threading.Lock()
        self._incoming: list[tuple[socket.socket, Any]] = []
        # Per connection: (client address, its deadline, the bytes read so far).
        self._conns: dict[socket.socket, tuple[Any, float, bytearray]] = {}
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="metrics-http-reader", daemon=True)
        self._thread.start()

    def add(self, sock: socket.socket, address: Any) -> None:
        with self._lock:
            if self._closed or not self._thread.is_alive():
                sock.close()
                return
            self._incoming.append((sock, address))
        with contextlib.suppress(OSError):
            self._wake_w.send(b"x")

    def close(self) -> None:
        with self._lock:
            self._closed = True
        with contextlib.suppress(OSError):
            self._wake_w.send(b"x")
        self._thread.join(5.0)

    def _drop(self, sock: socket.socket) -> None:
        self._conns.pop(sock, None)
        with contextlib.suppress(KeyError, ValueError):
            self._selector.unregister(sock)
        with contextlib.suppress(OSError):
            sock.close()

    def _run(self) -> None:
        try:
            while True:
                with self._lock:
                    closed = self._closed
                    incoming, self._incoming = self._incoming, []
                if closed:
                    break
                now = time.monotonic()
                for sock, address in incoming:
                    if len(self._conns) >= MAX_PENDING:  # the oldest (first added) goes
                        self._drop(next(iter(self._conns)))
                    try:
                        sock.setblocking(False)
                        self._selector.register(sock, selectors.EVENT_READ, None)
                    except (OSError, ValueError):  # closed by the client already
                        with contextlib.suppress(OSError):
                            sock.close()
                        continue
                    self._conns[sock] = (address, now + HEADER_DEADLINE_SECONDS, bytearray())
                for sock in [c for c, (_, d, _) in self._conns.items() if d <= now]:
                    self._drop(sock)  # headers not in by the deadline
                for key, _ in self._selector.select(timeout=0.5):
                    if key.fileobj is self._wake_r:
                        with contextlib.suppress(OSError):
                            while self._wake_r.recv(4096):
                                pass
                        continue
                    if isinstance(key.fileobj, socket.socket):
                        try:
                            self._read(key.fileobj)
                        except Exception:  # one connection's trouble, never the reader's end
                            _log.debug("metrics server: dropping a connection", exc_info=True)
                            self._drop(key.fileobj)
        finally:
            for sock in list(self._conns):
                self._drop(sock)
            self._selector.close()
            self._wake_r.close()
            self._wake_w.close()

    def _read(self, sock: socket.socket) -> None:
        address, _, buf = self._conns[sock]
        try:
            chunk = sock.recv(4096)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            chunk = b""
        if not chunk:  # the client went away
            self._drop(sock)
            return
        buf += chunk
        if b"\r\n\r\n" not in buf and b"\n\n" not in buf:
            if len(buf) > MAX_HEADER_BYTES:
                self._drop(sock)
            return
        self._conns.pop(sock, None)
        self._selector.unregister(sock)
        sock.setblocking(True)
        self._dispatch(sock, address, bytes(buf))


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    max_connections = MAX_CONNECTIONS
    #: The listen backlog: connections arriving faster than the accept loop takes them
    #: (a burst of probes and scrapes) wait here instead of being refused.
    request_queue_size = 128

    def server_bind(self) -> None:
        super().server_bind()
        self._slots = threading.BoundedSemaphore(self.max_connections)
        self._refused_logged = 0.0
        #: A connection's request as read by ``_Pending``, by its socket's id, for its handler.
        self.preread: dict[int, bytes] = {}
        self._pending = _Pending(self._dispatch)

    def process_request(self, request: Any, client_address: Any) -> None:
        self._pending.add(request, client_address)  # never blocks the accept loop

    def _dispatch(self, request: Any, client_address: Any, head: bytes) -> None:
        """A request whose headers are in: served on a thread of its own (at most
        ``max_connections`` at once; one more is answered 503 at once)."""
        if not self._slots.acquire(blocking=False):
            now = time.monotonic()
            if now - self._refused_logged >= 10.0:  # once per 10 s, not once per connection
                self._refused_logged = now
                _log.warning(
                    "metrics server: %d requests already being answered; refusing more (503)",
                    self.max_connections,
                )
            with contextlib.suppress(OSError):  # the client may be gone already
                request.settimeout(1.0)
                request.sendall(_REFUSED)
            self.shutdown_request(request)
            return
        self.preread[id(request)] = head
        try:
            super().process_request(request, client_address)
        except BaseException:
            self.preread.pop(id(request), None)
            self._slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.preread.pop(id(request), None)
            self._slots.release()

    def server_close(self) -> None:
        pending = getattr(self, "_pending", None)  # none when the bind failed
        if pending is not None:
            pending.close()
        super().server_close()

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A scraper that hangs up mid-response is not worth a traceback on stderr.
        _log.debug("error serving %s", client_address, exc_info=True)


class _Server6(_Server):
    address_family = socket.AF_INET6


def _make_handler(registry: CollectorRegistry, health: Health) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        timeout = 10  # a client that does not read its answer holds a thread this long at most

        def setup(self) -> None:
            super().setup()
            # The request's headers were read already (``_Pending``): read them from there.
            head = getattr(self.server, "preread", {}).pop(id(self.request), b"")
            self.rfile.close()
            self.rfile = io.BytesIO(head)

        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            if path == "/metrics":
                # Same negotiation as prometheus_client's own handler: text 0.0.4 by default,
                # text 1.0.0 (CONTENT_TYPE_LATEST) or OpenMetrics when the scraper asks.
                encoder, content_type = choose_encoder(self.headers.get("Accept", ""))
                self._send(200, content_type, encoder(registry))
            elif path == "/healthz":
                self._send_verdict(*health.liveness())
            elif path == "/readyz":
                self._send_verdict(*health.readiness())
            else:
                self._send(404, "text/plain; charset=utf-8", b"not found\n")

        def _send_verdict(self, ok: bool, reason: str) -> None:
            body = b"ok\n" if ok else f"{reason}\n".encode()
            self._send(200 if ok else 503, "text/plain; charset=utf-8", body)

        def _send(self, code: int, content_type: str, body: bytes) -> None:
            self.send_response(code)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            _log.debug("%s - " + format, self.address_string(), *args)

    return Handler


class MetricsServer:
    """Serves /metrics, /healthz and /readyz on a daemon thread.

    Example::

        with MetricsServer(registry, health, host="127.0.0.1", port=0) as server:
            url = f"http://127.0.0.1:{server.port}/metrics"

    The socket is bound in the constructor (``port=0`` picks a free port; ``.port`` tells
    which), so a taken port fails at once with ``ConfigError``. ``start()`` begins serving;
    ``close()`` stops, closes the socket and joins the thread, and may be called any number
    of times.
    """

    def __init__(
        self,
        registry: CollectorRegistry,
        health: Health,
        host: str = "127.0.0.1",
        port: int = 0,
    ) -> None:
        server_class = _Server6 if ":" in host else _Server
        try:
            self._server = server_class((host, port), _make_handler(registry, health))
        except socket.gaierror as exc:
            raise ConfigError("metrics_host", host, f"not a usable address ({exc})") from exc
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise ConfigError(
                    "metrics_port",
                    port,
                    f"address in use on {host}; pick another --metrics-port or stop the "
                    "process that holds it",
                ) from exc
            if exc.errno == errno.EACCES:
                raise ConfigError(
                    "metrics_port", port, f"permission denied on {host}; use a port >= 1024"
                ) from exc
            if exc.errno == errno.EADDRNOTAVAIL:
                raise ConfigError(
                    "metrics_host", host, "not an address of this machine; try 0.0.0.0"
                ) from exc
            raise
        self.host = host
        self.port: int = self._server.server_address[1]
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._closed = False

    def start(self) -> MetricsServer:
        with self._lock:
            if self._closed:
                raise RuntimeError("MetricsServer.start() after close()")
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._server.serve_forever,
                    kwargs={"poll_interval": 0.1},
                    name=f"metrics-http-{self.port}",
                    daemon=True,
                )
                self._thread.start()
                _log.info("serving /metrics, /healthz, /readyz on %s:%d", self.host, self.port)
        return self

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            thread = self._thread
        if thread is not None:
            # shutdown() waits for serve_forever() to return: only call it when it runs.
            self._server.shutdown()
            thread.join()
        self._server.server_close()

    def __enter__(self) -> MetricsServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
