"""consumers.settings: Secret never shows itself, SecuritySettings and ConsumerSettings reject
bad values and combinations with a ConfigError that names the setting, and the derived values
(kafka-python options, static split, inflate bound, loggable view) are right."""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import Any

import pytest

from consumers.errors import ConfigError
from consumers.settings import ConsumerSettings, Secret, SecuritySettings


def settings(**overrides: Any) -> ConsumerSettings:
    return ConsumerSettings(**{"bootstrap_servers": "h:9092", "topic": "t", **overrides})


def _rejects(setting: str, build: Any, *words: str) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        build()
    assert info.value.setting == setting
    assert str(info.value).startswith(f"invalid setting {setting}=")
    for word in words:
        assert word in str(info.value)
    return info.value


# ---- Secret -------------------------------------------------------------------------------


def test_a_secret_never_shows_in_repr_str_or_formatting() -> None:
    s = Secret("hunter2-pw")
    logged = logging.makeLogRecord({"msg": "%s %r", "args": (s, s)}).getMessage()
    for shown in (repr(s), str(s), f"{s}", f"{s!r}", logged, repr([s]), repr({"k": s})):
        assert "hunter2" not in shown
    assert s.get() == "hunter2-pw"


def test_secrets_compare_by_value_and_never_equal_the_plain_string() -> None:
    assert Secret("a-pw") == Secret("a-pw") and hash(Secret("a-pw")) == hash(Secret("a-pw"))
    assert Secret("a-pw") != Secret("b-pw")
    assert Secret("a-pw") != "a-pw"
    assert len({Secret("a-pw"), Secret("a-pw"), Secret("b-pw")}) == 2


def test_a_secret_comes_from_the_variable_or_is_absent() -> None:
    env = {"PW": "from-env", "EMPTY": ""}
    assert Secret.from_env_or_file("PW", environ=env) == Secret("from-env")
    assert Secret.from_env_or_file("EMPTY", environ=env) is None
    assert Secret.from_env_or_file("UNSET", "UNSET_FILE", environ=env) is None


def test_a_secret_file_wins_over_the_variable_and_loses_its_newline(tmp_path: Path) -> None:
    """Kubernetes Secret volumes and ``echo pw > file`` end the value with a newline."""
    path = tmp_path / "pw"
    path.write_text("  from-file\n", encoding="utf-8")
    env = {"PW": "from-env", "PW_FILE": str(path)}
    assert Secret.from_env_or_file("PW", "PW_FILE", environ=env) == Secret("from-file")
    env["PW_FILE"] = ""  # set but empty: the variable
    assert Secret.from_env_or_file("PW", "PW_FILE", environ=env) == Secret("from-env")


def test_a_secret_file_that_cannot_be_read_names_the_variable_and_the_path(
    tmp_path: Path,
) -> None:
    missing = tmp_path / "nope"
    exc = _rejects(
        "PW_FILE",
        lambda: Secret.from_env_or_file("PW", "PW_FILE", environ={"PW_FILE": str(missing)}),
        str(missing),
        "cannot read the file",
    )
    assert isinstance(exc.__cause__, OSError)


