#!/usr/bin/env bash
# What `[cluster] round_nice` costs when a node's CPU is saturated: 3 nodes on loopback (HTTP
# 18311-18313, gossip 18322/18324/18326), node-1 pinned to CPU 0, nodes 2 and 3 to CPU 1. After
# the cluster forms, a busy loop at normal priority takes CPU 0 for 20 s (any other process on
# the core would do the same). Prints node-1's round counters before and after, and node-2's
# suspicion of node-1 and the share it holds for it, at the end of the 20 s and 3 s after the
# loop stops.
#
#   bash benches/round_priority_saturation.sh 10          # the default: a nice increment
#   bash benches/round_priority_saturation.sh '"idle"'    # SCHED_IDLE
#
# BIN (target/release/gossamer) is the binary. Figures: docs/operations.md, "CPU priority".
set -euo pipefail
NICE=${1:?usage: round_priority_saturation.sh ROUND_NICE (a number 0-19, or '"idle"')}
BIN=${BIN:-target/release/gossamer}
W=$(mktemp -d)
PIDS=()
trap 'kill "${PIDS[@]}" 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$W"' EXIT
cp benches/cluster_rules.toml "$W/rules.toml"
printf '\n[cluster]\nround_nice = %s\n' "$NICE" >>"$W/rules.toml"
for i in 1 2 3; do
    cpu=1
    if ((i == 1)); then cpu=0; fi
    taskset -c "$cpu" "$BIN" serve --config "$W/rules.toml" --node-id "node-$i" \
        --http "127.0.0.1:1831$i" --gossip "127.0.0.1:1832$((i * 2))" \
        --seeds 127.0.0.1:18322 >"$W/n$i.log" 2>&1 &
    PIDS+=($!)
done
sleep 6
cluster_metrics() {
    curl -s "127.0.0.1:1831$1/metrics" |
        grep -E '^gossamer_cluster_(rounds_total|suspected_peers|held_share)' | tr '\n' ' '
    echo
}
echo "round_nice = $NICE"
echo "node-1 before:            $(cluster_metrics 1)"
taskset -c 0 sh -c 'while :; do :; done' &
PIDS+=($!)
sleep 20
echo "node-1 after 20 s busy:   $(cluster_metrics 1)"
echo "node-2 then:              $(cluster_metrics 2)"
kill "${PIDS[3]}"
sleep 3
echo "node-2 3 s after:         $(cluster_metrics 2)"
