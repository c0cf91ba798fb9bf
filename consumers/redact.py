"""Secrets out of the Kafka client libraries' log records, whatever levels an application sets.

kafka-python logs every request at DEBUG, the SASL PLAIN login among them
(``SaslAuthenticateRequest(auth_bytes=b'\\x00user\\x00user\\x00password')``), and its admin
client logs its whole configuration, passwords included. The CLI keeps those loggers at WARNING;
an application that embeds this package and turns DEBUG on does not. ``protect`` (called by the
client adapters whenever they build a client with credentials) redacts the secrets' values, in
every form a log line shows them (plain, escaped, hex, base64), and secret-bearing fields
(``auth_bytes=...``, ``...password...: '...'``) from every record of the ``kafka`` and
``confluent_kafka`` loggers (the one our confluent adapter hands librdkafka), before any handler
sees it.

A filter on a logger sees only the records of that exact logger, not those its children
propagate, and libraries create loggers as they import modules. So the redaction runs twice
over: a ``RedactingFilter`` on every library logger that exists when a client is built, and a
log record factory (chained to the one in place) for loggers made later. A record is redacted
once (it is marked); the factory leaves other loggers' records alone. The CLI also puts a
``RedactingFilter`` on its handler, which masks the known values in every record it prints.

librdkafka masks ``sasl.username``, ``sasl.password`` and ``ssl.key.password`` itself (as
``[redacted]``, even with ``debug=all``; confluent-kafka 2.16.1 / librdkafka 2.16.0, seen in
tests/reliability/test_security.py); its lines reach Python through the ``confluent_kafka``
logger our adapter passes it, and are redacted like kafka-python's.
"""

from __future__ import annotations

import base64
import json
import logging
import re
import threading
from collections.abc import Callable, Iterator
from typing import Any

from consumers.settings import SecuritySettings

__all__ = [
    "LIBRARY_LOGGERS",
    "MASK",
    "MIN_SECRET_CHARS",
    "RedactingFilter",
    "Redactor",
    "protect",
    "redact",
]

#: What a secret is replaced with.
MASK = "***"
#: The loggers (and their children) whose records are redacted.
LIBRARY_LOGGERS = ("kafka", "confluent_kafka")
#: Shorter values are not searched for (they would mask ordinary words); the field patterns
#: still catch them where a library names them.
MIN_SECRET_CHARS = 4

_DONE = "_streamer_redacted"  # set on a record once redacted
_QUOTED = r"""(?P<q>['"])(?:\\.|(?!(?P=q)).)*(?P=q)"""
#: kafka-python's SaslAuthenticateRequest / SaslBytesRequest: PLAIN's bytes hold the password,
#: SCRAM's a proof of it.
_AUTH_BYTES = re.compile(
    r"(?P<key>auth_bytes\s*=\s*)(?P<ba>bytearray\()?b?" + _QUOTED + r"(?(ba)\))"
)
#: Config dumps: ``'sasl_plain_password': '...'`` (kafka-python), ``sasl.password=...``.
_QUOTED_FIELD = re.compile(
    r"""(?P<key>['"]?[\w.-]*(?:password|passwd|secret)['"]?\s*[:=]\s*)(?P<b>b?)""" + _QUOTED,
    re.I,
)
_BARE_FIELD = re.compile(
    r"""(?P<key>[\w.-]*(?:password|passwd|secret)\s*[:=]\s*)"""
    r"""(?!b?['"]|None\b|\*\*\*|\[redacted\])[^\s,;'")}\]]+""",
    re.I,
)
_FIELD_WORDS = ("password", "passwd", "secret")
_URLSAFE = str.maketrans("+/", "-_")


