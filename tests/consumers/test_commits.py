"""CommitBook: a failed commit is asked for again after a backoff (issue 24: a checkpoint's
commit that met a coordinator moving to another broker was lost, and the next pass started
from the older commit)."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from consumers.commits import CommitBook
from consumers.hooks import ShardHooks


class _Client:
    """Answers commits with ``errors`` in turn (None: success), through the callback or by
    raising, as a client adapter does."""

    def __init__(self, *errors: BaseException | None) -> None:
        self.errors = list(errors)
        self.sent: list[dict[int, int]] = []

    def commit(
        self, offsets: dict[int, int], *, callback: Any = None, timeout_ms: int | None = None
    ) -> None:
        self.sent.append(dict(offsets))
        error = self.errors.pop(0) if self.errors else None
        if callback is not None:
            callback(offsets, error)
        elif error is not None:
            raise error


class NotCoordinatorError(Exception):
    pass


def _book() -> CommitBook:
    return CommitBook(0, ShardHooks(), threading.RLock(), owned=lambda: {0, 1})


def test_a_failed_async_commit_is_asked_for_again_after_a_backoff() -> None:
    book = _book()
    client = _Client(NotCoordinatorError(), None)
    book.request({0: 10, 1: 5})
    book.send(client, book.take(), sync=False)  # type: ignore[arg-type]
    assert book.committed(0) is None
    assert book.take() == {}, "no resend before the backoff"
    time.sleep(0.6)
    again = book.take()
    assert again == {0: 10, 1: 5}
    book.send(client, again, sync=False)  # type: ignore[arg-type]
    assert (book.committed(0), book.committed(1)) == (10, 5)
    book.request({0: 11})
    assert book.take() == {0: 11}, "a success ends the backoff"


def test_a_newer_request_wins_over_the_failed_one_and_a_sync_flush_skips_the_backoff() -> None:
    book = _book()
    client = _Client(NotCoordinatorError())
    book.send(client, {0: 10}, sync=False)  # type: ignore[arg-type]
    book.request({0: 20})
    assert book.take(force=True) == {0: 20}
    with pytest.raises(NotCoordinatorError):
        book.send(_Client(NotCoordinatorError()), {1: 3}, sync=True)  # type: ignore[arg-type]
    assert book.take(force=True) == {1: 3}, "a failed sync commit is asked for again too"


def test_a_failed_commit_of_a_partition_no_longer_owned_is_dropped() -> None:
    owned = {0, 1}
    book = CommitBook(0, ShardHooks(), threading.RLock(), owned=lambda: owned)
    book.send(_Client(NotCoordinatorError()), {0: 10, 1: 4}, sync=False)  # type: ignore[arg-type]
    owned.discard(1)  # revoked meanwhile: the new owner commits it
    assert book.take(force=True) == {0: 10}


class _Silent(_Client):
    """An async commit whose answer never comes (kafka-python closing: the callback is
    never called)."""

    def commit(
        self, offsets: dict[int, int], *, callback: Any = None, timeout_ms: int | None = None
    ) -> None:
        self.sent.append(dict(offsets))
        if callback is None:
            super().commit(offsets, timeout_ms=timeout_ms)


def test_an_unanswered_async_commit_is_sent_again_by_the_closing_sync_flush() -> None:
    book = _book()
    client = _Silent()
    book.request({0: 10, 1: 5})
    book.send(client, book.take(), sync=False)  # type: ignore[arg-type]
    assert book.take() == {}, "in flight: not sent again by the poller"
    book.request({1: 7})
    final = book.take(force=True)
    assert final == {0: 10, 1: 7}
    book.send(client, final, sync=True)  # type: ignore[arg-type]
    assert (book.committed(0), book.committed(1)) == (10, 7)
    assert book.take(force=True) == {}


def test_an_answered_async_commit_is_not_sent_again() -> None:
    book = _book()
    book.send(_Client(None), {0: 10}, sync=False)  # type: ignore[arg-type]
    assert book.take(force=True) == {}
