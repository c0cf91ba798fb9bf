"""Replay: train on a bounded range of the topic as a read-only side trip for the live system.

A replay reads by assignment (static mode) and, unless ``--replay-group`` names a group, belongs
to no consumer group and commits nothing. It may start from a checkpoint (``--restore-from``,
read only) and writes checkpoints and exports only into directories of its own. The options
that are a live worker's outputs (checkpoint and export directories, TensorBoard and audit
files, the dead-letter topic, the metrics port, the group) are taken only from the replay's own
command line: with the live worker's ``--config`` or ``STREAMER_*`` environment, a replay
touches nothing of the live worker. No TensorFlow here: every check runs before it loads.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from consumers.errors import ConfigError
from consumers.positions import parse_position
from consumers.settings import ConsumerSettings

__all__ = [
    "COMMIT_METADATA",
    "FLAG_ONLY",
    "MARKER_FILE",
    "RANGE_FORMS",
    "ReplaySpec",
    "check_outputs",
    "check_replay_group",
    "parse_bound",
    "write_marker",
]

log = logging.getLogger(__name__)

#: What ``--from`` and ``--to`` accept, word for word as their help and their errors say it.
RANGE_FORMS = (
    "earliest, latest, an ISO 8601 time (UTC unless it has an offset) or unix milliseconds"
)

#: Written into a checkpoint directory a replay writes to: such a directory is a replay's.
MARKER_FILE = "streamer-replay.json"

#: The metadata of a replay's commits (``--replay-group``): such commits are a replay's.
COMMIT_METADATA = "streamer-replay"

#: Options a replay takes only from its own command line, and its value for them otherwise:
#: in a live worker's config file or environment they are the live worker's outputs.
FLAG_ONLY: Mapping[str, Any] = {
    "checkpoint_dir": None,
    "export_dir": None,
    "logdir": None,
    "profile_steps": None,
    "audit_log": None,
    "dead_letter_topic": None,
    "dead_letter_replication_factor": None,
    "metrics_port": 0,
    "group": "",
}


def parse_bound(text: str, setting: str) -> str | int:
    """``--from``/``--to``: ``earliest``, ``latest``, or a time as unix milliseconds.

    >>> parse_bound("latest", "to"), parse_bound("2026-01-01T00:00:00Z", "from")
    ('latest', 1767225600000)
    """
    return parse_position(text, setting, names=("earliest", "latest"), forms=RANGE_FORMS)


def _order(bound: str | int) -> float:
    return {"earliest": float("-inf"), "latest": float("inf")}.get(bound, bound)  # type: ignore[arg-type]


@dataclass(frozen=True, slots=True)
class ReplaySpec:
    """One replay: its range, where it may commit, what it restores from.

    >>> ReplaySpec.parse("earliest", "latest").group is None
    True
    >>> ReplaySpec.parse("2026-01-02T00:00:00Z", "2026-01-01T00:00:00Z")
    Traceback (most recent call last):
    ...
    consumers.errors.ConfigError: invalid setting to='2026-01-01T00:00:00Z': must be after --from 2026-01-02T00:00:00Z: the range from --from up to (not including) --to is empty
    """

    start: str | int
    stop: str | int
    from_text: str
    to_text: str
    group: str | None = None
    force_live_group: bool = False
    restore_from: str | None = None
    #: Options of a live worker's config file or environment that this replay does not use.
    ignored: tuple[str, ...] = ()

    @classmethod
    def parse(
        cls,
        from_text: str,
        to_text: str,
        *,
        group: str | None = None,
        force_live_group: bool = False,
        restore_from: str | None = None,
    ) -> ReplaySpec:
        return cls(
            parse_bound(from_text, "from"),
            parse_bound(to_text, "to"),
            from_text.strip(),
            to_text.strip(),
            group,
            force_live_group,
            restore_from,
        )

    def __post_init__(self) -> None:
        if _order(self.stop) <= _order(self.start):
            raise ConfigError(
                "to",
                self.to_text,
                f"must be after --from {self.from_text}: the range from --from up to (not "
                "including) --to is empty",
            )
        if self.group is not None and not self.group.strip():
            raise ConfigError("replay_group", self.group, "a consumer group id")
        if self.force_live_group and self.group is None:
            raise ConfigError(
                "force_replay_into_live_group",
                True,
                "only with --replay-group (without it a replay commits to no group)",
            )

    def describe(self) -> dict[str, Any]:
        return {"from": self.from_text, "to": self.to_text, "group": self.group}


# ---- outputs ----------------------------------------------------------------------------------


def _same(a: str, b: str) -> bool:
    return os.path.realpath(a) == os.path.realpath(b)


def _holds_checkpoints(directory: str) -> bool:
    try:
        names = os.listdir(directory)
    except (FileNotFoundError, NotADirectoryError):
        return False
    return any(n == "checkpoint" or n.startswith("ckpt-") for n in names)


def _holds_live_exports(directory: str) -> bool:
    """Numbered versions whose ``streamer.json`` does not say they are a replay's."""
    try:
        names = os.listdir(directory)
    except (FileNotFoundError, NotADirectoryError):
        return False
    for name in names:
        if not name.isdigit():
            continue
        info = os.path.join(directory, name, "assets.extra", "streamer.json")
        try:
            with open(info, encoding="utf-8") as fh:
                if json.load(fh).get("replay"):
                    continue
        except (OSError, ValueError, AttributeError):
            pass
        return True
    return False


