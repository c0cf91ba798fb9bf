"""streamer.input.pipeline: the tf.data side's settings refuse what would break a pass, each
naming the setting (the option a user typed) and what is allowed."""

from __future__ import annotations

import pytest

from consumers.errors import ConfigError
from streamer.input.pipeline import PipelineSettings


def test_the_defaults_are_valid_and_unbounded() -> None:
    s = PipelineSettings()
    assert s.pass_records is None and s.pass_seconds is None  # a pass ends when idle
    assert s.num_shards >= 1 and s.batch_size >= 1 and 0 < s.max_reject_fraction <= 1


@pytest.mark.parametrize(
    ("field", "value", "setting", "says"),
    [
        ("num_shards", 0, "shards", "1 to 256"),
        ("num_shards", 257, "shards", "1 to 256"),
        ("batch_size", 0, "batch_size", "positive"),
        ("pass_records", 0, "pass_records", "positive"),
        ("pass_seconds", 0.0, "pass_seconds", "positive"),
        ("pass_seconds", -1.0, "pass_seconds", "positive"),
        ("shuffle_buffer", -1, "shuffle_buffer", "0 (off)"),
        ("max_reject_fraction", 0.0, "max_reject_fraction", "(0, 1]"),
        ("max_reject_fraction", 1.5, "max_reject_fraction", "(0, 1]"),
        ("idle_timeout_seconds", 0.0, "idle_timeout_seconds", "positive"),
    ],
)
def test_a_bad_value_names_its_setting(field: str, value: object, setting: str, says: str) -> None:
    with pytest.raises(ConfigError) as info:
        PipelineSettings(**{field: value})  # type: ignore[arg-type]
    assert info.value.setting == setting and says in info.value.allowed


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("num_shards", 1),
        ("num_shards", 256),
        ("pass_records", 1),
        ("pass_seconds", 0.001),
        ("shuffle_buffer", 0),
        ("max_reject_fraction", 1.0),  # the breaker off
    ],
)
def test_the_limits_themselves_are_accepted(field: str, value: object) -> None:
    assert getattr(PipelineSettings(**{field: value}), field) == value  # type: ignore[arg-type]


def test_settings_are_frozen() -> None:
    with pytest.raises(AttributeError):
        PipelineSettings().batch_size = 2  # type: ignore[misc]
