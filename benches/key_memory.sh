#!/usr/bin/env bash
# Memory per key, by algorithm, on a standalone node and on a one-node cluster, from the
# release binary on loopback (the issue "Memory per global key: 2.25 kB on a clustered node
# against 145 B standalone"):
#
#   bash benches/key_memory.sh
#   NKEYS=1000000 ALGORITHMS="fixed_window token_bucket" MODES=cluster bash benches/key_memory.sh
#
# For each ALGORITHM and MODE a fresh node serves one rule `km` of that algorithm:
# `standalone` is a node without gossip and the rule `scope = "local"`; `cluster` is
# `gossamer serve --gossip 127.0.0.1:PORT+1` with no peers and the rule `scope = "global"`;
# `mesh3` is three such nodes formed into one cluster (node i on PORT+10i, gossip PORT+10i+1,
# seeded with node 0), each sent a third of the keys: every node tracks every key (its own,
# and those the others report), so its row is its RSS growth per key of the cluster.
# The rule keeps a key checked once non-fresh for the whole run, so nothing is evicted:
# windows and the log 1000 per PERIOD (1h; a fixed window run is started after the window's
# edge if it would cross it), buckets 1000 per 10 d (a token refills in 864 s). After a
# warm-up of 2,000 keys, NKEYS new 12-byte keys ("key-00000000", ...) are each checked once by
# a python3 client (CONNS keep-alive connections, one process each; wrk is not needed), then,
# SETTLE seconds later (a clustered node's RSS still grows for ~5 s after the last check),
# VmRSS growth is divided by the growth of gossamer_active_keys{rule="km"}. Prints one
# markdown row per run (RSS growth includes the allocator's slack and hash-table doubling, so
# it depends on where NKEYS falls against a power of two; a clustered run varies by ±25%
# between runs: take several), then cluster / standalone per algorithm.
#
# Environment: NKEYS (100000), ALGORITHMS (all five), MODES ("standalone cluster"; add mesh3),
# PORT (17300: HTTP; PORT+1 gossip, PORT+2 QUIC, all checked free), CONNS (8), SETTLE (10),
# PERIOD (1h), BIN (a gossamer binary to measure instead of building this checkout's).
set -euo pipefail
cd "$(dirname "$0")/.."
NKEYS=${NKEYS:-100000}
ALGORITHMS=${ALGORITHMS:-token_bucket leaky_bucket fixed_window sliding_window_log sliding_window_counter}
MODES=${MODES:-standalone cluster}
PORT=${PORT:-17300}
CONNS=${CONNS:-8}
SETTLE=${SETTLE:-10}
PERIOD=${PERIOD:-1h}
WORK=$(mktemp -d -t gossamer-key-memory.XXXXXX)
PID=
PIDS=()
cleanup() {
    if [[ -n $PID ]] && kill -0 "$PID" 2>/dev/null; then kill "$PID"; wait "$PID" || true; fi
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null && wait "$p" || true; done
    rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

cat >"$WORK/client.py" <<'PY'
# client.py PORT RULE PREFIX COUNT CONNS: checks PREFIX%08d for 0..COUNT-1 once each.
import collections, http.client, multiprocessing, sys, time
port, rule, prefix, count, conns = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
def run(first):
    c, seen = http.client.HTTPConnection("127.0.0.1", int(port), timeout=30), collections.Counter()
    for k in range(first, count, conns):
        body = '{"rule":"%s","key":"%s%08d"}' % (rule, prefix, k)
        c.request("POST", "/v1/check", body, {"Content-Type": "application/json"})
        r = c.getresponse(); r.read(); seen[r.status] += 1
    return seen
t0 = time.monotonic()
with multiprocessing.Pool(conns) as pool:
    seen = sum(pool.map(run, range(conns)), collections.Counter())
secs = time.monotonic() - t0
print("checks=%d non200=%d statuses=%s secs=%.1f rate=%.0f/s" % (sum(seen.values()),
      sum(seen.values()) - seen[200], dict(seen), secs, sum(seen.values()) / secs))
PY

if [[ -n ${BIN:-} ]]; then
    cp "$BIN" "$WORK/gossamer"
    echo "binary: $BIN" >&2
else
    cargo build --release --locked --bin gossamer >&2
    cp target/release/gossamer "$WORK/gossamer" # a rebuild by someone else mid-run changes nothing
    echo "binary: $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- src Cargo.toml Cargo.lock || echo +dirty)" >&2
fi
rss_kib() { awk '/^VmRSS:/ { print $2 }' "/proc/$1/status"; }
keys_held() {
    curl -s "http://127.0.0.1:${1:-$PORT}/metrics" | awk '$1 == "gossamer_active_keys{rule=\"km\"}" { print $2 }'
}
ports_free() {
    local p base
    for base in "$PORT" $((PORT + 10)) $((PORT + 20)); do
        for p in "$base" $((base + 1)) $((base + 2)); do
            [[ -z $(ss -Hltun "sport = :$p") ]] || return 1
        done
    done
}
start() {
    for _ in $(seq 1 50); do ports_free && break; sleep 0.1; done
    ports_free || { echo "ports $PORT-$((PORT + 2)) are in use: set PORT" >&2; exit 1; }
    "$WORK/gossamer" serve --config "$WORK/km.toml" --http "127.0.0.1:$PORT" --node-id km \
        >"$WORK/log" 2>&1 &
    PID=$!
    for _ in $(seq 1 100); do
        curl -sf -o /dev/null "http://127.0.0.1:$PORT/readyz" && return 0
        sleep 0.1
    done
    echo "gossamer did not become ready:" >&2
    cat "$WORK/log" >&2
    exit 1
}
stop() { kill "$PID"; wait "$PID" || true; PID=; }
# Three clustered nodes, ready, each seeing three members alive.
start_mesh3() {
    local i http
    for _ in $(seq 1 50); do ports_free && break; sleep 0.1; done
    ports_free || { echo "ports $PORT-$((PORT + 22)) are in use: set PORT" >&2; exit 1; }
    for i in 0 1 2; do
        "$WORK/gossamer" serve --config "$WORK/km.toml" --node-id "km-$i" \
            --http "127.0.0.1:$((PORT + 10 * i))" --gossip "127.0.0.1:$((PORT + 10 * i + 1))" \
            --seeds "127.0.0.1:$((PORT + 1))" >"$WORK/log-$i" 2>&1 &
        PIDS+=($!)
    done
    for i in 0 1 2; do
        http=$((PORT + 10 * i))
        for _ in $(seq 1 300); do
            curl -sf -o /dev/null "http://127.0.0.1:$http/readyz" &&
                curl -s "http://127.0.0.1:$http/metrics" |
                grep -qx 'gossamer_cluster_members{state="alive"} 3' && continue 2
            sleep 0.1
        done
        echo "node km-$i did not join a cluster of three:" >&2
        cat "$WORK/log-$i" >&2
        exit 1
    done
}
stop_mesh3() {
    local p
    for p in "${PIDS[@]}"; do kill "$p"; wait "$p" || true; done
    PIDS=()
}
seconds() { local n=${1%[smhd]}; case $1 in *m) n=$((n * 60)) ;; *h) n=$((n * 3600)) ;; *d) n=$((n * 86400)) ;; esac; echo "$n"; }

