#!/usr/bin/env bash
# Check latency at a fixed offered rate, clustered vs standalone, on loopback.
#
#   bash benches/cluster_latency.sh
#   DURATION=3 RATES=1000 bash benches/cluster_latency.sh      # a quick look
#
# Why: benches/cluster_figures.sh times checks with wrk, which is closed-loop: it sends as fast
# as the answers come back, saturates the 2 cores it shares with the nodes, and its latencies
# then mostly measure each process's share of the CPU. Here the load is open-loop
# (benches/latency_probe.rs): a constant rate of checks, each timed from its scheduled send
# time to the end of its answer, so a stall counts against the server for every request it
# delays (no coordinated omission), at rates that leave the machine spare CPU.
#
# What: a 3-node cluster and a standalone node, started as benches/cluster_figures.sh starts
# them (benches/cluster_rules.toml, `default` global in the cluster). Pinned with taskset: the node
# under test (node-1, and the standalone node) on CPU 0 (NODE_CPU); nodes 2 and 3 and the
# probe on CPU 1 (OTHER_CPU). The standalone node and node-1 share CPU 0, so whichever is not
# being measured idles beside the other (node-1 keeps gossiping). Both run tokio with one
# worker thread (tokio sizes its pool from the CPU affinity).
#
# The probe runs SCHED_FIFO (chrt -f 1; PROBE_RT=0 turns that off). Under the normal
# scheduler nodes 2 and 3, busy with the cluster's rounds, held it off the CPU for
# milliseconds at a time, which counted against the clustered node only (one A/B against
# node-1 at 1,000/s on a quiet machine: probe lag p99 4-5 ms and `probe_late` 7-10% of the
# requests; with SCHED_FIFO 24-44 µs and 0-4). It still lags when other work shares CPU 1
# (the kernel is not preemptible): see lag_p99_us and probe_late in each RESULT. The probe
# takes ~15% of CPU 1 at 1,000/s and ~40% at 4,000/s, where with nodes 2 and 3 (~50%) CPU 1
# is nearly full.
#
# For each rate in RATES, both targets are warmed up (3 s each), then RUNS runs of each,
# alternating which goes first (clustered, standalone; standalone, clustered; ...): each run
# is the probe with `--rate RATE --duration DURATION` (plus its own WARMUP seconds, sent but
# not recorded), body as benches/check.lua (rule `default`, keys rotating over 10,000: all far
# below the limit, so all admitted). Each run's RESULT line goes to stderr; stdout gets the
# raw runs and Markdown tables of per-target medians (each column's median on its own) and
# clustered/standalone ratios.
#
# CPU µs per check: utime+stime of the node under test (all threads) from /proc/PID/stat,
# before and after the probe runs, in clock ticks (getconf CLK_TCK), divided by the checks
# sent in that time (warm-up included: RESULT's requests + errors + WARMUP x RATE). For the
# clustered node this includes its gossip rounds during the run, i.e. the cost of being in a
# cluster at that rate; nodes 2 and 3's CPU per check (together) is reported beside it, and
# the idle CPU of every node is measured once before the runs (IDLE seconds). Also recorded
# per run: the share of CPU 0 taken by anything but the two nodes pinned there
# (other_cpu0_pct, a warning above 10%; rough, see below). On a shared machine a build
# running beside the benchmark competes with the node under test, and hurts most the node
# that needs more CPU.
#
# Run-queue wait µs per check: the time the node's check threads (all but its
# `gossamer-cluster` threads) spent runnable but not running (field 2 of each thread's
# /proc/PID/task/TID/schedstat), over the checks sent, as for CPU. It is what a check waits for
# another thread of this machine to leave the core: on the clustered node mostly the cluster's
# threads, which is what `[server] check_slice` shortens. Unlike latency it does not grow when
# the hypervisor takes the CPU from the whole VM (steal), so it still compares the two nodes on
# a noisy machine whose p99 is set by steal.
#
# Ports (loopback; unlike cluster_figures.sh's 171xx, so both can run at once): node i has
# HTTP 17210+i, gossip 17220+2i, QUIC gossip+1 (the default); the standalone node HTTP 17209.
#
# Environment: RATES ("1000 4000", checks/s), DURATION (10, seconds recorded per run), RUNS (3),
# KEYS (10000: keys the checks rotate over, so the active keys the rounds carry),
# WARMUP (2, the probe's unrecorded seconds per run), CONNECTIONS (16), NODE_CPU (0),
# OTHER_CPU (1), PROBE_RT (1: SCHED_FIFO probe if chrt can; 0: normal), IDLE (5 s),
# SKIP_BUILD=1 (use the binaries in target/release as they are).
# Needs python3 (benches/cluster_load.py wait-cluster), curl, taskset; chrt and root (or
# CAP_SYS_NICE) for the SCHED_FIFO probe, else it falls back to the normal scheduler.
# Takes about 6 + 2 x RUNS x (DURATION + WARMUP) s per rate, plus start-up and IDLE: ~3 min
# with the defaults.

