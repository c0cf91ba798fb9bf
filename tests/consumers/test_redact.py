"""consumers.redact: known secrets masked in every form a log line shows them, secret-bearing
fields of the client libraries' records masked, harmless text left alone, and ``protect``'s
filter and record factory (process-wide logging state, restored after each test)."""

from __future__ import annotations

import base64
import json
import logging
import sys
import uuid
from collections.abc import Iterator

import pytest

import consumers.redact as redact_mod
from consumers.redact import MASK, RedactingFilter, Redactor, protect, redact
from consumers.settings import Secret, SecuritySettings

# A quote, a backslash and non-ASCII letters: every escaping form differs from the plain one.
SECRET = "pä'ss\\wörd-42"


def _base64_leaks(original: str, redacted: str, secret: str) -> bool:
    """Whether the base64 pieces ``redact`` left of ``original`` still decode to ``secret``."""
    raw, pos = secret.encode(), 0
    for piece in redacted.split(MASK):
        start = original.index(piece, pos)
        end = start + len(piece)
        first, last = -(-start // 4) * 4, end // 4 * 4  # the whole 4-char groups of the piece
        if last > first and raw in base64.b64decode(original[first:last]):
            return True
        pos = end
    return False


class _Lines(logging.Handler):
    """What a handler would print: each record formatted with its traceback and stack."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.setFormatter(logging.Formatter("%(name)s %(message)s"))
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(self.format(record))


def _logger(name: str) -> tuple[logging.Logger, _Lines]:
    logger = logging.getLogger(name)
    lines = _Lines()
    logger.addHandler(lines)
    logger.propagate = False
    return logger, lines


@pytest.fixture
def module_redactor(monkeypatch: pytest.MonkeyPatch) -> Iterator[Redactor]:
    """A fresh process-wide redactor; the record factory and the library loggers' filters
    are put back as they were afterwards."""
    fresh = Redactor()
    monkeypatch.setattr(redact_mod, "_REDACTOR", fresh)
    factory = logging.getLogRecordFactory()
    filters = {
        name: list(logger.filters)
        for name, logger in logging.root.manager.loggerDict.items()
        if isinstance(logger, logging.Logger)
    }
    filters.update(
        {root: list(logging.getLogger(root).filters) for root in ("kafka", "confluent_kafka")}
    )
    yield fresh
    logging.setLogRecordFactory(factory)
    for name, logger in list(logging.root.manager.loggerDict.items()):
        if isinstance(logger, logging.Logger):
            logger.filters[:] = filters.get(name, [])


def _sasl(password: str, ssl_password: str | None = None) -> SecuritySettings:
    return SecuritySettings(
        security_protocol="SASL_SSL",
        sasl_mechanism="PLAIN",
        sasl_plain_username="carol",
        sasl_plain_password=Secret(password),
        ssl_password=Secret(ssl_password) if ssl_password is not None else None,
    )


# ---- Redactor: known values ----------------------------------------------------------------


@pytest.mark.parametrize(
    "shown",
    [
        SECRET,
        repr(SECRET)[1:-1],  # inside a str's repr
        repr(SECRET.encode())[2:-1],  # inside a bytes' repr (\xc3\xa4...)
        json.dumps(SECRET)[1:-1],  # inside JSON (\u00e4...)
        SECRET.encode().hex(),
        SECRET.encode().hex().upper(),
    ],
    ids=["plain", "str-repr", "bytes-repr", "json", "hex", "HEX"],
)
def test_a_known_secret_is_masked_in_every_escaped_form(shown: str) -> None:
    """Each form differs from the plain value, and each is masked with the text around it kept."""
    out = Redactor([SECRET]).redact(f"connect as carol with {shown} to h:9093", fields=False)
    assert out == f"connect as carol with {MASK} to h:9093"


#: ">>>???~~~" encodes to "+" and "/", the characters the URL-safe alphabet replaces.
@pytest.mark.parametrize("secret", ["hunter2-pw", "pässwörd", "abcde", ">>>???~~~"])
@pytest.mark.parametrize("before", [b"", b"\x00", b"\x00u\x00"], ids=["at-0", "at-1", "at-2"])
@pytest.mark.parametrize("urlsafe", [False, True], ids=["std", "urlsafe"])
def test_base64_of_a_secret_inside_longer_bytes_never_decodes_back(
    secret: str, before: bytes, urlsafe: bool
) -> None:
    """At each of the three alignments a value can have in a base64 text (PLAIN's auth bytes
    put the password after the user names), what is left decodes to no copy of the secret."""
    data = before + secret.encode() + b"\x01trailer"
    text = base64.b64encode(data).decode()
    shown = text.translate(str.maketrans("+/", "-_")) if urlsafe else text
    out = Redactor([secret]).redact(shown, fields=False)
    assert MASK in out
    back = out.translate(str.maketrans("-_", "+/")) if urlsafe else out
    assert not _base64_leaks(text, back, secret)


def test_the_plain_auth_bytes_of_kafka_python_never_show_the_password() -> None:
    """kafka-python's PLAIN login as a log line shows it: the repr of the bytes, and its base64."""
    auth = b"\x00carol\x00carol\x00" + SECRET.encode()
    r = Redactor([SECRET])
    for shown in (repr(auth), base64.b64encode(auth).decode(), auth.hex()):
        out = r.redact(f"sent {shown}", fields=False)
        assert out != f"sent {shown}" and MASK in out
        assert SECRET.encode().hex() not in out and repr(SECRET.encode())[2:-1] not in out
    out = r.redact(base64.b64encode(auth).decode(), fields=False)
    assert not _base64_leaks(base64.b64encode(auth).decode(), out, SECRET)


def test_a_secret_is_masked_wherever_it_is_embedded() -> None:
    """In a URL's user info, glued to other words, and every time it occurs."""
    r = Redactor(["t0ken-abc"])
    assert (
        r.redact("GET https://bob:t0ken-abc@h/x?k=t0ken-abc&n=1 prefixt0ken-abcsuffix")
        == f"GET https://bob:{MASK}@h/x?k={MASK}&n=1 prefix{MASK}suffix"
    )


def test_a_secret_is_searched_literally_not_as_a_pattern() -> None:
    """Regex characters in a password match only themselves."""
    r = Redactor(["a.b*c+(d"])
    assert r.redact("x a.b*c+(d y") == f"x {MASK} y"
    assert r.redact("azbbbc+(d aXbc(d") == "azbbbc+(d aXbc(d"


def test_the_longest_known_value_is_masked_whole() -> None:
    """A password that contains another is not left with a tail showing."""
    r = Redactor(["abcd", "abcd-long-password"])
    assert r.redact("a abcd-long-password b abcd c") == f"a {MASK} b {MASK} c"


def test_values_shorter_than_the_minimum_are_not_searched_but_fields_still_hide_them() -> None:
    r = Redactor(["abc"])
    assert r.redact("abc: the abc of it") == "abc: the abc of it"
    assert r.redact("sasl.password=abc") == f"sasl.password={MASK}"


def test_secrets_added_later_are_masked_too_and_earlier_ones_stay_masked() -> None:
    r = Redactor()
    assert r.redact("one-secret two-secret") == "one-secret two-secret"
    r.add("one-secret")
    r.add("two-secret", "one-secret")
    assert r.redact("one-secret two-secret") == f"{MASK} {MASK}"


# ---- Redactor: secret-bearing fields ------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (  # kafka-python's admin client configuration dump
            "{'client_id': 'c', 'sasl_plain_password': 'pw', 'ssl_password': 'k'}",
            "{'client_id': 'c', 'sasl_plain_password': '***', 'ssl_password': '***'}",
        ),
        ('{"ssl_password": "p\\"w", "acks": 1}', '{"ssl_password": \'***\', "acks": 1}'),
        ("{'ssl_password': b'xyzzy'}", "{'ssl_password': b'***'}"),  # a bytes value
        ("password=b'abc' next", "password=b'***' next"),  # masked once, not mangled
        ("{'password': 'it\\'s'}", "{'password': '***'}"),  # an escaped quote ends nothing
        ("sasl.password=hunter, retries=3", "sasl.password=***, retries=3"),
        ("ssl.key.password = hunter; x", "ssl.key.password = ***; x"),
        ("Password: hunter", "Password: ***"),
        ("oauth client_secret=abc", "oauth client_secret=***"),
        ("passwd=abc", "passwd=***"),
        (
            "SaslAuthenticateRequest(auth_bytes=b'\\x00u\\x00u\\x00pw')",
            "SaslAuthenticateRequest(auth_bytes=b'***')",
        ),
        (
            'SaslBytesRequest(auth_bytes=bytearray(b"n,,n=u,r=x"))',
            "SaslBytesRequest(auth_bytes=b'***')",
        ),
    ],
)
def test_secret_bearing_fields_are_masked_whatever_their_value(text: str, expected: str) -> None:
    """No value is known: the field name alone hides what follows it (and only that)."""
    r = Redactor()
    assert r.redact(text) == expected
    assert r.redact(expected) == expected  # masking again changes nothing


