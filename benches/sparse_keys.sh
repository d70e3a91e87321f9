#!/usr/bin/env bash
# Sparse global window keys against one binary: 3 nodes on loopback (HTTP 18211-18213,
# gossip 18222/18224/18226), rule `win` fixed window 1000 per 10 s, and per node
# `wrk -t1 -c$CONNS -d15s` with benches/cluster_keys.lua walking 10,000 keys from a different
# offset, so each key is checked about every 3 s from some node. Prints each wrk RESULT
# line. Compares two builds (e.g. before and after a change to the round protocol):
#
#   for b in ./old-gossamer ./new-gossamer; do CONNS=8 bash benches/sparse_keys.sh $b; done
#
# CONNS (default 18) sets wrk connections per node. Figures: docs/design.md §10, "Sparse keys
# on a saturated machine".
set -euo pipefail
BIN=${1:?usage: sparse_keys.sh BINARY}
W=$(mktemp -d)
trap 'kill "${PIDS[@]}" 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$W"' EXIT
cat >"$W/rules.toml" <<'R'
[[rule]]
name = "win"
algorithm = "fixed_window"
limit = 1000
period = "10s"
R
PIDS=()
for i in 1 2 3; do
    "$BIN" serve --config "$W/rules.toml" --node-id "node-$i" --http "127.0.0.1:1821$i" \
        --gossip "127.0.0.1:1822$((i * 2))" --seeds 127.0.0.1:18222 >"$W/n$i.log" 2>&1 &
    PIDS+=($!)
done
sleep 4
WRKS=()
for i in 1 2 3; do
    wrk -t1 -c"${CONNS:-18}" -d15s -s "$(dirname "$0")/cluster_keys.lua" "http://127.0.0.1:1821$i/v1/check" \
        -- "s$RANDOM" $(((i - 1) * 3333)) 10000 5 >"$W/wrk-$i.txt" 2>&1 &
    WRKS+=($!)
done
wait "${WRKS[@]}"
grep -h RESULT "$W"/wrk-*.txt