set -euo pipefail
cd "$(dirname "$0")/.."

BIN=target/release/gossamer
PROBE=target/release/examples/latency_probe
LOAD=benches/cluster_load.py
RATES=${RATES:-"1000 4000"}
DURATION=${DURATION:-10}
RUNS=${RUNS:-3}
WARMUP=${WARMUP:-2}
CONNECTIONS=${CONNECTIONS:-16}
KEYS=${KEYS:-10000}
NODE_CPU=${NODE_CPU:-0}
OTHER_CPU=${OTHER_CPU:-1}
PROBE_RT=${PROBE_RT:-1}
IDLE=${IDLE:-5}
STANDALONE_PORT=17209

WORK=$(mktemp -d -t gossamer-cluster-latency.XXXXXX)
PIDS=()
PROBE_PID=

log() { echo "[$(date +%T)] $*" >&2; }

# Stops the processes this script started: SIGTERM, up to 12 s for all of them to exit (a
# node's shutdown_grace is 10 s, and with no connections open it exits at once), then SIGKILL.
stop() {
    local pid i alive
    for pid in "$@"; do kill "$pid" 2>/dev/null || true; done
    for i in $(seq 1 120); do
        alive=0
        for pid in "$@"; do if kill -0 "$pid" 2>/dev/null; then alive=1; fi; done
        ((alive)) || break
        sleep 0.1
    done
    for pid in "$@"; do
        if kill -0 "$pid" 2>/dev/null; then
            echo "pid $pid still running 12 s after SIGTERM: SIGKILL" >&2
            kill -9 "$pid" 2>/dev/null || true
        fi
        wait "$pid" 2>/dev/null || true
    done
}

