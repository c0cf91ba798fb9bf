"""Topology of one model trained on N workers: TF_CONFIG or a hosts list, each worker's
partitions, and the per-round control vector the workers agree on.

Pure: no TensorFlow, no Kafka (``streamer.cluster.strategy`` and ``streamer.cluster.worker`` use it).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from consumers.errors import ConfigError
from consumers.settings import valid_port
from streamer.stopping import StopReason

__all__ = [
    "Control",
    "RoundDecision",
    "Topology",
    "decide",
    "lost_worker",
    "offsets_from_vector",
    "offsets_vector",
    "should_wait",
    "tf_config",
    "topology_from",
    "worker_partitions",
]

#: The environment variable Kubernetes' Indexed Jobs (and JobSets) set to the pod's index.
JOB_INDEX_ENV = "JOB_COMPLETION_INDEX"


@dataclass(frozen=True, slots=True)
class Topology:
    """Which worker this process is, of how many, and every worker's address.

    ``index`` counts from 0 across the whole cluster in TensorFlow's task order (a ``chief``
    task first, then the ``worker`` tasks); worker 0 is the chief: it writes the checkpoints
    and hosts TensorFlow's coordination service.

    >>> t = topology_from({"TF_CONFIG": tf_config(["a:1", "b:2"], 1)})
    >>> t.index, t.count, t.chief, t.task_type, t.task_id
    (1, 2, False, 'worker', 1)
    >>> t.describe()
    'worker 1 of 2'
    """

    index: int
    count: int
    cluster: Mapping[str, tuple[str, ...]]
    task_type: str
    task_id: int
    source: str  # "TF_CONFIG" or "--cluster-workers"

    @property
    def chief(self) -> bool:
        return self.index == 0

    @property
    def hosts(self) -> tuple[str, ...]:
        """Every worker's host:port in index order."""
        return (*self.cluster.get("chief", ()), *self.cluster.get("worker", ()))

    def describe(self) -> str:
        return f"worker {self.index} of {self.count}"


def tf_config(hosts: Sequence[str], index: int) -> str:
    """The TF_CONFIG of worker ``index`` of a cluster of ``hosts`` (all ``worker`` tasks).

    >>> json.loads(tf_config(["h0:2222", "h1:2222"], 0))["task"]
    {'type': 'worker', 'index': 0}
    """
    return json.dumps(
        {"cluster": {"worker": list(hosts)}, "task": {"type": "worker", "index": index}}
    )


def _bad(value: object, allowed: str) -> ConfigError:
    return ConfigError("TF_CONFIG", value, allowed)


def _parse_tf_config(text: str) -> Topology:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise _bad(text, f"not JSON ({exc.msg})") from exc
    if not isinstance(data, dict) or not isinstance(data.get("cluster"), dict):
        raise _bad(text, 'a JSON object with "cluster" and "task"')
    cluster: dict[str, tuple[str, ...]] = {}
    for job, hosts in data["cluster"].items():
        if job not in ("chief", "worker"):
            raise _bad(
                text,
                f"job {job!r}: only chief and worker tasks (MultiWorkerMirroredStrategy); "
                "no ps or evaluator",
            )
        if not isinstance(hosts, list) or not all(isinstance(h, str) and h for h in hosts):
            raise _bad(text, f"cluster.{job} must be a list of host:port strings")
        cluster[job] = tuple(hosts)
    if len(cluster.get("chief", ())) > 1:
        raise _bad(text, "at most one chief task")
    task = data.get("task")
    if not isinstance(task, dict):
        raise _bad(text, 'a "task" object with "type" and "index"')
    task_type, task_id = task.get("type"), task.get("index", 0)
    if task_type not in cluster or not isinstance(task_id, int) or isinstance(task_id, bool):
        raise _bad(text, f"task.type one of {sorted(cluster)} and an integer task.index")
    if not 0 <= task_id < len(cluster[task_type]):
        raise _bad(text, f"task.index {task_id} outside cluster.{task_type}")
    offset = len(cluster.get("chief", ())) if task_type == "worker" else 0
    count = sum(len(h) for h in cluster.values())
    return Topology(offset + task_id, count, cluster, task_type, task_id, "TF_CONFIG")


def _host_port(entry: str) -> bool:
    """``host:port`` with a host and a port in 1..65535 (ASCII digits only)."""
    host, _, port = entry.rpartition(":")
    return bool(host) and valid_port(port)


