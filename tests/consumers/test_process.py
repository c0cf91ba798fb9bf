"""consumers.process, pure parts (no Kafka): a shard child's log forwarding."""

from __future__ import annotations

import logging

import pytest

from consumers.process import _ForwardLogs


def test_a_child_whose_parent_is_gone_drops_its_records_quietly(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A worker killed with -9 leaves its shard children closing their shards: their records
    have nowhere to go. One broken pipe marks the parent gone; no "--- Logging error ---"
    traceback per record on stderr, and nothing more is tried."""
    sent: list[object] = []
    broken = [True]

    def send(item: object) -> None:
        if broken[0]:
            raise BrokenPipeError(32, "Broken pipe")
        sent.append(item)

    handler = _ForwardLogs(send)
    logger = logging.getLogger("tests.forward-logs")
    logger.propagate = False
    logger.addHandler(handler)
    try:
        logger.warning("shard 0: final commit failed")
        broken[0] = False  # even if a send would work again, the parent is known gone
        logger.warning("shard 0: closed")
    finally:
        logger.removeHandler(handler)
    assert handler.parent_gone and sent == []
    assert "Logging error" not in capsys.readouterr().err


def test_a_record_that_cannot_be_sent_for_another_reason_is_reported(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Only a gone parent is quiet: any other failure is logging's own error report."""

    def send(item: object) -> None:
        raise TypeError("not picklable")

    handler = _ForwardLogs(send)
    logger = logging.getLogger("tests.forward-logs-other")
    logger.propagate = False
    logger.addHandler(handler)
    try:
        logger.warning("hello")
    finally:
        logger.removeHandler(handler)
    assert not handler.parent_gone
    assert "Logging error" in capsys.readouterr().err
