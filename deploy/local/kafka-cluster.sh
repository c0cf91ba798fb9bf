#!/usr/bin/env bash
# Runs an N-node Apache Kafka 4.x cluster (KRaft: every node broker + controller, one JVM each)
# on 127.0.0.1, from the same Maven Central jars as kafka.sh (fetched by `kafka.sh libs`). For
# fault tests and demos: kill, stop, pause and restart single nodes. No Docker needed.
#
#   deploy/local/kafka-cluster.sh start [--nodes N]
#                                  format storage (one cluster id, one controller.quorum.voters
#                                  line), start N nodes (default 3) on free ports, wait until
#                                  every node serves, N brokers are live and no partition is
#                                  under-replicated, and print the bootstrap list
#                                  127.0.0.1:P1,127.0.0.1:P2,... as the last line of stdout.
#                                  A stopped cluster restarts on its ports and data; a running
#                                  one is reused.
#   deploy/local/kafka-cluster.sh stop            stop every node (SIGTERM, SIGKILL after 30 s).
#   deploy/local/kafka-cluster.sh status          one line per node (index, pid, state, port);
#                                                 exit 1 if no node runs.
#   deploy/local/kafka-cluster.sh bootstrap       print the bootstrap list.
#   deploy/local/kafka-cluster.sh stop-node I     SIGTERM node I (1..N), wait until it exits.
#   deploy/local/kafka-cluster.sh kill-node I     SIGKILL node I: no clean shutdown.
#   deploy/local/kafka-cluster.sh restart-node I  (stop and) start node I on its ports and data,
#                                                 wait until it serves, N brokers are live and
#                                                 no partition is under-replicated (with other
#                                                 nodes down: until it serves; without a
#                                                 majority running: no wait).
#   deploy/local/kafka-cluster.sh pause-node I    SIGSTOP node I (a hung node: sockets open,
#   deploy/local/kafka-cluster.sh resume-node I   no answers); SIGCONT.
#   deploy/local/kafka-cluster.sh leader T P      the index of the node leading topic T partition P.
#   deploy/local/kafka-cluster.sh isr T P         the indexes in its ISR, comma-separated.
#   deploy/local/kafka-cluster.sh controller      the index of the active controller (quorum leader).
#   deploy/local/kafka-cluster.sh coordinator G   the index of group G's coordinator.
#   deploy/local/kafka-cluster.sh wait-healthy    wait until N brokers are live and no partition is
#                                                 under-replicated (exit 1 after the timeout).
#   deploy/local/kafka-cluster.sh health          one line: live brokers, under-replicated and
#                                                 offline partitions; exit 1 unless healthy.
#   deploy/local/kafka-cluster.sh clean           stop, then delete the state folder.
#
# Node I has node.id I, so the index printed by leader/controller/coordinator is the node.id.
#
# Environment:
#   KAFKA_CLUSTER_DIR    state folder (one node-I/ folder per node) [default: <repo>/.local-kafka-cluster]
#                        Never kafka.sh's KAFKA_LOCAL_DIR: the single broker's ports are avoided too.
#   KAFKA_HEAP_OPTS      JVM heap of each node [default: -Xms128m -Xmx384m]
#   KAFKA_START_TIMEOUT  seconds to wait for a start or a node restart [default: 120]
#   KAFKA_LIBS_DIR       where the jars are (see kafka.sh)
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
state="${KAFKA_CLUSTER_DIR:-$repo/.local-kafka-cluster}"
single_state="${KAFKA_LOCAL_DIR:-$repo/.local-kafka}"
heap="${KAFKA_HEAP_OPTS:--Xms128m -Xmx384m}"
start_timeout="${KAFKA_START_TIMEOUT:-120}"
libs=""

log() { echo "kafka-cluster.sh: $*" >&2; }
die() { log "error: $*"; exit 1; }

[ "$(cd "$state" 2>/dev/null && pwd)" != "$(cd "$single_state" 2>/dev/null && pwd)" ] \
    || die "KAFKA_CLUSTER_DIR is kafka.sh's state folder ($single_state): pick another one"

