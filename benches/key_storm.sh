#!/usr/bin/env bash
# A burst of new keys on a fresh 3-node cluster, and whether the cluster recovers after it
# (docs/design.md §10, "A full-frame storm"):
#
#   bash benches/key_storm.sh
#   NKEYS=9000 RUNS=3 BIN=/tmp/gossamer-old bash benches/key_storm.sh
#
# Three release nodes on loopback (node i on PORT+10i, gossip PORT+10i+1, seeded with node 0)
# serve one global fixed window of 1,000 an hour. Each node is sent NKEYS new keys, one check
# each, by a python3 client with CONNS keep-alive connections, all three at once. Then, PROBES
# times 5 s apart, five new keys are checked at node 0 (all should be admitted: each is far
# below its limit) and every node's bytes sent and suspected peers are read. Prints per run:
# the share of the load's checks refused, each node's instants and full frames by cause so far,
# then per probe the new keys admitted, each node's
# cluster bytes sent per second since the last probe, and the peers each node suspects.
#
# Environment: NKEYS (33000), CONNS (3), PROBES (3), RUNS (1), PORT (17300), BIN (a gossamer
# binary to measure instead of building this checkout's).
set -euo pipefail
cd "$(dirname "$0")/.."
NKEYS=${NKEYS:-33000}
CONNS=${CONNS:-3}
PROBES=${PROBES:-3}
RUNS=${RUNS:-1}
PORT=${PORT:-17300}
WORK=$(mktemp -d -t gossamer-key-storm.XXXXXX)
PIDS=()
stop_nodes() {
    local p
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null && wait "$p" || true; done
    PIDS=()
}
cleanup() {
    stop_nodes
    rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

if [[ -n ${BIN:-} ]]; then
    cp "$BIN" "$WORK/gossamer"
    echo "binary: $BIN" >&2
else
    cargo build --release --locked --bin gossamer >&2
    cp target/release/gossamer "$WORK/gossamer"
    echo "binary: $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- src Cargo.toml Cargo.lock || echo +dirty)" >&2
fi

cat >"$WORK/storm.toml" <<'TOML'
[server]
max_keys = 200000
shutdown_grace = "1s"

[[rule]]
name = "storm"
algorithm = "fixed_window"
limit = 1000
period = "1h"
scope = "global"
TOML

cat >"$WORK/client.py" <<'PY'
# client.py PORT PREFIX COUNT CONNS: checks PREFIX%08d for 0..COUNT-1 once each; prints
# "checks refused".
import collections, http.client, multiprocessing, sys
port, prefix, count, conns = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
def run(first):
    c, seen = http.client.HTTPConnection("127.0.0.1", port, timeout=30), collections.Counter()
    for k in range(first, count, conns):
        body = '{"rule":"storm","key":"%s%08d"}' % (prefix, k)
        c.request("POST", "/v1/check", body, {"Content-Type": "application/json"})
        r = c.getresponse(); r.read(); seen[r.status] += 1
    return seen
with multiprocessing.Pool(conns) as pool:
    seen = sum(pool.map(run, range(conns)), collections.Counter())
print(sum(seen.values()), sum(seen.values()) - seen[200])
PY

metric() { # metric NODE PREFIX: the sum of the node's samples whose name starts with PREFIX
    curl -s "http://127.0.0.1:$((PORT + 10 * $1))/metrics" |
        awk -v p="$2" 'index($1, p) == 1 { s += $2 } END { printf "%.0f\n", s }'
}
suspects() {
    curl -s "http://127.0.0.1:$((PORT + 10 * $1))/v1/cluster" | python3 -c '
import json, sys
print(sum(1 for m in json.load(sys.stdin).get("members", []) if m.get("suspected")))'
}

for run in $(seq 1 "$RUNS"); do
    for i in 0 1 2; do
        for p in $((PORT + 10 * i)) $((PORT + 10 * i + 1)); do
            if (echo >"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then
                echo "port $p is in use: set PORT" >&2
                exit 1
            fi
        done
    done
    for i in 0 1 2; do
        "$WORK/gossamer" serve --config "$WORK/storm.toml" --node-id "storm-$i" \
            --http "127.0.0.1:$((PORT + 10 * i))" --gossip "127.0.0.1:$((PORT + 10 * i + 1))" \
            --seeds "127.0.0.1:$((PORT + 1))" >"$WORK/log-$i" 2>&1 &
        PIDS+=($!)
    done
    for i in 0 1 2; do
        for _ in $(seq 1 300); do
            curl -s "http://127.0.0.1:$((PORT + 10 * i))/metrics" |
                grep -qx 'gossamer_cluster_members{state="alive"} 3' && continue 2
            sleep 0.1
        done
        echo "node storm-$i did not join a cluster of three:" >&2
        cat "$WORK/log-$i" >&2
        exit 1
    done
    CLIENTS=()
    for i in 0 1 2; do
        python3 "$WORK/client.py" $((PORT + 10 * i)) "r$run-n$i-" "$NKEYS" "$CONNS" \
            >"$WORK/load-$i" &
        CLIENTS+=($!)
    done
    wait "${CLIENTS[@]}"
    read -r checks refused < <(cat "$WORK"/load-* | awk '{ c += $1; r += $2 } END { print c, r }')
    printf 'run %d: %d new keys at 3 nodes, %.1f%% of their checks refused\n' "$run" "$checks" \
        "$(awk -v r="$refused" -v c="$checks" 'BEGIN { print 100 * r / c }')"
    for i in 0 1 2; do
        curl -s "http://127.0.0.1:$((PORT + 10 * i))/metrics" | awk -v node="$i" '
            $1 ~ /^gossamer_cluster_rounds_total/ { split($1, a, "\""); r[a[2]] = $2 }
            $1 ~ /^gossamer_cluster_full_frames_total/ { split($1, a, "\""); f[a[2]] = $2 }
            END { printf "  node %d so far: instants %d consistent, %d degraded; full frames %d for a membership change, %d asked\n",
                  node, r["consistent"], r["degraded"], f["view_changed"], f["asked"] }'
    done
    declare -a sent
    for i in 0 1 2; do sent[i]=$(metric "$i" gossamer_cluster_sent_bytes_total); done
    last=$(date +%s.%N)
    for probe in $(seq 1 "$PROBES"); do
        sleep 5
        ok=0
        for j in 1 2 3 4 5; do
            code=$(curl -s -o /dev/null -w '%{http_code}' -X POST \
                -d "{\"rule\":\"storm\",\"key\":\"probe-$run-$probe-$j\"}" \
                "http://127.0.0.1:$PORT/v1/check")
            [[ $code == 200 ]] && ok=$((ok + 1))
        done
        now=$(date +%s.%N)
        line="  probe $probe: $ok/5 new keys admitted; sent per node"
        for i in 0 1 2; do
            s=$(metric "$i" gossamer_cluster_sent_bytes_total)
            line+=$(awk -v a="${sent[i]}" -v b="$s" -v t0="$last" -v t1="$now" \
                'BEGIN { printf " %.2f MB/s", (b - a) / (t1 - t0) / 1e6 }')
            sent[i]=$s
        done
        line+="; suspected peers $(suspects 0) $(suspects 1) $(suspects 2)"
        echo "$line"
        last=$now
    done
    stop_nodes
done
