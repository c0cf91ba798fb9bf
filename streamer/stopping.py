"""Why a run stops: a kind the loops decide on, and the words the stop line says.

A stop's reason was once free text that drove control flow (``reason.startswith(...)``); the
kind is what code reads, the text is what an operator reads (``stopped (<text>) at step N``).

>>> StopReason.max_steps(10).kind is StopKind.MAX_STEPS, str(StopReason.max_steps(10))
(True, '--max-steps 10')
>>> str(StopReason.idle(2.5)), str(StopReason.signal("SIGTERM"))
('idle for 2.5s', 'signal SIGTERM')
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

__all__ = ["StopKind", "StopReason"]


class StopKind(enum.Enum):
    """What stopped a run."""

    #: SIGTERM or SIGINT (Kubernetes' stop, Ctrl-C).
    SIGNAL = "signal"
    #: ``--max-steps`` reached.
    MAX_STEPS = "max_steps"
    #: ``--stop-after-idle``: no record came for that long.
    IDLE = "idle"
    #: Every worker's input ran out (a cluster without ``--stop-after-idle``).
    INPUT_ENDED = "input_ended"
    #: A replay trained its range (``streamer replay``).
    REPLAY_TRAINED = "replay_trained"
    #: The reject breaker tripped (too many records rejected).
    REJECT_BREAKER = "reject_breaker"
    #: Another worker of the cluster was stopped, so this one stops with it.
    PEER = "peer"
    #: The code that runs the worker asked (a benchmark, an embedding program).
    REQUESTED = "requested"


@dataclass(frozen=True, slots=True)
class StopReason:
    """A stop's kind and the words the stop line says (``str()``)."""

    kind: StopKind
    text: str

    def __str__(self) -> str:
        return self.text

    @classmethod
    def signal(cls, name: str) -> StopReason:
        return cls(StopKind.SIGNAL, f"signal {name}")

    @classmethod
    def max_steps(cls, steps: int) -> StopReason:
        return cls(StopKind.MAX_STEPS, f"--max-steps {steps}")

    @classmethod
    def idle(cls, seconds: float, more: str = "") -> StopReason:
        """``more``: what the stop line adds (records left elsewhere in the group)."""
        return cls(StopKind.IDLE, f"idle for {seconds:g}s{more}")

    @classmethod
    def input_ended(cls) -> StopReason:
        return cls(StopKind.INPUT_ENDED, "every worker's input ended")

    @classmethod
    def replay_trained(cls) -> StopReason:
        return cls(StopKind.REPLAY_TRAINED, "the replay range is trained")

    @classmethod
    def reject_breaker(cls) -> StopReason:
        return cls(StopKind.REJECT_BREAKER, "the reject breaker tripped")

    @classmethod
    def peer(cls) -> StopReason:
        return cls(StopKind.PEER, "another worker was stopped")

    @classmethod
    def requested(cls, why: str) -> StopReason:
        return cls(StopKind.REQUESTED, why)