# --------------------------------------------------------------------------------------------
# Jars and the admin helper

need_libs() {
    [ -n "$libs" ] && return
    libs="$(bash "$here/kafka.sh" libs | tail -n 1)" || die "could not fetch the Kafka jars (see above)"
    [ -d "$libs" ] || die "kafka.sh libs printed no folder"
}

# A small Java admin client over kafka-clients (already in the jar folder), compiled once per
# version of its source: cluster health, partition leaders and ISRs, the quorum leader, group
# coordinators. The Java client retries other nodes when one is dead, unlike a one-shot ping.
admin_source() {
    cat <<'JAVA'
import java.util.*;
import java.util.concurrent.TimeUnit;
import org.apache.kafka.clients.admin.*;
import org.apache.kafka.common.*;
import org.apache.kafka.common.errors.UnknownTopicOrPartitionException;

public class ClusterAdmin {
    static Admin admin;

    public static void main(String[] a) throws Exception {
        Properties p = new Properties();
        p.put(AdminClientConfig.BOOTSTRAP_SERVERS_CONFIG, a[1]);
        p.put(AdminClientConfig.REQUEST_TIMEOUT_MS_CONFIG, "3000");
        p.put(AdminClientConfig.DEFAULT_API_TIMEOUT_MS_CONFIG, "8000");
        p.put(AdminClientConfig.RECONNECT_BACKOFF_MAX_MS_CONFIG, "1000");
        int rc = 0;
        try (Admin ad = Admin.create(p)) {
            admin = ad;
            switch (a[0]) {
                case "health": {  // health BOOTSTRAP N
                    String why = problem(Integer.parseInt(a[2]));
                    System.out.println(why == null ? "healthy: " + summary() : why);
                    rc = why == null ? 0 : 1;
                    break;
                }
                case "wait": {  // wait BOOTSTRAP N SECONDS: until live == N and no URP
                    long deadline = System.nanoTime() + (long) (Double.parseDouble(a[3]) * 1e9);
                    String why;
                    while ((why = problem(Integer.parseInt(a[2]))) != null && System.nanoTime() < deadline) {
                        Thread.sleep(300);
                    }
                    if (why != null) System.err.println(why);
                    rc = why == null ? 0 : 1;
                    break;
                }
                case "leader": {  // leader BOOTSTRAP TOPIC PARTITION
                    Node leader = partition(a[2], Integer.parseInt(a[3])).leader();
                    if (leader == null || leader.isEmpty()) { System.err.println("no leader"); rc = 1; }
                    else System.out.println(leader.id());
                    break;
                }
                case "isr": {  // isr BOOTSTRAP TOPIC PARTITION
                    StringJoiner out = new StringJoiner(",");
                    for (Node n : partition(a[2], Integer.parseInt(a[3])).isr()) out.add("" + n.id());
                    System.out.println(out);
                    break;
                }
                case "controller":
                    System.out.println(ad.describeMetadataQuorum().quorumInfo().get(8, TimeUnit.SECONDS).leaderId());
                    break;
                case "coordinator": {  // coordinator BOOTSTRAP GROUP
                    Node coordinator;
                    try {
                        coordinator = ad.describeConsumerGroups(List.of(a[2])).describedGroups()
                            .get(a[2]).get(8, TimeUnit.SECONDS).coordinator();
                    } catch (java.util.concurrent.ExecutionException e) {
                        // A group the broker does not know yet: its coordinator is the leader of
                        // its __consumer_offsets partition, as the broker picks it.
                        int n = admin.describeTopics(List.of("__consumer_offsets")).allTopicNames()
                            .get(8, TimeUnit.SECONDS).get("__consumer_offsets").partitions().size();
                        coordinator = partition("__consumer_offsets", abs(a[2].hashCode()) % n).leader();
                    }
                    if (coordinator == null || coordinator.isEmpty()) { System.err.println("no coordinator"); rc = 1; }
                    else System.out.println(coordinator.id());
                    break;
                }
                default:
                    System.err.println("unknown command " + a[0]);
                    rc = 2;
            }
        } catch (Exception e) {
            System.err.println(a[0] + " failed: " + e);
            rc = 1;
        }
        System.exit(rc);
    }

    static TopicPartitionInfo partition(String topic, int index) throws Exception {
        TopicDescription d = admin.describeTopics(List.of(topic)).allTopicNames()
            .get(8, TimeUnit.SECONDS).get(topic);
        for (TopicPartitionInfo info : d.partitions()) if (info.partition() == index) return info;
        throw new IllegalArgumentException(topic + " has no partition " + index);
    }

    static int abs(int n) {  // Kafka's Utils.abs
        return n == Integer.MIN_VALUE ? 0 : Math.abs(n);
    }

    static List<Integer> live() throws Exception {
        List<Integer> ids = new ArrayList<>();
        for (Node n : admin.describeCluster().nodes().get(5, TimeUnit.SECONDS)) ids.add(n.id());
        Collections.sort(ids);
        return ids;
    }

    static int underReplicated, offline, partitions;

    /** null when n brokers are live and every partition has a leader and a full ISR. */
    static String problem(int n) {
        try {
            List<Integer> ids = live();
            if (ids.size() < n) return "live brokers " + ids + ", want " + n;
            Set<String> names = admin.listTopics(new ListTopicsOptions().listInternal(true))
                .names().get(5, TimeUnit.SECONDS);
            underReplicated = offline = partitions = 0;
            String first = null;
            for (Map.Entry<String, KafkaFuture<TopicDescription>> e
                    : admin.describeTopics(names).topicNameValues().entrySet()) {
                TopicDescription d;
                try {
                    d = e.getValue().get(5, TimeUnit.SECONDS);
                } catch (java.util.concurrent.ExecutionException ex) {
                    if (ex.getCause() instanceof UnknownTopicOrPartitionException) continue;  // deleted meanwhile
                    throw ex;
                }
                for (TopicPartitionInfo info : d.partitions()) {
                    partitions++;
                    if (info.leader() == null || info.leader().isEmpty()) offline++;
                    if (info.isr().size() < info.replicas().size()) {
                        underReplicated++;
                        if (first == null) first = d.name() + "-" + info.partition() + " isr " + ids(info.isr()) + " of " + ids(info.replicas());
                    }
                }
            }
            if (offline > 0 || underReplicated > 0) {
                return "live brokers " + ids + ", " + offline + " offline and " + underReplicated
                    + " under-replicated partitions (" + first + ")";
            }
            return null;
        } catch (Exception e) {
            return "no answer: " + e;
        }
    }

    static String summary() throws Exception {
        return "live brokers " + live() + ", " + partitions + " partitions, none under-replicated";
    }

    static String ids(List<Node> nodes) {
        StringJoiner out = new StringJoiner(",", "[", "]");
        for (Node n : nodes) out.add("" + n.id());
        return out.toString();
    }
}
JAVA
}

