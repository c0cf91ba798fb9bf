"""The errors of the input path above the consumers: the tf.data pipeline and the reject
breaker."""

from __future__ import annotations

from consumers.errors import StreamerError

__all__ = ["PipelineError", "RejectLimitError"]


class PipelineError(StreamerError):
    """The input pipeline (tf.data) failed for a reason no shard reported."""

    def __init__(self, what: str, detail: str) -> None:
        self.what = what
        super().__init__(f"{what} failed: {detail}")


class RejectLimitError(StreamerError):
    """Too large a share of the latest records was rejected by the decoder: a wrong schema or a
    bad producer deploy. The worker stops without committing past them."""

    exit_code = 4

    def __init__(self, summary: str, example: str, held: dict[int, int]) -> None:
        self.held = dict(held)
        where = ", ".join(f"partition {p} from offset {o}" for p, o in sorted(held.items()))
        super().__init__(
            f"stopped by the reject breaker: {summary} (for example: {example}); nothing was "
            f"committed past them ({where or 'none held'}). Fix the schema (--schema) or the "
            "producer and restart: the worker decodes them again. A topic that really holds "
            "that many bad records: raise --max-reject-fraction (1 turns the breaker off)"
        )
