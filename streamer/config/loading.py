"""load_config: the worker's settings from defaults, a TOML file, STREAMER_* variables and flags."""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import math
import os
import tomllib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from consumers.errors import ConfigError
from consumers.settings import Secret
from streamer.config.options import ENV_PREFIX, OPTIONS, OPTIONS_BY_NAME, Option
from streamer.config.replay import FLAG_ONLY, ReplaySpec
from streamer.config.settings import WorkerConfig

__all__ = ["SECRET_ENV", "load_config"]

_BY_NAME = OPTIONS_BY_NAME
SECRET_ENV = (
    "STREAMER_SASL_PASSWORD",
    "STREAMER_SASL_PASSWORD_FILE",
    "STREAMER_SSL_PASSWORD",
    "STREAMER_SSL_PASSWORD_FILE",
)


_KIND_WORDS: dict[type, str] = {int: "an integer", float: "a number"}


def _typed(opt: Option, value: Any, source: str) -> Any:
    """A TOML value (already typed by the TOML parser) checked against the option's type:
    never converted with a loss (``2.7`` is not an int, ``[1.9]`` not a partition list)."""
    kind = opt.kind
    if kind is bool:
        if not isinstance(value, bool):
            raise ConfigError(opt.name, value, f"from {source}: true or false")
        return value
    if kind is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(opt.name, value, f"from {source}: an integer")
        return value
    if kind is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(opt.name, value, f"from {source}: a number")
        return float(value)
    if kind is tuple:
        if not isinstance(value, list) or not all(
            isinstance(v, int) and not isinstance(v, bool) for v in value
        ):
            raise ConfigError(opt.name, value, f"from {source}: a list of integers, e.g. [0, 1]")
        return tuple(value)
    if not isinstance(value, str):
        raise ConfigError(opt.name, value, f"from {source}: a string")
    return value


def _convert(opt: Option, value: Any, source: str, *, typed: bool = False) -> Any:
    """A value from a flag, a variable (text) or a TOML file (``typed``: TOML has types, so
    ``shards = "2"`` is refused as ``shards = 2.7`` is), as the option's type."""
    if value is None:
        return None
    if isinstance(value, str) and opt.kind is not str and not typed:
        try:
            out = opt.parse(value.strip())
        except (ValueError, TypeError) as exc:
            what = _KIND_WORDS.get(opt.kind) or str(exc)
            raise ConfigError(opt.name, value, f"from {source}: {what}") from exc
    else:
        out = _typed(opt, value, source)
    if opt.choices is not None and out not in opt.choices:
        # Enumerations are case-insensitive: --log-level info is INFO.
        out = next((c for c in opt.choices if c.lower() == str(out).lower()), out)
    if opt.kind is float and not math.isfinite(out):
        raise ConfigError(opt.name, value, f"from {source}: a finite number")
    if opt.choices is not None and out not in opt.choices:
        raise ConfigError(opt.name, value, f"from {source}: one of {', '.join(opt.choices)}")
    return out


def unknown_name(name: str, known: Sequence[str], where: str) -> ConfigError:
    """An unknown key or variable: its name and the closest known ones, never its value (it
    may be a secret put under a wrong name)."""
    close = difflib.get_close_matches(name, known, n=3, cutoff=0.6)
    hint = f"did you mean {' or '.join(close)}?" if close else "see streamer run --help"
    if "password" in name.lower() and not name.startswith(ENV_PREFIX):
        hint = "passwords come only from the environment: " + ", ".join(SECRET_ENV)
    return ConfigError(name, "(set)", f"unknown {where}; {hint}")


def load_config(
    args: argparse.Namespace | Mapping[str, Any] | None = None,
    env: Mapping[str, str] | None = None,
    *,
    replay: ReplaySpec | None = None,
    sources: dict[str, str] | None = None,
    own_model: bool = False,
) -> WorkerConfig:
    """Merge defaults < TOML file < STREAMER_* environment < flags into a WorkerConfig.

    ``sources``: filled with where each option's value came from (``default``, the file's
    path, the variable's name or the flag), for ``streamer run --print-config``.

    A ``replay`` takes the options of ``streamer.config.replay.FLAG_ONLY`` (a live worker's outputs)
    from ``args`` only; their values from the file or the environment are not used, and their
    names are noted in ``config.replay.ignored``. ``own_model``: the caller trains a model of
    its own (``streamer.Stream``), so the schema need not suit the built-in one.
    """
    env = os.environ if env is None else env
    flags = dict(vars(args)) if isinstance(args, argparse.Namespace) else dict(args or {})
    values: dict[str, Any] = {o.name: o.default for o in OPTIONS}
    came = dict.fromkeys(values, "default")
    config_path = flags.pop("config", None) or env.get("STREAMER_CONFIG")
    if config_path:
        try:
            data = tomllib.loads(Path(config_path).read_text(encoding="utf-8"))
        except OSError as exc:
            raise ConfigError(
                "config", config_path, f"cannot read the file: {exc.strerror}"
            ) from exc
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError("config", config_path, f"not valid TOML: {exc}") from exc
        for key, value in data.items():
            opt = _BY_NAME.get(key)
            if opt is None:
                raise unknown_name(key, sorted(_BY_NAME), f"key in {config_path}")
            values[key] = _convert(opt, value, config_path, typed=True)
            came[key] = str(config_path)
    known_env = {o.env for o in OPTIONS} | set(SECRET_ENV) | {"STREAMER_CONFIG"}
    for key in env:
        if key.startswith(ENV_PREFIX) and key not in known_env:
            raise unknown_name(key, sorted(known_env), "STREAMER_ variable")
    for opt in OPTIONS:
        if opt.env in env:
            values[opt.name] = _convert(opt, env[opt.env], opt.env)
            came[opt.name] = opt.env
    if replay is not None:
        ignored = []
        for name, value in FLAG_ONLY.items():
            flagged = flags.get(name) is not None
            if not flagged and values[name] not in (value, _BY_NAME[name].default):
                ignored.append(name)
            values[name] = value
        values["start_from"] = replay.from_text
        replay = dataclasses.replace(replay, ignored=tuple(ignored))
    for key, value in flags.items():
        if key in _BY_NAME and value is not None:
            values[key] = _convert(_BY_NAME[key], value, _BY_NAME[key].flag)
            came[key] = _BY_NAME[key].flag
    if replay is not None:
        values["group"] = replay.group or ""
    sasl = Secret.from_env_or_file("STREAMER_SASL_PASSWORD", "STREAMER_SASL_PASSWORD_FILE", env)
    ssl = Secret.from_env_or_file("STREAMER_SSL_PASSWORD", "STREAMER_SSL_PASSWORD_FILE", env)
    if sources is not None:
        sources.update(came)
        for name, var in (
            ("sasl_password", "STREAMER_SASL_PASSWORD"),
            ("ssl_password", "STREAMER_SSL_PASSWORD"),
        ):
            if var in env or var + "_FILE" in env:
                sources[name] = var if var in env else var + "_FILE"
    return WorkerConfig(
        **values, sasl_password=sasl, ssl_password=ssl, replay=replay, own_model=own_model
    )
