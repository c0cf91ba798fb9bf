"""A local N-node Kafka cluster for fault tests (issue 24): ``deploy/local/kafka-cluster.sh``.

Every node is a JVM of the same jars as the single broker of ``kafka.sh``, broker and controller
at once, node.id = its index 1..N. The cluster keeps its state (and so its ports) in its own
``KAFKA_CLUSTER_DIR``; the script never picks the single broker's ports. Node indexes are what
``leader_of``, ``controller`` and ``coordinator_of`` return, and what ``kill_node`` and friends
take. Leaders, ISRs and coordinators come from Kafka's Java admin client (the script's helper),
which tries another node when one just died, unlike kafka-python's admin client.

Just after a ``kill -9`` the surviving nodes still report the dead node as live and in the ISR
for a few seconds (until its broker session times out): use ``wait_for_leader`` rather than one
``leader_of`` call, and ``restart_node`` (which waits for N live brokers and full ISRs) before
the next fault.
"""

from __future__ import annotations

import os
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CLUSTER_SH = ROOT / "deploy" / "local" / "kafka-cluster.sh"


class ClusterError(RuntimeError):
    """The script failed; the message carries its stderr."""


@dataclass
class KafkaCluster:
    """An N-node cluster run by kafka-cluster.sh with its state in ``state``."""

    state: Path
    nodes: int = 3
    bootstrap: str = ""  # 127.0.0.1:P1,127.0.0.1:P2,... once started

    # ----------------------------------------------------------------------------------------
    # The script

    def _env(self) -> dict[str, str]:
        env = dict(os.environ)
        env["KAFKA_CLUSTER_DIR"] = str(self.state)
        return env

    def sh(self, *args: str | int, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["bash", str(CLUSTER_SH), *map(str, args)],
            env=self._env(),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def _run(self, *args: str | int, timeout: float = 300) -> str:
        """Run the script; its last stdout line, or ClusterError with its stderr."""
        proc = self.sh(*args, timeout=timeout)
        if proc.returncode != 0:
            cmd = " ".join(map(str, args))
            raise ClusterError(
                f"kafka-cluster.sh {cmd} failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}"
            )
        lines = proc.stdout.strip().splitlines()
        return lines[-1] if lines else ""

    # ----------------------------------------------------------------------------------------
    # The whole cluster

    def start(self, timeout: float = 300) -> str:
        """Start (or reuse) the cluster; its bootstrap list."""
        address = self._run("start", "--nodes", self.nodes, timeout=timeout)
        if len(address.split(",")) != self.nodes:
            raise ClusterError(f"kafka-cluster.sh start printed {address!r}")
        self.bootstrap = address
        return address

    def stop(self) -> None:
        """Stop every node (SIGTERM, SIGKILL after 30 s); state and logs stay."""
        self._run("stop", timeout=120)

    def clean(self) -> None:
        """Stop every node and delete the state folder."""
        self._run("clean", timeout=120)

    @property
    def servers(self) -> list[str]:
        """The bootstrap list as a list (kafka-python's ``bootstrap_servers``)."""
        return self.bootstrap.split(",")

    def address_of(self, node: int) -> str:
        """host:port of node ``node`` (1..N)."""
        return self.servers[node - 1]

    def status(self) -> dict[int, str]:
        """{index: "running" | "paused" | "stopped"}."""
        out: dict[int, str] = {}
        for line in self.sh("status", timeout=60).stdout.splitlines():
            if line.startswith("node "):
                index, rest = line[len("node ") :].split(":", 1)
                out[int(index)] = rest.split()[0]
        return out

    def health(self) -> tuple[bool, str]:
        """(healthy, one line): N live brokers and no offline or under-replicated partition."""
        proc = self.sh("health", timeout=60)
        return proc.returncode == 0, (proc.stdout.strip() or proc.stderr.strip())

    def wait_healthy(self, timeout: float = 120) -> None:
        """Wait until N brokers are live and every partition has a full ISR."""
        proc = subprocess.run(
            ["bash", str(CLUSTER_SH), "wait-healthy"],
            env={**self._env(), "KAFKA_START_TIMEOUT": str(int(timeout))},
            capture_output=True,
            text=True,
            timeout=timeout + 60,
            check=False,
        )
        if proc.returncode != 0:
            raise ClusterError(f"cluster not healthy within {timeout:.0f}s:\n{proc.stderr[-3000:]}")

    def heal(self) -> None:
        """Resume paused nodes and restart stopped ones, then wait healthy (between tests)."""
        for node, state in self.status().items():
            if state == "paused":
                self.resume_node(node)
            elif state == "stopped":
                self.restart_node(node)
        self.wait_healthy()

    def create_topic(self, prefix: str, partitions: int, min_isr: int = 2) -> str:
        """A new topic ``<prefix>-<random>`` replicated on every node (RF = N)."""
        import uuid

        from kafka.admin import KafkaAdminClient

        topic = f"{prefix}-{uuid.uuid4().hex[:10]}"
        admin = KafkaAdminClient(bootstrap_servers=self.servers, client_id=prefix)
        try:
            spec = {
                "num_partitions": partitions,
                "replication_factor": self.nodes,
                "configs": {"min.insync.replicas": str(min_isr)},
            }
            admin.create_topics({topic: spec}, wait_for_metadata=True)
        finally:
            admin.close()
        return topic

    # ----------------------------------------------------------------------------------------
    # One node (1..N)

    def stop_node(self, node: int) -> None:
        """SIGTERM (a clean shutdown), wait until the JVM exits."""
        self._run("stop-node", node, timeout=120)

    def kill_node(self, node: int) -> None:
        """SIGKILL: no clean shutdown."""
        self._run("kill-node", node, timeout=60)

    def restart_node(self, node: int) -> None:
        """(Stop and) start the node on its ports and data; return when it serves, N brokers
        are live and no partition is under-replicated."""
        self._run("restart-node", node, timeout=300)

    def pause_node(self, node: int) -> None:
        """SIGSTOP: the node keeps its sockets open and answers nothing."""
        self._run("pause-node", node, timeout=60)

    def resume_node(self, node: int) -> None:
        self._run("resume-node", node, timeout=60)

    def node_log(self, node: int) -> str:
        path = self.state / f"node-{node}" / "logs" / "server.log"
        try:
            return path.read_text(encoding="utf-8", errors="replace")
        except FileNotFoundError:
            return ""

    # ----------------------------------------------------------------------------------------
    # Who does what

    def leader_of(self, topic: str, partition: int) -> int:
        """Index of the node leading ``topic``-``partition`` (as the cluster reports it now)."""
        return int(self._run("leader", topic, partition, timeout=60))

    def isr_of(self, topic: str, partition: int) -> list[int]:
        """Indexes of the in-sync replicas of ``topic``-``partition``."""
        out = self._run("isr", topic, partition, timeout=60)
        return sorted(int(x) for x in out.split(",") if x)

    def controller(self) -> int:
        """Index of the active controller (the KRaft quorum leader)."""
        return int(self._run("controller", timeout=60))

    def coordinator_of(self, group: str) -> int:
        """Index of the group coordinator of ``group`` (for a group the brokers do not know yet:
        the leader of its ``__consumer_offsets`` partition, which is where it will live)."""
        return int(self._run("coordinator", group, timeout=60))

    def wait_for_leader(
        self, topic: str, partition: int, *, not_on: int | None = None, timeout: float = 60
    ) -> int:
        """The partition's leader, once it is not node ``not_on`` (after that node died)."""
        deadline = time.monotonic() + timeout
        last: object = None
        while time.monotonic() < deadline:
            try:
                leader = self.leader_of(topic, partition)
            except ClusterError as exc:  # no leader for a moment
                last = exc
            else:
                if leader != not_on:
                    return leader
                last = f"still led by node {leader}"
            time.sleep(0.5)
        raise ClusterError(f"{topic}-{partition}: no new leader within {timeout:.0f}s ({last})")
