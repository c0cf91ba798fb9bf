"""The ``streamer`` command: every subcommand registered once (``COMMANDS``), the parser built
from them, and ``main``.

A new subcommand is one ``Command`` subclass in a module of its own, added to ``COMMANDS``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from consumers.errors import ConfigError, StreamerError
from streamer.cli.base import Command, Parser, quiet_tensorflow
from streamer.cli.benchmark import Bench
from streamer.cli.lag import Lag
from streamer.cli.launch import Launch
from streamer.cli.replay import Replay
from streamer.cli.reset_group import ResetGroup
from streamer.cli.run import Run
from streamer.cli.simulate import Simulate

__all__ = ["COMMANDS", "main", "parsers"]

#: Every subcommand, in the order ``streamer --help`` lists them.
COMMANDS: tuple[Command, ...] = (
    Run(),
    Replay(),
    Simulate(),
    Lag(),
    Launch(),
    ResetGroup(),
    Bench(),
)


def parsers() -> tuple[argparse.ArgumentParser, dict[str, Parser]]:
    """The ``streamer`` parser and each command's own (whose usage its errors show)."""
    from streamer import __version__

    parser = Parser(
        prog="streamer",
        description="Train a TensorFlow model continuously on msgpack records from Kafka.",
    )
    parser.add_argument("--version", action="version", version=f"streamer {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    own: dict[str, Parser] = {}
    for command in COMMANDS:
        extra = (
            {"formatter_class": argparse.RawDescriptionHelpFormatter}
            if command.raw_description
            else {}
        )
        p = sub.add_parser(
            command.name,
            help=command.help,
            description=command.description or command.help,
            **extra,  # type: ignore[arg-type]
        )
        assert isinstance(p, Parser)  # a subparser is of its parent's class
        command.add_arguments(p)
        own[command.name] = p
    return parser, own


def main(argv: Sequence[str] | None = None) -> int:
    quiet_tensorflow()
    parser, own = parsers()
    args, unknown = parser.parse_known_args(argv)
    if unknown:  # the command's usage, not the top level's: that is where the flag belongs
        own[args.command].unrecognized(unknown)
    command = next(c for c in COMMANDS if c.name == args.command)
    try:
        return command.run(args)
    except ConfigError as exc:
        print(f"streamer: error: {exc}", file=sys.stderr)
        return 2
    except StreamerError as exc:
        print(f"streamer: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except Exception as exc:
        # A Kafka client's own error that no layer above typed (an operations tool asking a
        # broker mid-change): one line that names it, not a traceback.
        if not type(exc).__module__.startswith(("kafka.", "confluent_kafka")):
            raise
        print(
            f"streamer: error: the broker answered {type(exc).__name__} ({exc}); "
            "it may be starting or moving a coordinator: try again in a few seconds",
            file=sys.stderr,
        )
        return 1


if __name__ == "__main__":
    sys.exit(main())
