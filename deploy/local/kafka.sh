#!/usr/bin/env bash
# Runs a real single-node Apache Kafka 4.x broker (KRaft: broker + controller in one JVM) on
# 127.0.0.1, from Maven Central jars. No Docker needed: Java 17+ and Maven are enough.
#
#   deploy/local/kafka.sh start    fetch jars (once), format storage, start in the background on
#                                  free ports, wait for a real client round trip, and print the
#                                  bootstrap address 127.0.0.1:PORT as the last line of stdout.
#                                  Starting while a broker runs reuses it.
#   deploy/local/kafka.sh stop     stop it (SIGTERM, then SIGKILL after 30 s); no java left.
#   deploy/local/kafka.sh status   print the bootstrap address if running, exit 1 if not.
#   deploy/local/kafka.sh restart  stop and start again on the same ports and data (for fault tests).
#   deploy/local/kafka.sh libs     fetch the jars (once) and print their folder (kafka-clients for
#                                  Java test clients).
#   deploy/local/kafka.sh datadir  print the broker's log.dirs folder (for DumpLogSegments).
#   deploy/local/kafka.sh consumer-groups ARGS...
#                                  Kafka's own kafka-consumer-groups.sh (ConsumerGroupCommand),
#                                  from the kafka-tools jars (fetched once with tests/interop/pom.xml).
#
# Environment:
#   KAFKA_LOCAL_DIR      state folder (config, data, logs, pid)  [default: <repo>/.local-kafka]
#   KAFKA_LIBS_DIR       where the jars go, shared between clones [default: ~/.cache/streamer/kafka-<version>]
#   KAFKA_PORT           broker port   [default: a free port]
#   KAFKA_HEAP_OPTS      JVM heap      [default: -Xms256m -Xmx512m]
#   KAFKA_START_TIMEOUT  seconds to wait for the broker [default: 90]
#   KAFKA_EXTRA_PROPERTIES  a file appended to server.properties (extra listeners, SASL, TLS)
#   KAFKA_FORMAT_ARGS    extra arguments for `StorageTool format` (e.g. --add-scram ...)
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
kafka_version="$(sed -n 's:.*<kafka.version>\(.*\)</kafka.version>.*:\1:p' "$here/pom.xml")"
state="${KAFKA_LOCAL_DIR:-$repo/.local-kafka}"
libs="${KAFKA_LIBS_DIR:-$HOME/.cache/streamer/kafka-$kafka_version}"
heap="${KAFKA_HEAP_OPTS:--Xms256m -Xmx512m}"
start_timeout="${KAFKA_START_TIMEOUT:-90}"

log() { echo "kafka.sh: $*" >&2; }
die() { log "error: $*"; exit 1; }

need_tools() {
    command -v java >/dev/null 2>&1 || die "java not found: install a JDK 17 or newer (Debian: apt-get install openjdk-17-jdk-headless)"
    local major
    major="$(java -XshowSettings:properties -version 2>&1 | sed -n 's/.*java.specification.version = \([0-9]*\).*/\1/p')"
    [ -n "$major" ] && [ "$major" -ge 17 ] || die "Java ${major:-?} found, Kafka 4.x needs Java 17 or newer"
    command -v javac >/dev/null 2>&1 || die "javac not found: install a JDK (not only a JRE), 17 or newer"
}

fetch_jars() {
    if [ -f "$libs/.complete" ]; then return; fi
    command -v mvn >/dev/null 2>&1 || die "mvn not found: install Maven to fetch the Kafka jars (Debian: apt-get install maven)"
    # One fetch at a time (brokers started side by side, e.g. by parallel tests): the others
    # wait for it and find the jars complete.
    mkdir -p "$(dirname "$libs")"
    exec 8>"$libs.lock"
    flock 8
    if [ -f "$libs/.complete" ]; then exec 8>&-; return; fi
    log "fetching Kafka $kafka_version jars from Maven Central into $libs"
    mkdir -p "$libs"
    mvn -B -q -f "$here/pom.xml" dependency:copy-dependencies -DincludeScope=runtime \
        -DoutputDirectory="$libs" >&2 || die "maven could not fetch the Kafka jars (see above)"
    mkdir -p "$libs/ping"
    javac -d "$libs/ping" -cp "$libs/*" "$here/Ping.java" || die "could not compile Ping.java"
    touch "$libs/.complete"
    exec 8>&-
}

