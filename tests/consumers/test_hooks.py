"""consumers.hooks: ShardHooks' defaults ask for nothing, every hook is forwarded by a process
shard's child and handled by the owner, and every shard (thread, process, simulator) has what
``ShardLike`` promises. No shard is started: no broker, no child process."""

from __future__ import annotations

import inspect

import pytest

from consumers.hooks import ShardHooks, ShardLike
from consumers.process import ProcessShard, _ChildHooks
from consumers.settings import ConsumerSettings
from consumers.shard import Shard
from streamer.input.routing import ShardRouter
from streamer.input.simulator import SimulatedShard

CALLBACKS = sorted(
    name
    for name, value in vars(ShardHooks).items()
    if not name.startswith("_") and inspect.isfunction(value)
)
#: What ShardLike promises: its attributes, methods and properties.
MEMBERS = sorted(
    {name for name in vars(ShardLike) if not name.startswith("_")} | set(ShardLike.__annotations__)
)


def _settings() -> ConsumerSettings:
    return ConsumerSettings(bootstrap_servers="127.0.0.1:1", topic="t", group_id="g")


def test_the_defaults_seek_nothing_commit_nothing_and_ignore_the_rest() -> None:
    h = ShardHooks()
    assert h.on_assigned(0, [0, 1]) == {}
    assert h.on_revoked(0, [0, 1]) == {}
    assert h.on_revoking(0, [0]) is None
    assert h.on_lost(0, [1]) is None
    assert h.on_poll(0, 3, 30, {0: 10}, {0: 7}) is None
    assert h.on_stable_offsets(0, {0: 5}) is None
    assert h.on_commit({0: 5}, True, 0.01, None) is None
    assert h.on_error("connection", ConnectionError("refused")) is None
    assert h.on_paused(0, 2) is None
    assert h.on_group_committed(0, {0: 5}) is None
    assert h.on_topic_missing(0, True) is None


def test_the_default_answers_are_fresh_dicts_a_shard_may_change() -> None:
    """A shard that adds to what ``on_assigned``/``on_revoked`` returned changes no later answer."""
    h = ShardHooks()
    h.on_assigned(0, [0])[0] = 5
    h.on_revoked(0, [0])[0] = 9
    assert h.on_assigned(0, [0]) == {} and h.on_revoked(0, [0]) == {}


@pytest.mark.parametrize(
    "hooks",
    [_ChildHooks, ShardRouter],
    ids=["process-child", "owner-router"],
)
def test_every_callback_is_implemented_where_a_default_would_lose_an_event(
    hooks: type[ShardHooks],
) -> None:
    """A process shard's child must forward each callback, and the owner must act on each:
    one left to the no-op default is an event silently lost (a lost partition, a commit
    result, a missing topic)."""
    assert {"on_assigned", "on_revoked", "on_lost", "on_commit", "on_topic_missing"} <= set(
        CALLBACKS
    )
    missing = [name for name in CALLBACKS if getattr(hooks, name) is getattr(ShardHooks, name)]
    assert missing == []


@pytest.mark.parametrize("callback", CALLBACKS)
def test_overrides_keep_the_callbacks_signature(callback: str) -> None:
    """The shards call hooks positionally: an override with other parameters breaks there."""
    expected = list(inspect.signature(getattr(ShardHooks, callback)).parameters)
    for hooks in (_ChildHooks, ShardRouter):
        assert list(inspect.signature(getattr(hooks, callback)).parameters) == expected, hooks


@pytest.fixture(
    params=["thread", "process", "simulator"],
)
def shard(request: pytest.FixtureRequest) -> object:
    """An unstarted shard of each runtime."""
    if request.param == "thread":
        return Shard(_settings(), 0, 2)
    if request.param == "process":
        return ProcessShard(_settings(), 0, 2)
    return SimulatedShard(0, 2)


def test_every_shard_has_what_shard_like_promises(shard: object) -> None:
    missing = [name for name in MEMBERS if not hasattr(shard, name)]
    assert missing == []
    assert isinstance(shard.assigned, frozenset)  # type: ignore[attr-defined]
    assert shard.failed is None and shard.queued_records == 0  # type: ignore[attr-defined]
    assert shard.topic_missing is False  # type: ignore[attr-defined]


@pytest.mark.parametrize("method", ["start", "get", "commit", "close"])
def test_every_shard_takes_the_owners_arguments(shard: object, method: str) -> None:
    """The owner calls ``get(timeout, claim=...)`` and ``close(timeout)``: same names, and the
    protocol's defaults are defaults there too."""
    promised = inspect.signature(getattr(ShardLike, method)).parameters
    actual = inspect.signature(getattr(shard, method)).parameters
    assert list(actual) == [p for p in promised if p != "self"]
    for name, param in promised.items():
        if param.default is not inspect.Parameter.empty:
            assert actual[name].default is not inspect.Parameter.empty, name


def test_a_childs_question_gives_up_when_its_parent_closes_it() -> None:
    """A child waiting for its parent's answer (a revocation as the pass closes) stops waiting
    at the parent's Close: its consumer's close is not held for the question's timeout."""
    import threading
    import time

    sent: list[object] = []
    hooks = _ChildHooks(sent.append, {}, session_ms=45_000)
    threading.Timer(0.2, hooks.close_asks).start()
    t0 = time.monotonic()
    hooks.on_revoking(0, [1, 2])
    assert time.monotonic() - t0 < 3.0  # its bound is 15 s
    assert len(sent) == 1  # the question went up; no answer came
    assert hooks.on_revoked(0, [1, 2]) == {}  # nothing requested: nothing to commit
    t0 = time.monotonic()
    hooks.on_revoking(0, [3])  # once closing, nothing more is asked
    assert len(sent) == 1 and time.monotonic() - t0 < 0.5
