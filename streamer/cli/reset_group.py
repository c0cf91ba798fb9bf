"""``streamer reset-group``: move a stopped group's committed offsets (a dry run unless --execute)."""

from __future__ import annotations

import argparse

from streamer.cli.arguments import add_run_arguments
from streamer.cli.base import CONNECTION_HELPS, CONNECTION_OPTIONS, Command, connection
from streamer.cli.logs import configure_logging
from streamer.config.replay import RANGE_FORMS


class ResetGroup(Command):
    name = "reset-group"
    help = (
        "move a stopped consumer group's committed offsets to a time, the earliest or "
        "the latest records (a dry run unless --execute)"
    )
    description = (
        "Show, and with --execute commit, new offsets of a consumer group on a topic: the "
        "first record at or after a time (inclusive), or the topic's earliest or latest "
        "offsets, as Kafka's kafka-consumer-groups --reset-offsets does. The group must "
        "have no members (stop its workers first). A worker with --checkpoint-dir starts "
        "from its checkpoint, not from the group's offsets: move it with --start-from."
    )

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        add_run_arguments(parser, CONNECTION_HELPS, only=CONNECTION_OPTIONS)
        parser.add_argument("--group", required=True, help="consumer group id")
        parser.add_argument("--topic", required=True, help="the topic whose offsets move")
        parser.add_argument(
            "--to",
            dest="reset_to",
            metavar="TO",
            required=True,
            help=f"where the group resumes: {RANGE_FORMS}; a partition with no record at or after "
            "a time resumes at its end",
        )
        parser.add_argument(
            "--execute", action="store_true", help="commit the new offsets [default: a dry run]"
        )

    def run(self, args: argparse.Namespace) -> int:
        configure_logging("WARNING")
        from consumers.admin import group_activity, reset_group
        from consumers.errors import GroupActiveError
        from consumers.positions import start_offsets
        from consumers.settings import ConsumerSettings
        from streamer.config.replay import parse_bound

        position = parse_bound(args.reset_to, "to")
        bootstrap, security = connection(args)
        activity = group_activity(bootstrap, args.group, security=security)
        if activity.members:
            raise GroupActiveError(args.group, activity.members)
        settings = ConsumerSettings(
            bootstrap_servers=bootstrap, topic=args.topic, group_id=args.group, security=security
        )
        new = start_offsets(settings, position)
        current = {p: offset for p, (offset, _meta) in activity.committed_on(args.topic).items()}
        print(f"{'GROUP':<30} {'TOPIC':<30} {'PARTITION':>9} {'CURRENT':>12} {'NEW':>12}")
        for p in sorted(new):
            now = "-" if current.get(p) is None else str(current[p])
            print(f"{args.group:<30} {args.topic:<30} {p:>9} {now:>12} {new[p]:>12}")
        if not args.execute:
            print("dry run: nothing changed; add --execute to commit these offsets")
            return 0
        reset_group(bootstrap, args.group, args.topic, new, security=security)
        print(
            f"committed: group {args.group!r} resumes {args.topic} at NEW (a worker with "
            "--checkpoint-dir too: an operator's rewind wins over its checkpoint, and it says so)"
        )
        return 0