tools_jars() {
    # kafka-tools and its dependencies: the same cache tests/interop/javaclients.py uses.
    local tools="${KAFKA_TOOLS_DIR:-$HOME/.cache/streamer/kafka-tools-$kafka_version}"
    if [ ! -f "$tools/.complete" ]; then
        command -v mvn >/dev/null 2>&1 || die "mvn not found: install Maven to fetch Kafka's tools"
        mkdir -p "$(dirname "$tools")"
        exec 7>"$tools.lock"
        flock 7  # one fetch at a time; a fetch that waited finds them complete
    fi
    if [ ! -f "$tools/.complete" ]; then
        log "fetching kafka-tools $kafka_version jars from Maven Central into $tools"
        mkdir -p "$tools"
        mvn -B -q -f "$repo/tests/interop/pom.xml" dependency:copy-dependencies \
            -DincludeScope=runtime -DoutputDirectory="$tools" >&2 \
            || die "maven could not fetch kafka-tools (see above)"
        touch "$tools/.complete"
    fi
    exec 7>&-
    echo "$tools"
}

free_port() {
    python3 - <<'PY'
import socket
s = socket.socket()
s.bind(("127.0.0.1", 0))
print(s.getsockname()[1])
s.close()
PY
}

running_pid() {
    [ -f "$state/kafka.pid" ] || return 1
    local pid
    pid="$(cat "$state/kafka.pid")"
    kill -0 "$pid" 2>/dev/null || return 1
    # The pid must still be our broker, not a recycled pid.
    grep -q "kafka.Kafka" "/proc/$pid/cmdline" 2>/dev/null || return 1
    echo "$pid"
}

ping_broker() {
    java -cp "$libs/ping:$libs/*" Ping "$1" >/dev/null 2>&1
}

render() {  # render TEMPLATE OUT: fill in the placeholders
    sed -e "s|@PORT@|$port|g" -e "s|@CONTROLLER_PORT@|$cport|g" \
        -e "s|@LOG_DIRS@|$state/data|g" -e "s|@LOG_FILE@|$state/logs/server.log|g" "$1" > "$2"
}