def _parse_hosts(hosts: str, index: int | None, env: Mapping[str, str]) -> Topology:
    listed = tuple(h.strip() for h in hosts.split(",") if h.strip())
    if not listed or not all(_host_port(h) for h in listed):
        raise ConfigError("cluster_workers", hosts, "a comma-separated list of host:port")
    if len(set(listed)) != len(listed):
        raise ConfigError("cluster_workers", hosts, "each worker's host:port once")
    if index is None:
        raw = env.get(JOB_INDEX_ENV)
        if raw is None or not re.fullmatch(r"[0-9]+", raw.strip()):
            raise ConfigError(
                "worker_index",
                raw,
                f"with --cluster-workers, give --worker-index or run where {JOB_INDEX_ENV} is "
                "set (a Kubernetes Indexed Job or JobSet)",
            )
        index = int(raw)
    if not 0 <= index < len(listed):
        raise ConfigError(
            "worker_index", index, f"an index into --cluster-workers (0..{len(listed) - 1})"
        )
    return Topology(index, len(listed), {"worker": listed}, "worker", index, "--cluster-workers")


def topology_from(
    env: Mapping[str, str],
    *,
    cluster_workers: str | None = None,
    worker_index: int | None = None,
) -> Topology | None:
    """The cluster this worker belongs to, or None for a worker on its own.

    From ``TF_CONFIG`` (TensorFlow's standard) or from ``--cluster-workers`` plus the index
    (``--worker-index``, else ``$JOB_COMPLETION_INDEX``); one of the two, never both.

    >>> topology_from({}) is None
    True
    >>> topology_from({"JOB_COMPLETION_INDEX": "2"}, cluster_workers="a:1,b:1,c:1").describe()
    'worker 2 of 3'
    """
    text = env.get("TF_CONFIG", "").strip()
    if text and cluster_workers:
        raise ConfigError(
            "cluster_workers", cluster_workers, "TF_CONFIG is set too: describe the cluster once"
        )
    if worker_index is not None and not cluster_workers:
        raise ConfigError("worker_index", worker_index, "goes with --cluster-workers")
    if text:
        return _parse_tf_config(text)
    if cluster_workers:
        return _parse_hosts(cluster_workers, worker_index, env)
    return None


def worker_partitions(partitions: Sequence[int], index: int, count: int) -> list[int]:
    """Worker ``index``'s share: every ``count``-th partition of the sorted list, from the
    ``index``-th (for a whole topic, 0..P-1, the partitions p with p % count == index).

    >>> worker_partitions(range(6), 1, 2), worker_partitions([3, 9, 4], 0, 2)
    ([1, 3, 5], [3, 9])
    """
    return sorted(partitions)[index::count]


def offsets_vector(offsets: Mapping[int, int], partitions: int) -> npt.NDArray[np.float64]:
    """One worker's offsets as its part of the all-reduced (SUM) vector: slot p holds
    ``next offset + 1`` for the partitions this worker owns, 0 for the others.

    Each partition has one owner, so the sum over workers holds every owned partition's
    offset; float64 is exact for offsets below 2**53.

    >>> offsets_vector({1: 41, 3: 0}, 4).tolist()
    [0.0, 42.0, 0.0, 1.0]
    """
    vec = np.zeros(partitions, dtype=np.float64)
    for p, o in offsets.items():
        if 0 <= p < partitions:
            vec[p] = float(o) + 1.0
    return vec


def offsets_from_vector(vector: npt.ArrayLike) -> dict[int, int]:
    """The all-reduced vector back to {partition: next offset} (slots at 0 had no owner's
    offset).

    >>> offsets_from_vector([0.0, 42.0, 0.0, 1.0])
    {1: 41, 3: 0}
    """
    vec = np.asarray(vector, dtype=np.float64)
    return {int(p): int(vec[p]) - 1 for p in np.flatnonzero(vec > 0)}


class Control:
    """Slots of the small vector every worker contributes to one all-reduce (SUM) per round.

    ``REAL``: rows of real records in this worker's batch; ``STOP``: this worker was asked to
    stop (signal, --max-steps); ``DONE``: its input is finished or idle for
    --stop-after-idle; ``CHECKPOINT``: the chief's clock says a checkpoint is due; ``FULL``:
    the batch was full (its input has more waiting); ``LOSS``: Σ weight·loss of this
    worker's previous training step (the previous global loss comes for free); ``REPORT``:
    the chief's window of train metrics is over (every worker reads them, an all-reduce, at
    the same round).
    """

    REAL, STOP, DONE, CHECKPOINT, FULL, LOSS, REPORT = range(7)
    SIZE = 7

    @staticmethod
    def local(
        *,
        real: int,
        stop: bool,
        done: bool,
        checkpoint: bool,
        full: bool,
        loss_sum: float,
        report: bool = False,
    ) -> npt.NDArray[np.float32]:
        vec = np.zeros(Control.SIZE, dtype=np.float32)
        vec[Control.REAL] = real
        vec[Control.STOP] = float(stop)
        vec[Control.DONE] = float(done)
        vec[Control.CHECKPOINT] = float(checkpoint)
        vec[Control.FULL] = float(full)
        vec[Control.LOSS] = loss_sum
        vec[Control.REPORT] = float(report)
        return vec


