"""streamer.cluster.topology: TF_CONFIG and --cluster-workers read or refused, each worker's
partitions, the offsets all-reduce and the round's decision. The main cases are in
test_multiworker; these are the edges and the invariants."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from consumers.errors import ConfigError
from streamer.cluster.topology import (
    JOB_INDEX_ENV,
    Control,
    RoundDecision,
    Topology,
    decide,
    lost_worker,
    offsets_from_vector,
    offsets_vector,
    should_wait,
    tf_config,
    topology_from,
    worker_partitions,
)
from streamer.stopping import StopReason


def _topology(env: dict[str, str], **kw: Any) -> Topology:
    t = topology_from(env, **kw)
    assert t is not None
    return t


def _tf(cluster: dict[str, Any], task: dict[str, Any] | None = None) -> dict[str, str]:
    doc: dict[str, Any] = {"cluster": cluster}
    if task is not None:
        doc["task"] = task
    return {"TF_CONFIG": json.dumps(doc)}


# ---- TF_CONFIG ---------------------------------------------------------------------------------


@pytest.mark.parametrize("count", [1, 2, 5])
def test_tf_config_round_trips_every_workers_place(count: int) -> None:
    """What tf_config writes for worker i, topology_from reads back as worker i of count."""
    hosts = [f"h{i}:2222" for i in range(count)]
    for i in range(count):
        t = _topology({"TF_CONFIG": tf_config(hosts, i)})
        assert (t.index, t.count, t.task_type, t.task_id) == (i, count, "worker", i)
        assert t.hosts == tuple(hosts) and t.chief == (i == 0)
        assert t.source == "TF_CONFIG" and t.describe() == f"worker {i} of {count}"


def test_a_chief_task_is_worker_0_and_the_workers_follow_it() -> None:
    cluster = {"worker": ["w0:1", "w1:1"], "chief": ["c:1"]}
    chief = _topology(_tf(cluster, {"type": "chief", "index": 0}))
    assert (chief.index, chief.count, chief.chief) == (0, 3, True)
    w1 = _topology(_tf(cluster, {"type": "worker", "index": 1}))
    assert (w1.index, w1.task_id, w1.chief) == (2, 1, False)
    assert w1.hosts == ("c:1", "w0:1", "w1:1")  # index order, whatever the JSON key order


def test_a_task_without_an_index_is_task_0() -> None:
    t = _topology(_tf({"worker": ["a:1", "b:1"]}, {"type": "worker"}))
    assert (t.index, t.task_id) == (0, 0)


@pytest.mark.parametrize("text", ["", "   ", "\n\t"])
def test_an_empty_tf_config_is_no_cluster(text: str) -> None:
    """A blank TF_CONFIG (an unset variable rendered empty by a template) is a worker alone."""
    assert topology_from({"TF_CONFIG": text}) is None


@pytest.mark.parametrize(
    ("doc", "says"),
    [
        ("[1, 2]", '"cluster" and "task"'),
        ('{"cluster": ["a:1"]}', '"cluster" and "task"'),
        (
            '{"cluster": {"evaluator": ["e:1"]}, "task": {"type": "evaluator"}}',
            "no ps or evaluator",
        ),
        ('{"cluster": {"worker": "a:1"}, "task": {"type": "worker"}}', "list of host:port"),
        ('{"cluster": {"worker": ["a:1", ""]}, "task": {"type": "worker"}}', "list of host:port"),
        ('{"cluster": {"worker": ["a:1", 7]}, "task": {"type": "worker"}}', "list of host:port"),
        ('{"cluster": {"worker": ["a:1"]}, "task": "worker"}', 'a "task" object'),
        ('{"cluster": {"worker": ["a:1"]}, "task": {"index": 0}}', "task.type one of"),
        ('{"cluster": {"worker": ["a:1"]}, "task": {"type": "chief"}}', "task.type one of"),
        (
            '{"cluster": {"worker": ["a:1", "b:1"]}, "task": {"type": "worker", "index": true}}',
            "integer task.index",
        ),
        (
            '{"cluster": {"worker": ["a:1", "b:1"]}, "task": {"type": "worker", "index": "1"}}',
            "integer task.index",
        ),
        (
            '{"cluster": {"worker": ["a:1"]}, "task": {"type": "worker", "index": 1.0}}',
            "integer task.index",
        ),
        (
            '{"cluster": {"worker": ["a:1"]}, "task": {"type": "worker", "index": -1}}',
            "outside cluster.worker",
        ),
        ('{"cluster": {"worker": ["a:1"]', "not JSON"),
    ],
)
def test_a_bad_tf_config_is_a_config_error_saying_what_is_wrong(doc: str, says: str) -> None:
    with pytest.raises(ConfigError) as info:
        topology_from({"TF_CONFIG": doc})
    assert info.value.setting == "TF_CONFIG"
    assert says in info.value.allowed


def test_tf_config_and_cluster_workers_together_are_refused_even_when_they_agree() -> None:
    with pytest.raises(ConfigError) as info:
        topology_from({"TF_CONFIG": tf_config(["a:1", "b:1"], 0)}, cluster_workers="a:1,b:1")
    assert info.value.setting == "cluster_workers"


# ---- --cluster-workers -------------------------------------------------------------------------


def test_cluster_workers_ignore_spaces_and_empty_items() -> None:
    t = _topology({}, cluster_workers=" a:1 , ,b:2,", worker_index=1)
    assert t.hosts == ("a:1", "b:2") and t.count == 2
    assert (t.source, t.task_type, t.task_id, t.index) == ("--cluster-workers", "worker", 1, 1)
    v6 = _topology({}, cluster_workers="[::1]:2222,[::1]:2223", worker_index=0)
    assert v6.hosts == ("[::1]:2222", "[::1]:2223")  # the port is after the last colon


@pytest.mark.parametrize(
    ("hosts", "says"),
    [
        ("a:1,b", "host:port"),
        ("a:1,b:http", "host:port"),
        ("a:", "host:port"),
        (":2222", "host:port"),  # no host
        ("a:\u00b2", "host:port"),  # a digit to str.isdigit, not to int()
        ("a:70000", "host:port"),
        (" , ", "host:port"),
        ("a:1,b:1,a:1", "once"),
    ],
)
def test_bad_cluster_workers_are_refused(hosts: str, says: str) -> None:
    with pytest.raises(ConfigError) as info:
        topology_from({}, cluster_workers=hosts, worker_index=0)
    assert info.value.setting == "cluster_workers" and says in info.value.allowed


def test_the_option_index_wins_over_the_job_index() -> None:
    t = _topology({JOB_INDEX_ENV: "2"}, cluster_workers="a:1,b:1,c:1", worker_index=0)
    assert t.index == 0


@pytest.mark.parametrize("raw", ["", "x", "-1", "1.0", "\u00b2"])
def test_a_job_index_that_is_no_index_is_a_config_error(raw: str) -> None:
    with pytest.raises(ConfigError) as info:
        topology_from({JOB_INDEX_ENV: raw}, cluster_workers="a:1,b:1")
    assert info.value.setting == "worker_index" and JOB_INDEX_ENV in info.value.allowed


def test_a_job_index_with_spaces_is_read() -> None:
    assert _topology({JOB_INDEX_ENV: " 1\n"}, cluster_workers="a:1,b:1").index == 1


@pytest.mark.parametrize("index", [-1, 2])
def test_an_index_outside_the_hosts_names_the_range(index: int) -> None:
    with pytest.raises(ConfigError, match=r"0\.\.1") as info:
        topology_from({}, cluster_workers="a:1,b:1", worker_index=index)
    assert info.value.setting == "worker_index"


def test_worker_index_without_cluster_workers_is_refused_even_with_tf_config() -> None:
    for env in ({}, {"TF_CONFIG": tf_config(["a:1"], 0)}):
        with pytest.raises(ConfigError, match="goes with --cluster-workers"):
            topology_from(env, worker_index=0)


# ---- partitions and offsets --------------------------------------------------------------------


@settings(max_examples=150, deadline=None)
@given(st.sets(st.integers(0, 10_000), max_size=40), st.integers(1, 8))
def test_any_partition_list_is_shared_once_and_evenly(partitions: set[int], count: int) -> None:
    """Whatever the partitions (any numbers, any order), each goes to exactly one worker,
    shares differ by at most one, and the same list in another order shares the same way."""
    given_order = sorted(partitions, reverse=True)
    shares = [worker_partitions(given_order, i, count) for i in range(count)]
    assert sorted(p for share in shares for p in share) == sorted(partitions)
    assert max(map(len, shares)) - min(map(len, shares)) <= 1
    assert shares == [worker_partitions(sorted(partitions), i, count) for i in range(count)]
    assert all(share == sorted(share) for share in shares)


def test_offsets_outside_the_vector_are_left_out() -> None:
    vec = offsets_vector({-1: 5, 0: 0, 3: 9, 4: 7}, 4)
    assert vec.dtype == np.float64 and vec.tolist() == [1.0, 0.0, 0.0, 10.0]


def test_offset_0_is_told_apart_from_no_owner() -> None:
    assert offsets_from_vector(offsets_vector({2: 0}, 3)) == {2: 0}
    assert offsets_from_vector(np.zeros(3)) == {}


def test_offsets_come_back_as_python_ints() -> None:
    """The offsets go into commits and JSON: plain ints, never numpy scalars."""
    back = offsets_from_vector(offsets_vector({1: 41}, 2))
    assert [(type(p), type(o)) for p, o in back.items()] == [(int, int)]


@settings(max_examples=150, deadline=None)
@given(
    st.integers(1, 16).flatmap(
        lambda n: st.tuples(
            st.just(n),
            st.dictionaries(st.integers(0, n - 1), st.integers(0, 2**53 - 1)),
            st.integers(1, 4),
        )
    )
)
def test_offsets_survive_the_all_reduce_exactly(case: tuple[int, dict[int, int], int]) -> None:
    """Each worker contributes its own partitions' offsets; the sum over workers read back is
    every offset, exact up to 2**53 - 1."""
    partitions, offsets, workers = case
    total = sum(
        offsets_vector(
            {
                p: o
                for p, o in offsets.items()
                if p in worker_partitions(range(partitions), i, workers)
            },
            partitions,
        )
        for i in range(workers)
    )
    assert offsets_from_vector(total) == offsets


# ---- the round ---------------------------------------------------------------------------------


def _ctrl(**kw: Any) -> np.ndarray:
    base: dict[str, Any] = dict(
        real=0, stop=False, done=False, checkpoint=False, full=False, loss_sum=0.0
    )
    base.update(kw)
    return Control.local(**base)


def _decide(ctrl: np.ndarray, **kw: Any) -> RoundDecision:
    args: dict[str, Any] = dict(
        workers=2,
        step=10,
        last_checkpoint_step=0,
        checkpoint_every_steps=None,
        max_steps=None,
        stopping_here=None,
        stop_after_idle=None,
    )
    args.update(kw)
    return decide(ctrl, **args)


def test_control_slots_are_distinct_and_fill_the_vector() -> None:
    vec = Control.local(
        real=7, stop=True, done=False, checkpoint=True, full=False, loss_sum=2.5, report=True
    )
    assert vec.dtype == np.float32 and vec.shape == (Control.SIZE,)
    slots = [
        Control.REAL,
        Control.STOP,
        Control.DONE,
        Control.CHECKPOINT,
        Control.FULL,
        Control.LOSS,
        Control.REPORT,
    ]
    assert sorted(slots) == list(range(Control.SIZE))
    assert [vec[s] for s in slots] == [7.0, 1.0, 0.0, 1.0, 0.0, 2.5, 1.0]


def test_the_global_rows_are_rounded_from_the_float_sum() -> None:
    """The all-reduce sums float32: a count a hair off an integer is that integer."""
    r = _decide(np.array([255.99998, 0, 0, 0, 0, 0, 0], np.float32))
    assert (r.train, r.global_rows) == (True, 256)
    idle = _decide(np.array([0.00001, 0, 0, 0, 0, 0, 0], np.float32))
    assert (idle.train, idle.global_rows) == (False, 0)


def test_max_steps_stops_at_and_past_the_limit_before_the_idle_stop() -> None:
    both_done = _ctrl(done=True) + _ctrl(done=True)
    assert _decide(both_done, step=11, max_steps=10).stop == StopReason.max_steps(10)
    assert _decide(_ctrl(), step=9, max_steps=10).stop is None


def test_every_input_ended_without_an_idle_limit_says_so() -> None:
    r = _decide(_ctrl(done=True) + _ctrl(done=True))
    assert r.stop == StopReason.input_ended() and r.checkpoint
    assert _decide(_ctrl(done=True) * 2, stop_after_idle=2.5).stop == StopReason.idle(2.5)


def test_a_stop_request_first_drains_even_when_every_input_is_done() -> None:
    """The round that first sees a stop drains (trains what was read) instead of stopping,
    whatever the DONE count; draining rounds never ask to drain again."""
    ctrl = _ctrl(stop=True, done=True) + _ctrl(done=True)
    first = _decide(ctrl, stopping_here=StopReason.signal("SIGTERM"))
    assert (first.drain, first.stop) == (True, None)
    later = _decide(ctrl, stopping_here=StopReason.signal("SIGTERM"), draining=True)
    assert (later.drain, later.stop) == (False, StopReason.signal("SIGTERM"))
    # The stop request also wins over --max-steps.
    assert _decide(ctrl, step=50, max_steps=10).stop is None


def test_a_checkpoint_needs_the_step_to_have_moved() -> None:
    asked = _ctrl(checkpoint=True) + _ctrl()
    assert _decide(asked).checkpoint
    assert not _decide(asked, step=5, last_checkpoint_step=5).checkpoint
    assert not _decide(_ctrl() + _ctrl()).checkpoint  # nothing due, no stop
    assert _decide(_ctrl(), step=10, checkpoint_every_steps=10).checkpoint
    assert not _decide(_ctrl(), step=9, checkpoint_every_steps=10).checkpoint


def test_when_every_worker_is_full_nobody_waits() -> None:
    """Another worker's full batch means records wait there, even when mine is full too."""
    both_full = _ctrl(real=128, full=True) + _ctrl(real=128, full=True)
    assert not should_wait(both_full, mine=128, full=True)


