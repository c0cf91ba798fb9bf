"""The run options as argparse flags: one per option, its help naming its variable, TOML key
and default."""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from typing import Any

from streamer.config.options import OPTIONS

__all__ = ["add_run_arguments"]


def add_run_arguments(
    parser: argparse.ArgumentParser,
    helps: Mapping[str, str] | None = None,
    *,
    only: Sequence[str] | None = None,
) -> None:
    """Add every option (or those named in ``only``) as a flag whose help shows its env var,
    TOML key and default (no secret flags). A bool option is a plain flag with its negation
    (``--jit-compile`` / ``--no-jit-compile``); an enumeration lists its values and takes them
    in any case.

    ``helps``: the whole help text of some options, instead of the generated one.
    """
    helps = helps or {}
    parser.add_argument(
        "--config",
        default=None,
        metavar="FILE",
        help="TOML config file (keys = option names with underscores) [env STREAMER_CONFIG]",
    )
    groups: dict[str, Any] = {}
    for opt in OPTIONS:
        if only is not None and opt.name not in only:
            continue
        grp = groups.get(opt.group)
        if grp is None:
            grp = groups[opt.group] = parser.add_argument_group(opt.group)
        default = opt.shown or ("unset" if opt.default is None else opt.default)
        if opt.kind is bool:
            forms = f"env {opt.env}=true|false; TOML {opt.name} = true|false"
            grp.add_argument(
                opt.flag,
                dest=opt.name,
                default=None,
                action=argparse.BooleanOptionalAction,
                help=helps.get(opt.name, f"{opt.help} [{forms}; default: {str(default).lower()}]"),
            )
            continue
        metavar = opt.name.upper() if opt.choices is None else "{" + ",".join(opt.choices) + "}"
        grp.add_argument(
            opt.flag,
            dest=opt.name,
            default=None,
            metavar=metavar,
            help=helps.get(opt.name, f"{opt.help} [env {opt.env}; default: {default}]"),
        )