@dataclass(frozen=True, slots=True)
class RoundDecision:
    """What every worker does after a round's all-reduce: the same on all, since every input
    is either all-reduced or the same on all (the step count)."""

    train: bool  # a row is real somewhere: step (else an idle round, no weight changes)
    global_rows: int
    stop: StopReason | None  # why the cluster stops after this round (None: go on)
    checkpoint: bool
    drain: bool = False  # a stop was asked: from the next round on, train what was read, stop
    report: bool = False  # every worker reads and reports the train metrics now


def decide(
    ctrl: npt.ArrayLike,
    *,
    workers: int,
    step: int,
    last_checkpoint_step: int,
    checkpoint_every_steps: int | None,
    max_steps: int | None,
    stopping_here: StopReason | None,
    stop_after_idle: float | None,
    draining: bool = False,
) -> RoundDecision:
    """The round's decision from the all-reduced control vector.

    ``step`` counts training steps after this round's step (if any); a checkpoint is taken
    only when the step moved since the last one.

    A stop request (a signal, the reject breaker) first drains: every worker stops reading
    and trains what it read (a later block of a partition may have been trained before an
    earlier one, which the commit cannot pass), reporting DONE when its input ended or its
    drain time is up; the cluster stops when every worker is done.

    >>> s = Control.local(real=0, stop=True, done=False, checkpoint=False, full=False, loss_sum=0)
    >>> kw = dict(workers=2, step=7, last_checkpoint_step=5, checkpoint_every_steps=100,
    ...           max_steps=None, stopping_here=None, stop_after_idle=None)
    >>> d = decide(s, **kw); d.drain, d.stop
    (True, None)
    >>> d = decide(s + 2 * Control.local(real=0, stop=False, done=True, checkpoint=False,
    ...            full=False, loss_sum=0), draining=True, **kw); str(d.stop), d.checkpoint
    ('another worker was stopped', True)

    >>> c = Control.local(real=0, stop=False, done=True, checkpoint=False, full=False, loss_sum=0)
    >>> d = decide(2 * c, workers=2, step=7, last_checkpoint_step=5, checkpoint_every_steps=100,
    ...            max_steps=None, stopping_here=None, stop_after_idle=5.0)
    >>> d.train, str(d.stop), d.checkpoint
    (False, 'idle for 5s', True)
    """
    vec = np.asarray(ctrl, dtype=np.float64)
    rows = round(float(vec[Control.REAL]))
    stop: StopReason | None = None
    drain = False
    all_done = round(float(vec[Control.DONE])) >= workers
    if vec[Control.STOP] > 0:
        if draining and all_done:
            stop = stopping_here or StopReason.peer()
        drain = not draining
    elif max_steps is not None and step >= max_steps:
        stop = StopReason.max_steps(max_steps)
    elif all_done:
        stop = (
            StopReason.idle(stop_after_idle)
            if stop_after_idle is not None
            else StopReason.input_ended()
        )
    moved = step != last_checkpoint_step
    due = vec[Control.CHECKPOINT] > 0 or (
        checkpoint_every_steps is not None and step - last_checkpoint_step >= checkpoint_every_steps
    )
    return RoundDecision(
        train=rows > 0,
        global_rows=rows,
        stop=stop,
        checkpoint=moved and (due or stop is not None),
        drain=drain,
        report=vec[Control.REPORT] > 0,
    )


def should_wait(ctrl: npt.ArrayLike, *, mine: int, full: bool) -> bool:
    """Whether this worker's next batch may wait (up to --pad-after-seconds) for records.

    Not when another worker's batch was full (records wait there: nobody gains from this
    worker holding the round), nor when this worker had no record and another had some (the
    other paces the round by filling its own batch; this one's records, if any come, go in
    the next round). Otherwise, everyone being quiet, waiting fills batches.

    >>> busy = Control.local(real=128, stop=False, done=False, checkpoint=False, full=True,
    ...                      loss_sum=0)
    >>> should_wait(busy, mine=0, full=False), should_wait(busy, mine=128, full=True)
    (False, True)
    """
    vec = np.asarray(ctrl, dtype=np.float64)
    others_full = vec[Control.FULL] - float(full) > 0
    others_rows = vec[Control.REAL] - mine > 0
    return not (others_full or (mine == 0 and others_rows))


def lost_worker(message: str, topology: Topology) -> str:
    """Which peer TensorFlow's error names (``task:N`` of a job), as "worker N", else "a peer".

    >>> t = topology_from({"TF_CONFIG": tf_config(["a:1", "b:1"], 0)})
    >>> lost_worker("unhealthy (stopped sending heartbeats):\\n/job:worker/replica:0/task:1", t)
    'worker 1'
    """
    import re

    for job, task in re.findall(r"/job:(chief|worker)(?:/replica:\d+)?/task:(\d+)", message):
        offset = len(topology.cluster.get("chief", ())) if job == "worker" else 0
        index = offset + int(task)
        if index != topology.index:
            return f"worker {index}"
    return "a peer"
