"""consumers.admin's pure parts: a group call is asked again while the coordinator is not
ready (a fresh broker creating __consumer_offsets answers CoordinatorNotAvailable)."""

from __future__ import annotations

import kafka.errors as kerrors
import pytest

from consumers import admin


def test_a_group_call_is_asked_again_until_the_coordinator_is_ready(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    waits: list[float] = []
    monkeypatch.setattr(admin.time, "sleep", waits.append)
    answers: list[BaseException | str] = [
        kerrors.CoordinatorNotAvailableError("GROUP/trainer"),
        kerrors.CoordinatorLoadInProgressError(),
        "offsets",
    ]

    def call() -> str:
        answer = answers.pop(0)
        if isinstance(answer, BaseException):
            raise answer
        return answer

    assert admin._with_coordinator(call, 10_000) == "offsets"
    assert waits == [0.5, 1.0]


def test_the_last_error_comes_out_when_the_time_is_up(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = [0.0]
    monkeypatch.setattr(admin.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(admin.time, "sleep", lambda s: clock.__setitem__(0, clock[0] + s))
    calls = []

    def call() -> None:
        calls.append(clock[0])
        raise kerrors.CoordinatorNotAvailableError("GROUP/g")

    with pytest.raises(kerrors.CoordinatorNotAvailableError):
        admin._with_coordinator(call, 3_000)
    assert calls == [0.0, 0.5, 1.5]  # a fourth would start past the 3 s


def test_other_errors_are_not_retried() -> None:
    calls = []

    def call() -> None:
        calls.append(1)
        raise kerrors.GroupAuthorizationFailedError()

    with pytest.raises(kerrors.GroupAuthorizationFailedError):
        admin._with_coordinator(call, 10_000)
    assert calls == [1]
