"""What every ``streamer`` command shares: the parser's habits, the ``Command`` shape, the
connection options of the Kafka tools, and the start and end of a worker process."""

from __future__ import annotations

import argparse
import difflib
import os
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, ClassVar, NoReturn

from consumers.errors import ConfigError

if TYPE_CHECKING:
    from consumers.settings import SecuritySettings

__all__ = [
    "CODECS",
    "CONNECTION_HELPS",
    "CONNECTION_OPTIONS",
    "Command",
    "Parser",
    "connection",
    "exit_guard",
    "load_tensorflow",
    "quiet_tensorflow",
]

#: The options of ``streamer run`` that say how to reach and log in to Kafka: every command
#: that talks to Kafka takes them, from flags, STREAMER_* and --config alike.
CONNECTION_OPTIONS = (
    "bootstrap",
    "security_protocol",
    "sasl_mechanism",
    "sasl_username",
    "ssl_cafile",
    "ssl_certfile",
    "ssl_keyfile",
)
#: The tools that talk to Kafka need a broker: their --bootstrap has no simulator fallback.
CONNECTION_HELPS = {
    "bootstrap": "Kafka bootstrap servers host:port[,host:port]; required "
    "[env STREAMER_BOOTSTRAP; TOML bootstrap]",
}

#: Kafka's compression codecs, all readable by the worker (DESIGN section 3).
CODECS = ("none", "gzip", "snappy", "lz4", "zstd")


class Command:
    """One subcommand: its name, help and arguments, and what it does (kafka-python's
    ``kafka.cli.admin`` commands have the same shape). Registered once, in
    ``streamer.cli.commands.COMMANDS``."""

    name: ClassVar[str]
    #: The line in ``streamer --help``.
    help: ClassVar[str]
    #: The text of ``streamer NAME --help`` (None: the help line).
    description: ClassVar[str | None] = None
    #: Keep the description's own line breaks.
    raw_description: ClassVar[bool] = False

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        """The command's arguments."""

    def run(self, args: argparse.Namespace) -> int:
        """Do it; the exit code (a ``ConfigError`` raised here exits 2, any other
        ``StreamerError`` 1)."""
        raise NotImplementedError


#: Words of a flag that may carry a secret: its value is never shown, nor a look-alike flag.
_SECRET_WORDS = ("pass", "pwd", "secret", "token", "credential")


class Parser(argparse.ArgumentParser):
    """argparse with the habits of a careful CLI: no abbreviations (``--max-step`` is not
    ``--max-steps``), and an error that is one line with a suggestion, not the whole usage."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n(see {self.prog} --help)\n")

    def unrecognized(self, tokens: Sequence[str]) -> NoReturn:
        """Arguments this command does not take: their flags, never their values (a secret
        given as a flag must not be echoed, to a terminal or a pod's log), with the flag each
        was probably meant to be; a password flag names the variables passwords come from."""
        known = [o for action in self._actions for o in action.option_strings]
        flags = [t.split("=", 1)[0] for t in tokens if t.startswith("-")]
        values = len(tokens) - len(flags) + sum("=" in t for t in tokens if t.startswith("-"))
        shown = " ".join(flags) or "(values only)"
        if values:
            shown += f" (and {values} value{'s' if values > 1 else ''}, not shown)"
        secret = [f for f in flags if any(w in f.lower() for w in _SECRET_WORDS)]
        if secret:
            self.error(
                f"unrecognized arguments: {shown}; passwords are never flags (a process list "
                "shows them): set STREAMER_SASL_PASSWORD or STREAMER_SASL_PASSWORD_FILE (a file "
                "that holds it), STREAMER_SSL_PASSWORD or STREAMER_SSL_PASSWORD_FILE"
            )
        tips = []
        for flag in flags:
            close = difflib.get_close_matches(flag, known, n=1, cutoff=0.6)
            if close:
                tips.append(f"{flag} -> {close[0]}")
        hint = f"; did you mean: {', '.join(tips)}?" if tips else ""
        self.error(f"unrecognized arguments: {shown}{hint}")


def quiet_tensorflow() -> None:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def load_tensorflow() -> None:
    """Every impossible setting has failed by now: load TensorFlow, without its noise."""
    from streamer.ops.tfstart import load_tensorflow as load

    load()


def exit_guard(code: int, seconds: float) -> None:
    """The worker is done; if some library thread keeps the interpreter from exiting, exit anyway.

    SIGINT and SIGTERM are ignored from here on: the stop is over, and a late copy of the one
    that asked for it (a terminal's Ctrl-C reaches the process two or three times) must not
    turn a clean exit into death by signal. A Python-level handler would not do: the
    interpreter's finalization puts the default action back (a copy landing then killed the
    process with SIGINT, exit -2, in CI); an ignored signal stays ignored. The exit itself is
    bounded by this guard.
    """
    import signal
    import threading

    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, signal.SIG_IGN)

    def guard() -> None:
        import time

        time.sleep(seconds)
        sys.stderr.flush()
        os._exit(code)

    threading.Thread(target=guard, name="streamer-exit-guard", daemon=True).start()


def connection(args: argparse.Namespace) -> tuple[str, SecuritySettings]:
    """Bootstrap servers and security settings of a command that talks to Kafka, from its
    flags, STREAMER_* and --config, as ``streamer run`` reads them."""
    from streamer.config import load_config

    params = {n: getattr(args, n, None) for n in CONNECTION_OPTIONS}
    params["config"] = getattr(args, "config", None)
    config = load_config(params)
    if config.bootstrap is None:
        raise ConfigError(
            "bootstrap",
            None,
            f"streamer {args.command} talks to Kafka: give --bootstrap, bootstrap in --config, "
            "or STREAMER_BOOTSTRAP",
        )
    return config.bootstrap, config.security_settings()