def test_a_secret_is_read_from_the_process_environment_by_default(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("STREAMER_TEST_SECRET", "env-pw")
    assert Secret.from_env_or_file("STREAMER_TEST_SECRET") == Secret("env-pw")


# ---- SecuritySettings ---------------------------------------------------------------------


def _sasl(**overrides: Any) -> SecuritySettings:
    given: dict[str, Any] = {
        "security_protocol": "SASL_SSL",
        "sasl_mechanism": "SCRAM-SHA-512",
        "sasl_plain_username": "alice",
        "sasl_plain_password": Secret("alice-pw"),
        **overrides,
    }
    return SecuritySettings(**given)


@pytest.fixture
def pem(tmp_path: Path) -> Path:
    path = tmp_path / "x.pem"
    path.write_text("-----BEGIN CERTIFICATE-----\n", encoding="utf-8")
    return path


@pytest.mark.parametrize(
    ("setting", "overrides", "words"),
    [
        ("security_protocol", {"security_protocol": "sasl_ssl"}, ("SASL_SSL",)),
        ("sasl_mechanism", {"sasl_mechanism": None}, ("SCRAM-SHA-256", "SASL_SSL")),
        ("sasl_mechanism", {"sasl_mechanism": "GSSAPI"}, ("PLAIN",)),
        ("sasl_plain_username", {"sasl_plain_username": ""}, ("STREAMER_SASL_PASSWORD",)),
        ("sasl_plain_username", {"sasl_plain_password": None}, ("user name and a password",)),
        (
            "sasl_mechanism",
            {"security_protocol": "SSL"},
            ("only allowed with security_protocol SASL_PLAINTEXT or SASL_SSL",),
        ),
        ("ssl_cafile", {"ssl_cafile": "/nonexistent/ca.pem"}, ("existing PEM file",)),
    ],
)
def test_bad_security_settings_name_the_setting_and_what_is_allowed(
    setting: str, overrides: dict[str, Any], words: tuple[str, ...]
) -> None:
    exc = _rejects(setting, lambda: _sasl(**overrides), *words)
    assert "alice-pw" not in str(exc)


def test_a_client_certificate_and_its_key_come_together(pem: Path) -> None:
    ssl = {"security_protocol": "SSL"}
    _rejects("ssl_certfile", lambda: SecuritySettings(**ssl, ssl_certfile=str(pem)), "ssl_keyfile")
    _rejects("ssl_certfile", lambda: SecuritySettings(**ssl, ssl_keyfile=str(pem)), "ssl_keyfile")
    both = SecuritySettings(**ssl, ssl_certfile=str(pem), ssl_keyfile=str(pem))
    assert both.kafka_config()["ssl_keyfile"] == str(pem)


def test_a_directory_is_not_a_pem_file(tmp_path: Path) -> None:
    _rejects(
        "ssl_cafile", lambda: SecuritySettings(security_protocol="SSL", ssl_cafile=str(tmp_path))
    )


def test_plaintext_passes_only_the_protocol_even_with_tls_options(pem: Path) -> None:
    """A key password or CA given for a plaintext listener reaches no client."""
    sec = SecuritySettings(ssl_cafile=str(pem), ssl_password=Secret("key-pw"))
    assert sec.kafka_config() == {"security_protocol": "PLAINTEXT"}


def test_sasl_plaintext_passes_the_login_and_no_tls_options() -> None:
    sec = _sasl(security_protocol="SASL_PLAINTEXT", ssl_password=Secret("key-pw"))
    assert sec.kafka_config() == {
        "security_protocol": "SASL_PLAINTEXT",
        "sasl_mechanism": "SCRAM-SHA-512",
        "sasl_plain_username": "alice",
        "sasl_plain_password": "alice-pw",
    }


def test_sasl_ssl_passes_the_login_the_files_and_the_key_password(pem: Path) -> None:
    sec = _sasl(
        ssl_cafile=str(pem),
        ssl_certfile=str(pem),
        ssl_keyfile=str(pem),
        ssl_password=Secret("key-pw"),
        ssl_check_hostname=False,
    )
    assert sec.kafka_config() == {
        "security_protocol": "SASL_SSL",
        "sasl_mechanism": "SCRAM-SHA-512",
        "sasl_plain_username": "alice",
        "sasl_plain_password": "alice-pw",
        "ssl_check_hostname": False,
        "ssl_cafile": str(pem),
        "ssl_certfile": str(pem),
        "ssl_keyfile": str(pem),
        "ssl_password": "key-pw",
    }


def test_security_settings_never_show_their_passwords() -> None:
    sec = _sasl(ssl_password=Secret("key-pw"))
    for shown in (repr(sec), str(sec), repr(settings(security=sec))):
        assert "alice-pw" not in shown and "key-pw" not in shown
    assert "alice" in repr(sec)  # the user name is no secret


# ---- ConsumerSettings: accepted -----------------------------------------------------------


@pytest.mark.parametrize(
    "servers",
    [
        "h:9092",
        "10.0.0.1:9092,10.0.0.2:9093",
        " a:1 , b:2 ,",
        "[::1]:9092",
        "kafka-0.kafka.svc:9092",
    ],
)
def test_bootstrap_lists_of_host_port_are_accepted(servers: str) -> None:
    assert settings(bootstrap_servers=servers).bootstrap_servers == servers


def test_the_defaults_are_a_valid_committing_group_consumer() -> None:
    s = settings()
    assert (s.mode, s.group_id, s.commits) == ("group", "streamer", True)
    assert s.heartbeat_interval_ms < s.session_timeout_ms
    assert s.poll_timeout_ms * 4 <= s.max_poll_interval_ms


def test_a_static_consumer_without_a_group_commits_nothing() -> None:
    s = settings(mode="static", partitions=(0,), group_id="")
    assert s.commits is False
    assert settings(mode="static", partitions=(0,), group_id="replay").commits is True


def test_settings_are_frozen() -> None:
    s = settings()
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.topic = "other"  # type: ignore[misc]


# ---- ConsumerSettings: rejected -----------------------------------------------------------


@pytest.mark.parametrize(
    ("setting", "overrides", "words"),
    [
        ("bootstrap_servers", {"bootstrap_servers": ""}, ("host:port",)),
        ("bootstrap_servers", {"bootstrap_servers": " , "}, ()),
        ("bootstrap_servers", {"bootstrap_servers": "h"}, ()),
        ("bootstrap_servers", {"bootstrap_servers": "h:port"}, ()),
        ("bootstrap_servers", {"bootstrap_servers": "h:123456"}, ()),
        ("bootstrap_servers", {"bootstrap_servers": "PLAINTEXT://h:9092"}, ()),
        ("bootstrap_servers", {"bootstrap_servers": "h:9092,h2"}, ()),  # every entry counts
        ("bootstrap_servers", {"bootstrap_servers": "h:99999"}, ()),  # no such port
        ("bootstrap_servers", {"bootstrap_servers": "h:0"}, ()),
        ("bootstrap_servers", {"bootstrap_servers": "h:\u0669\u0660\u0669\u0662"}, ()),  # not ASCII
        ("bootstrap_servers", {"bootstrap_servers": None}, ()),  # a missing value, typed
        ("topic", {"topic": ""}, ("1-249",)),
        ("topic", {"topic": "a b"}, ()),
        ("topic", {"topic": "t" * 250}, ()),
        ("topic", {"topic": "tópico"}, ()),
        ("topic", {"topic": "."}, ("'..'",)),  # Kafka refuses both
        ("topic", {"topic": ".."}, ()),
        ("mode", {"mode": "assign"}, ("'group'", "'static'")),
        ("group_id", {"group_id": ""}, ("group mode needs",)),
        ("partitions", {"mode": "static"}, ("static mode needs",)),
        ("partitions", {"mode": "static", "partitions": ()}, ()),
        ("partitions", {"partitions": (0, 1)}, ("only allowed in static mode",)),
        ("partitions", {"mode": "static", "partitions": (0, -1)}, (">= 0",)),
        ("shard_runtime", {"shard_runtime": "auto"}, ("thread or process",)),
        ("auto_offset_reset", {"auto_offset_reset": "smallest"}, ("'earliest'", "'none'")),
        ("isolation_level", {"isolation_level": "committed"}, ("'read_committed'",)),
        ("kafka_client", {"client": "librdkafka"}, ("'confluent'",)),
        ("partition_assignment_strategy", {"partition_assignment_strategy": "sticky"}, ()),
        ("group_protocol", {"group_protocol": "modern"}, ("'classic'",)),
        ("group_protocol", {"group_protocol": "consumer"}, ("--kafka-client confluent",)),
        ("num_shards", {"num_shards": 257}, ("at most 256",)),
        ("heartbeat_interval_ms", {"heartbeat_interval_ms": 45_000}, ("session_timeout_ms",)),
        ("poll_timeout_ms", {"poll_timeout_ms": 80_000}, ("max_poll_interval_ms (300000)",)),
        ("worker_id", {"worker_id": ""}, ("1-200",)),
        ("worker_id", {"worker_id": "w/0"}, ()),
        ("worker_id", {"worker_id": "w" * 201}, ()),
        ("max_batch_inflated_bytes", {"max_batch_inflated_bytes": (1 << 20) - 1}, ("1048576",)),
        ("max_batch_inflated_bytes", {"max_batch_inflated_bytes": -1}, ()),
        ("max_batch_inflated_bytes", {"max_batch_inflated_bytes": 2.0 * (1 << 20)}, ()),
    ],
)
def test_bad_consumer_settings_name_the_setting_and_what_is_allowed(
    setting: str, overrides: dict[str, Any], words: tuple[str, ...]
) -> None:
    _rejects(setting, lambda: settings(**overrides), *words)


@pytest.mark.parametrize(
    "name",
    [
        "num_shards",
        "max_poll_records",
        "fetch_max_bytes",
        "max_partition_fetch_bytes",
        "max_poll_interval_ms",
        "session_timeout_ms",
        "heartbeat_interval_ms",
        "request_timeout_ms",
        "metadata_max_age_ms",
        "poll_timeout_ms",
        "queue_max_blocks",
        "bootstrap_timeout_ms",
    ],
)
@pytest.mark.parametrize("value", [0, -1, True, 1.5, "100"])
def test_counts_and_durations_must_be_positive_integers(name: str, value: object) -> None:
    """``True`` is an int to Python, not a count; a float or a string from a config file is no
    integer either."""
    exc = _rejects(name, lambda: settings(**{name: value}), "a positive integer")
    assert exc.value == value and type(exc.value) is type(value)


def test_the_consumer_group_protocol_is_allowed_with_confluent() -> None:
    assert settings(group_protocol="consumer", client="confluent").group_protocol == "consumer"


@pytest.mark.parametrize("topic", ["t" * 249, "a.b_c-D9"])
def test_topic_names_at_the_limits_are_accepted(topic: str) -> None:
    assert settings(topic=topic).topic == topic


# ---- ConsumerSettings: derived values -----------------------------------------------------


@pytest.mark.parametrize(
    ("fetch_max_bytes", "explicit", "bound"),
    [
        (52_428_800, 0, 104_857_600),  # twice the default fetch_max_bytes
        (1_000_000, 0, 64 << 20),  # never below 64 MiB
        (52_428_800, 1 << 20, 1 << 20),  # an explicit bound wins, even below the default
        (1_000_000, 200 << 20, 200 << 20),
    ],
)
def test_the_inflate_bound(fetch_max_bytes: int, explicit: int, bound: int) -> None:
    s = settings(fetch_max_bytes=fetch_max_bytes, max_batch_inflated_bytes=explicit)
    assert s.inflate_bound == bound


def test_group_instance_ids_are_stable_and_distinct_per_shard() -> None:
    s = settings(worker_id="pod-3")
    ids = [s.group_instance_id(k) for k in range(4)]
    assert ids == [settings(worker_id="pod-3").group_instance_id(k) for k in range(4)]
    assert len(set(ids)) == 4 and all(i.startswith("pod-3") for i in ids)
    assert settings(worker_id="pod-4").group_instance_id(0) not in ids


@pytest.mark.parametrize(
    ("partitions", "num_shards"),
    [
        (tuple(range(8)), 3),
        ((9, 1, 5, 3, 7), 2),  # one worker's share of a cluster, unsorted
        ((0, 0, 1, 1, 2), 2),  # a partition twice
        ((4, 2), 5),  # more shards than partitions
    ],
)
def test_the_static_split_gives_every_partition_to_exactly_one_shard(
    partitions: tuple[int, ...], num_shards: int
) -> None:
    s = settings(mode="static", partitions=partitions)
    shares = [s.static_partitions(k, num_shards) for k in range(num_shards)]
    assert sorted(p for share in shares for p in share) == sorted(set(partitions))
    assert all(share == sorted(share) for share in shares)
    sizes = [len(share) for share in shares]
    assert max(sizes) - min(sizes) <= 1  # balanced


def test_the_static_split_of_a_whole_topic_is_partition_modulo_shards() -> None:
    s = settings(mode="static", partitions=tuple(range(10)))
    for k in range(3):
        assert s.static_partitions(k, 3) == [p for p in range(10) if p % 3 == k]


def test_describe_shows_every_setting_but_the_passwords() -> None:
    sec = _sasl(ssl_password=Secret("key-pw"))
    s = settings(security=sec, group_id="g1")
    view = s.describe()
    assert "alice-pw" not in repr(view) and "key-pw" not in repr(view)
    assert view["security"]["sasl_plain_password"] == "***"
    assert view["security"]["ssl_password"] == "***"
    assert view["security"]["sasl_plain_username"] == "alice"
    assert view["group_id"] == "g1" and view["topic"] == "t"
    names = {f.name for f in dataclasses.fields(ConsumerSettings)}
    assert set(view) == names


def test_describe_shows_absent_passwords_as_absent() -> None:
    view = settings().describe()
    assert view["security"]["sasl_plain_password"] is None
    assert view["security"]["ssl_password"] is None
