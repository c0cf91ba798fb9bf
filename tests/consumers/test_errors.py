"""consumers.errors, and the errors of the input path and of training beside their code
(streamer.input.errors, streamer.train.errors): one root, the exit code and retriable flag of
each kind (docs/reference/exit-codes.md), and messages that name what was wrong and what to do, never
more than they were given."""

from __future__ import annotations

import inspect
import pickle

import pytest

import consumers.errors as errors_mod
import streamer.input.errors as input_errors
import streamer.train.errors as train_errors
from consumers.errors import (
    AuthenticationError,
    BrokerUnavailableError,
    ClientFatalError,
    ConfigError,
    FencedError,
    GroupActiveError,
    GroupProtocolError,
    GroupRepairError,
    GroupResetError,
    OffsetResetError,
    ShardFailedError,
    StreamerError,
    TlsHandshakeError,
    TopicCreateError,
    TopicNotFoundError,
)
from streamer.input.errors import PipelineError, RejectLimitError
from streamer.train.errors import CheckpointsFailingError, ModelDivergedError

#: One instance of every error, as the code raises them.
EXAMPLES: dict[type[StreamerError], StreamerError] = {
    StreamerError: StreamerError("a broker went away"),
    ConfigError: ConfigError("num_shards", 0, "a positive integer"),
    TopicCreateError: TopicCreateError("dead_letter_topic", "dlq", 3, "TopicAuthorizationFailed"),
    BrokerUnavailableError: BrokerUnavailableError("h:9092", "connection refused"),
    AuthenticationError: AuthenticationError("h:9093", "SaslAuthenticationFailedError"),
    TlsHandshakeError: TlsHandshakeError("h:9093", "certificate verify failed"),
    TopicNotFoundError: TopicNotFoundError("samples"),
    FencedError: FencedError("worker-0-shard-1"),
    ClientFatalError: ClientFatalError("confluent", "_FENCED"),
    GroupRepairError: GroupRepairError("g", "worker-0-shard-0", "UnknownMemberIdError"),
    GroupActiveError: GroupActiveError("g", 2),
    GroupResetError: GroupResetError("g", {0: "UnknownMemberIdError"}),
    GroupProtocolError: GroupProtocolError("g", "cooperative-sticky"),
    OffsetResetError: OffsetResetError("samples", [3, 1], out_of_range=False),
    PipelineError: PipelineError("the input pipeline", "InvalidArgumentError"),
    ShardFailedError: ShardFailedError(1, RuntimeError("poller died")),
    ModelDivergedError: ModelDivergedError("5 steps with a NaN loss", "ckpt-12"),
    CheckpointsFailingError: CheckpointsFailingError(612.0, 14, "No space left on device", "/ckpt"),
    RejectLimitError: RejectLimitError("60% of 1000 records", "dtype: x", {0: 17}),
}


def test_every_error_class_is_exported_and_has_an_example() -> None:
    """An error added to the module without being exported (or tested here) fails this test."""
    declared: set[str] = set()
    for module in (errors_mod, input_errors, train_errors):
        here = {
            name
            for name, value in vars(module).items()
            if inspect.isclass(value) and issubclass(value, BaseException)
            if value.__module__ == module.__name__
        }
        assert here == set(module.__all__), module.__name__
        declared |= here
    assert {cls.__name__ for cls in EXAMPLES} == declared


@pytest.mark.parametrize("exc", EXAMPLES.values(), ids=lambda e: type(e).__name__)
def test_every_error_is_a_streamer_error_with_a_message(exc: StreamerError) -> None:
    assert isinstance(exc, StreamerError) and isinstance(exc, Exception)
    assert str(exc).strip() and "\n" not in str(exc)


@pytest.mark.parametrize(
    ("cls", "code"),
    [
        (StreamerError, 1),
        (BrokerUnavailableError, 1),
        (AuthenticationError, 1),
        (TlsHandshakeError, 1),
        (FencedError, 1),
        (ShardFailedError, 1),
        (ConfigError, 2),
        (TopicCreateError, 2),  # a deployment's configuration problem
        (GroupActiveError, 2),
        (ModelDivergedError, 3),
        (RejectLimitError, 4),
    ],
    ids=lambda v: v.__name__ if isinstance(v, type) else str(v),
)
def test_exit_codes_tell_runtime_config_divergence_and_the_reject_breaker_apart(
    cls: type[StreamerError], code: int
) -> None:
    assert EXAMPLES[cls].exit_code == code


