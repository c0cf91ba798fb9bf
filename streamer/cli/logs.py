"""Logging of the ``streamer`` command: set up once, by the CLI (the library never does): one
line per record (or JSON), secrets masked, kafka-python's transport noise at DEBUG."""

from __future__ import annotations

import json
import logging
import sys

__all__ = ["configure_logging"]


class _JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out = {
            "time": self.formatTime(record, "%Y-%m-%dT%H:%M:%S"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return json.dumps(out)


def configure_logging(level: str = "INFO", fmt: str = "text") -> None:
    """The library never configures logging; the CLI does, once."""
    from consumers.redact import RedactingFilter
    from streamer.ops.status import LiveLineHandler

    # On a terminal a record never lands on the live status line (it moves out of the way).
    handler = LiveLineHandler(sys.stderr)
    # Whatever level a logger runs at, no Kafka secret reaches the output: the handler masks
    # the values the client adapters registered (consumers/redact.py) in every record.
    handler.addFilter(RedactingFilter())
    # A broker that is down, unreachable or restarting makes kafka-python log every failed
    # connection, backoff and lost coordinator (about 90 lines before the one error that
    # says what happened). The worker reports those conditions itself (one line per retry
    # at most, readiness, one final error): the library's transport lines are DEBUG.
    handler.addFilter(_TransportNoise(logging.getLevelName(level)))
    if fmt == "json":
        handler.setFormatter(_JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    # kafka-python is chatty at INFO (every connection and rebalance step), and at DEBUG logs
    # every request (the SASL login among them) and its admin client's configuration.
    logging.getLogger("kafka").setLevel(max(logging.WARNING, root.level))
    logging.getLogger("confluent_kafka").setLevel(max(logging.WARNING, root.level))
    # TensorFlow's Python loggers at INFO: every collective multi-worker training builds,
    # "Assets written to ..." at every export, absl's "Sharding callback duration" at every
    # checkpoint.
    for name in ("tensorflow", "absl"):
        logging.getLogger(name).setLevel(max(logging.WARNING, root.level))
    # "Task ran for 0.1s ... blocking the event loop": kafka-python's IO thread noticing that
    # another thread held the GIL (decode, training). Expected in a busy worker, not an error.
    logging.getLogger("kafka.net.selector").setLevel(max(logging.ERROR, root.level))
    # "Metadata refresh: failed Cancelled": a consumer closed (every pass end, every
    # evaluation) while its metadata request was in flight. Not a failure.
    logging.getLogger("kafka.cluster").addFilter(_drop_cancelled_refresh)


#: kafka-python's loggers of connections, bootstrap, metadata and the coordinator's
#: connection: their WARNING/ERROR lines repeat what the worker reports once.
_TRANSPORT_LOGGERS = (
    "kafka.net",
    "kafka.conn",
    "kafka.client",
    "kafka.cluster",
    "kafka.protocol",
)
#: Lines of other kafka-python loggers that only say a connection dropped.
_TRANSPORT_TEXT = (
    "Node Disconnected",
    "NodeNotReadyError",
    "KafkaConnectionError",
    "Connection lost",
    "Cancelled",
    "Marking the coordinator dead",
    "NotCoordinatorError",
    "CoordinatorNotAvailableError",
    "Unable to bootstrap",
    # A static member's heartbeat racing its own rejoin: the next heartbeat carries the new id.
    "member_id was not recognized",
)


class _TransportNoise(logging.Filter):
    """kafka-python's transport lines at DEBUG: shown only with --log-level DEBUG."""

    def __init__(self, level: int | str) -> None:
        super().__init__()
        self.debug = level == logging.DEBUG or level == "DEBUG"

    def filter(self, record: logging.LogRecord) -> bool:
        name = record.name
        if not name.startswith("kafka") or record.levelno < logging.WARNING:
            return True
        transport = name.startswith(_TRANSPORT_LOGGERS) or any(
            t in record.getMessage() for t in _TRANSPORT_TEXT
        )
        if not transport:
            return True
        if not self.debug:
            return False
        record.levelno, record.levelname = logging.DEBUG, "DEBUG"
        return True


def _drop_cancelled_refresh(record: logging.LogRecord) -> bool:
    message = record.getMessage()
    return not ("Metadata refresh" in message and "Cancelled" in message)
