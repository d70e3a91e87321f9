#!/usr/bin/env bash
# Sizing figures for docs/operations.md, from the release binary under wrk on loopback:
#
#   bash benches/sizing.sh
#
# 1. Memory per key: a node serving one rule (token bucket, 1000 per day: a key checked once
#    stays non-fresh, so nothing is evicted) is sent NKEYS (1,000,000) checks, each for a new
#    12-byte key, then its resident memory (VmRSS) is compared with before, against the keys
#    /metrics reports held.
# 2. CPU per check: benches/check.lua (rule `default`, 10,000 rotating keys, every check
#    admitted) at concurrency 16 for RUNS runs of DURATION; user+system time of the server
#    divided by checks answered. Cores per 10,000 checks/s = that many microseconds / 100.
#    wrk shares the machine's cores with the server.
#
# Environment: NKEYS (1000000), RUNS (3), DURATION (10s), PORT (17170); CLUSTER=1 makes the
# sizing rule global on a clustered node (gossip on 127.0.0.1:PORT+1, no peers), whose keys
# live in the cluster's store (leases, counts per slot) instead.
set -euo pipefail
cd "$(dirname "$0")/.."
NKEYS=${NKEYS:-1000000}
RUNS=${RUNS:-3}
DURATION=${DURATION:-10s}
PORT=${PORT:-17170}
WORK=$(mktemp -d -t gossamer-sizing.XXXXXX)
PID=
cleanup() {
    if [[ -n $PID ]] && kill -0 "$PID" 2>/dev/null; then kill "$PID"; wait "$PID" || true; fi
    rm -rf "$WORK"
}
trap cleanup EXIT

cargo build --release --locked --bin gossamer >&2
HZ=$(getconf CLK_TCK)
ticks() { local s; s=$(<"/proc/$1/stat"); s=${s##*) }; awk '{ print $12 + $13 }' <<<"$s"; }
rss_kib() { awk '/^VmRSS:/ { print $2 }' "/proc/$1/status"; }
metric() { curl -s "http://127.0.0.1:$PORT/metrics" | awk -v m="$1" '$1 == m { print $2 }'; }
# start [CONFIG]: without one, the built-in rules.
start() {
    target/release/gossamer serve ${1:+--config "$1"} --http "127.0.0.1:$PORT" >"$WORK/log" 2>&1 &
    PID=$!
    for _ in $(seq 1 100); do
        curl -sf -o /dev/null "http://127.0.0.1:$PORT/healthz" && return 0
        sleep 0.1
    done
    echo "gossamer did not start:" >&2
    cat "$WORK/log" >&2
    exit 1
}
stop() { kill "$PID"; wait "$PID" || true; PID=; }

if [[ ${CLUSTER:-0} == 1 ]]; then
    scope=global
    cluster="[cluster]
gossip = \"127.0.0.1:$((PORT + 1))\""
else
    scope=local
    cluster=
fi
cat >"$WORK/sizing.toml" <<TOML
[server]
max_keys = $((NKEYS + 1000))
$cluster
[[rule]]
name = "sizing"
algorithm = "token_bucket"
limit = 1000
period = "1d"
scope = "$scope"
TOML
start "$WORK/sizing.toml"
wrk -t1 -c4 -d1s -s benches/check.lua "http://127.0.0.1:$PORT/v1/check" >/dev/null 2>&1 || true
before=$(rss_kib "$PID")
# Enough time for NKEYS requests at ~15,000/s; wrk stops at the duration, so check the count.
seconds=$((NKEYS / 15000 + 10))
NKEYS=$NKEYS THREADS=2 wrk -t2 -c16 -d"${seconds}s" -s benches/sizing.lua \
    "http://127.0.0.1:$PORT/v1/check" | grep '^RESULT' >&2
sleep 1
after=$(rss_kib "$PID")
keys=$(metric 'gossamer_active_keys{rule="sizing"}')
echo "memory: RSS ${before} KiB before, ${after} KiB after ${keys} keys held:" \
    "$(( (after - before) * 1024 / keys )) bytes per key (RSS, allocator and table growth included)"
stop

start
wrk -t2 -c16 -d2s -s benches/check.lua "http://127.0.0.1:$PORT/v1/check" >/dev/null
echo "rss with the built-in rules after warm-up: $(rss_kib "$PID") KiB"
for n in $(seq 1 "$RUNS"); do
    t0=$(ticks "$PID")
    line=$(wrk -t2 -c16 -d"$DURATION" -s benches/check.lua "http://127.0.0.1:$PORT/v1/check" | grep '^RESULT')
    t1=$(ticks "$PID")
    awk -v ticks=$((t1 - t0)) -v hz="$HZ" -v n="$n" '{
        for (i = 2; i <= NF; i++) { split($i, kv, "="); v[kv[1]] = kv[2] }
        us = ticks / hz * 1e6 / v["requests"]
        printf "cpu run %d: %.0f checks/s, %.1f us of server CPU per check = %.2f cores per 10,000 checks/s\n", n, v["rps"], us, us / 100
    }' <<<"$line"
done
stop