cleanup() {
    stop ${PROBE_PID:+"$PROBE_PID"} "${PIDS[@]}"
    rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

for tool in python3 curl taskset; do
    command -v "$tool" >/dev/null || { echo "$tool is missing" >&2; exit 1; }
done
if ((NODE_CPU == OTHER_CPU)) || ! taskset -c "$NODE_CPU,$OTHER_CPU" true 2>/dev/null; then
    echo "need two distinct usable CPUs NODE_CPU=$NODE_CPU OTHER_CPU=$OTHER_CPU" >&2
    exit 1
fi

PROBE_SCHED=()
if [[ $PROBE_RT == 1 ]]; then
    if chrt -f 1 true 2>/dev/null; then
        PROBE_SCHED=(chrt -f 1)
    else
        echo "chrt -f 1 is not allowed here: the probe runs under the normal scheduler" >&2
    fi
fi

if [[ -z ${SKIP_BUILD:-} ]]; then
    log "building (release)..."
    cargo build --release --bin gossamer --example latency_probe >&2
fi
[[ -x $BIN && -x $PROBE ]] || { echo "missing $BIN or $PROBE (build, or unset SKIP_BUILD)" >&2; exit 1; }


http_port() { echo $((17210 + $1)); }
gossip_port() { echo $((17220 + 2 * $1)); }

CLK_TCK=$(getconf CLK_TCK)

# Ticks of user + system CPU the process has used (fields 14 and 15 of /proc/PID/stat,
# counted after the parenthesised command name, which may contain spaces).
cpu_ticks() {
    local stat
    stat=$(<"/proc/$1/stat")
    stat=${stat##*) }
    # After "pid (comm) ", field 3 (state) is the first word: utime is word 12, stime 13.
    awk '{ print $12 + $13 }' <<<"$stat"
}

# Nanoseconds the process's threads other than the cluster's (`gossamer-cluster`, which the
# kernel shortens to 15 characters) have spent runnable but waiting for a CPU, so far: field 2
# of /proc/PID/task/TID/schedstat. Those are the threads that answer checks (the HTTP
# runtime's workers and the main thread). Unlike latency, this is not inflated when the
# hypervisor takes the CPU from the whole VM (steal): it counts only a thread waiting behind
# another thread of this machine. A thread that exits between two readings takes its share
# with it (the HTTP runtime keeps its threads).
wait_ns() {
    local t comm total=0 stat
    for t in /proc/"$1"/task/*; do
        comm=$(<"$t/comm") 2>/dev/null || continue
        [[ $comm == gossamer-clust* ]] && continue
        stat=$(<"$t/schedstat") 2>/dev/null || continue
        stat=${stat#* }
        total=$((total + ${stat%% *}))
    done
    echo "$total"
}

# wait_ready PORT PID: until a check on PORT answers (10 s at most).
wait_ready() {
    local port=$1 pid=$2 i
    for i in $(seq 1 100); do
        if ! kill -0 "$pid" 2>/dev/null; then
            echo "node on port $port died; log:" >&2
            tail -n 20 "$WORK"/*.log >&2
            exit 1
        fi
        if curl -s -o /dev/null --max-time 1 -X POST -H 'Content-Type: application/json' \
            -d '{"rule":"default","key":"probe"}' "http://127.0.0.1:$port/v1/check"; then
            return 0
        fi
        sleep 0.1
    done
    echo "node on port $port did not come up" >&2
    exit 1
}

# --- start --------------------------------------------------------------------------------
for i in 1 2 3; do
    if ((i == 1)); then cpu=$NODE_CPU; else cpu=$OTHER_CPU; fi
    taskset -c "$cpu" "$BIN" serve --config benches/cluster_rules.toml --node-id "node-$i" \
        --http "127.0.0.1:$(http_port "$i")" --gossip "127.0.0.1:$(gossip_port "$i")" \
        --seeds "127.0.0.1:$(gossip_port 1)" >"$WORK/node$i.log" 2>&1 &
    PIDS+=($!)
done
NODE1_PID=${PIDS[0]}
PEER_PIDS=("${PIDS[1]}" "${PIDS[2]}")
taskset -c "$NODE_CPU" "$BIN" serve --config benches/cluster_rules.toml --node-id standalone \
    --http "127.0.0.1:$STANDALONE_PORT" >"$WORK/standalone.log" 2>&1 &
STANDALONE_PID=$!
PIDS+=("$STANDALONE_PID")

HTTP_PORTS=$(for i in 1 2 3; do http_port "$i"; done | paste -sd,)
t0=$SECONDS
if ! python3 "$LOAD" wait-cluster --http "$HTTP_PORTS" --timeout 30; then
    tail -n 20 "$WORK"/node*.log >&2
    exit 1
fi
log "3 nodes up, all members alive after $((SECONDS - t0)) s"
wait_ready "$STANDALONE_PORT" "$STANDALONE_PID"
# CPU is read from these pids: make sure they are the nodes (taskset execs), not a wrapper.
for pid in "${PIDS[@]}"; do
    [[ $(<"/proc/$pid/comm") == gossamer ]] || { echo "pid $pid is not gossamer" >&2; exit 1; }
done

# cpu_stat N: "busy total" ticks of CPU N so far (/proc/stat: user nice system idle iowait
# irq softirq steal ...; busy is all but idle and iowait).
cpu_stat() {
    awk -v c="cpu$1" '$1 == c { print $2 + $3 + $4 + $7 + $8 + $9, $2 + $3 + $4 + $5 + $6 + $7 + $8 + $9 }' /proc/stat
}
# Ticks of the two processes pinned to NODE_CPU: node-1 and the standalone node.
nodes_ticks() { echo $(($(cpu_ticks "$NODE1_PID") + $(cpu_ticks "$STANDALONE_PID"))); }
peer_ticks() { echo $(($(cpu_ticks "${PEER_PIDS[0]}") + $(cpu_ticks "${PEER_PIDS[1]}"))); }
pid_of() { if [[ $1 == clustered ]]; then echo "$NODE1_PID"; else echo "$STANDALONE_PID"; fi; }
port_of() { if [[ $1 == clustered ]]; then http_port 1; else echo "$STANDALONE_PORT"; fi; }

# probe TARGET RATE DURATION WARMUP LABEL: runs the probe on CPU OTHER_CPU against TARGET, in the
# background so that the traps can stop it; its RESULT line lands in $WORK/probe.out.
probe() {
    local target=$1 rate=$2 duration=$3 warmup=$4 label=$5
    "${PROBE_SCHED[@]}" taskset -c "$OTHER_CPU" "$PROBE" --url "http://127.0.0.1:$(port_of "$target")" \
        --rate "$rate" --duration "$duration" --warmup "$warmup" \
        --connections "$CONNECTIONS" --keys "$KEYS" >"$WORK/probe.out" 2>"$WORK/probe.err" &
    PROBE_PID=$!
    if ! wait "$PROBE_PID"; then
        PROBE_PID=
        echo "latency_probe failed against $target:" >&2
        cat "$WORK/probe.err" >&2
        exit 1
    fi
    PROBE_PID=
    if [[ -s $WORK/probe.err ]]; then sed "s/^/  [$label] /" "$WORK/probe.err" >&2; fi
}

# One measured run; appends "rate target run requests achieved p50 p90 p99 p999 max non2xx
# errors late probe_late lag_p50 lag_p99 cpu_us_per_check peers_cpu_us_per_check
# other_cpu0_pct other_cpu1_pct probe_cpu_pct wait_us_per_check" to $RESULTS (the last:
# see "Run-queue wait" above). other_cpu0_pct: the share of NODE_CPU that went to anything
# but node-1 and the standalone node during the run (other work on the machine competing
# with the node under test); other_cpu1_pct: the same for OTHER_CPU, less nodes 2-3 and the probe; probe_cpu_pct: the probe's share of OTHER_CPU.
# The per-CPU busy time comes from /proc/stat, which this kernel samples at each tick (a
# process's utime+stime is exact), so the other_* figures are rough: good at showing a
# build or test run competing for the CPU (tens of %), not at a few %.
RESULTS="$WORK/results.txt"
: >"$RESULTS"
run() {
    local target=$1 rate=$2 n=$3 pid before after peers_before peers_after line wait_before wait_after
    local nodes_before nodes_after cpu0_before cpu0_after cpu1_before cpu1_after
    pid=$(pid_of "$target")
    nodes_before=$(nodes_ticks)
    cpu0_before=($(cpu_stat "$NODE_CPU"))
    cpu1_before=($(cpu_stat "$OTHER_CPU"))
    before=$(cpu_ticks "$pid")
    wait_before=$(wait_ns "$pid")
    peers_before=$(peer_ticks)
    probe "$target" "$rate" "$DURATION" "$WARMUP" "$target run $n"
    after=$(cpu_ticks "$pid")
    wait_after=$(wait_ns "$pid")
    peers_after=$(peer_ticks)
    nodes_after=$(nodes_ticks)
    cpu0_after=($(cpu_stat "$NODE_CPU"))
    cpu1_after=($(cpu_stat "$OTHER_CPU"))
    line=$(grep '^RESULT ' "$WORK/probe.out") || {
        echo "latency_probe printed no RESULT line:" >&2
        cat "$WORK/probe.out" "$WORK/probe.err" >&2
        exit 1
    }
    log "rate $rate $target run $n: $line"
    if ((100 * (cpu0_after[0] - cpu0_before[0] - (nodes_after - nodes_before)) > 10 * (cpu0_after[1] - cpu0_before[1]))); then
        log "WARNING: more than 10% of CPU $NODE_CPU went to other processes during this run:" \
            "the node under test competed for its CPU (see other_cpu0_pct)"
    fi
    awk -v t="$target" -v r="$rate" -v n="$n" -v ticks=$((after - before)) -v hz="$CLK_TCK" \
        -v warmup="$WARMUP" -v peers=$((peers_after - peers_before)) \
        -v other0=$((cpu0_after[0] - cpu0_before[0] - (nodes_after - nodes_before))) \
        -v total0=$((cpu0_after[1] - cpu0_before[1])) \
        -v busy1=$((cpu1_after[0] - cpu1_before[0])) -v total1=$((cpu1_after[1] - cpu1_before[1])) \
        -v peers_on1=$((peers_after - peers_before)) -v waited=$((wait_after - wait_before)) '
        {
            for (i = 2; i <= NF; i++) { split($i, kv, "="); v[kv[1]] = kv[2] }
            sent = v["requests"] + v["errors"] + int(warmup * r + 0.5)
            cpu = sent > 0 ? ticks / hz * 1e6 / sent : 0
            pcpu = sent > 0 ? peers / hz * 1e6 / sent : 0
            o0 = total0 > 0 ? 100 * (other0 > 0 ? other0 : 0) / total0 : 0
            # The probe share of OTHER_CPU, from its own report (NA counts as 0).
            probe1 = v["probe_cpu_pct"] + 0
            o1 = total1 > 0 ? 100 * (busy1 - peers_on1) / total1 - probe1 : 0
            if (o1 < 0) o1 = 0
            wait = sent > 0 ? waited / 1e3 / sent : 0
            printf "%s %s %s %s %s %s %s %s %s %s %s %s %s %s %s %s %.2f %.2f %.1f %.1f %s %.2f\n", r,
                t, n, v["requests"], v["achieved_rps"], v["p50_us"], v["p90_us"], v["p99_us"],
                v["p999_us"], v["max_us"], v["non2xx"], v["errors"], v["late"],
                v["probe_late"], v["lag_p50_us"], v["lag_p99_us"], cpu, pcpu, o0, o1,
                v["probe_cpu_pct"], wait
        }' <<<"$line" >>"$RESULTS"
}

log "$(nproc) CPUs; nodes under test on CPU $NODE_CPU, nodes 2-3 and the probe on CPU $OTHER_CPU" \
    "(${PROBE_SCHED[*]:-normal scheduler}); rates: $RATES checks/s; $RUNS runs x ${DURATION}s" \
    "(+${WARMUP}s warm-up) per target and rate"
log "idle CPU, ${IDLE}s"
idle_before=("$(cpu_ticks "$NODE1_PID")" "$(cpu_ticks "$STANDALONE_PID")" "$(peer_ticks)" $(cpu_stat "$NODE_CPU"))
sleep "$IDLE"
idle_after=("$(cpu_ticks "$NODE1_PID")" "$(cpu_ticks "$STANDALONE_PID")" "$(peer_ticks)" $(cpu_stat "$NODE_CPU"))
# Percent of one CPU, from ticks over IDLE seconds.
idle_pct() { awk -v t="$1" -v hz="$CLK_TCK" -v s="$IDLE" 'BEGIN { printf "%.1f", t / hz / s * 100 }'; }
IDLE_LINE="Idle (no checks, ${IDLE}s, before the runs): node-1 $(idle_pct $((idle_after[0] - idle_before[0])))%"
IDLE_LINE+=" of a CPU, standalone $(idle_pct $((idle_after[1] - idle_before[1])))%,"
IDLE_LINE+=" nodes 2+3 together $(idle_pct $((idle_after[2] - idle_before[2])))%;"
IDLE_LINE+=" other processes on CPU $NODE_CPU $(idle_pct $((idle_after[3] - idle_before[3] - (idle_after[0] - idle_before[0]) - (idle_after[1] - idle_before[1]))))%."
log "$IDLE_LINE"
for rate in $RATES; do
    log "rate $rate: warming up both targets"
    for target in clustered standalone; do probe "$target" "$rate" 3 0 "$target warm-up"; done
    for n in $(seq 1 "$RUNS"); do
        # Alternate which target goes first, so neither always runs on a warmer machine.
        if ((n % 2)); then order="clustered standalone"; else order="standalone clustered"; fi
        for target in $order; do run "$target" "$rate" "$n"; done
    done
done

echo "Machine: $(nproc) CPUs, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //'); $(date -u +%Y-%m-%dT%H:%MZ)"
echo "Open-loop probe (benches/latency_probe.rs), $CONNECTIONS connections over $KEYS keys, ${DURATION}s recorded per run after ${WARMUP}s warm-up, $RUNS runs per target and rate; probe: ${PROBE_SCHED[*]:-normal scheduler}, CPU $OTHER_CPU; nodes under test: CPU $NODE_CPU."
echo "$IDLE_LINE"
echo
echo "Raw runs (rate target run requests achieved_rps p50_us p90_us p99_us p999_us max_us non2xx errors late probe_late lag_p50_us lag_p99_us cpu_us_per_check peers_cpu_us_per_check other_cpu0_pct other_cpu1_pct probe_cpu_pct wait_us_per_check):"
sort -k1,1n -k2,2 -k3,3n "$RESULTS"
echo

# Medians per (rate, target), column by column, and clustered/standalone ratios.
awk -f benches/median.awk -f /dev/stdin "$RESULTS" <<'AWK'
    {
        k = $1 SUBSEP $2
        rps[k] = rps[k] " " $5; p50[k] = p50[k] " " $6; p90[k] = p90[k] " " $7
        p99[k] = p99[k] " " $8; p999[k] = p999[k] " " $9; cpu[k] = cpu[k] " " $17
        pcpu[k] = pcpu[k] " " $18; if ($19 > other[k]) other[k] = $19
        if ($20 > other1[k]) other1[k] = $20
        wait[k] = wait[k] " " $22
        non2xx[k] += $11; errs[k] += $12; late[k] += $13; plate[k] += $14
        if (!($1 in seen)) { seen[$1] = 1; rates[++nr] = $1 }
    }
    END {
        split("clustered standalone", ts, " ")
        print "| rate/s | target | achieved checks/s | p50 µs | p90 µs | p99 µs | p99.9 µs | CPU µs per check | check threads' run-queue wait µs per check | nodes 2+3 CPU µs per check | non-2xx / errors / late / probe-late (all runs) | other load on CPU 0 / CPU 1, max % |"
        print "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|"
        for (i = 1; i <= nr; i++) {
            r = rates[i]
            for (j = 1; j <= 2; j++) {
                k = r SUBSEP ts[j]
                m_rps[k] = median(rps[k]); m_p50[k] = median(p50[k]); m_p90[k] = median(p90[k])
                m_p99[k] = median(p99[k]); m_p999[k] = median(p999[k]); m_cpu[k] = median(cpu[k])
                m_wait[k] = median(wait[k])
                printf "| %s | %s | %.0f | %s | %s | %s | %s | %.1f | %.2f | %.1f | %d / %d / %d / %d | %.0f / %.0f |\n",
                    r, ts[j], m_rps[k], m_p50[k], m_p90[k], m_p99[k], m_p999[k], m_cpu[k],
                    m_wait[k], median(pcpu[k]), non2xx[k], errs[k], late[k], plate[k], other[k], other1[k]
            }
        }
        print ""
        print "| rate/s | p50 clustered/standalone | p90 | p99 | p99.9 | achieved checks/s | CPU per check |"
        print "|---:|---:|---:|---:|---:|---:|---:|"
        for (i = 1; i <= nr; i++) {
            r = rates[i]; c = r SUBSEP "clustered"; s = r SUBSEP "standalone"
            printf "| %s | %s | %s | %s | %s | %s | %s |\n", r, ratio(m_p50[c], m_p50[s]),
                ratio(m_p90[c], m_p90[s]), ratio(m_p99[c], m_p99[s]),
                ratio(m_p999[c], m_p999[s]), ratio(m_rps[c], m_rps[s]), ratio(m_cpu[c], m_cpu[s])
        }
    }
    function ratio(a, b) { return b > 0 ? sprintf("%.2f", a / b) : "-" }
AWK
