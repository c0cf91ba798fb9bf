"""Fixtures: private Kafka brokers for the reliability tests (issue 6), never the shared one.

Each broker is a separate ``deploy/local/kafka.sh`` instance with its own ``KAFKA_LOCAL_DIR``
under ``tmp_path_factory`` (see brokers.py), stopped at the end of its scope. ``kafka_cluster``
is a 3-node cluster of ``deploy/local/kafka-cluster.sh`` (see cluster.py), also in its own
folder and on its own ports.
"""

from __future__ import annotations

import fcntl
import os
import subprocess
import tempfile
from collections.abc import Iterator

import pytest

from tests.reliability.brokers import (
    USERS,
    Certs,
    PrivateBroker,
    fixed_ports,
    free_port,
    make_certs,
    need_tools,
    serve,
    unavailable,
)
from tests.reliability.cluster import ClusterError, KafkaCluster


@pytest.fixture(scope="session")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    need_tools("openssl")
    return make_certs(tmp_path_factory.mktemp("certs"))


@pytest.fixture(scope="session")
def secure_broker(
    tmp_path_factory: pytest.TempPathFactory, certs: Certs
) -> Iterator[PrivateBroker]:
    """A private broker with PLAINTEXT, SASL_PLAINTEXT, SSL (client certificates required) and
    SASL_SSL listeners; SCRAM-SHA-256/512 and PLAIN users from ``USERS``."""
    need_tools("java", "bash")
    state = tmp_path_factory.mktemp("kafka-secure")
    port, cport = fixed_ports(state)
    ports = {"SASL_PLAINTEXT": free_port(), "SSL": free_port(), "SASL_SSL": free_port()}
    listeners = {"PLAINTEXT": f"127.0.0.1:{port}"}
    listeners.update({name: f"127.0.0.1:{p}" for name, p in ports.items()})
    urls = [f"{name}://{addr}" for name, addr in listeners.items()]
    urls.append(f"CONTROLLER://127.0.0.1:{cport}")
    plain_users = " ".join(
        f'user_{name}="{pw}"' for name, (mech, pw) in USERS.items() if mech == "PLAIN"
    )
    lines = [
        "listeners=" + ",".join(urls),
        "advertised.listeners=" + ",".join(urls),
        "listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT,"
        "SASL_PLAINTEXT:SASL_PLAINTEXT,SSL:SSL,SASL_SSL:SASL_SSL",
        "sasl.enabled.mechanisms=PLAIN,SCRAM-SHA-256,SCRAM-SHA-512",
        f"ssl.keystore.type=PEM\nssl.keystore.location={certs.server_keystore}",
        f"ssl.truststore.type=PEM\nssl.truststore.location={certs.ca}",
        "listener.name.ssl.ssl.client.auth=required",
    ]
    for listener in ("sasl_plaintext", "sasl_ssl"):
        lines.append(
            f"listener.name.{listener}.plain.sasl.jaas.config="
            f"org.apache.kafka.common.security.plain.PlainLoginModule required {plain_users};"
        )
        for mech in ("scram-sha-256", "scram-sha-512"):
            lines.append(
                f"listener.name.{listener}.{mech}.sasl.jaas.config="
                "org.apache.kafka.common.security.scram.ScramLoginModule required;"
            )
    extra = state.parent / f"{state.name}.properties"
    extra.write_text("\n".join(lines) + "\n")
    scram = [
        f"--add-scram {mech}=[name={name},password={pw}]"
        for name, (mech, pw) in USERS.items()
        if mech.startswith("SCRAM")
    ]
    broker = PrivateBroker(state, extra, " ".join(scram), listeners)
    yield from serve(broker)


@pytest.fixture(scope="module")
def private_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrivateBroker]:
    """A plain private broker that a test may stop, kill and restart (never the shared one)."""
    need_tools("java", "bash")
    broker = PrivateBroker(tmp_path_factory.mktemp("kafka-faults"))
    yield from serve(broker)


@pytest.fixture(scope="module")
def kafka_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaCluster]:
    """A 3-node KRaft cluster (RF 3, min ISR 2 by default) started once per module that asks for
    it, stopped at its end. Tests may kill, stop, pause and restart nodes; a test that leaves a
    node down should ``heal()`` it. A start failure fails the test in CI and skips it elsewhere.
    """
    need_tools("java", "bash", "python3")
    # One 3-node cluster on the machine at a time: under pytest-xdist the modules that ask
    # for it may run side by side, and six brokers on two cores would starve both.
    lock = open(os.path.join(tempfile.gettempdir(), "streamer-test-cluster.lock"), "w")  # noqa: SIM115
    fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file is closed
    cluster = KafkaCluster(tmp_path_factory.mktemp("kafka-cluster"), nodes=3)
    try:
        cluster.start()
    except (ClusterError, OSError, subprocess.TimeoutExpired) as exc:
        try:
            cluster.stop()
        except (ClusterError, OSError, subprocess.TimeoutExpired) as stop_exc:
            print(f"stopping the half-started cluster: {stop_exc}")
        lock.close()
        unavailable(f"could not start the 3-node Kafka cluster: {exc}")
    try:
        yield cluster
    finally:
        cluster.stop()  # the state folder (logs) stays under pytest's basetemp
        lock.close()
