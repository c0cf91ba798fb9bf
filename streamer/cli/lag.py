"""``streamer lag``: a consumer group's committed offset, end offset and lag per partition."""

from __future__ import annotations

import argparse
import json
import sys

from streamer.cli.arguments import add_run_arguments
from streamer.cli.base import CONNECTION_HELPS, CONNECTION_OPTIONS, Command, connection
from streamer.cli.logs import configure_logging


class Lag(Command):
    name = "lag"
    help = "a consumer group's committed offset, end offset and lag per partition"
    description = "Show a group's committed offset, end offset and lag per partition, from outside the worker."

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        add_run_arguments(parser, CONNECTION_HELPS, only=CONNECTION_OPTIONS)
        parser.add_argument("--group", required=True, help="consumer group id")
        parser.add_argument(
            "--topic",
            default=None,
            help="only this topic [default: every topic the group committed]",
        )
        parser.add_argument(
            "--isolation-level",
            default="read_committed",
            type=str.lower,  # any case, as the run options take them
            choices=("read_committed", "read_uncommitted"),
            help="END is what a consumer of this isolation level can read: the last stable offset "
            "(read_committed, the worker's default) or the log end (read_uncommitted, what "
            "kafka-consumer-groups shows); they differ only while a transaction is open "
            "[default: read_committed]",
        )
        parser.add_argument("--json", action="store_true", help="print JSON instead of a table")

    def run(self, args: argparse.Namespace) -> int:
        configure_logging("WARNING")
        from consumers.admin import group_activity, group_lag

        bootstrap, security = connection(args)
        rows = group_lag(
            bootstrap,
            args.group,
            args.topic,
            isolation_level=args.isolation_level,
            security=security,
        )
        note = None
        if all(r.committed is None for r in rows):
            known = group_activity(bootstrap, args.group, security=security).known
            what = "no committed offsets" + (f" on {args.topic}" if args.topic else "")
            note = f"group {args.group!r} has {what}" + ("" if known else " (unknown group)")
            if args.topic is None:
                print(f"streamer: {note}", file=sys.stderr)
                return 1
            note += f": its lag is the whole topic, from offset 0 ({sum(r.lag for r in rows)})"
        if args.json:
            out: dict[str, object] = {
                "group": args.group,
                "partitions": [r.as_dict() for r in rows],
            }
            if note is not None:
                out["note"] = note
            print(json.dumps(out, indent=2))
            return 0
        print(f"{'TOPIC':<30} {'PARTITION':>9} {'COMMITTED':>12} {'END':>12} {'LAG':>10}")
        for r in rows:
            committed = "-" if r.committed is None else str(r.committed)
            print(f"{r.topic:<30} {r.partition:>9} {committed:>12} {r.end:>12} {r.lag:>10}")
        print(f"{'TOTAL':<30} {'':>9} {'':>12} {'':>12} {sum(r.lag for r in rows):>10}")
        if note is not None:
            print(f"note: {note}")
        return 0
