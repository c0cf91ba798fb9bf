"""streamer.train.callbacks: the list both loops call around steps (no TensorFlow, no Kafka)."""

from __future__ import annotations

from typing import Any

from streamer.train.callbacks import Callback, CallbackList, Evaluation, Every, TrainMetricReport


class _Note(Callback):
    def __init__(self, name: str, calls: list[str]) -> None:
        self.name, self.calls = name, calls

    def on_train_batch_begin(self, step: int, logs: Any = None) -> None:
        self.calls.append(f"{self.name}.begin{step}")

    def on_train_batch_end(self, step: int, logs: Any = None) -> None:
        self.calls.append(f"{self.name}.end{step}")

    def on_pass_end(self, step: int, logs: Any = None) -> None:
        self.calls.append(f"{self.name}.pass{step}")

    def on_train_end(self, logs: Any = None) -> None:
        self.calls.append(f"{self.name}.train_end")


def test_the_list_calls_every_callback_in_order_and_leaves_out_parts_not_built() -> None:
    calls: list[str] = []
    callbacks = CallbackList([_Note("a", calls), None])
    callbacks.append(_Note("b", calls))
    callbacks.on_train_batch_begin(0)
    callbacks.on_train_batch_end(1)
    callbacks.on_pass_end(1)
    callbacks.on_train_end()
    assert calls == [
        "a.begin0",
        "b.begin0",
        "a.end1",
        "b.end1",
        "a.pass1",
        "b.pass1",
        "a.train_end",
        "b.train_end",
    ]


def test_every_acts_once_when_a_call_of_several_steps_crosses_a_multiple() -> None:
    done: list[int] = []
    every = Every(10, done.append)
    every.on_train_batch_end(8, {"steps": 8})
    every.on_train_batch_end(16, {"steps": 8})  # crossed 10
    every.on_train_batch_end(24, {"steps": 8})  # crossed 20
    every.on_train_batch_end(25, {"steps": 1})
    every.on_train_batch_end(30, {"steps": 5})  # reached 30
    assert done == [16, 24, 30]


def test_evaluation_runs_every_n_steps_or_seconds_once_a_step_and_closes_at_the_end() -> None:
    """--eval-every-steps, or --eval-every-seconds counted from the first step and then from
    the end of the last evaluation; never twice at one step; the report window ends first."""
    from streamer.ops.metrics import Metrics
    from streamer.train.evaluate import EvalResult

    now = [0.0]
    runs: list[float] = []
    reports: list[int] = []

    class Held:
        def evaluate(self) -> EvalResult:
            runs.append(now[0])
            now[0] += 5.0  # an evaluation takes 5 s
            return EvalResult(loss=0.5, metrics={"mae": 0.25}, records=10)

        def close(self) -> None:
            runs.append(-1.0)

    metrics = Metrics("t", version="0", tensorflow_version="0", kafka_python_version="0")
    report = TrainMetricReport(60, lambda: {}, clock=lambda: now[0])
    report.report = reports.append  # type: ignore[method-assign]
    cb = Evaluation(
        Held(),  # type: ignore[arg-type]
        every_steps=100,
        every_seconds=10.0,
        metrics=metrics,
        reports=report,
        clock=lambda: now[0],
    )
    cb.on_train_batch_end(1)  # the clock starts at the first step
    now[0] = 9.0
    cb.on_train_batch_end(2)
    assert runs == []
    now[0] = 10.0
    cb.on_train_batch_end(3)  # 10 s after the first step
    cb.on_train_batch_end(3)  # the same step again: not twice
    assert runs == [10.0] and reports == [3]
    now[0] = 24.0  # 9 s after the evaluation ended (15 s)
    cb.on_train_batch_end(4)
    assert runs == [10.0]
    cb.on_train_batch_end(100)  # every 100 steps, whatever the clock
    assert runs == [10.0, 24.0]
    registry = metrics.registry
    assert registry.get_sample_value("streamer_eval_loss") == 0.5
    assert registry.get_sample_value("streamer_eval_metric", {"metric": "mae"}) == 0.25
    cb.on_train_end()
    assert runs[-1] == -1.0


def test_a_clusters_report_waits_for_the_agreed_round_and_an_empty_window_reads_nothing() -> None:
    """``automatic=False``: the window only says it is due (the chief's vote); ``report`` is
    what every worker calls at the agreed round. A window without a step reads nothing (Keras'
    metrics read 0 after a reset: a false figure)."""
    now = [0.0]
    reads: list[int] = []
    published: list[dict[str, float]] = []

    def read() -> dict[str, float]:
        reads.append(1)
        return {"mae": 0.25}

    r = TrainMetricReport(5, read, publish=published.append, automatic=False, clock=lambda: now[0])
    r.report(0)
    assert reads == [] and not r.due()
    r.on_train_batch_end(1, {"steps": 1})
    assert not r.due()
    now[0] = 5.0
    assert r.due()
    r.on_train_batch_end(2, {"steps": 1})  # due, but not automatic: no read here
    assert reads == []
    r.report(2)
    assert reads == [1] and published == [{"mae": 0.25}] and not r.due()
