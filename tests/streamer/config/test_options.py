"""streamer.config.options: the text parsers of flags and variables, each option's derived view
(flag, variable, kind, choices) and the declaration's consistency. test_config and test_cli
cover loading and precedence through load_config and the command line."""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any, Literal

import pytest

from consumers.settings import ConsumerSettings, SecuritySettings
from consumers.types import CLIENTS, SaslMechanism
from streamer.config import SECRET_ENV
from streamer.config.options import (
    ENV_PREFIX,
    OPTIONS,
    OPTIONS_BY_NAME,
    Options,
    _bool,
    _int_list,
)


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("1", True),
        ("true", True),
        ("TRUE", True),
        (" Yes ", True),
        ("on", True),
        ("0", False),
        ("False", False),
        ("no", False),
        ("OFF", False),
        ("", False),  # STREAMER_JIT_COMPILE= (set empty) is off
    ],
)
def test_bool_reads_the_usual_spellings(text: str, value: bool) -> None:
    assert _bool(text) is value


@pytest.mark.parametrize("text", ["2", "y", "enabled", "truee", "-1"])
def test_bool_refuses_anything_else_saying_what_it_takes(text: str) -> None:
    with pytest.raises(ValueError, match="true or false"):
        _bool(text)


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("0,1,2", (0, 1, 2)),
        ("7", (7,)),
        (" 3 , 4 ", (3, 4)),
        ("1,,2,", (1, 2)),  # empty items are skipped
        ("", ()),
        ("2,1,2", (2, 1, 2)),  # order and repeats are kept: the settings judge them
    ],
)
def test_int_list_reads_comma_separated_partitions(text: str, value: tuple[int, ...]) -> None:
    assert _int_list(text) == value


@pytest.mark.parametrize("text", ["1.5", "0,x", "0;1", "0 1"])
def test_int_list_refuses_what_is_not_a_list_of_integers_with_an_example(text: str) -> None:
    with pytest.raises(
        ValueError, match=r"comma-separated list of partition numbers, e\.g\. 0,1,2"
    ):
        _int_list(text)


def test_flag_and_variable_are_derived_from_the_name() -> None:
    opt = OPTIONS_BY_NAME["max_batch_inflated_bytes"]
    assert (opt.flag, opt.env) == (
        "--max-batch-inflated-bytes",
        "STREAMER_MAX_BATCH_INFLATED_BYTES",
    )


@pytest.mark.parametrize(
    ("name", "kind", "parse", "text", "value"),
    [
        ("batch_size", int, int, "64", 64),
        ("worker_index", int, int, "3", 3),  # int | None: the int is parsed
        ("learning_rate", float, float, "1e-3", 0.001),
        ("stop_after_idle", float, float, "2.5", 2.5),
        ("jit_compile", bool, _bool, "yes", True),
        ("partitions", tuple, _int_list, "0,2", (0, 2)),
        ("bootstrap", str, str, "h:9092", "h:9092"),
        ("log_level", str, str, "DEBUG", "DEBUG"),
    ],
)
def test_the_declared_type_gives_the_kind_and_parser(
    name: str, kind: type, parse: Any, text: str, value: Any
) -> None:
    opt = OPTIONS_BY_NAME[name]
    assert opt.kind is kind and opt.parse is parse
    assert opt.parse(text) == value


def test_a_literal_type_gives_the_choices_optional_or_not() -> None:
    assert OPTIONS_BY_NAME["kafka_client"].choices == CLIENTS
    sasl = OPTIONS_BY_NAME["sasl_mechanism"]  # SaslMechanism | None
    assert sasl.choices == typing.get_args(SaslMechanism) and sasl.default is None
    assert OPTIONS_BY_NAME["log_format"].choices == ("text", "json")
    assert OPTIONS_BY_NAME["batch_size"].choices is None


def test_options_are_declared_in_field_order_with_help_and_group() -> None:
    assert [o.name for o in OPTIONS] == [f.name for f in dataclasses.fields(Options)]
    assert len(OPTIONS_BY_NAME) == len(OPTIONS)
    assert all(o.help.strip() and o.group for o in OPTIONS)
    groups = {o.group for o in OPTIONS}
    assert groups == {
        "kafka",
        "security",
        "training",
        "online",
        "multi-worker",
        "simulator",
        "operations",
    }


def test_every_default_is_of_its_kind_and_among_its_choices() -> None:
    """--help and --print-config show the default as declared: a float option's default is a
    float, a choice's default one of the choices."""
    for o in OPTIONS:
        if o.default is None:
            continue
        assert type(o.default) is o.kind, (o.name, o.default)
        if o.choices is not None:
            assert o.default in o.choices, o.name
    for o in OPTIONS:
        if o.choices is not None:
            assert len(set(o.choices)) == len(o.choices), o.name
            lowered = {c.lower() for c in o.choices}
            assert len(lowered) == len(o.choices), f"{o.name}: choices differing only in case"


def test_no_option_takes_a_reserved_variable_or_a_second_flag() -> None:
    """Secrets and STREAMER_CONFIG are read apart from the options; two options never share a
    flag or a variable."""
    envs = [o.env for o in OPTIONS]
    flags = [o.flag for o in OPTIONS]
    assert len(set(envs)) == len(envs) and len(set(flags)) == len(flags)
    reserved = {*SECRET_ENV, ENV_PREFIX + "CONFIG"}
    assert not reserved & set(envs)
    assert "--config" not in flags


def _unwrap(hint: Any) -> Any:
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        hint = next(a for a in typing.get_args(hint) if a is not type(None))
    return hint


def test_every_destination_is_a_field_of_the_settings_it_names() -> None:
    """``to="consumer.x"`` becomes ConsumerSettings(x=...): a name that is no field there
    would fail only at start-up. An enumeration offers exactly what the field accepts."""
    targets = {"consumer": ConsumerSettings, "security": SecuritySettings}
    for o in OPTIONS:
        if o.to is None:
            continue
        prefix, _, field = o.to.partition(".")
        assert prefix in targets, o.to
        hints = typing.get_type_hints(targets[prefix])
        assert field in hints, o.to
        hint = _unwrap(hints[field])
        if o.choices is not None:
            assert typing.get_origin(hint) is Literal, o.to
            assert set(typing.get_args(hint)) == set(o.choices), o.to
    destinations = [o.to for o in OPTIONS if o.to is not None]
    assert len(set(destinations)) == len(destinations)