def test_only_what_a_later_try_can_fix_is_retriable() -> None:
    retriable = {cls for cls, exc in EXAMPLES.items() if exc.retriable}
    assert retriable == {
        BrokerUnavailableError,
        TopicNotFoundError,
        GroupRepairError,
        GroupResetError,
    }


def test_config_errors_are_value_errors_and_a_tls_failure_is_an_authentication_failure() -> None:
    """Callers that catch ValueError (argument parsing) or AuthenticationError (a rejected
    login of either kind) catch these too."""
    for cls in (ConfigError, TopicCreateError, GroupActiveError):
        assert issubclass(cls, ValueError)
    assert isinstance(EXAMPLES[TlsHandshakeError], AuthenticationError)
    assert not issubclass(AuthenticationError, ConfigError)


def test_a_config_error_names_the_setting_the_value_and_what_is_allowed() -> None:
    exc = ConfigError("topic", "bad topic", "1-249 characters of [A-Za-z0-9._-]")
    assert str(exc) == "invalid setting topic='bad topic': 1-249 characters of [A-Za-z0-9._-]"
    assert (exc.setting, exc.value, exc.allowed) == ("topic", "bad topic", exc.allowed)
    assert "None" in str(ConfigError("group_id", None, "x"))  # repr: None, not an empty string


def test_topic_create_error_says_how_to_create_the_topic_or_grant_the_right() -> None:
    exc = EXAMPLES[TopicCreateError]
    assert isinstance(exc, TopicCreateError)
    text = str(exc)
    assert exc.setting == "dead_letter_topic" and exc.topic == "dlq" and exc.value == "dlq"
    assert "TopicAuthorizationFailed" in text
    assert "kafka-topics.sh --create --topic dlq --partitions 3" in text
    assert "CREATE on the topic or the cluster" in text


def test_broker_and_authentication_errors_name_the_address_and_what_to_check() -> None:
    broker = str(EXAMPLES[BrokerUnavailableError])
    assert "h:9092" in broker and "connection refused" in broker
    assert "--bootstrap" in broker and "STREAMER_BOOTSTRAP" in broker
    auth = str(EXAMPLES[AuthenticationError])
    assert "h:9093" in auth and "SaslAuthenticationFailedError" in auth
    assert "SASL mechanism" in auth and "password" in auth


def test_a_tls_failure_points_at_the_certificates_not_at_the_sasl_login() -> None:
    exc = EXAMPLES[TlsHandshakeError]
    assert isinstance(exc, TlsHandshakeError)
    text = str(exc)
    assert text.startswith("TLS handshake with h:9093 failed: certificate verify failed.")
    assert "--ssl-cafile" in text and "--ssl-certfile" in text and "--ssl-keyfile" in text
    assert "SASL" not in text
    assert exc.bootstrap_servers == "h:9093"


def test_errors_keep_what_they_name_as_attributes() -> None:
    missing = TopicNotFoundError("samples")
    assert missing.topic == "samples"
    assert "'samples'" in str(missing) and "--topic" in str(missing)
    fenced = FencedError("worker-0-shard-1")
    assert fenced.group_instance_id == "worker-0-shard-1"
    assert "'worker-0-shard-1'" in str(fenced) and "--worker-id" in str(fenced)
    assert str(ClientFatalError("confluent", "_FENCED")) == "confluent fatal error: _FENCED"
    assert str(PipelineError("the input pipeline", "X")) == "the input pipeline failed: X"


def test_group_errors_name_the_group_and_how_to_get_out_of_it() -> None:
    active = EXAMPLES[GroupActiveError]
    assert isinstance(active, GroupActiveError)
    assert (active.setting, active.value, active.members) == ("group", "g", 2)
    assert "2 active member(s)" in str(active) and "stop its workers" in str(active)
    reset = str(EXAMPLES[GroupResetError])
    assert "'g'" in reset and "{0: 'UnknownMemberIdError'}" in reset and "stop every" in reset
    repair = str(EXAMPLES[GroupRepairError])
    assert "'worker-0-shard-0'" in repair and "'g'" in repair and "UnknownMemberIdError" in repair
    protocol = str(EXAMPLES[GroupProtocolError])
    assert "'g'" in protocol and "(cooperative-sticky)" in protocol
    assert "--partition-assignment-strategy" in protocol


