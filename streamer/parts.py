"""Parts: everything a run needs, built once from its configuration, in one order, for every
loop; frozen once built.

``build_parts(config, plan, ...)`` builds, in this order: the checkpoint directory's lease;
the metrics and their server (probes find the worker alive while the rest starts); the
strategy (a cluster's first TensorFlow op), the seed and precision; the schema and decoder;
the model and its step machinery; the topic (waited for) and this worker's partitions; the
checkpointer and what it restores; the dead-letter writer; where the stream starts and its
position; the offset tracker, the source and its dataset; the audit log; the broker probe
for readiness. What differs between a worker of its own and one of a cluster is a ``Plan``:
its strategy, its step, its partitions, its restore, its pipeline. A part the run does not
have (no ``--checkpoint-dir``: no checkpointer) is None, and code that needs it asks
``required(...)``: a typed error (``MissingPartError``), not an assert.

If a step fails (no broker, a bad checkpoint, a signal while waiting), what was opened
before it is closed again (the lease released, the server's port freed), in reverse order.
Anchor: Keras' ``Trainer`` builds its data adapter, its step function and its callbacks
before the loop; tf.distribute's ``Strategy`` decides how, not the loop.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import numpy as np

from consumers import ShardHooks, ShardLike
from consumers.errors import StreamerError
from consumers.settings import ConsumerSettings
from streamer.committer import CommitSchedule, Committer, Save
from streamer.config import WorkerConfig
from streamer.config.replay import write_marker
from streamer.input.offsets import OffsetTracker
from streamer.input.pipeline import PipelineSettings
from streamer.input.probe import BrokerProbe
from streamer.input.source import StreamSource, StreamStart, resolve_start
from streamer.input.stream_position import StreamPosition
from streamer.ops.audit import AuditLog
from streamer.ops.health import Health, MetricsServer
from streamer.ops.metrics import Metrics

if TYPE_CHECKING:
    import tensorflow as tf

    from streamer.decode.schema import Schema
    from streamer.input.deadletter import DeadLetterWriter
    from streamer.train.checkpoint import Checkpointer
    from streamer.train.lease import Lease
    from streamer.train.model import ModelBundle
    from streamer.train.trainer import Trainer

__all__ = [
    "LocalPlan",
    "MissingPartError",
    "Parts",
    "Plan",
    "Restored",
    "StreamInput",
    "Topic",
    "build_input",
    "build_parts",
    "choose_decoder",
    "dead_letter_writer",
    "find_topic",
    "new_committer",
    "new_metrics",
    "required",
    "serve_metrics",
]

log = logging.getLogger(__name__)

T = TypeVar("T")
#: The step machinery of a loop: ``Trainer`` (a worker of its own) or ``ClusterStep``.
StepT = TypeVar("StepT")


class MissingPartError(StreamerError):
    """Code asked for a part this run does not have (a bug, or an option the code path needs).

    The message names the part and the option that builds it.
    """

    def __init__(self, part: str, needs: str) -> None:
        self.part = part
        super().__init__(f"this run has no {part} ({needs})")


def required(value: T | None, part: str, needs: str) -> T:
    """``value``, or MissingPartError naming ``part`` and what builds it.

    >>> required(3, "x", "--x")
    3
    >>> required(None, "checkpointer", "built with --checkpoint-dir")
    Traceback (most recent call last):
    ...
    streamer.parts.MissingPartError: this run has no checkpointer (built with --checkpoint-dir)
    """
    if value is None:
        raise MissingPartError(part, needs)
    return value


@dataclasses.dataclass(frozen=True)
class Restored:
    """What a plan's restore found: the checkpointer (None without ``--checkpoint-dir``), the
    step and this worker's partitions' offsets to start from."""

    checkpointer: Checkpointer | None
    step: int = 0
    offsets: dict[int, int] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Parts(Generic[StepT]):
    """Everything a run needs, built once (``build_parts``); a loop receives it whole."""

    config: WorkerConfig  # as resolved (a replay's partitions filled in)
    metrics: Metrics
    server: MetricsServer | None  # /metrics, /healthz, /readyz (None with port 0)
    schema: Schema
    decoder: str  # the decoder as resolved: "native" or "python"
    strategy: tf.distribute.Strategy
    bundle: ModelBundle  # the user's compiled model and its optimizer
    steps: StepT  # the step machinery: Trainer or ClusterStep
    step: int  # the step the run starts at (restored)
    checkpointer: Checkpointer | None
    lease: Lease | None  # this worker's hold on --checkpoint-dir
    start: StreamStart  # where the stream starts, and why; a replay's stop offsets
    position: StreamPosition
    tracker: OffsetTracker
    source: StreamSource
    dataset: tf.data.Dataset  # batches (a worker of its own) or decoded blocks (a cluster's)
    audit: AuditLog | None
    probe: BrokerProbe | None  # whether a broker answers (readiness); None on the simulator
    topic_partitions: tuple[int, ...]  # every partition of the topic
    partitions: tuple[int, ...]  # this worker's, where it reads a fixed set (a cluster's)

    @property
    def input(self) -> StreamInput:
        """The input side of these parts (what ``new_committer`` takes)."""
        return StreamInput(
            start=self.start,
            position=self.position,
            tracker=self.tracker,
            source=self.source,
            dataset=self.dataset,
            audit=self.audit,
            probe=self.probe,
        )

    def trained_positions(self) -> dict[int, int]:
        """Where this model is in each partition it knows: the next offset after what it
        trained (an export's offsets)."""
        return self.position.current(self.tracker.commit_points())

    def close(self) -> None:
        """Close what the parts hold open besides the input (the loop's shutdown closes the
        source first, for its last commits): the audit log, the probe, the server."""
        if self.audit is not None:
            self.audit.close()
        if self.probe is not None:
            self.probe.close()
        if self.server is not None:
            self.server.close()


class Plan(Generic[StepT]):
    """How a kind of loop builds what differs (hooks of ``build_parts``): a worker of its own
    here (``LocalPlan``), one of a cluster in ``streamer.cluster.plan``."""

    #: The workers training this one model (the ``streamer_cluster_workers`` gauge).
    workers = 1
    #: Whether this worker holds a lease on its --checkpoint-dir (one writer per directory).
    holds_lease = True

    def strategy(self, config: WorkerConfig) -> tf.distribute.Strategy:
        raise NotImplementedError

    def steps(self, config: WorkerConfig, strategy: Any, bundle: ModelBundle) -> StepT:
        raise NotImplementedError

    def partitions(self, config: WorkerConfig, everything: list[int]) -> list[int]:
        """This worker's partitions of ``everything`` (a worker of its own: all of them)."""
        return everything

    def restore(
        self, config: WorkerConfig, bundle: ModelBundle, steps: StepT, topic: Topic
    ) -> Restored:
        raise NotImplementedError

    def source_config(self, config: WorkerConfig, partitions: list[int]) -> WorkerConfig:
        """The configuration the source reads with (a cluster's: its own partitions)."""
        return config

    def pipeline(self, config: WorkerConfig) -> PipelineSettings:
        return config.pipeline_settings()

    def start(
        self, config: WorkerConfig, consumer: ConsumerSettings | None, restored: Restored
    ) -> StreamStart:
        """Where the stream starts: the checkpoint's offsets, or those of --start-from / a
        replay's --from, which win; a replay's stop offsets. Looked up once."""
        return resolve_start(config.pipeline_settings(), consumer, restored.offsets)

    def dataset(self, source: StreamSource) -> tf.data.Dataset:
        return source.dataset()


@dataclasses.dataclass(frozen=True)
class Topic:
    """The topic as found at start: its partitions (this worker's and all) and its id."""

    everything: tuple[int, ...]
    mine: tuple[int, ...]
    topic_id: str | None


class LocalPlan(Plan["Trainer"]):
    """A worker of its own: every visible device, the checkpoint of its own directory (or a
    replay's --restore-from), the stream's batches."""

    def strategy(self, config: WorkerConfig) -> tf.distribute.Strategy:
        from streamer.train.trainer import choose_strategy

        return choose_strategy()

    def steps(self, config: WorkerConfig, strategy: Any, bundle: ModelBundle) -> Trainer:
        from streamer.train.trainer import Trainer

        return Trainer(bundle, strategy, jit_compile=config.jit_compile)

    def restore(
        self, config: WorkerConfig, bundle: ModelBundle, steps: Trainer, topic: Topic
    ) -> Restored:
        from streamer.train.checkpoint import Checkpointer

        # A replay reads only --restore-from and writes only its own --checkpoint-dir.
        replay = config.replay
        restore_dir = replay.restore_from if replay is not None else config.checkpoint_dir
        checkpointer: Checkpointer | None = None
        reader: Checkpointer | None = None
        if config.checkpoint_dir:
            if replay is not None:
                write_marker(config.checkpoint_dir, replay, config.topic)
            reader = checkpointer = Checkpointer(
                config.checkpoint_dir,
                bundle,
                topic=config.topic,
                keep=config.checkpoint_keep,
                restore_from=restore_dir,
            )
        elif restore_dir:
            reader = Checkpointer(None, bundle, topic=config.topic, restore_from=restore_dir)
        step, offsets = 0, dict[int, int]()
        if reader is not None and restore_dir:
            found = reader.restore()
            if found is not None:
                step, offsets = found
        # The topic's id is saved from here on; offsets saved for an earlier topic of the
        # same name are dropped (the model only).
        if (
            checkpointer is not None
            and config.bootstrap is not None
            and not checkpointer.adopt_topic_id(topic.topic_id)
        ):
            offsets = {}
        return Restored(checkpointer, step, offsets)


def new_metrics(config: WorkerConfig, *, workers: int = 1) -> Metrics:
    """The worker's metric set, its versions and the number of workers of its model."""
    import kafka
    import tensorflow as tf

    from streamer import __version__

    metrics = Metrics(
        config.topic,
        version=__version__,
        tensorflow_version=tf.__version__,
        kafka_python_version=kafka.__version__,
    )
    metrics.cluster_workers.set(workers)
    return metrics


def choose_decoder(config: WorkerConfig, schema: Schema) -> str:
    """The msgpack decoder of this run (``native`` or ``python``, for the start line); the
    source hands ``--decoder`` to its decode map and its shard children
    (``PipelineSettings.decoder``)."""
    from streamer.decode.native import decoder_name, why_python

    why = why_python(schema, config.decoder)
    if why is not None:
        log.info("decoder: the pure-Python reference (%s)", why)
    return decoder_name(schema, config.decoder)


def serve_metrics(config: WorkerConfig, metrics: Metrics, health: Health) -> MetricsServer | None:
    """/metrics, /healthz and /readyz on --metrics-port (none with port 0)."""
    if not config.metrics_port:
        return None
    server = MetricsServer(
        metrics.registry, health, host=config.metrics_host, port=config.metrics_port
    ).start()
    log.info("metrics on http://%s:%d/metrics", config.metrics_host, server.port)
    return server


def dead_letter_writer(
    config: WorkerConfig,
    consumer: ConsumerSettings,
    partitions: int,
    tracker: OffsetTracker,
    metrics: Metrics,
) -> DeadLetterWriter | None:
    """The dead-letter topic (created, sized to the source's max.message.bytes) and its
    writer, whose acknowledged letters count as done records, each the original record read
    back from the source (key, value, headers); None without --dead-letter-topic."""
    if not config.dead_letter_topic:
        return None
    from consumers.admin import ensure_topic
    from consumers.clients.kafka_python import RecordReader
    from streamer.input.deadletter import DeadLetterWriter

    sized = ensure_topic(
        consumer,
        config.dead_letter_topic,
        partitions=partitions,
        replication_factor=config.dead_letter_replication_factor,
    )

    def done(p: int, o: int) -> None:
        tracker.ack(np.array([p], np.int32), np.array([o], np.int64))
        metrics.observe_dead_lettered(1)

    return DeadLetterWriter(
        consumer.bootstrap_servers,
        config.dead_letter_topic,
        on_done=done,
        on_failure=lambda _exc: metrics.kafka_error("dead_letter"),
        security=consumer.security.kafka_config(),
        max_message_bytes=sized.max_message_bytes,
        max_record_bytes=sized.source_max_message_bytes,
        reader=RecordReader(consumer),
    )


def _simulated_shards(
    config: WorkerConfig, schema: Schema, position: StreamPosition
) -> Callable[[int, int, ShardHooks], ShardLike]:
    """The built-in simulator's shards; each pass's start where the model is."""
    from streamer.input.simulator import RandomRecords, SimulatedShard, Task, task_named

    # A schema file of one's own: random records of it (nothing to learn, but every feature
    # kind travels the real decode path); else the named task.
    task: Task = RandomRecords(schema) if config.schema else task_named(config.sim_task)

    def make(k: int, n: int, hooks: ShardHooks) -> ShardLike:
        shard = SimulatedShard(
            k,
            n,
            task=task,
            partitions=config.sim_partitions,
            rate=config.sim_rate,
            record_bytes=config.sim_record_bytes,
            start_offsets=position.current(),
            topic=config.topic,
        )
        hooks.on_assigned(k, sorted(shard.assigned), {})  # no group: its own position
        return shard

    return make


@dataclasses.dataclass(frozen=True, kw_only=True)
class StreamInput:
    """The input side of a run (``build_input``): where the stream starts, its position, the
    offset tracker, the source and its dataset, the audit log and the broker probe. The
    worker's ``Parts`` hold it; the public API (``streamer.Stream``) is built on it alone,
    before the user's model exists."""

    start: StreamStart
    position: StreamPosition
    tracker: OffsetTracker
    source: StreamSource
    dataset: tf.data.Dataset
    audit: AuditLog | None
    probe: BrokerProbe | None


def find_topic(
    config: WorkerConfig, plan: Plan[Any], *, health: Health, stop: threading.Event
) -> tuple[WorkerConfig, Topic]:
    """The topic, waited for (``--broker-wait-seconds``; ``stop`` ends the wait), and this
    worker's partitions of it; the configuration as resolved (a replay reads every partition
    unless told which). The simulator's partitions without a broker."""
    cfg = config
    if cfg.bootstrap is None:
        every = tuple(range(cfg.sim_partitions))
        return cfg, Topic(every, every, None)
    from consumers.admin import wait_for_topic

    ids: dict[str, str] = {}
    everything = wait_for_topic(
        cfg.consumer_settings(),
        health=health,
        stop=stop,
        topic_ids=ids,
        broker_wait_seconds=cfg.broker_wait_seconds,
        topic_wait_seconds=cfg.topic_wait_seconds or None,
    )
    if cfg.replay is not None and not cfg.partitions:  # a replay reads them all
        cfg = dataclasses.replace(cfg, partitions=tuple(everything))
    chosen = sorted(set(everything) & set(cfg.partitions or everything))
    return cfg, Topic(tuple(everything), tuple(plan.partitions(cfg, chosen)), ids.get(cfg.topic))


def build_input(
    cfg: WorkerConfig,
    plan: Plan[Any],
    schema: Schema,
    topic: Topic,
    offsets: dict[int, int],
    *,
    metrics: Metrics,
    health: Health,
    opened: contextlib.ExitStack,
) -> StreamInput:
    """The input of a run that starts at ``offsets`` (a checkpoint's; ``--start-from`` wins):
    the dead-letter writer, the start and position, the tracker, the source and its dataset
    (``plan.dataset``), the audit log, the broker probe. What it opens is closed by
    ``opened`` should a later step fail."""
    tracker = OffsetTracker()
    local = plan.source_config(cfg, list(topic.mine))
    consumer: ConsumerSettings | None = None
    dead_letter = None
    if cfg.bootstrap is not None:
        consumer = local.consumer_settings()
        dead_letter = dead_letter_writer(local, consumer, len(topic.everything), tracker, metrics)
    start = plan.start(cfg, consumer, Restored(None, 0, offsets))
    position = StreamPosition(start.offsets)
    source = StreamSource(
        schema,
        plan.pipeline(local),
        consumer=consumer,
        shard_factory=_simulated_shards(cfg, schema, position) if consumer is None else None,
        tracker=tracker,
        metrics=metrics,
        health=health,
        dead_letter=dead_letter,
        start=start,
        topic=cfg.topic,
    )
    opened.callback(source.close)
    dataset = plan.dataset(source)
    audit = AuditLog(cfg.audit_log, cfg.topic) if cfg.audit_log else None
    if audit is not None:
        opened.callback(audit.close)
    probe = BrokerProbe(cfg.bootstrap).start() if cfg.bootstrap else None
    if probe is not None:
        opened.callback(probe.close)
    return StreamInput(
        start=start,
        position=position,
        tracker=tracker,
        source=source,
        dataset=dataset,
        audit=audit,
        probe=probe,
    )


def new_committer(
    cfg: WorkerConfig,
    inp: StreamInput,
    metrics: Metrics,
    *,
    step: int,
    save: Save | None,
    failure_cause: Callable[[], str] | None = None,
) -> Committer:
    """The commit sequence of a run at ``step``: commits every --commit-every-steps /
    --commit-every-seconds, or, with ``save`` (a checkpoint directory), checkpoints every
    --checkpoint-every-steps / --checkpoint-every-seconds, each followed by the commit of
    the same offsets; checkpoints that keep failing for --checkpoint-failure-seconds stop
    the run (``failure_cause``: the last failure's cause, for the message). The same for the
    worker, a cluster's worker and ``streamer.Stream``."""
    return Committer(
        inp.source,
        inp.tracker,
        inp.position,
        metrics,
        commits=CommitSchedule(cfg.commit_every_steps, cfg.commit_every_seconds, step=step),
        checkpoints=None
        if save is None
        else CommitSchedule(cfg.checkpoint_every_steps, cfg.checkpoint_every_seconds, step=step),
        save=save,
        audit=inp.audit,
        to_group=cfg.commits,  # a replay without --replay-group commits to no group
        failure_seconds=cfg.checkpoint_failure_seconds or None,
        failure_cause=failure_cause,
        directory=cfg.checkpoint_dir or "",
    )


def build_parts(
    config: WorkerConfig,
    plan: Plan[StepT],
    *,
    health: Health,
    stop: threading.Event,
) -> Parts[StepT]:
    """Every part of a run, in order (module docstring); on failure what was opened is
    closed again. ``stop``: a signal while waiting for the broker or topic ends the wait."""
    import tensorflow as tf

    from streamer.train.model import load_model

    cfg = config
    with contextlib.ExitStack() as opened:
        lease: Lease | None = None
        if cfg.checkpoint_dir and plan.holds_lease:
            from streamer.train.lease import Lease

            # First, before anything reads the directory or joins the group: a second worker
            # on the same directory is refused here (CheckpointDirInUseError, exit 2).
            lease = Lease.acquire(cfg.checkpoint_dir)
            opened.callback(lease.close)
        metrics = new_metrics(cfg, workers=plan.workers)
        server = serve_metrics(cfg, metrics, health)
        if server is not None:
            opened.callback(server.close)
        strategy = plan.strategy(cfg)
        if cfg.seed is not None:
            tf.keras.utils.set_random_seed(cfg.seed)
        if cfg.mixed_precision:
            import keras

            keras.mixed_precision.set_global_policy("mixed_float16")
        loaded = cfg.load_schema()
        decoder = choose_decoder(cfg, loaded)
        with strategy.scope():
            bundle = load_model(cfg.model, loaded, cfg.learning_rate)
        steps = plan.steps(cfg, strategy, bundle)

        cfg, topic = find_topic(cfg, plan, health=health, stop=stop)
        restored = plan.restore(cfg, bundle, steps, topic)
        inp = build_input(
            cfg,
            plan,
            loaded,
            topic,
            restored.offsets,
            metrics=metrics,
            health=health,
            opened=opened,
        )
        parts = Parts(
            config=cfg,
            metrics=metrics,
            server=server,
            schema=loaded,
            decoder=decoder,
            strategy=strategy,
            bundle=bundle,
            steps=steps,
            step=restored.step,
            checkpointer=restored.checkpointer,
            lease=lease,
            start=inp.start,
            position=inp.position,
            tracker=inp.tracker,
            source=inp.source,
            dataset=inp.dataset,
            audit=inp.audit,
            probe=inp.probe,
            topic_partitions=topic.everything,
            partitions=topic.mine,
        )
        opened.pop_all()  # built: the loop's shutdown closes them from here on
    return parts