def _forms(secret: str) -> set[str]:
    """The ways a log line can show ``secret``: as is, escaped (str, bytes and JSON reprs),
    in hex, and the base64 characters that encode only its bytes (at each of the three
    alignments it can have inside a longer base64 text, such as PLAIN's auth bytes)."""
    raw = secret.encode("utf-8")
    forms = {secret, repr(secret)[1:-1], repr(raw)[2:-1], json.dumps(secret)[1:-1]}
    forms.update((raw.hex(), raw.hex().upper()))
    for shift in range(3):
        text = base64.b64encode(b"\0" * shift + raw).decode("ascii")
        run = text[-(-8 * shift // 6) : 8 * (shift + len(raw)) // 6]
        if len(run) >= 6:
            forms.update((run, run.translate(_URLSAFE)))
    return {f for f in forms if len(f) >= MIN_SECRET_CHARS}


class Redactor:
    """Masks known secrets, in every form a log line shows them, and secret-bearing fields.

    >>> r = Redactor(["hunter2-pw"])
    >>> r.redact("login hunter2-pw; {'ssl_password': 'other'}; auth_bytes=b'\\x00u\\x00u\\x00x'")
    "login ***; {'ssl_password': '***'}; auth_bytes=b'***'"
    >>> r.redact("aHVudGVyMi1wdw==")  # base64("hunter2-pw")
    '***w=='
    """

    def __init__(self, secrets: list[str] | tuple[str, ...] = ()) -> None:
        self._lock = threading.Lock()
        self._secrets: set[str] = set()
        self._known: re.Pattern[str] | None = None
        self.add(*secrets)

    def add(self, *secrets: str) -> None:
        """Search for these values too (those under ``MIN_SECRET_CHARS`` are skipped)."""
        with self._lock:
            new = {s for s in secrets if len(s) >= MIN_SECRET_CHARS} - self._secrets
            if not new:
                return
            self._secrets |= new
            forms = set().union(*(_forms(s) for s in self._secrets))
            # Longest first: a form that contains another is masked whole.
            alternatives = sorted(forms, key=len, reverse=True)
            self._known = re.compile("|".join(map(re.escape, alternatives)))

    def redact(self, text: str, *, fields: bool = True) -> str:
        """``text`` with every known secret (and, with ``fields``, every secret-bearing
        field) replaced by ``MASK``."""
        known = self._known
        if known is not None:
            text = known.sub(MASK, text)
        if not fields:
            return text
        if "auth_bytes" in text:
            text = _AUTH_BYTES.sub(lambda m: f"{m['key']}b'{MASK}'", text)
        lower = text.lower()
        if any(word in lower for word in _FIELD_WORDS):
            text = _QUOTED_FIELD.sub(lambda m: f"{m['key']}{m['b']}'{MASK}'", text)
            text = _BARE_FIELD.sub(lambda m: f"{m['key']}{MASK}", text)
        return text

    def redact_record(self, record: logging.LogRecord) -> None:
        """Redact ``record`` in place (once): its message, traceback and stack.

        Field patterns apply to the client libraries' records; other records (our own
        lines, an application's) only have the known values masked: their prose may say
        "password: ..." about something else.
        """
        if record.__dict__.get(_DONE):
            return
        record.__dict__[_DONE] = True
        fields = _is_library(record.name)
        try:
            message = record.getMessage()
        except Exception:  # a broken format: logging would print msg and args raw
            message = f"{record.msg!s} {record.args!r}"
            record.msg, record.args = self.redact(message, fields=fields), ()
        else:
            clean = self.redact(message, fields=fields)
            if clean != message:
                # The formatted text replaces the template: the args held the secret.
                record.msg, record.args = clean, ()
        if record.exc_info and record.exc_info[0] is not None:
            text = record.exc_text or logging.Formatter().formatException(record.exc_info)
            clean = self.redact(text, fields=fields)
            if clean != text:
                # Formatters print exc_text as it is when exc_info is gone.
                record.exc_info, record.exc_text = None, clean
        elif record.exc_text:
            record.exc_text = self.redact(record.exc_text, fields=fields)
        if record.stack_info:
            record.stack_info = self.redact(record.stack_info, fields=fields)


_REDACTOR = Redactor()
_INSTALL_LOCK = threading.Lock()


def redact(text: str) -> str:
    """``text`` with the secrets of every ``protect``-ed client and secret-bearing fields
    masked.

    >>> redact("{'sasl_plain_password': 'x'}")
    "{'sasl_plain_password': '***'}"
    """
    return _REDACTOR.redact(text)


class RedactingFilter(logging.Filter):
    """Redacts every record it sees with the secrets ``protect`` knows; drops none.

    On a logger it sees that logger's own records; on a handler (the CLI's), every record the
    handler gets. Field patterns apply to the client libraries' records only.

    >>> record = logging.makeLogRecord(
    ...     {"name": "kafka.admin", "msg": "%s", "args": ("{'ssl_password': 'x'}",)}
    ... )
    >>> RedactingFilter().filter(record), record.getMessage()
    (True, "{'ssl_password': '***'}")
    """

    def filter(self, record: logging.LogRecord) -> bool:
        _REDACTOR.redact_record(record)
        return True


def _is_library(name: object) -> bool:
    return isinstance(name, str) and any(
        name == root or name.startswith(root + ".") for root in LIBRARY_LOGGERS
    )


def _library_loggers() -> Iterator[logging.Logger]:
    for root in LIBRARY_LOGGERS:
        yield logging.getLogger(root)
    for name, logger in list(logging.root.manager.loggerDict.items()):
        if isinstance(logger, logging.Logger) and _is_library(name) and "." in name:
            yield logger


def _redacting_factory(previous: Callable[..., logging.LogRecord]) -> Callable[..., Any]:
    def factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
        record = previous(*args, **kwargs)
        if _is_library(record.name):
            _REDACTOR.redact_record(record)
        return record

    factory._streamer_redacts = True  # type: ignore[attr-defined]
    return factory


def _install() -> None:
    with _INSTALL_LOCK:
        current = logging.getLogRecordFactory()
        if not getattr(current, "_streamer_redacts", False):
            logging.setLogRecordFactory(_redacting_factory(current))
        for logger in _library_loggers():
            if not any(isinstance(f, RedactingFilter) for f in logger.filters):
                logger.addFilter(RedactingFilter())


def protect(security: SecuritySettings) -> None:
    """Keep ``security``'s secrets out of the client libraries' log records (idempotent).

    The client adapters call it whenever they build a client with credentials, so an
    application that embeds the package is covered without calling anything. Without a
    password (PLAINTEXT, TLS with an unencrypted key) it does nothing.

    >>> protect(SecuritySettings())  # no credentials: nothing to hide
    """
    secrets = [
        s.get() for s in (security.sasl_plain_password, security.ssl_password) if s is not None
    ]
    secrets = [s for s in secrets if s]
    if not secrets:
        return
    _REDACTOR.add(*secrets)
    _install()
