"""consumers.types: the closed sets other modules rely on: no value twice, the value tuples in
step with their Literal types, the fallbacks the metrics count into present, every settings
value accepted and every error kind reported somewhere."""

from __future__ import annotations

import re
from pathlib import Path
from typing import get_args

import pytest

import consumers.types as types_mod
from consumers.settings import ConsumerSettings, Secret, SecuritySettings
from consumers.types import (
    CLIENTS,
    KAFKA_ERROR_TYPES,
    REASONS,
    SHARD_RUNTIMES,
    ClientName,
    KafkaErrorType,
    Reason,
    ShardRuntime,
    ShardRuntimeChoice,
)

ROOT = Path(__file__).resolve().parents[2]
LITERALS = sorted(name for name in types_mod.__all__ if not name.isupper())


@pytest.mark.parametrize("name", LITERALS)
def test_every_closed_set_is_a_literal_of_distinct_non_empty_strings(name: str) -> None:
    values = get_args(getattr(types_mod, name))
    assert len(values) >= 2
    assert all(isinstance(v, str) and v == v.strip() and v for v in values)
    assert len(set(values)) == len(values)


@pytest.mark.parametrize(
    ("values", "literal"),
    [
        (CLIENTS, ClientName),
        (SHARD_RUNTIMES, ShardRuntime),
        (REASONS, Reason),
        (KAFKA_ERROR_TYPES, KafkaErrorType),
    ],
    ids=["CLIENTS", "SHARD_RUNTIMES", "REASONS", "KAFKA_ERROR_TYPES"],
)
def test_the_value_tuples_are_their_literals_in_order(
    values: tuple[str, ...], literal: object
) -> None:
    """The metrics pre-register one label per value, in this order."""
    assert isinstance(values, tuple) and values == get_args(literal)


def test_the_runtime_option_is_auto_or_a_runtime() -> None:
    assert get_args(ShardRuntimeChoice) == ("auto", *SHARD_RUNTIMES)


def test_the_metrics_fallback_error_kind_exists() -> None:
    """``Metrics.kafka_error`` counts an unknown kind as "other": it must be a label."""
    assert "other" in KAFKA_ERROR_TYPES


@pytest.mark.parametrize("runtime", SHARD_RUNTIMES)
@pytest.mark.parametrize("client", CLIENTS)
def test_consumer_settings_accept_every_client_and_runtime(client: str, runtime: str) -> None:
    s = ConsumerSettings(
        bootstrap_servers="h:9092", topic="t", client=client, shard_runtime=runtime
    )
    assert (s.client, s.shard_runtime) == (client, runtime)


@pytest.mark.parametrize(
    ("field", "literal"),
    [
        ("auto_offset_reset", types_mod.AutoOffsetReset),
        ("isolation_level", types_mod.IsolationLevel),
        ("partition_assignment_strategy", types_mod.AssignmentStrategy),
        ("mode", types_mod.ShardMode),
    ],
)
def test_consumer_settings_accept_every_value_of_kafkas_own_settings(
    field: str, literal: object
) -> None:
    for value in get_args(literal):
        extra = {"partitions": (0,)} if value == "static" else {}
        s = ConsumerSettings(bootstrap_servers="h:9092", topic="t", **{field: value}, **extra)
        assert getattr(s, field) == value


def test_security_settings_accept_every_protocol_and_mechanism() -> None:
    for protocol in get_args(types_mod.SecurityProtocol):
        if protocol.startswith("SASL_"):
            for mechanism in get_args(types_mod.SaslMechanism):
                sec = SecuritySettings(
                    security_protocol=protocol,
                    sasl_mechanism=mechanism,
                    sasl_plain_username="u",
                    sasl_plain_password=Secret("pw"),
                )
                assert sec.kafka_config()["sasl_mechanism"] == mechanism
        else:
            assert SecuritySettings(security_protocol=protocol).kafka_config() == {
                "security_protocol": protocol,
                **({"ssl_check_hostname": True} if protocol == "SSL" else {}),
            }


_REPORT = re.compile(r"""\b(?:on_error|report_error|kafka_error)\(\s*["']([A-Za-z_]+)["']""")


def test_every_kafka_error_kind_is_reported_and_every_reported_kind_is_known() -> None:
    """A kind nothing reports is a metric label that stays 0 forever; a kind reported but not
    declared (a typo) is counted as "other" and its alert never fires."""
    code = "\n".join(
        path.read_text(encoding="utf-8")
        for package in ("consumers", "streamer")
        for path in sorted((ROOT / package).rglob("*.py"))
    )
    reported = set(_REPORT.findall(code))
    assert len(reported) >= 5, "the report pattern no longer finds the calls"
    assert sorted(reported - set(KAFKA_ERROR_TYPES)) == []
    assert sorted(set(KAFKA_ERROR_TYPES) - reported) == []