start() {
    need_tools
    local pid
    if pid="$(running_pid)"; then
        local addr
        addr="$(cat "$state/bootstrap")"
        fetch_jars
        if ping_broker "$addr"; then
            log "reusing the running broker (pid $pid)"
            echo "$addr"
            return
        fi
        log "broker pid $pid does not answer at $addr; restarting it"
        stop
    fi
    fetch_jars
    mkdir -p "$state/logs"
    if [ -f "$state/ports" ] && [ -d "$state/data" ]; then
        # A stopped broker restarts on the same ports and data: clients reconnect, offsets stay.
        read -r port cport < "$state/ports"
    else
        rm -rf "$state/data"
        port="${KAFKA_PORT:-$(free_port)}"
        cport="$(free_port)"
        while [ "$cport" = "$port" ]; do cport="$(free_port)"; done
    fi
    render "$here/server.properties.template" "$state/server.properties"
    if [ -n "${KAFKA_EXTRA_PROPERTIES:-}" ]; then
        [ -f "$KAFKA_EXTRA_PROPERTIES" ] || die "KAFKA_EXTRA_PROPERTIES=$KAFKA_EXTRA_PROPERTIES is not a file"
        { echo; cat "$KAFKA_EXTRA_PROPERTIES"; } >> "$state/server.properties"
    fi
    render "$here/log4j2.properties.template" "$state/log4j2.properties"
    if [ ! -f "$state/data/meta.properties" ]; then
        mkdir -p "$state/data"
        local cluster_id
        cluster_id="$(java -cp "$libs/*" kafka.tools.StorageTool random-uuid 2>/dev/null | tail -n 1)"
        # shellcheck disable=SC2086
        java -cp "$libs/*" -Dlog4j2.configurationFile="$state/log4j2.properties" \
            kafka.tools.StorageTool format -t "$cluster_id" -c "$state/server.properties" \
            --standalone ${KAFKA_FORMAT_ARGS:-} > "$state/logs/format.log" 2>&1 \
            || { cat "$state/logs/format.log" >&2; die "formatting the storage in $state/data failed"; }
    fi
    echo "$port $cport" > "$state/ports"
    echo "127.0.0.1:$port" > "$state/bootstrap"
    log "starting Kafka $kafka_version on 127.0.0.1:$port (controller $cport), state in $state"
    local t0=$SECONDS
    # shellcheck disable=SC2086
    nohup java $heap -XX:+UseG1GC -Djava.awt.headless=true \
        -Dlog4j2.configurationFile="$state/log4j2.properties" -Dkafka.logs.dir="$state/logs" \
        -cp "$libs/*" kafka.Kafka "$state/server.properties" \
        > "$state/logs/stdout.log" 2>&1 < /dev/null &
    echo $! > "$state/kafka.pid"
    while ! ping_broker "127.0.0.1:$port"; do
        if ! running_pid >/dev/null; then
            tail -n 30 "$state/logs/server.log" "$state/logs/stdout.log" >&2 2>/dev/null || true
            die "the broker exited during start-up (logs in $state/logs)"
        fi
        if [ $((SECONDS - t0)) -ge "$start_timeout" ]; then
            tail -n 30 "$state/logs/server.log" >&2 2>/dev/null || true
            stop
            die "the broker did not answer within ${start_timeout}s (logs in $state/logs)"
        fi
        sleep 1
    done
    log "broker ready after $((SECONDS - t0))s"
    echo "127.0.0.1:$port"
}

stop() {
    local pid
    if ! pid="$(running_pid)"; then
        log "no broker running (state in $state)"
        return 0
    fi
    log "stopping broker pid $pid"
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 1 60); do
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.5
    done
    if kill -0 "$pid" 2>/dev/null; then
        log "broker did not stop within 30 s; killing it"
        kill -KILL "$pid" 2>/dev/null || true
        while kill -0 "$pid" 2>/dev/null; do sleep 0.2; done
    fi
    rm -f "$state/kafka.pid"
    log "stopped"
}

case "${1:-}" in
    start) start ;;
    stop) stop ;;
    restart) stop; start ;;
    status)
        if running_pid >/dev/null; then cat "$state/bootstrap"; else log "not running"; exit 1; fi ;;
    kill)  # SIGKILL without a clean shutdown, for fault tests
        if pid="$(running_pid)"; then kill -KILL "$pid"; while kill -0 "$pid" 2>/dev/null; do sleep 0.2; done; rm -f "$state/kafka.pid"; fi ;;
    clean) stop; rm -rf "$state" ;;
    libs) need_tools; fetch_jars; echo "$libs" ;;
    datadir) echo "$state/data" ;;
    consumer-groups)
        need_tools; tools="$(tools_jars)"; shift
        # Without a logging backend SLF4J prints three lines of warning: drop them.
        exec java -Xmx256m -cp "$tools/*" org.apache.kafka.tools.consumer.group.ConsumerGroupCommand \
            "$@" 2> >(grep -v '^SLF4J:' >&2) ;;
    *) echo "usage: $0 start|stop|restart|status|kill|clean|libs|datadir|consumer-groups ARGS" >&2; exit 2 ;;
esac
