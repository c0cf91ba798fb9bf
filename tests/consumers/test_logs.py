"""consumers.logs: a repeated WARNING/ERROR gets through once per window (on a fake clock),
distinct ones all get through, a library's level is capped, and ``quiet`` installs once."""

from __future__ import annotations

import logging
import types
import uuid

import pytest

import consumers.logs as logs_mod
from consumers.logs import RepeatFilter, quiet


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    """The filter's clock, moved by hand (its module's ``time`` only)."""
    fake = Clock()
    monkeypatch.setattr(logs_mod, "time", types.SimpleNamespace(monotonic=fake.monotonic))
    return fake


def _rec(msg: str, *args: object, level: int = logging.WARNING) -> logging.LogRecord:
    return logging.makeLogRecord(
        {
            "name": "kafka.cluster",
            "msg": msg,
            "args": args,
            "levelno": level,
            "levelname": logging.getLevelName(level),
        }
    )


@pytest.mark.parametrize("level", [logging.DEBUG, logging.INFO])
def test_records_below_warning_always_get_through(clock: Clock, level: int) -> None:
    f = RepeatFilter(10.0)
    assert all(f.filter(_rec("poll %s", 1, level=level)) for _ in range(5))


@pytest.mark.parametrize("level", [logging.WARNING, logging.ERROR, logging.CRITICAL])
def test_an_identical_record_gets_through_once_per_window(clock: Clock, level: int) -> None:
    f = RepeatFilter(10.0)
    assert f.filter(_rec("topic %s not found", "t", level=level))
    clock.now += 9.9
    assert not f.filter(_rec("topic %s not found", "t", level=level))
    clock.now += 0.1  # exactly one window after the first: through again
    assert f.filter(_rec("topic %s not found", "t", level=level))


def test_a_dropped_repeat_does_not_extend_the_window(clock: Clock) -> None:
    """A line repeated every 6 s with a 10 s window shows at 0, 12, 24 s: the window runs from
    the last line shown, not from the last one dropped."""
    f = RepeatFilter(10.0)
    shown = []
    for t in range(0, 30, 6):
        clock.now = 1000.0 + t
        if f.filter(_rec("commit failed: %s", "timeout")):
            shown.append(t)
    assert shown == [0, 12, 24]


def test_records_with_other_args_or_another_template_all_get_through(clock: Clock) -> None:
    f = RepeatFilter(10.0)
    assert f.filter(_rec("topic %s not found", "a"))
    assert f.filter(_rec("topic %s not found", "b"))
    assert f.filter(_rec("topic %s gone", "a"))
    assert not f.filter(_rec("topic %s not found", "a"))
    assert not f.filter(_rec("topic %s not found", "b"))


def test_without_folding_numbers_in_the_args_make_records_distinct(clock: Clock) -> None:
    f = RepeatFilter(10.0)
    assert f.filter(_rec("retry in %d ms", 100))
    assert f.filter(_rec("retry in %d ms", 200))


def test_folding_numbers_merges_lines_that_differ_only_in_their_numbers(clock: Clock) -> None:
    """librdkafka's lines carry counters and timings in the text itself."""
    f = RepeatFilter(10.0, fold_numbers=True)
    assert f.filter(_rec("%s", "10.0.0.1:9092/1: Connect failed after 12 ms (1 attempts)"))
    assert not f.filter(_rec("%s", "10.0.0.1:9092/1: Connect failed after 345 ms (2 attempts)"))
    assert not f.filter(_rec("10.0.0.%d:9092/1: Connect failed after %d ms (%d attempts)", 1, 7, 3))
    assert f.filter(_rec("%s", "10.0.0.1:9092/1: Disconnected after 12 ms"))


@pytest.mark.parametrize(
    ("level", "shown"),
    [
        (logging.DEBUG, logging.DEBUG),
        (logging.WARNING, logging.WARNING),
        (logging.ERROR, logging.WARNING),
        (logging.CRITICAL, logging.WARNING),
    ],
)
def test_max_level_caps_a_librarys_level_and_leaves_lower_ones(
    clock: Clock, level: int, shown: int
) -> None:
    record = _rec("Connect to ipv4#127.0.0.1:%d failed", 9092, level=level)
    assert RepeatFilter(10.0, max_level=logging.WARNING).filter(record)
    assert (record.levelno, record.levelname) == (shown, logging.getLevelName(shown))


def test_a_record_capped_below_warning_is_never_dropped(clock: Clock) -> None:
    f = RepeatFilter(10.0, max_level=logging.INFO)
    records = [_rec("broker down", level=logging.ERROR) for _ in range(3)]
    assert all(f.filter(r) for r in records)
    assert {r.levelname for r in records} == {"INFO"}


def test_a_zero_window_lets_every_repeat_through(clock: Clock) -> None:
    f = RepeatFilter(0.0)
    assert all(f.filter(_rec("same")) for _ in range(3))


def test_the_memory_of_seen_lines_stays_bounded(clock: Clock) -> None:
    f = RepeatFilter(10.0)
    for i in range(5000):
        assert f.filter(_rec("distinct %d", i))
    assert len(f._seen) <= 1001


def test_quiet_installs_one_filter_on_the_named_logger_with_its_options() -> None:
    logger = logging.getLogger(f"kafka.test.{uuid.uuid4().hex[:8]}")
    try:
        quiet(logger.name, every_seconds=3.0, fold_numbers=True, max_level=logging.WARNING)
        quiet(logger.name)
        installed = [f for f in logger.filters if isinstance(f, RepeatFilter)]
        assert len(installed) == 1
        f = installed[0]
        assert (f.every_seconds, f.fold_numbers, f.max_level) == (3.0, True, logging.WARNING)
        assert not any(isinstance(f, RepeatFilter) for f in logging.getLogger("kafka").filters)
    finally:
        logger.filters.clear()


def test_on_a_logger_it_drops_repeats_before_any_handler(clock: Clock) -> None:
    logger = logging.getLogger(f"kafka.test.{uuid.uuid4().hex[:8]}")
    seen: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: seen.append(record.getMessage())  # type: ignore[method-assign]
    logger.addHandler(handler)
    logger.propagate = False
    logger.setLevel(logging.DEBUG)
    try:
        quiet(logger.name)
        for _ in range(3):
            logger.error("Topic %s not found in cluster metadata", "t")
        logger.error("Topic %s not found in cluster metadata", "u")
        logger.info("fetching %s", "t")
        logger.info("fetching %s", "t")
        assert seen == [
            "Topic t not found in cluster metadata",
            "Topic u not found in cluster metadata",
            "fetching t",
            "fetching t",
        ]
    finally:
        logger.filters.clear()
        logger.removeHandler(handler)