declare -A GROWTH
echo "| algorithm | mode | keys held | RSS before (KiB) | RSS after (KiB) | RSS growth per key (B) | non-200 |"
echo "|---|---|---|---|---|---|---|"
for alg in $ALGORITHMS; do
    case $alg in
        token_bucket | leaky_bucket) limits='limit = 1000
period = "10d"
burst = 1000' ;;
        fixed_window | sliding_window_log | sliding_window_counter) limits="limit = 1000
period = \"$PERIOD\"" ;;
        *) echo "unknown algorithm $alg" >&2; exit 2 ;;
    esac
    for mode in $MODES; do
        case $mode in
            standalone) scope=local cluster= ;;
            cluster) scope=global cluster="[cluster]
gossip = \"127.0.0.1:$((PORT + 1))\"" ;;
            mesh3) scope=global cluster= ;;
            *) echo "unknown mode $mode" >&2; exit 2 ;;
        esac
        cat >"$WORK/km.toml" <<TOML
[server]
max_keys = $((NKEYS + 10000))
shutdown_grace = "1s"
$cluster
[[rule]]
name = "km"
algorithm = "$alg"
$limits
scope = "$scope"
TOML
        if [[ $alg == fixed_window ]]; then # a window edge in the run would make every key fresh
            p=$(seconds "$PERIOD") need=$((NKEYS / 2000 + SETTLE + 20))
            left=$((p - $(date +%s) % p))
            if ((left < need)); then echo "waiting ${left}s for the window edge" >&2; sleep $((left + 1)); fi
        fi
        if [[ $mode == mesh3 ]]; then
            start_mesh3
            declare -a before keys0
            for i in 0 1 2; do
                python3 "$WORK/client.py" $((PORT + 10 * i)) km "wrm$i-" 700 "$CONNS" >/dev/null
            done
            sleep 2
            for i in 0 1 2; do
                before[i]=$(rss_kib "${PIDS[i]}") keys0[i]=$(keys_held $((PORT + 10 * i)))
            done
            clients=()
            for i in 0 1 2; do
                python3 "$WORK/client.py" $((PORT + 10 * i)) km "key$i-" $((NKEYS / 3)) \
                    $(((CONNS + 2) / 3)) >"$WORK/result-$i" &
                clients+=($!)
            done
            wait "${clients[@]}"
            sleep "$SETTLE"
            for i in 0 1 2; do
                after=$(rss_kib "${PIDS[i]}") keys1=$(keys_held $((PORT + 10 * i)))
                echo "$alg $mode node $i: $(cat "$WORK/result-$i")" >&2
                sent=$((3 * (NKEYS / 3)))
                per=$(((after - ${before[i]}) * 1024 / sent))
                GROWTH[$alg,$mode,$i]=$per
                echo "| $alg | $mode km-$i | $((keys1 - ${keys0[i]})) | ${before[i]} | $after | $per | $(sed -E 's/.*non200=([0-9]+).*/\1/' "$WORK/result-$i") |"
            done
            stop_mesh3
            continue
        fi
        start
        python3 "$WORK/client.py" "$PORT" km wrm- 2000 "$CONNS" >/dev/null
        sleep 1
        before=$(rss_kib "$PID") keys0=$(keys_held)
        result=$(python3 "$WORK/client.py" "$PORT" km key- "$NKEYS" "$CONNS")
        sleep "$SETTLE"
        after=$(rss_kib "$PID") keys1=$(keys_held)
        echo "$alg $mode: $result" >&2
        held=$((keys1 - keys0))
        per=n/a; ((held > 0)) && per=$(((after - before) * 1024 / held))
        GROWTH[$alg,$mode]=$per
        echo "| $alg | $mode | $held | $before | $after | $per | $(sed -E 's/.*non200=([0-9]+).*/\1/' <<<"$result") |"
        stop
    done
done

if [[ " $MODES " == *" standalone "* && " $MODES " == *" cluster "* ]]; then
    echo
    echo "| algorithm | cluster / standalone |"
    echo "|---|---|"
    for alg in $ALGORITHMS; do
        s=${GROWTH[$alg,standalone]} c=${GROWTH[$alg,cluster]}
        r=n/a; [[ $s =~ ^[1-9][0-9]*$ && $c =~ ^-?[0-9]+$ ]] && r=$(awk -v c="$c" -v s="$s" 'BEGIN { printf "%.1f", c / s }')
        echo "| $alg | $r |"
    done
fi
echo "wall time: ${SECONDS}s" >&2