def check_outputs(
    spec: ReplaySpec,
    *,
    checkpoint_dir: str | None,
    export_dir: str | None,
    audit_log: str | None,
) -> None:
    """Refuse (ConfigError) any output a live worker uses: every output must be the replay's.

    A checkpoint directory is a replay's when it is new, empty, or holds this module's marker
    file; an export directory when each version in it says ``"replay"`` in its streamer.json;
    an audit log when it does not exist yet or is empty.
    """
    restore = spec.restore_from
    if restore is not None and not _holds_checkpoints(restore):
        raise ConfigError(
            "restore_from", restore, "a directory that holds checkpoints (none found there)"
        )
    for setting, path in (("checkpoint_dir", checkpoint_dir), ("export_dir", export_dir)):
        if path and restore is not None and _same(path, restore):
            raise ConfigError(
                setting,
                path,
                "must differ from --restore-from: a replay reads that checkpoint and never "
                "writes into it",
            )
    marked = checkpoint_dir and os.path.exists(os.path.join(checkpoint_dir, MARKER_FILE))
    if checkpoint_dir and _holds_checkpoints(checkpoint_dir) and not marked:
        raise ConfigError(
            "checkpoint_dir",
            checkpoint_dir,
            "holds checkpoints that no replay wrote (a live worker's?): a replay writes only "
            "into a directory of its own; to start from them give --restore-from "
            f"{checkpoint_dir} and a new --checkpoint-dir (or none)",
        )
    if export_dir and _holds_live_exports(export_dir):
        raise ConfigError(
            "export_dir",
            export_dir,
            "holds model versions that no replay exported (a live worker's, served?): a "
            "replay exports only into a directory of its own",
        )
    if audit_log and os.path.exists(audit_log) and os.path.getsize(audit_log) > 0:
        raise ConfigError(
            "audit_log",
            audit_log,
            "exists and is not empty (a live worker's?): a replay writes a new audit log",
        )


def write_marker(directory: str, spec: ReplaySpec, topic: str) -> None:
    """Mark ``directory`` as a replay's (before the first checkpoint is written there)."""
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, MARKER_FILE)
    info = {"topic": topic, **spec.describe(), "restore_from": spec.restore_from}
    with open(path, "w", encoding="utf-8") as fh:
        json.dump(info, fh, indent=1)
        fh.write("\n")


# ---- the group --------------------------------------------------------------------------------


def check_replay_group(settings: ConsumerSettings, spec: ReplaySpec) -> None:
    """``--replay-group``: refuse a group with members, or with commits on the topic that no
    replay made (a live worker's), unless ``--force-replay-into-live-group``."""
    if spec.group is None:
        return
    from consumers.admin import group_activity

    activity = group_activity(settings.bootstrap_servers, spec.group, security=settings.security)
    live = {
        p: off
        for p, (off, meta) in activity.committed_on(settings.topic).items()
        if not meta.startswith(COMMIT_METADATA)
    }
    if not activity.members and not live:
        return
    found = []
    if activity.members:
        found.append(f"{activity.members} active member(s)")
    if live:
        found.append(f"committed offsets on {settings.topic} that no replay wrote {live}")
    what = " and ".join(found)
    if not spec.force_live_group:
        raise ConfigError(
            "replay_group",
            spec.group,
            f"group {spec.group!r} has {what}: a live worker's group; a replay's commits would "
            "move its position. Name a new group, or none (a replay commits nothing by "
            "default); --force-replay-into-live-group overrides this check",
        )
    log.warning(
        "--force-replay-into-live-group: replaying into group %r, which has %s; its committed "
        "offsets will be overwritten with the replay's",
        spec.group,
        what,
    )
