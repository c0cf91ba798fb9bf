"""``streamer.Stream``: the stream as a library -- a team's own ``model.fit`` (or training loop)
reads our shards, and its offsets are committed only after Keras trained their records.

The third face of the run machinery (``streamer.parts``): the same lease, metrics, topic wait,
checkpoint position, source, decode map, offset tracker, audit log and commit sequence
(``Committer``) as ``streamer run``; what differs is who steps. Here Keras does, and tells us
through a callback which batches it trained: the dataset's last stage notes each batch's
records in the order Keras takes them (``_Ledger``), and a batch trained is the next one
noted, so prefetching, ``steps_per_execution`` and Keras' own look-ahead are handled; a
record read and not trained is never committed.

>>> import keras, streamer                                                 # doctest: +SKIP
>>> with streamer.Stream(bootstrap="localhost:9092", topic="samples") as stream:  # doctest: +SKIP
...     model = build(stream.schema)          # your compiled model
...     model.fit(stream.dataset(), steps_per_epoch=1000, epochs=10,
...               callbacks=[stream.callback()])

Each ``fit`` (and each ``batches()`` loop) is one pass of the worker: its shards join the
group as its iterator starts and leave it, after the final checkpoint or commit, as it ends.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import logging
import os
import threading
import time
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from consumers.errors import ConfigError
from consumers.settings import Secret
from streamer.config import WorkerConfig, load_config
from streamer.config.loading import unknown_name
from streamer.config.options import OPTIONS
from streamer.decode.schema import Schema
from streamer.ops.health import Health

if TYPE_CHECKING:
    import keras
    import tensorflow as tf

    from streamer.committer import Committer
    from streamer.ops.health import MetricsServer
    from streamer.ops.metrics import Metrics
    from streamer.parts import StreamInput
    from streamer.train.checkpoint import Checkpointer, CheckpointPosition
    from streamer.train.lease import Lease

__all__ = ["Batch", "Stream"]

log = logging.getLogger(__name__)

_OPTION_NAMES = frozenset(o.name for o in OPTIONS)
_DEFAULTS = {o.name: o.default for o in OPTIONS}

#: Options of ``streamer run`` that belong to the training loop, which is the user's here:
#: what to use instead. Given to a ``Stream`` (a keyword, the file or a STREAMER_* variable)
#: they are a ConfigError, not silently ignored.
LOOP_OPTIONS: dict[str, str] = {
    "model": "build and compile your own model and give it to model.fit",
    "learning_rate": "your optimizer's learning_rate",
    "max_steps": "model.fit(steps_per_epoch=..., epochs=...)",
    "steps_per_execution": "model.compile(steps_per_execution=...)",
    "jit_compile": "model.compile(jit_compile=...)",
    "mixed_precision": 'keras.mixed_precision.set_global_policy("mixed_float16")',
    "seed": "keras.utils.set_random_seed(...)",
    "max_nonfinite_steps": "keras.callbacks.TerminateOnNaN()",
    "stop_after_idle": "idle_timeout (the dataset ends after that many idle seconds)",
    "pass_records": "model.fit(steps_per_epoch=...): a fit is one pass",
    "pass_seconds": "model.fit(steps_per_epoch=...): a fit is one pass",
    "eval_topic": "model.fit(validation_data=...) with a dataset of your own",
    "eval_every_steps": "model.fit(validation_freq=...)",
    "eval_every_seconds": "model.fit(validation_freq=...)",
    "eval_records": "model.fit(validation_steps=...)",
    "logdir": "keras.callbacks.TensorBoard(...)",
    "profile_steps": "keras.callbacks.TensorBoard(profile_batch=...)",
    "export_dir": "model.export(...) in a callback of your own",
    "export_every_steps": "model.export(...) in a callback of your own",
    "export_keep": "model.export(...) in a callback of your own",
    "status_interval": "Keras' progress bar: model.fit(verbose=...)",
    "shutdown_timeout": "your script's own signal handling (a Stream installs none)",
    "log_level": 'logging.getLogger("streamer").setLevel(...) (a library configures no logging)',
    "log_format": "logging.basicConfig(...) (a library configures no logging)",
    "cluster_workers": "one Stream per process; several workers: streamer launch",
    "worker_index": "one Stream per process; several workers: streamer launch",
    "pad_after_seconds": "one Stream per process; several workers: streamer launch",
    "peer_stop_exit_code": "one Stream per process; several workers: streamer launch",
}

#: Secrets are never flags; a Stream takes them as keywords (or the worker's variables).
_SECRETS = {
    "sasl_password": "STREAMER_SASL_PASSWORD",
    "ssl_password": "STREAMER_SSL_PASSWORD",
}


@dataclasses.dataclass(frozen=True, slots=True)
class Batch:
    """One batch of a custom training loop (``Stream.batches()``): Keras' ``(x, y,
    sample_weight)`` and the records it holds. Give it back to ``Stream.trained`` once the
    model has trained on it.

    ``x``: the input features by name; ``y``: the label (a dict by name for several);
    ``sample_weight``: the schema's weight column, or None; ``partition``, ``offset``,
    ``timestamp``: one entry per row (numpy); ``input_wait_seconds``: how long the loop waited
    for it."""

    x: dict[str, Any]
    y: Any
    sample_weight: Any
    partition: np.ndarray
    offset: np.ndarray
    timestamp: np.ndarray
    #: Seconds the loop waited for this batch (``streamer_input_wait_seconds``).
    input_wait_seconds: float = 0.0

    def __len__(self) -> int:
        return len(self.offset)

    @property
    def data(self) -> tuple[Any, ...]:
        """``(x, y)`` or ``(x, y, sample_weight)``: what ``model.train_on_batch(*data)`` takes."""
        if self.sample_weight is None:
            return self.x, self.y
        return self.x, self.y, self.sample_weight


@dataclasses.dataclass(frozen=True, slots=True)
class _Noted:
    """A batch as it left the dataset for the trainer: its records, and when (``perf_counter``
    seconds: the end of the trainer's wait for it)."""

    partition: np.ndarray
    offset: np.ndarray
    timestamp: np.ndarray
    taken_at: float = 0.0


class _Ledger:
    """The records of each batch, in the order the trainer takes the batches: the dataset's
    last stage appends (``push``, on a tf.data thread), the callback takes the oldest ones
    as Keras reports them trained (``take``). Only while a pass trains (``open``): batches
    taken before (Keras' symbolic build) or without the callback are not noted, so nothing
    piles up. Thread-safe.

    >>> ledger = _Ledger(); ledger.open()
    >>> for first in (0, 2, 4):
    ...     _ = ledger.push(np.zeros(2, np.int32), np.arange(first, first + 2), np.zeros(2))
    >>> [b.offset.tolist() for b in ledger.take(2)], len(ledger)
    ([[0, 1], [2, 3]], 1)
    >>> ledger.close()     # the one batch noted and not trained
    1
    >>> _ = ledger.push(np.zeros(1), np.zeros(1), np.zeros(1)); len(ledger)
    0
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._open = False
        self._batches: collections.deque[_Noted] = collections.deque()

    def open(self) -> None:
        """A pass trains: note every batch from now on (none before)."""
        with self._lock:
            self._batches.clear()
            self._open = True

    def close(self) -> int:
        """The pass ended: note nothing more; how many batches noted were not trained."""
        with self._lock:
            n = len(self._batches)
            self._batches.clear()
            self._open = False
        return n

    def push(self, partition: np.ndarray, offset: np.ndarray, timestamp: np.ndarray) -> np.int64:
        with self._lock:
            if self._open:
                self._batches.append(_Noted(partition, offset, timestamp, time.perf_counter()))
        return np.int64(len(offset))

    def take(self, n: int) -> list[_Noted]:
        """The ``n`` oldest batches (fewer if fewer were taken: a bug, logged)."""
        with self._lock:
            k = min(n, len(self._batches))
            out = [self._batches.popleft() for _ in range(k)]
        if k < n:  # the data ended inside a call of several steps: Keras counts them all
            log.debug("Keras reported %d steps done, %d batches had left the dataset", n, k)
        return out

    def __len__(self) -> int:
        with self._lock:
            return len(self._batches)


class Stream:
    """A Kafka topic (or the built-in simulator) as a ``tf.data`` stream for your own
    ``model.fit`` or training loop, with offsets committed only after training.

    Settings are those of ``streamer run``, by their option names (``streamer run --help``;
    ``--checkpoint-dir`` is ``checkpoint_dir``), with the same precedence and validation:
    defaults < the TOML file (``config=``, or ``Stream.from_config``) < ``STREAMER_*``
    variables < keywords. ``schema`` may also be a ``streamer.Schema``; without
    ``bootstrap`` the built-in simulator feeds the stream. ``metrics_port`` serves the
    worker's Prometheus metrics when given (none by default). ``idle_timeout``, when given,
    ends the dataset after that many seconds without a record (default: endless).
    ``sasl_password`` / ``ssl_password`` are taken as keywords too (or the worker's
    ``STREAMER_*_PASSWORD(_FILE)`` variables); they never appear in logs or errors.

    The stream starts where the newest checkpoint of ``checkpoint_dir`` says (else at the
    group's commits, or ``start_from``). A bad setting raises ``ConfigError`` naming it; a
    missing broker ``BrokerUnavailableError`` after ``broker_wait_seconds``.

    >>> stream = Stream(bootstrap="localhost:9092", topic="samples", group="trainer",  # doctest: +SKIP
    ...                 checkpoint_dir="ckpt", shards=4, batch_size=256)
    >>> model.fit(stream.dataset(), steps_per_epoch=1000, callbacks=[stream.callback()])  # doctest: +SKIP
    >>> stream.close()                                                         # doctest: +SKIP
    """

    def __init__(self, *, env: Mapping[str, str] | None = None, **settings: Any) -> None:
        """``env``: the environment to read ``STREAMER_*`` variables from (default:
        ``os.environ``); ``settings``: options by name (see the class)."""
        settings = dict(settings)
        env = dict(os.environ if env is None else env)
        for name, var in _SECRETS.items():
            secret = settings.pop(name, None)
            if secret is not None:
                env[var] = secret.get() if isinstance(secret, Secret) else str(secret)
        given: Schema | None = None
        schema = settings.get("schema")
        if isinstance(schema, Schema):
            given = settings.pop("schema")
        elif schema is not None:
            settings["schema"] = os.fspath(schema)
        for name in settings:
            if name != "config" and name not in _OPTION_NAMES:
                if any(w in name.lower() for w in ("pas", "pwd", "secret")):  # never its value
                    raise ConfigError(
                        name,
                        "(set)",
                        "unknown setting of streamer.Stream; passwords are sasl_password= and "
                        "ssl_password= (or STREAMER_SASL_PASSWORD / STREAMER_SSL_PASSWORD)",
                    )
                raise unknown_name(name, sorted(_OPTION_NAMES), "setting of streamer.Stream")
        sources: dict[str, str] = {}
        config = load_config(settings, env, sources=sources, own_model=True)
        ignored: dict[str, Any] = {}
        for name, instead in LOOP_OPTIONS.items():
            came = sources.get(name, "default")
            if came == "default":
                continue
            why = f"a setting of streamer run's own training loop; with your model: {instead}"
            if came.startswith("STREAMER_"):  # the worker's environment, beside a script
                log.warning("%s ignored: %s", came, why)
                ignored[name] = _DEFAULTS[name]
                continue
            raise ConfigError(name, getattr(config, name), why)
        if config.replay is not None:  # pragma: no cover - load_config sets none here
            raise ConfigError("replay", "(set)", "streamer replay is a command, not a Stream")
        changes: dict[str, Any] = dict(ignored)
        if sources.get("metrics_port") == "default":
            changes["metrics_port"] = 0  # a library serves nothing unless asked
        if sources.get("idle_timeout") == "default":
            changes["idle_timeout"] = float("inf")  # endless: fit's steps say how long
        self.config: WorkerConfig = dataclasses.replace(config, **changes)
        self._given_schema = given
        self.health = Health(self.config.stall_timeout)
        self._closed = False
        self._stop = threading.Event()
        self._build()

    @classmethod
    def from_config(cls, path: str | os.PathLike[str], **settings: Any) -> Stream:
        """A Stream of the TOML file at ``path`` (``streamer run --config``'s format), with
        ``settings`` (and ``STREAMER_*`` variables) over it."""
        return cls(config=os.fspath(path), **settings)

    # ---- the parts ----------------------------------------------------------------------------

    def _build(self) -> None:
        """The input parts, built as the worker builds them (``streamer.parts``); the model's
        side (checkpointer, restore) waits for the model (``_bind``)."""
        from streamer.parts import (
            LocalPlan,
            build_input,
            choose_decoder,
            find_topic,
            new_committer,
            new_metrics,
            serve_metrics,
        )

        cfg = self.config
        with contextlib.ExitStack() as opened:
            self._lease: Lease | None = None
            if cfg.checkpoint_dir:
                from streamer.train.lease import Lease

                self._lease = Lease.acquire(cfg.checkpoint_dir)
                opened.callback(self._lease.close)
            self.metrics: Metrics = new_metrics(cfg)
            self._server: MetricsServer | None = serve_metrics(cfg, self.metrics, self.health)
            if self._server is not None:
                opened.callback(self._server.close)
            schema = self._given_schema or cfg.load_schema()
            if self._given_schema is not None and cfg.sample_weight is not None:
                schema = schema.with_weight(cfg.sample_weight)
            if not schema.labels:
                raise ConfigError("schema", "label", "training needs a schema with a label feature")
            self.schema: Schema = schema
            self.decoder = choose_decoder(cfg, schema)
            plan = LocalPlan()
            cfg, topic = find_topic(cfg, plan, health=self.health, stop=self._stop)
            self.config = cfg
            self._topic = topic
            self._position: CheckpointPosition | None = None
            if cfg.checkpoint_dir:
                from streamer.train.checkpoint import read_position

                self._position = read_position(cfg.checkpoint_dir, cfg.topic, topic.topic_id)
            offsets = self._position.offsets if self._position is not None else {}
            self._input: StreamInput = build_input(
                cfg,
                plan,
                schema,
                topic,
                offsets,
                metrics=self.metrics,
                health=self.health,
                opened=opened,
            )
            #: The training steps done with this stream's model (the checkpoint's, restored).
            self.step = self._position.step if self._position is not None else 0
            save = self._save if cfg.checkpoint_dir else None
            self.committer: Committer = new_committer(
                cfg,
                self._input,
                self.metrics,
                step=self.step,
                save=save,
                failure_cause=lambda: self._checkpointer.last_error if self._checkpointer else "",
            )
            opened.pop_all()
        self._ledger = _Ledger()
        self._model: keras.Model | None = None
        self._checkpointer: Checkpointer | None = None
        self._training = False
        self._keras: dict[tuple[str, ...] | None, tf.data.Dataset] = {}
        where = "the simulator" if cfg.bootstrap is None else f"{cfg.topic} at {cfg.bootstrap}"
        log.info(
            "stream of %s: group=%s shards=%d batch_size=%d decoder=%s checkpoint_dir=%s%s",
            where,
            cfg.group,
            cfg.shards,
            cfg.batch_size,
            self.decoder,
            cfg.checkpoint_dir,
            f", from checkpoint {self._position.path} (step {self.step})"
            if self._position is not None
            else "",
        )

    def position(self) -> dict[int, int]:
        """Where the model is in each partition it knows: the next offset after what it
        trained (what a checkpoint written now would hold)."""
        inp = self._input
        return inp.position.current(inp.tracker.commit_points())

    @property
    def metrics_port(self) -> int | None:
        """The port /metrics is served on (None: not served)."""
        return self._server.port if self._server is not None else None

    # ---- what Keras reads -----------------------------------------------------------------------

    def _columns(self, model: keras.Model | None) -> tuple[str, ...]:
        """The input columns: those ``model`` declares (a functional model of dict inputs takes
        exactly its own), else every input feature of the schema."""
        if model is None:
            return self.schema.input_columns
        from streamer.train.model import bundle_for

        return bundle_for(model, self.schema, "the model given to Stream.dataset").input_names

    def _split(self, batch: Mapping[str, Any], inputs: tuple[str, ...]) -> tuple[Any, ...]:
        schema = self.schema
        x = {n: batch[n] for n in inputs}
        labels = schema.labels
        y = batch[labels[0]] if len(labels) == 1 else {n: batch[n] for n in labels}
        if schema.weight:
            return x, y, batch[schema.weight]
        return x, y

    def dataset(self, model: keras.Model | None = None) -> tf.data.Dataset:
        """An endless ``tf.data.Dataset`` of ``(features, label)`` batches, or ``(features,
        label, sample_weight)`` with the schema's weight column, as ``model.fit`` takes them:
        the worker's shards, interleaved ``from_generator`` sources and parallel decode map.

        ``features`` is a dict of every input feature of the schema, or, with ``model``,
        exactly the inputs that model declares. Each iteration (each ``fit``) is one pass:
        its shards join the group as it starts. Train it with ``callbacks=[stream.callback()]``:
        without the callback nothing is committed. One iteration at a time: a second one while
        a fit trains on it (``validation_data=stream.dataset()``) is refused. A pass left open
        by a fit that raised ends here (what it trained is committed).
        """
        import tensorflow as tf

        if self._training:
            # A fit that raised never reached its train end: its pass ends here (what it
            # trained is committed), so the next fit's iterators are not a second iteration.
            self._end()
        inputs = self._columns(model)
        key = inputs
        if key not in self._keras:
            from streamer.decode.columns import METADATA_COLUMNS

            ledger = self._ledger

            def to_keras(batch: dict[str, Any]) -> tuple[Any, ...]:
                meta = [batch[k] for k in METADATA_COLUMNS]
                noted = tf.numpy_function(
                    ledger.push, meta, tf.int64, stateful=True, name="streamer_ledger"
                )
                with tf.control_dependencies([noted]):
                    return tuple(
                        tf.nest.map_structure(tf.identity, part)
                        for part in self._split(batch, inputs)
                    )

            # The batch leaves our pipeline as the trainer takes it (no buffer after the
            # hand-over stage): the ledger's order is the order Keras trains.
            self._keras[key] = self._input.dataset.map(to_keras)
        return self._keras[key]

    def callback(self) -> keras.callbacks.Callback:
        """A Keras callback for ``model.fit(stream.dataset(), callbacks=[...])``: on train
        begin it restores the checkpoint (model, optimizer; the stream already starts at its
        offsets) and begins a pass; each batch Keras reports trained has its records
        acknowledged (in batch order: prefetched and not trained is never committed); it
        checkpoints and commits on the worker's schedule (``checkpoint_every_*``, or
        ``commit_every_*`` without a checkpoint directory) and at train end, and keeps the
        worker's metrics (lag, freshness, samples/s) up to date."""
        from streamer.train.keras_callback import StreamCallback

        return StreamCallback(self)

    # ---- a custom loop --------------------------------------------------------------------------

    def batches(self, model: keras.Model | None = None) -> Iterator[Batch]:
        """The stream's batches for a loop of your own: give each back to ``trained(batch)``
        once the model trained on it (what was not given back is never committed). One
        pass: the shards join the group at the first batch and leave it, after the final
        checkpoint or commit, when the generator ends: exhausted, closed (``close()``, or
        released after a ``break``), or at ``Stream.close()``. A generator: nothing (the
        restore, a missing model's error) happens before its first batch is asked for.

        ``model``: the model being trained (required with ``checkpoint_dir``: the checkpoint
        holds it; it is restored here before the first batch)."""
        from streamer.decode.columns import METADATA_COLUMNS
        from streamer.input.source import end_iterator

        if model is not None or self.config.checkpoint_dir:
            if model is None:
                raise ConfigError(
                    "checkpoint_dir",
                    self.config.checkpoint_dir,
                    "the checkpoint holds the model: give it, stream.batches(model=model)",
                )
            self._bind(model)
        inputs = self._columns(model)
        source = self._input.source
        self._begin()
        iterator = iter(self._input.dataset)
        try:
            while True:
                t0 = time.perf_counter()
                self.health.waiting("trainer", "waiting for input")
                raw = source.next_batch(iterator)
                if raw is None:
                    return
                self.health.beat("trainer")  # the step, from here, must end in stall_timeout
                partition, offset, timestamp = (raw.pop(k).numpy() for k in METADATA_COLUMNS)
                parts = self._split(raw, inputs)
                weight = parts[2] if len(parts) == 3 else None
                waited = time.perf_counter() - t0
                self._last = time.perf_counter()  # the step's time runs from here
                yield Batch(parts[0], parts[1], weight, partition, offset, timestamp, waited)
        finally:
            source.training_over()
            box = [iterator]
            del iterator
            end_iterator(box, source.stop)
            self._end()

    def trained(self, batch: Batch, *, loss: float | None = None) -> None:
        """``batch`` was trained: its records are done (committed with the next commit or
        checkpoint, which may come now). ``loss``: the step's, for ``streamer_model_loss``."""
        noted = _Noted(batch.partition, batch.offset, batch.timestamp)
        self._trained([noted], loss=loss, wait=batch.input_wait_seconds)

    # ---- the pass (shared by the callback and the custom loop) ---------------------------------

    def _bind(self, model: keras.Model) -> None:
        """The model this stream trains: with a checkpoint directory, its checkpointer, and
        the checkpoint restored into it (once: a second fit goes on from where it is)."""
        if self._model is model:
            return
        if self._model is not None:
            raise ConfigError(
                "model",
                getattr(model, "name", "?"),
                "a Stream trains one model (its checkpoints and position are that model's): "
                "a Stream per model",
            )
        cfg = self.config
        if not cfg.checkpoint_dir:
            self._model = model
            return
        import keras

        if keras.backend.backend() != "tensorflow":
            raise ConfigError(
                "checkpoint_dir",
                cfg.checkpoint_dir,
                f"checkpoints are TensorFlow checkpoints; Keras runs on {keras.backend.backend()} "
                "here: leave checkpoint_dir unset (commits alone still follow training) or use "
                "KERAS_BACKEND=tensorflow",
            )
        from streamer.train.checkpoint import Checkpointer
        from streamer.train.model import ModelBundle

        if getattr(model, "optimizer", None) is None:
            raise ConfigError("model", model.name, "compile the model before fit")
        if not model.built:
            raise ConfigError(
                "model",
                model.name,
                "the model has no weights yet: build it (a functional model, or call it on a "
                "batch) before fit, so the checkpoint can be restored into it",
            )
        with model.distribute_strategy.scope():
            if not model.optimizer.built:
                model.optimizer.build(model.trainable_variables)
        schema = self.schema
        bundle = ModelBundle(model, schema.input_columns, schema.labels, schema.weight)
        checkpointer = Checkpointer(
            cfg.checkpoint_dir, bundle, topic=cfg.topic, keep=cfg.checkpoint_keep
        )
        step = self.step
        if self._position is not None:
            step, _ = checkpointer.restore_path(self._position.path)
        if cfg.bootstrap is not None:  # after the restore: it compares the restored topic id
            checkpointer.adopt_topic_id(self._topic.topic_id)
        # Bound only now: a model refused above may be fixed and given again.
        self._model, self._checkpointer, self.step = model, checkpointer, step

    def _begin(self) -> None:
        """A pass begins (a fit's train begin, a loop's first batch): shards of an iterator
        abandoned before it (Keras' symbolic build takes one batch from an iterator of its
        own) leave the group, their records are read again, and training is on."""
        if self._training:  # the last fit ended without its train end (an exception)
            self._end()
        source = self._input.source
        if source.open_shards:
            source.stop()
            source.end_pass()
            log.debug("closed the shards of an iterator abandoned before training")
        self._ledger.open()
        source.resume()
        source.begin_pass()
        source.exclusive_pass = True  # a second iterator now would mix into the ledger
        self._training = True
        self._last = time.perf_counter()
        self.health.beat("trainer")
        self.health.set_ready(True, "training")

    def _trained(
        self,
        batches: list[_Noted],
        *,
        loss: float | None,
        began: float | None = None,
        wait: float | None = None,
    ) -> None:
        """These batches were trained (one step each) in a call that began at ``began``
        (``perf_counter``; default: the end of the last one): their records are done; the
        commit or checkpoint schedule goes on. ``wait``: the input wait of a single step, where
        known (several steps of one call: not known, not observed)."""
        if not batches:
            return
        inp = self._input
        now = time.perf_counter()
        seconds = now - (self._last if began is None else began)
        self._last = now
        partition = np.concatenate([b.partition for b in batches])
        offset = np.concatenate([b.offset for b in batches])
        timestamp = np.concatenate([b.timestamp for b in batches])
        if inp.audit is not None:
            inp.audit.add(partition, offset)  # before the tracker: never behind a commit
        inp.tracker.ack(partition, offset)
        per = seconds / len(batches)
        if len(batches) > 1:
            wait = None
        elif wait is None and began is not None:
            # Keras takes a step's batch as the step begins (TensorFlow) or before it (a
            # look-ahead): the wait is from the step's start until the batch left the dataset.
            wait = max(0.0, batches[0].taken_at - began)
        for b in batches:
            self.metrics.observe_step(len(b.offset), per, wait, loss)
        self.metrics.observe_trained(partition, offset, timestamp, time.time())
        self.health.beat("trainer")
        self.step += len(batches)
        self.committer.after_step(self.step)

    def _end(self) -> None:
        """The pass ends (train end, the loop's end): the final checkpoint (if the model
        moved) or commit of what was trained, then the shards leave the group (their commits
        sent first); the stream is ready for the next pass."""
        if not self._training:
            return
        self._training = False
        self._input.source.exclusive_pass = False
        left = self._ledger.close()
        if left:
            log.debug("%d batches taken and not trained: read again by the next pass", left)
        source = self._input.source
        source.training_over()
        committer = self.committer
        try:
            if source.reject_limit is None:
                source.settle_rejects()  # the pass's rejects are judged: commit past them
            checkpoints = committer.checkpoints
            if checkpoints is not None and self._checkpointer is not None:
                if self.step != checkpoints.last_step:
                    committer.checkpoint(self.step)
            elif checkpoints is None:
                committer.commit(committer.done_points(), self.step)
        finally:
            source.stop()
            source.end_pass()
            source.resume()
            # Between passes the script does what it likes (an evaluation, an export) for as
            # long as it likes: nothing is watched, so /healthz stays 200; not ready.
            for component in ("trainer", "poller"):
                self.health.unregister(component)
            self.health.set_ready(False, "between passes")
        if source.reject_limit is not None:
            raise source.reject_limit  # after a commit that stays below the rejects

    def _save(self, step: int, positions: dict[int, int]) -> dict[int, int] | None:
        """The committer's save: one checkpoint of the bound model at ``positions``; what it
        saved is committed (None: it failed, nothing is committed)."""
        checkpointer = self._checkpointer
        if checkpointer is None:
            log.warning("no checkpoint at step %d: no model was bound yet", step)
            return None
        if self._lease is not None:
            self._lease.check()
        return None if checkpointer.save_logged(step, positions) is None else positions

    # ---- closing ------------------------------------------------------------------------------

    def close(self) -> None:
        """End a pass still open (its final checkpoint or commit), close the shards, the
        audit log, the metrics server and release the checkpoint directory. Idempotent."""
        if self._closed:
            return
        self._closed = True
        inp = self._input
        try:
            self._end()
        finally:
            inp.source.stop()
            inp.source.close()
            if inp.audit is not None:
                inp.audit.close()
            if inp.probe is not None:
                inp.probe.close()
            if self._server is not None:
                self._server.close()
            if self._lease is not None:
                self._lease.close()

    def __enter__(self) -> Stream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