@pytest.mark.parametrize(
    "text",
    [
        "sasl.password = [redacted]",  # librdkafka's own mask
        "sasl_plain_password=None",
        "{'ssl_password': None, 'sasl_mechanism': 'PLAIN'}",
        "sasl_plain_username='alice' security_protocol=SASL_SSL bootstrap_servers=['h:9092']",
        "passwords are never logged",
        "sasl.password=***",
    ],
)
def test_harmless_text_and_settings_are_left_alone(text: str) -> None:
    assert Redactor(["hunter2-pw"]).redact(text) == text


def test_without_fields_only_known_values_are_masked() -> None:
    """Prose (our own lines, an application's) may say "password: ..." about something else."""
    r = Redactor(["hunter2-pw"])
    assert r.redact("password: rotate it; got hunter2-pw", fields=False) == (
        f"password: rotate it; got {MASK}"
    )


# ---- redact_record ---------------------------------------------------------------------------


def _record(name: str, msg: object, *args: object, **more: object) -> logging.LogRecord:
    return logging.makeLogRecord({"name": name, "msg": msg, "args": args, **more})


def test_a_record_whose_args_hold_a_secret_is_rewritten_as_its_masked_text() -> None:
    record = _record("kafka.conn", "login %s with %r", "carol", {"sasl_plain_password": "pw"})
    Redactor(["carol-pw"]).redact_record(record)
    assert record.getMessage() == "login carol with {'sasl_plain_password': '***'}"
    assert record.args == ()