admin_classes=""
need_admin() {
    [ -n "$admin_classes" ] && return
    need_libs
    local sum dir tmp
    sum="$(admin_source | sha256sum | cut -c 1-12)"
    dir="$libs/cluster-admin-$sum"
    if [ ! -f "$dir/ClusterAdmin.class" ]; then
        tmp="$(mktemp -d "$libs/.cluster-admin.XXXXXX")"
        admin_source > "$tmp/ClusterAdmin.java"
        javac -nowarn -d "$tmp" -cp "$libs/*" "$tmp/ClusterAdmin.java" >&2 \
            || { rm -rf "$tmp"; die "could not compile the cluster admin helper"; }
        mv -T "$tmp" "$dir" 2>/dev/null || rm -rf "$tmp"  # another process won the race: fine
    fi
    admin_classes="$dir"
}

cluster_admin() {  # cluster_admin COMMAND ARGS...: the Java helper against this cluster
    need_admin
    local command="$1"
    shift
    # The client's own logging off: stdout carries only the answer.
    java -Xmx128m -XX:TieredStopAtLevel=1 -Dlog4j2.level=OFF -cp "$admin_classes:$libs/*" \
        ClusterAdmin "$command" "$(bootstrap)" "$@"
}

# --------------------------------------------------------------------------------------------
# State: $state/nodes (N), $state/bootstrap, $state/node-I/{ports,server.properties,data,logs,kafka.pid}