@pytest.mark.parametrize(
    ("out_of_range", "what"),
    [(False, "have no committed offset"), (True, "are out of range")],
)
def test_offset_reset_error_sorts_the_partitions_and_says_why_and_the_fix(
    out_of_range: bool, what: str
) -> None:
    given = [5, 0, 3]
    exc = OffsetResetError("samples", given, out_of_range)
    assert exc.partitions == [0, 3, 5] and given == [5, 0, 3]  # sorted, the caller's list kept
    assert str(exc) == (
        f"partitions [0, 3, 5] of samples {what} and auto_offset_reset=none; "
        "set --auto-offset-reset earliest or latest"
    )


def test_shard_failed_error_chains_its_cause_and_names_its_type() -> None:
    cause = KeyError("p")
    exc = ShardFailedError(3, cause)
    assert exc.__cause__ is cause and exc.shard_index == 3
    assert str(exc) == "shard 3 failed: KeyError: 'p'"


@pytest.mark.parametrize(
    ("checkpoint", "kept"),
    [
        ("ckpt-12", "the last good checkpoint (ckpt-12) is kept"),
        (None, "nothing was committed past the last good step"),
        ("", "nothing was committed past the last good step"),
    ],
)
def test_model_diverged_says_what_is_kept_and_how_to_resume(
    checkpoint: str | None, kept: str
) -> None:
    text = str(ModelDivergedError("5 steps with a NaN loss", checkpoint))
    assert text.startswith("the model diverged: 5 steps with a NaN loss; ")
    assert kept in text and "Lower the learning rate" in text


def test_reject_limit_error_lists_the_held_partitions_in_order_and_keeps_a_copy() -> None:
    held = {2: 40, 0: 17}
    exc = RejectLimitError("60% of 1000 records", "dtype: x holds NaN", held)
    held[1] = 99  # the caller's dict changing later changes nothing
    assert exc.held == {0: 17, 2: 40}
    text = str(exc)
    assert "60% of 1000 records" in text and "(for example: dtype: x holds NaN)" in text
    assert "(partition 0 from offset 17, partition 2 from offset 40)" in text
    assert "--schema" in text and "--max-reject-fraction" in text
    assert "(none held)" in str(RejectLimitError("s", "e", {}))


def test_the_root_error_survives_a_pipe_to_the_parent() -> None:
    """A process shard's child sends the error that ended it over a pipe (pickle)."""
    back = pickle.loads(pickle.dumps(StreamerError("KeyError: 'p'")))  # noqa: S301
    assert type(back) is StreamerError and str(back) == "KeyError: 'p'"


def test_every_error_survives_a_pipe_to_the_parent_with_its_type_and_message() -> None:
    broken = []
    for cls, exc in EXAMPLES.items():
        data = pickle.dumps(exc)  # a process shard's child sends it over a pipe
        try:
            back = pickle.loads(data)  # noqa: S301
        except TypeError:
            broken.append(cls.__name__)
            continue
        if type(back) is not cls or str(back) != str(exc) or repr(vars(back)) != repr(vars(exc)):
            broken.append(cls.__name__)
    assert broken == []


class Stubborn(Exception):
    def __init__(self, a: int, b: int) -> None:
        super().__init__(f"{a}/{b}")


def test_an_error_that_would_not_unpickle_crosses_the_pipe_as_a_streamer_error() -> None:
    """consumers.process._picklable round-trips the error, not only dumps it: an error whose
    rebuild fails is sent as a StreamerError naming it, so the parent still fails the shard."""
    from consumers.process import _picklable

    assert pickle.dumps(Stubborn(1, 2))  # it pickles; it does not unpickle
    sent = _picklable(Stubborn(1, 2))
    assert type(sent) is StreamerError and str(sent) == "Stubborn: 1/2"
    offset = OffsetResetError("t", [0], False)
    assert _picklable(offset) is offset


def test_an_error_whose_attribute_refers_back_to_it_survives_the_pipe() -> None:
    """The attributes travel as pickle state, so a cycle (an error holding itself, as a
    traceback-keeping wrapper might) does not recurse."""
    error = PipelineError("decode", "a detail")
    error.itself = error  # type: ignore[attr-defined]
    back = pickle.loads(pickle.dumps(error))  # noqa: S301
    assert type(back) is PipelineError and str(back) == str(error)
    assert back.itself is back  # type: ignore[attr-defined]