def test_a_record_without_secrets_keeps_its_template_and_args() -> None:
    """Handlers that group lines by template (Sentry, a repeat filter) still can."""
    record = _record("kafka.conn", "connected to %s", "h:9092")
    Redactor(["carol-pw"]).redact_record(record)
    assert record.msg == "connected to %s" and record.args == ("h:9092",)


@pytest.mark.parametrize(
    ("name", "fields"),
    [
        ("kafka", True),
        ("kafka.coordinator.consumer", True),
        ("confluent_kafka", True),
        ("kafkaesque", False),  # a name that only starts like a library's
        ("streamer.app", False),
        ("root", False),
    ],
)
def test_field_patterns_apply_to_the_client_libraries_records_only(name: str, fields: bool) -> None:
    record = _record(name, "password: %s; token known-secret", "rotate-it")
    Redactor(["known-secret"]).redact_record(record)
    shown = "***" if fields else "rotate-it"
    assert record.getMessage() == f"password: {shown}; token {MASK}"


def test_a_traceback_that_shows_a_secret_is_replaced_by_its_masked_text() -> None:
    try:
        raise RuntimeError("auth failed for password hunter2-pw")
    except RuntimeError:
        record = _record("streamer.app", "failed", exc_info=sys.exc_info())
    Redactor(["hunter2-pw"]).redact_record(record)
    printed = logging.Formatter().format(record)
    assert "hunter2-pw" not in printed
    assert f"RuntimeError: auth failed for password {MASK}" in printed
    assert record.exc_info is None  # else a formatter would format the original again


def test_a_traceback_without_secrets_is_kept_as_it_is() -> None:
    try:
        raise KeyError("nothing to hide")
    except KeyError:
        info = sys.exc_info()
    record = _record("kafka.conn", "failed", exc_info=info)
    Redactor(["hunter2-pw"]).redact_record(record)
    assert record.exc_info == info


def test_stack_info_and_cached_exception_text_are_masked() -> None:
    record = _record(
        "kafka.conn", "x", stack_info="Stack:\n  f('hunter2-pw')", exc_text="E: hunter2-pw"
    )
    Redactor(["hunter2-pw"]).redact_record(record)
    assert record.stack_info == f"Stack:\n  f('{MASK}')" and record.exc_text == f"E: {MASK}"


def test_a_record_with_a_broken_format_still_never_shows_the_secret() -> None:
    """Too few args: logging would print msg and args raw; the masked text replaces both."""
    record = _record("kafka.conn", "%s and %s", "hunter2-pw")
    Redactor(["hunter2-pw"]).redact_record(record)
    message = record.getMessage()  # no longer raises
    assert "hunter2-pw" not in message and MASK in message and "%s and %s" in message