nodes() {
    [ -f "$state/nodes" ] || die "no cluster in $state (run: $0 start --nodes 3)"
    cat "$state/nodes"
}

bootstrap() {
    [ -f "$state/bootstrap" ] || die "no cluster in $state (run: $0 start --nodes 3)"
    cat "$state/bootstrap"
}

node_dir() { echo "$state/node-$1"; }

check_index() {
    local n
    n="$(nodes)"
    [[ "${1:-}" =~ ^[0-9]+$ ]] && [ "$1" -ge 1 ] && [ "$1" -le "$n" ] \
        || die "node index must be 1..$n, got '${1:-}'"
}

alive() {  # a live process (a zombie left to a parent that never reaps it counts as dead)
    [ -e "/proc/$1" ] && ! grep -q '^State:[[:space:]]*Z' "/proc/$1/status" 2>/dev/null
}

node_pid() {  # print the pid of node I if it runs (and is still our JVM, not a recycled pid)
    local dir pid
    dir="$(node_dir "$1")"
    [ -f "$dir/kafka.pid" ] || return 1
    pid="$(cat "$dir/kafka.pid")"
    alive "$pid" || return 1
    tr '\0' ' ' < "/proc/$pid/cmdline" 2>/dev/null | grep -qF -- "$dir/server.properties" || return 1
    echo "$pid"
}

node_state() {
    local pid
    if ! pid="$(node_pid "$1")"; then echo "stopped"; return; fi
    if grep -q '^State:[[:space:]]*T' "/proc/$pid/status" 2>/dev/null; then echo "paused"; else echo "running"; fi
}

free_ports() {  # free_ports COUNT: distinct free ports, none of them the single broker's
    python3 - "$1" "$single_state/ports" <<'PY'
import socket
import sys

count, avoid_file = int(sys.argv[1]), sys.argv[2]
try:
    with open(avoid_file) as f:
        avoid = {int(p) for p in f.read().split()}
except (OSError, ValueError):
    avoid = set()
held, ports = [], []
while len(ports) < count:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    held.append(s)  # held open until all are picked: no duplicates
    port = s.getsockname()[1]
    if port not in avoid:
        ports.append(port)
print(" ".join(map(str, ports)))
for s in held:
    s.close()
PY
}

new_cluster_id() {  # what StorageTool random-uuid prints, without starting a JVM
    python3 -c '
import base64, uuid
while True:
    cid = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode()[:22]
    if not cid.startswith("-"):
        print(cid)
        break'
}

render_node() {  # render_node I: server.properties and log4j2.properties of node I
    local i="$1" n dir port cport voters="" j rf min_isr
    n="$(nodes)"
    dir="$(node_dir "$i")"
    read -r port cport < "$dir/ports"
    for j in $(seq 1 "$n"); do
        local c
        read -r _ c < "$(node_dir "$j")/ports"
        voters="${voters:+$voters,}$j@127.0.0.1:$c"
    done
    rf=$((n < 3 ? n : 3))
    min_isr=$((rf >= 3 ? 2 : 1))
    sed -e "s|@NODE_ID@|$i|g" -e "s|@PORT@|$port|g" -e "s|@CONTROLLER_PORT@|$cport|g" \
        -e "s|@VOTERS@|$voters|g" -e "s|@LOG_DIRS@|$dir/data|g" -e "s|@RF@|$rf|g" \
        -e "s|@MIN_ISR@|$min_isr|g" "$here/server-cluster.properties.template" > "$dir/server.properties"
    sed -e "s|@LOG_FILE@|$dir/logs/server.log|g" "$here/log4j2.properties.template" > "$dir/log4j2.properties"
}

