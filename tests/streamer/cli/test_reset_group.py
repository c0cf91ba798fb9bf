"""``streamer reset-group`` against the real broker: a dry run changes nothing, ``--execute``
moves the group's commits where ``streamer lag`` sees them, a group with a member is refused
(exit 2) and keeps its commits."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable

import pytest

from consumers.admin import group_activity, reset_group
from consumers.errors import GroupActiveError
from streamer.cli.commands import main
from tests.streamer.cli.test_replay import commits, produce_timed, wait_until


def cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """``streamer ARGS`` in this process (no TensorFlow: about 0.5 s a call, not 3 s)."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    try:
        rc = main(list(args))
    finally:  # main configures logging for a process of its own
        root.handlers[:], root.level = handlers, level
    out = capsys.readouterr()
    return rc, out.out, out.err


def commit(bootstrap: str, group: str, topic: str, offsets: dict[int, int]) -> None:
    from kafka import KafkaConsumer, TopicPartition
    from kafka.structs import OffsetAndMetadata

    owner = KafkaConsumer(bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False)
    owner.commit(
        {TopicPartition(topic, p): OffsetAndMetadata(o, "", -1) for p, o in offsets.items()}
    )
    owner.close(autocommit=False)


def offsets(bootstrap: str, group: str, topic: str) -> dict[int, int]:
    return {p: o for p, (o, _m) in commits(bootstrap, group, topic).items()}


@pytest.mark.kafka
@pytest.mark.timeout(180)
def test_reset_group_dry_run_execute_and_a_live_group(
    kafka_bootstrap: str,
    make_topic: Callable[..., str],
    group_id: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from kafka import KafkaConsumer

    topic = make_topic(2)
    base = int(time.time() * 1000) - 3_600_000
    produce_timed(kafka_bootstrap, topic, 2, 50, base)  # (p, i) at base + 1000*i + p
    commit(kafka_bootstrap, group_id, topic, {0: 40, 1: 45})
    common = ["reset-group", "--bootstrap", kafka_bootstrap, "--group", group_id, "--topic", topic]
    # Inclusive: the first record at or after the time. Offset 10 of partition 0 is at
    # base + 10_000, of partition 1 at base + 10_001.
    when = str(base + 10_000)

    rc, out, err = cli(capsys, *common, "--to", when)
    assert rc == 0, err
    rows = [line.split() for line in out.splitlines() if line.startswith(group_id)]
    assert [r[2:] for r in rows] == [["0", "40", "10"], ["1", "45", "10"]]
    assert "dry run: nothing changed" in out
    assert offsets(kafka_bootstrap, group_id, topic) == {0: 40, 1: 45}

    rc, out, err = cli(capsys, *common, "--to", when, "--execute")
    assert rc == 0, err
    assert f"committed: group '{group_id}'" in out
    rc, out, err = cli(capsys, "lag", "--bootstrap", kafka_bootstrap, "--group", group_id,
                       "--topic", topic, "--json")  # fmt: skip
    assert rc == 0, err
    lag = {r["partition"]: (r["committed"], r["lag"]) for r in json.loads(out)["partitions"]}
    assert lag == {0: (10, 40), 1: (10, 40)}

    rc, _out, err = cli(capsys, *common, "--to", "latest", "--execute")
    assert rc == 0, err
    assert offsets(kafka_bootstrap, group_id, topic) == {0: 50, 1: 50}

    rc, _out, err = cli(capsys, *common, "--to", "soon")
    assert rc == 2 and "invalid setting to='soon': earliest, latest" in err

    # A group with a member (a worker polling): refused before anything is computed, exit 2,
    # commits as they were; the library call refuses it too.
    member = KafkaConsumer(
        topic, bootstrap_servers=kafka_bootstrap, group_id=group_id,
        enable_auto_commit=False, session_timeout_ms=6000,
    )  # fmt: skip
    try:

        def joined() -> bool:
            member.poll(200)  # joins the group (an empty assignment is fine: it is a member)
            return group_activity(kafka_bootstrap, group_id).members == 1

        wait_until(joined, 60, "a member")
        for extra in ([], ["--execute"]):
            rc, out, err = cli(capsys, *common, "--to", "earliest", *extra)
            assert rc == 2, err
            assert f"invalid setting group='{group_id}': has 1 active member(s)" in err
            assert "stop its workers first" in err and out == ""
        with pytest.raises(GroupActiveError):
            reset_group(kafka_bootstrap, group_id, topic, {0: 0, 1: 0})
    finally:
        member.close(autocommit=False)
    assert offsets(kafka_bootstrap, group_id, topic) == {0: 50, 1: 50}