def test_redacting_filter_drops_nothing_and_masks_on_a_handler(module_redactor: Redactor) -> None:
    """On a handler (the CLI's) it masks every record it gets, from any logger."""
    module_redactor.add("hunter2-pw")
    logger, lines = _logger(f"app-{uuid.uuid4().hex[:8]}")
    lines.addFilter(RedactingFilter())
    logger.warning("login with %s", "hunter2-pw")
    logger.warning("nothing secret")
    assert lines.lines == [f"{logger.name} login with {MASK}", f"{logger.name} nothing secret"]


# ---- protect and the process-wide state ------------------------------------------------


@pytest.mark.parametrize(
    "security",
    [
        SecuritySettings(),
        SecuritySettings(security_protocol="SSL"),
        SecuritySettings(security_protocol="SSL", ssl_password=Secret("")),
    ],
    ids=["plaintext", "tls-without-key-password", "empty-key-password"],
)
def test_protect_without_a_password_installs_nothing(
    module_redactor: Redactor, security: SecuritySettings
) -> None:
    factory = logging.getLogRecordFactory()
    filters = list(logging.getLogger("kafka").filters)
    protect(security)
    assert logging.getLogRecordFactory() is factory
    assert logging.getLogger("kafka").filters == filters
    assert redact("secret-looking text ***") == "secret-looking text ***"


def test_protect_masks_both_passwords_in_the_module_redact(module_redactor: Redactor) -> None:
    protect(_sasl("sasl-pw-1234", "key-pw-5678"))
    assert redact("u sasl-pw-1234 k key-pw-5678") == f"u {MASK} k {MASK}"


def test_loggers_made_after_protect_are_masked_by_the_record_factory(
    module_redactor: Redactor,
) -> None:
    protect(_sasl("sasl-pw-1234"))
    logger, lines = _logger(f"kafka.made.later.{uuid.uuid4().hex[:8]}")
    logger.warning("config %s", {"sasl_plain_password": "sasl-pw-1234", "acks": 1})
    users = b"\x00carol\x00carol\x00"
    logger.warning("%s", (users + b"sasl-pw-1234").hex())
    assert lines.lines == [
        f"{logger.name} config {{'sasl_plain_password': '{MASK}', 'acks': 1}}",
        f"{logger.name} {users.hex()}{MASK}",
    ]


def test_loggers_that_existed_before_protect_keep_masking_if_the_factory_is_replaced(
    module_redactor: Redactor,
) -> None:
    """An application resetting the record factory does not undo the loggers' filters."""
    logger, lines = _logger(f"kafka.existing.{uuid.uuid4().hex[:8]}")
    protect(_sasl("sasl-pw-1234"))
    logging.setLogRecordFactory(logging.LogRecord)
    logger.warning("auth_bytes=b'\\x00carol\\x00carol\\x00%s'", "sasl-pw-1234")
    assert lines.lines == [f"{logger.name} auth_bytes=b'{MASK}'"]


def test_the_factory_leaves_other_loggers_records_to_the_handlers(
    module_redactor: Redactor,
) -> None:
    """Only library records are touched at creation; the template of an app's record stays."""
    protect(_sasl("sasl-pw-1234"))
    record = logging.getLogRecordFactory()("myapp", logging.INFO, __file__, 1, "x %s", ("y",), None)
    library = logging.getLogRecordFactory()(
        "kafka.conn", logging.INFO, __file__, 1, "pw %s", ("sasl-pw-1234",), None
    )
    assert (record.msg, record.args) == ("x %s", ("y",))
    assert library.getMessage() == f"pw {MASK}"


def test_protect_chains_the_factory_in_place_and_is_idempotent(module_redactor: Redactor) -> None:
    """An application's own factory still runs; a second protect adds no second factory or
    filter."""
    previous = logging.getLogRecordFactory()

    def tagging(*args: object, **kwargs: object) -> logging.LogRecord:
        record = previous(*args, **kwargs)
        record.tagged = True
        return record

    logging.setLogRecordFactory(tagging)
    protect(_sasl("sasl-pw-1234"))
    factory = logging.getLogRecordFactory()
    protect(_sasl("sasl-pw-1234"))
    protect(_sasl("other-pw-9999"))
    assert logging.getLogRecordFactory() is factory
    for root in ("kafka", "confluent_kafka"):
        filters = logging.getLogger(root).filters
        assert sum(isinstance(f, RedactingFilter) for f in filters) == 1, root
    record = factory(
        "kafka.x", logging.INFO, __file__, 1, "%s %s", ("sasl-pw-1234", "other-pw-9999"), None
    )
    assert record.tagged and record.getMessage() == f"{MASK} {MASK}"