launch_node() {  # start the JVM of node I in the background; remember where its log starts
    local i="$1" dir
    dir="$(node_dir "$i")"
    mkdir -p "$dir/logs"
    stat -c %s "$dir/logs/server.log" 2>/dev/null > "$dir/log-offset" || echo 0 > "$dir/log-offset"
    # shellcheck disable=SC2086
    nohup java $heap -XX:+UseG1GC -Djava.awt.headless=true \
        -Dlog4j2.configurationFile="$dir/log4j2.properties" -Dkafka.logs.dir="$dir/logs" \
        -cp "$libs/*" kafka.Kafka "$dir/server.properties" \
        >> "$dir/logs/stdout.log" 2>&1 < /dev/null &
    echo $! > "$dir/kafka.pid"
}

served() {  # node I logged "Kafka Server started" since its last launch
    local dir offset
    dir="$(node_dir "$1")"
    offset="$(cat "$dir/log-offset" 2>/dev/null || echo 0)"
    tail -c +"$((offset + 1))" "$dir/logs/server.log" 2>/dev/null | grep -q "Kafka Server started"
}

wait_served() {  # wait_served T0 I...: each node serves; die (stopping them) if one exits or time runs out
    local t0="$1" i pending
    shift
    pending=("$@")
    while [ "${#pending[@]}" -gt 0 ]; do
        local still=()
        for i in "${pending[@]}"; do
            if served "$i"; then continue; fi
            if ! node_pid "$i" >/dev/null; then
                tail -n 30 "$(node_dir "$i")/logs/server.log" "$(node_dir "$i")/logs/stdout.log" >&2 2>/dev/null || true
                die "node $i exited during start-up (logs in $(node_dir "$i")/logs)"
            fi
            still+=("$i")
        done
        pending=("${still[@]+"${still[@]}"}")
        [ "${#pending[@]}" -eq 0 ] && break
        if [ $((SECONDS - t0)) -ge "$start_timeout" ]; then
            for i in "${pending[@]}"; do tail -n 20 "$(node_dir "$i")/logs/server.log" >&2 2>/dev/null || true; done
            die "node(s) ${pending[*]} did not serve within ${start_timeout}s (logs in $state/node-*/logs)"
        fi
        sleep 0.5
    done
}

wait_healthy() {  # wait_healthy T0: N live brokers, no under-replicated partition, within the timeout
    local t0="$1" n left i
    n="$(nodes)"
    while :; do
        left=$((start_timeout - (SECONDS - t0)))
        [ "$left" -gt 0 ] || die "the cluster was not healthy within ${start_timeout}s"
        if cluster_admin wait "$n" "$((left < 15 ? left : 15))" 2>"$state/health.err"; then
            return 0
        fi
        for i in $(seq 1 "$n"); do
            [ "$(node_state "$i")" = "running" ] || die "node $i is $(node_state "$i"): the cluster cannot become healthy"
        done
        log "waiting: $(tail -n 1 "$state/health.err")"
    done
}

# --------------------------------------------------------------------------------------------
# Commands