# ---- errors from TensorFlow --------------------------------------------------------------------


def test_lost_worker_counts_the_chief_before_the_workers() -> None:
    cluster = {"chief": ["c:1"], "worker": ["w0:1", "w1:1"]}
    w0 = _topology(_tf(cluster, {"type": "worker", "index": 0}))  # index 1
    assert lost_worker("from /job:chief/replica:0/task:0 ...", w0) == "worker 0"
    assert lost_worker("from /job:worker/task:1 ...", w0) == "worker 2"
    # Only itself named: no peer is known.
    assert lost_worker("/job:worker/replica:0/task:0 failed", w0) == "a peer"
    chief = _topology(_tf(cluster, {"type": "chief"}))
    assert lost_worker("/job:chief/task:0 then /job:worker/task:0", chief) == "worker 1"


def test_lost_worker_ignores_jobs_of_other_names() -> None:
    t = _topology({"TF_CONFIG": tf_config(["a:1", "b:1"], 0)})
    assert lost_worker("/job:ps/replica:0/task:1 is gone", t) == "a peer"


def test_the_chiefs_report_vote_is_every_workers_decision() -> None:
    """The train-metric window is the chief's clock: its vote makes every worker read the
    metrics (an all-reduce) at the same round."""
    assert _decide(_ctrl(report=True) + _ctrl()).report
    assert not _decide(_ctrl() + _ctrl()).report