start() {
    local n="" i
    while [ $# -gt 0 ]; do
        case "$1" in
            --nodes) n="${2:-}"; shift 2 || die "--nodes needs a number" ;;
            --nodes=*) n="${1#--nodes=}"; shift ;;
            *) die "start: unknown argument $1 (usage: start [--nodes N])" ;;
        esac
    done
    local previous=""
    [ -f "$state/nodes" ] && previous="$(cat "$state/nodes")"
    n="${n:-${previous:-3}}"
    [[ "$n" =~ ^[0-9]+$ ]] && [ "$n" -ge 1 ] && [ "$n" -le 9 ] || die "--nodes must be 1..9, got '$n'"
    need_libs

    if [ "$previous" = "$n" ]; then
        local running=0
        for i in $(seq 1 "$n"); do node_pid "$i" >/dev/null && running=$((running + 1)); done
        if [ "$running" -eq "$n" ] && cluster_admin health "$n" >/dev/null 2>&1; then
            log "reusing the running $n-node cluster in $state"
            bootstrap
            return
        fi
        if [ "$running" -gt 0 ]; then
            log "$running of $n nodes run but the cluster is not healthy: restarting all"
            stop_all
        fi
    elif [ -n "$previous" ]; then
        log "the cluster in $state has $previous nodes, $n asked: starting a fresh one"
        stop_all
    fi

    local fresh=1
    if [ "$previous" = "$n" ]; then
        fresh=0
        for i in $(seq 1 "$n"); do
            [ -f "$(node_dir "$i")/data/meta.properties" ] && [ -f "$(node_dir "$i")/ports" ] || fresh=1
        done
    fi
    if [ "$fresh" = 1 ]; then
        rm -rf "$state"
        mkdir -p "$state"
        echo '*' > "$state/.gitignore"  # the default folder lives in the repository
        echo "$n" > "$state/nodes"
        local ports=() list=""
        read -r -a ports <<< "$(free_ports $((2 * n)))"
        for i in $(seq 1 "$n"); do
            mkdir -p "$(node_dir "$i")/logs" "$(node_dir "$i")/data"
            echo "${ports[$((2 * i - 2))]} ${ports[$((2 * i - 1))]}" > "$(node_dir "$i")/ports"
            list="${list:+$list,}127.0.0.1:${ports[$((2 * i - 2))]}"
        done
        echo "$list" > "$state/bootstrap"
    fi
    for i in $(seq 1 "$n"); do render_node "$i"; done

    if [ "$fresh" = 1 ]; then
        local cluster_id pids=()
        cluster_id="$(new_cluster_id)"
        echo "$cluster_id" > "$state/cluster-id"
        for i in $(seq 1 "$n"); do
            local dir
            dir="$(node_dir "$i")"
            java -Xmx256m -cp "$libs/*" -Dlog4j2.configurationFile="$dir/log4j2.properties" \
                kafka.tools.StorageTool format -t "$cluster_id" -c "$dir/server.properties" \
                > "$dir/logs/format.log" 2>&1 &
            pids+=($!)
        done
        for i in $(seq 1 "$n"); do
            wait "${pids[$((i - 1))]}" || {
                cat "$(node_dir "$i")/logs/format.log" >&2
                die "formatting the storage of node $i failed"
            }
        done
    fi

    log "starting a $n-node Kafka cluster on $(bootstrap), state in $state"
    local t0=$SECONDS
    for i in $(seq 1 "$n"); do launch_node "$i"; done
    # shellcheck disable=SC2046
    (wait_served "$t0" $(seq 1 "$n")) || { stop_all; exit 1; }
    log "all $n nodes serve after $((SECONDS - t0))s; waiting for $n live brokers"
    (wait_healthy "$t0") || { stop_all; exit 1; }
    log "cluster ready after $((SECONDS - t0))s"
    bootstrap
}

signal_stop() {  # signal_stop PID...: SIGTERM (resuming paused ones first), SIGKILL after 30 s
    local pid
    for pid in "$@"; do kill -CONT "$pid" 2>/dev/null || true; kill -TERM "$pid" 2>/dev/null || true; done
    for _ in $(seq 1 60); do
        local left=0
        for pid in "$@"; do alive "$pid" && left=1; done
        [ "$left" = 0 ] && return 0
        sleep 0.5
    done
    for pid in "$@"; do
        if alive "$pid"; then
            log "pid $pid did not stop within 30 s; killing it"
            kill -KILL "$pid" 2>/dev/null || true
        fi
    done
    for pid in "$@"; do while alive "$pid"; do sleep 0.2; done; done
}

stop_all() {
    [ -f "$state/nodes" ] || { log "no cluster in $state"; return 0; }
    local n i pid pids=()
    n="$(nodes)"
    for i in $(seq 1 "$n"); do
        pid="$(node_pid "$i")" && pids+=("$pid")
    done
    if [ "${#pids[@]}" -eq 0 ]; then
        log "no node running (state in $state)"
        return 0
    fi
    log "stopping ${#pids[@]} node(s): pids ${pids[*]}"
    signal_stop "${pids[@]}"
    rm -f "$state"/node-*/kafka.pid
    log "stopped"
}

stop_node() {
    check_index "$1"
    local pid
    if ! pid="$(node_pid "$1")"; then log "node $1 is not running"; return 0; fi
    log "stopping node $1 (pid $pid)"
    signal_stop "$pid"
    rm -f "$(node_dir "$1")/kafka.pid"
}

kill_node() {
    check_index "$1"
    local pid
    if ! pid="$(node_pid "$1")"; then log "node $1 is not running"; return 0; fi
    log "killing node $1 (pid $pid) with SIGKILL"
    kill -KILL "$pid" 2>/dev/null || true
    while alive "$pid"; do sleep 0.1; done
    rm -f "$(node_dir "$1")/kafka.pid"
}

restart_node() {
    check_index "$1"
    need_libs
    if node_pid "$1" >/dev/null; then stop_node "$1"; fi
    render_node "$1"
    log "starting node $1 again"
    local t0=$SECONDS n i running=0
    n="$(nodes)"
    launch_node "$1"
    for i in $(seq 1 "$n"); do [ "$(node_state "$i")" = stopped ] || running=$((running + 1)); done
    if [ $((2 * running)) -le "$n" ]; then
        # Bringing nodes back one by one after a full crash: this one cannot serve alone.
        log "node $1 started; not waiting: only $running of $n nodes run (no controller quorum)"
        return 0
    fi
    wait_served "$t0" "$1"
    if [ "$running" -lt "$n" ]; then
        log "node $1 serves after $((SECONDS - t0))s; $((n - running)) other node(s) down: not waiting for full ISRs"
        return 0
    fi
    log "node $1 serves after $((SECONDS - t0))s; waiting for $n live brokers and full ISRs"
    wait_healthy "$t0"
    log "node $1 back, cluster healthy after $((SECONDS - t0))s"
}

signal_node() {  # signal_node I SIGNAL
    check_index "$1"
    local pid
    pid="$(node_pid "$1")" || die "node $1 is not running"
    kill "-$2" "$pid"
}

status() {
    [ -f "$state/nodes" ] || { log "no cluster in $state"; exit 1; }
    local n i any=0 dir port cport st
    n="$(nodes)"
    for i in $(seq 1 "$n"); do
        dir="$(node_dir "$i")"
        read -r port cport < "$dir/ports"
        st="$(node_state "$i")"
        [ "$st" = stopped ] || any=1
        echo "node $i: $st pid $(node_pid "$i" || echo -) port $port controller $cport"
    done
    echo "bootstrap $(bootstrap)"
    [ "$any" = 1 ]
}

command="${1:-}"
shift || true
case "$command" in
    start) start "$@" ;;
    stop) stop_all ;;
    status) status ;;
    bootstrap) bootstrap ;;
    stop-node) stop_node "${1:-}" ;;
    kill-node) kill_node "${1:-}" ;;
    restart-node) restart_node "${1:-}" ;;
    pause-node) signal_node "${1:-}" STOP ;;
    resume-node) signal_node "${1:-}" CONT ;;
    leader) [ $# -eq 2 ] || die "usage: $0 leader TOPIC PARTITION"; cluster_admin leader "$1" "$2" ;;
    isr) [ $# -eq 2 ] || die "usage: $0 isr TOPIC PARTITION"; cluster_admin isr "$1" "$2" ;;
    controller) cluster_admin controller ;;
    coordinator) [ $# -eq 1 ] || die "usage: $0 coordinator GROUP"; cluster_admin coordinator "$1" ;;
    health) cluster_admin health "$(nodes)" ;;
    wait-healthy) wait_healthy "$SECONDS" ;;
    clean) stop_all; rm -rf "$state" ;;
    libs) need_libs; echo "$libs" ;;
    *)
        echo "usage: $0 start [--nodes N] | stop | status | bootstrap | stop-node I | kill-node I |" \
            "restart-node I | pause-node I | resume-node I | leader TOPIC PARTITION | isr TOPIC PARTITION |" \
            "controller | coordinator GROUP | health | wait-healthy | clean" >&2
        exit 2 ;;
esac
