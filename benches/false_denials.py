#!/usr/bin/env python3
"""False 429s: denials of checks that one exact counter would have admitted at once.

What it measures
----------------
It starts gossamer nodes on loopback as a new user would (README, "A cluster": N nodes of
`gossamer serve --config rules.toml --node-id node-i --http 127.0.0.1:P --gossip
127.0.0.1:G --seeds 127.0.0.1:G0`, each also on QUIC at G + 1), waits until every node's
`/readyz` is 200 and its `/v1/cluster` shows all N members alive, and then offers the
per-user tiers a real API uses, every rule global (the default scope):

    bucket   token_bucket            60/min, burst 60
    fixed    fixed_window            60/min
    log      sliding_window_log      60/min
    counter  sliding_window_counter  60/min
    hybrid   token_bucket 10/s burst 20  +  sliding_window_log 300/min (docs/configuration.md's)

With `--exchange tree` the nodes run `[cluster] exchange = "tree"`, which accepts only global
fixed windows of at most a minute, so only `fixed` is loaded. With `--standalone` one node
runs without `--gossip`, for comparison; with `--separate`, `--nodes` nodes each run without
`--gossip` and take the same load as the cluster's nodes, so the latencies compare like for
like where the nodes share one machine's cores (on a real cluster each node has its own).

Load: `--users` users (5,000). Client threads (`--concurrency`, 16, spread over `--procs`
processes: 2, or 1 on a single CPU; each process has its own share of the users, since one
Python process tops out near 5,000-6,000 checks/s on a loaded 2-core machine) each keep one
keep-alive HTTP connection per node and repeatedly pick a random user, a random rule and a
random node, and send that node a burst of 1 to 5 checks (`POST /v1/check
{"rule","key","cost":1}`) back to back, for `--duration` seconds. No user comes near a
limit: per (user, rule) the script keeps what it sent in the last 60 s (and, for the hybrid's
10/s bucket, the last 1 s), and skips a burst that would take that user past 50% of any limit
of the rule (30 per minute; hybrid: 5 per second and 150 per minute). Every check it sends
is therefore one that a single exact counter would admit at once, and every 429 is a false
denial. (The 50% margin leaves room for any slop between the client's bookkeeping and the
nodes' clocks, and for window edges: at most 30 in any 60 s is at most 30 in any aligned
minute.) The load is closed-loop: each thread waits
for an answer before it sends the next check, so checks a node holds (a new key waiting for a
round) lower the rate; the rate achieved is printed.

Timing: the load starts as soon as the cluster has formed, as a new user's first requests
would. With `--exchange tree` a freshly started cluster is in its *start freeze*
(`gossamer_cluster_tree_start_frozen` 1, docs/operations.md) until each node's first complete
round, a round or two after it joins; `--wait-unfrozen` waits (up to 70 s) for every node
to leave it before the load. The minute window open at the start is not based (design
§3.3.3), so a key new at a node waits for a round's grant there until the next minute;
`--next-minute` starts the load in the next minute window instead (either exchange), to
measure a cluster past its first windows.

`--cluster-option KEY=VALUE` adds a line to the config's `[cluster]` table (e.g.
`round_nice=0`, `'round_nice="idle"'`, `'on_partition="split"'`), to see what a setting changes.

With `--stress N` it also starts N busy-loop processes for the duration of the load (to
saturate the CPU, as a busy machine would) and kills them after.

How to run
----------
    cargo build --release
    python3 benches/false_denials.py                       # 3 nodes, full mesh
    python3 benches/false_denials.py --standalone          # 1 node, no cluster
    python3 benches/false_denials.py --separate            # 3 nodes, each standalone
    python3 benches/false_denials.py --exchange tree       # 3 nodes, aggregation tree
    python3 benches/false_denials.py --exchange tree --wait-unfrozen
    python3 benches/false_denials.py --exchange tree --next-minute
    python3 benches/false_denials.py --stress 2            # 3 nodes + 2 busy loops
    python3 benches/false_denials.py --rules counter       # one of the tiers alone
    python3 benches/false_denials.py --binary /tmp/gossamer --nodes 5 --users 5000 \\
        --duration 5 --concurrency 8 --json               # one JSON object on stdout

Standard library only (Python 3.11). Nodes and busy loops are stopped on exit, Ctrl-C, SIGTERM
and errors included; configs and node logs live in a temporary directory, removed at exit
(`--keep` keeps it). `--records FILE` writes every check as CSV (send and answer times, rule,
node, user, status, latency, retry_after_ms, remaining), to follow one user's checks across
nodes. Every wait is bounded (`--ready-timeout`, 30 s, for the cluster to form).
Exit status: 0 when no check was denied or failed, 1 otherwise, 2 when the cluster did not
form (the nodes' last log lines are printed).

What the output means
---------------------
The header says the mode, when the cluster formed, and the load: when it began (UTC: a
minute's windows turn over at :00), checks answered, elapsed
seconds, checks per second, the CPU (in cores) the client and each node used over the load,
the load average before and after, and how many bursts the throttle skipped. On a cluster,
each node's rounds during the load: mesh `consistent` / `degraded` (a degraded instant grants
no room, and then a key new at that node is denied until the next round), tree `complete` /
`short`, and the mean time a tick (a round's boundary or instant) took. Then one row per
rule, and `all`:

    checks      checks answered (200, 429 or anything else)
    denied      answers 429, and their share of the rule's checks: all false denials
    other       anything but 200 or 429 (HTTP errors; a failed connection is status 0)
    p50/p99/max client-side latency of a check in ms: request written to body read, over a
                keep-alive connection. It includes the client's own scheduling (Python threads
                share a GIL) and, on a busy machine, waiting for a core; compare with the
                nodes' own decision time, gossamer_check_duration_seconds sum / count below
                (on a cluster that includes checks held for a round).
    >10ms       checks whose client-side latency was over 10 ms

Then checks and denials per node; on a cluster, the bytes of cluster messages the nodes sent
(`gossamer_cluster_sent_bytes_total`, summed over the nodes, since they started) per check of
the load, by message kind; for the denials, per rule and node: how many, their
`retry_after_ms` (min / median / max), the `remaining` their bodies reported (for a window,
the cluster-wide room left: near the limit means the node denied with room to spare), when
in the load they came (s after it began) and the body's `outcome`. Then, per second of the
load: checks sent, denied, the nodes' rounds in that second (summed over the nodes; 10 per
node per second when none is skipped), the mean ms a tick took, and the keys all nodes held
at its end (`gossamer_active_keys`, summed over nodes and rules). Then denied / checks by how
new the key was when the check was sent: the key's first check anywhere (`new key`), first at
this node but seen at another (`new at node`), or seen at this node before, first less or more
than 0.2 s ago (a burst's later checks are `at node <0.2s`). Finally each node's
`gossamer_checks_total{rule,outcome}` and `gossamer_check_duration_seconds` sum and count
from `/metrics` (and `gossamer_check_denied_with_room_total`, if the binary has it; the header
says when it does not), with the cluster's membership and round counters for context.
"""

import argparse
import atexit
import csv
import http.client
import json
import multiprocessing
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict, deque

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_BINARY = os.path.join(os.path.dirname(HERE), "target", "release", "gossamer")

# The rules, one [[rule]] block per name, from benches/false_denials.toml (shared with
# tests/netns.rs); a run writes the blocks of the rules it serves.
with open(os.path.join(HERE, "false_denials.toml")) as _f:
    RULES = {
        re.search(r'^name = "([^"]+)"', block, re.M).group(1): "\n[[rule]]" + block
        for block in _f.read().split("\n[[rule]]")[1:]
    }

# What the client lets itself send per (user, rule): 50% of every limit of the rule,
# as (window in seconds, most units in any such trailing window).
BUDGET = {
    "bucket": [(60.0, 30)],
    "fixed": [(60.0, 30)],
    "log": [(60.0, 30)],
    "counter": [(60.0, 30)],
    "hybrid": [(1.0, 5), (60.0, 150)],
}

# Every process this script started; stopped by cleanup() whatever happens.
PROCS = []
PROCS_LOCK = threading.Lock()


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def spawn(argv, **kw):
    with PROCS_LOCK:
        p = subprocess.Popen(argv, **kw)
        PROCS.append(p)
    return p


def stop(procs, grace=5.0):
    """SIGTERM, wait up to `grace` s in all, then SIGKILL what is left."""
    for p in procs:
        if p.poll() is None:
            try:
                p.terminate()
            except OSError:
                pass
    deadline = time.monotonic() + grace
    for p in procs:
        try:
            p.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass


def cleanup():
    with PROCS_LOCK:
        procs = list(PROCS)
        PROCS.clear()
    stop(procs)


def on_signal(signum, _frame):
    raise SystemExit(128 + signum)


# ---------------------------------------------------------------------------- ports


def _free(kind, port):
    s = socket.socket(socket.AF_INET, kind)
    try:
        s.bind(("127.0.0.1", port))
        return True
    except OSError:
        return False
    finally:
        s.close()


def pick_ports(n, rng):
    """n (http, gossip) pairs: http a free TCP port, gossip and gossip+1 free UDP ports,
    with a gap of at least two ports between nodes' UDP pairs."""
    used = set()
    out = []
    tries = 0
    while len(out) < n:
        tries += 1
        if tries > 10_000:
            raise RuntimeError("could not find free ports")
        base = rng.randrange(20_000, 60_000, 4)
        http_p, gossip = base, base + 2  # http, [gap], gossip, quic = gossip + 1
        span = set(range(base - 4, base + 8))
        if span & used:
            continue
        if _free(socket.SOCK_STREAM, http_p) and _free(socket.SOCK_DGRAM, gossip) \
                and _free(socket.SOCK_DGRAM, gossip + 1):
            used |= span
            out.append((http_p, gossip))
    return out


# ---------------------------------------------------------------------------- HTTP


def get(port, path, timeout=2.0):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        c.request("GET", path)
        r = c.getresponse()
        return r.status, r.read()
    finally:
        c.close()


def node_state(port, n):
    """(ready, alive members) of the node, or (False, 0) if it does not answer."""
    try:
        status, _ = get(port, "/readyz")
        ready = status == 200
        if n is None:
            return ready, 1
        status, body = get(port, "/v1/cluster")
        if status != 200:
            return ready, 0
        members = json.loads(body).get("members", [])
        return ready, sum(1 for m in members if m.get("alive"))
    except (OSError, ValueError, http.client.HTTPException):
        return False, 0


def tail(path, lines=15):
    try:
        with open(path, errors="replace") as f:
            return "".join(f.readlines()[-lines:])
    except OSError:
        return ""


# ---------------------------------------------------------------------------- load


class Throttle:
    """Per (user, rule) what was sent in the trailing windows of BUDGET."""

    def __init__(self):
        self.lock = threading.Lock()
        self.sent = defaultdict(deque)  # (user, rule) -> deque of (t, units)
        self.skipped = 0

    def reserve(self, user, rule, units, now):
        with self.lock:
            q = self.sent[(user, rule)]
            longest = max(w for w, _ in BUDGET[rule])
            while q and q[0][0] <= now - longest:
                q.popleft()
            for window, most in BUDGET[rule]:
                used = sum(u for t, u in q if t > now - window)
                if used + units > most:
                    self.skipped += 1
                    return False
            q.append((now, units))
            return True


def worker(seed, ports, rules, users, part, throttle, t_start, t_end, out, pace=0.0):
    """One client thread. It draws users from its process's share of them: users u with
    u % parts == index, for part = (index, parts). With `pace` > 0 it starts a burst every
    `pace` seconds (an open loop, as far as the answers keep up), else as soon as the last
    one is answered."""
    index, parts = part
    mine = (users - index + parts - 1) // parts
    rng = random.Random(seed)
    conns = [None] * len(ports)
    perf = time.perf_counter
    headers = {"Content-Type": "application/json"}
    next_at = time.monotonic() + rng.random() * pace
    try:
        while True:
            if pace > 0:
                wait = next_at - time.monotonic()
                if wait > 0:
                    time.sleep(wait)
                next_at += pace
            now = time.monotonic()
            if now >= t_end:
                break
            user = index + parts * rng.randrange(mine)
            rule = rng.choice(rules)
            node = rng.randrange(len(ports))
            burst = rng.randint(1, 5)
            if not throttle.reserve(user, rule, burst, now):
                time.sleep(0.001)  # no busy loop when few users are all at their budget
                continue
            body = json.dumps({"rule": rule, "key": f"user-{user}", "cost": 1})
            for _ in range(burst):
                t0 = perf()
                status, retry, remaining, outcome = 0, None, None, None
                try:
                    c = conns[node]
                    if c is None:
                        c = conns[node] = http.client.HTTPConnection(
                            "127.0.0.1", ports[node], timeout=10)
                    c.request("POST", "/v1/check", body=body, headers=headers)
                    r = c.getresponse()
                    data = r.read()
                    status = r.status
                    if status == 429:
                        try:
                            b = json.loads(data)
                            retry, remaining, outcome = (
                                b.get("retry_after_ms"), b.get("remaining"), b.get("outcome"))
                        except ValueError:
                            pass
                    elif status != 200:
                        outcome = data[:200].decode(errors="replace")
                except (OSError, http.client.HTTPException) as e:
                    outcome = f"{type(e).__name__}: {e}"
                    if conns[node] is not None:
                        conns[node].close()
                    conns[node] = None
                t1 = perf()
                out.append((rule, node, status, t1 - t0, retry, remaining, outcome,
                            time.monotonic() - t_start, user))
    finally:
        for c in conns:
            if c is not None:
                c.close()


def drive(seed, ports, rules, users, part, threads, t_start, t_end, pace=0.0):
    """One client process: `threads` threads over the process's share of the users, with one
    throttle (users are never shared between processes). Returns (records, bursts skipped,
    CPU seconds used, threads still running 30 s after the end)."""
    throttle = Throttle()
    outs = [[] for _ in range(threads)]
    cpu0 = os.times()
    ts = [threading.Thread(
        target=worker, daemon=True,
        args=(seed + k, ports, rules, users, part, throttle, t_start, t_end, outs[k], pace))
        for k in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(timeout=max(0.0, t_end - time.monotonic()) + 30)
    cpu1 = os.times()
    hung = sum(1 for t in ts if t.is_alive())
    records = [r for o in outs for r in list(o)]
    return records, throttle.skipped, (cpu1.user + cpu1.system) - (cpu0.user + cpu0.system), hung


def drive_child(conn, *a):
    try:
        conn.send(drive(*a))
    except BaseException as e:  # the parent reports it
        conn.send(e if isinstance(e, Exception) else RuntimeError(repr(e)))
    finally:
        conn.close()


def proc_cpu(pid):
    """User + system CPU seconds of a process, from /proc (None if unavailable)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return None


# ---------------------------------------------------------------------------- stats


def pct(sorted_xs, p):
    if not sorted_xs:
        return None
    k = max(0, min(len(sorted_xs) - 1, int(round(p / 100.0 * len(sorted_xs) + 0.5)) - 1))
    return sorted_xs[k]


def summarize(records, rules):
    rows = []
    for rule in rules + ["all"]:
        rs = [r for r in records if rule == "all" or r[0] == rule]
        lat = sorted(r[3] * 1000 for r in rs)
        denied = sum(1 for r in rs if r[2] == 429)
        other = sum(1 for r in rs if r[2] not in (200, 429))
        rows.append({
            "rule": rule,
            "checks": len(rs),
            "denied": denied,
            "denied_pct": 100.0 * denied / len(rs) if rs else 0.0,
            "other": other,
            "p50_ms": pct(lat, 50),
            "p99_ms": pct(lat, 99),
            "max_ms": lat[-1] if lat else None,
            "over_10ms": sum(1 for x in lat if x > 10),
        })
    return rows


def denial_detail(records, names):
    groups = defaultdict(list)
    for r in records:
        if r[2] == 429:
            groups[(r[0], names[r[1]])].append(r)
    out = []
    for (rule, node), rs in sorted(groups.items()):
        retry = sorted(r[4] for r in rs if isinstance(r[4], (int, float)))
        rem = sorted(r[5] for r in rs if isinstance(r[5], (int, float)))
        at = sorted(r[7] for r in rs)
        outcomes = sorted({str(r[6]) for r in rs})
        out.append({
            "rule": rule, "node": node, "denied": len(rs),
            "retry_after_ms_min": retry[0] if retry else None,
            "retry_after_ms_p50": pct(retry, 50) if retry else None,
            "retry_after_ms_max": retry[-1] if retry else None,
            "remaining_min": rem[0] if rem else None,
            "remaining_max": rem[-1] if rem else None,
            "first_s": at[0], "last_s": at[-1],
            "outcomes": outcomes,
        })
    return out


KINDS = (
    ("new key", "the key's first check in the run, at any node"),
    ("new at node", "the key was checked before, but only at other nodes"),
    ("at node <0.2s", "checked at this node before, the first time under 0.2 s ago"),
    ("at node >=0.2s", "checked at this node before, the first time 0.2 s ago or more"),
)


def classify(records):
    """Per record (by index), which of KINDS it is: how new its key was, at its node and in
    the cluster, when it was sent (start time = end - latency)."""
    order = sorted(range(len(records)), key=lambda i: records[i][7] - records[i][3])
    seen_any = set()
    first_at_node = {}
    kinds = [None] * len(records)
    for i in order:
        r = records[i]
        start = r[7] - r[3]
        key = (r[8], r[0])
        if key not in seen_any:
            kinds[i] = 0
        elif (key, r[1]) not in first_at_node:
            kinds[i] = 1
        elif start - first_at_node[(key, r[1])] < 0.2:
            kinds[i] = 2
        else:
            kinds[i] = 3
        seen_any.add(key)
        first_at_node.setdefault((key, r[1]), start)
    return kinds


def by_kind(records, kinds, rules):
    out = []
    for k, (name, what) in enumerate(KINDS):
        row = {"kind": name, "what": what}
        for rule in rules + ["all"]:
            rs = [r for r, kk in zip(records, kinds) if kk == k and rule in ("all", r[0])]
            row[rule] = {"checks": len(rs), "denied": sum(1 for r in rs if r[2] == 429)}
        out.append(row)
    return out


def fmt_ms(x):
    return "-" if x is None else f"{x:.2f}"


def print_table(rows):
    hdr = f"{'rule':<8} {'checks':>8} {'denied':>7} {'denied%':>8} {'other':>6} " \
          f"{'p50 ms':>8} {'p99 ms':>8} {'max ms':>8} {'>10ms':>6}"
    print(hdr)
    print("-" * len(hdr))
    for r in rows:
        if r["rule"] == "all":
            print("-" * len(hdr))
        print(f"{r['rule']:<8} {r['checks']:>8} {r['denied']:>7} {r['denied_pct']:>7.2f}% "
              f"{r['other']:>6} {fmt_ms(r['p50_ms']):>8} {fmt_ms(r['p99_ms']):>8} "
              f"{fmt_ms(r['max_ms']):>8} {r['over_10ms']:>6}")


ROUND_METRICS = re.compile(
    r'^gossamer_cluster_(rounds_total|tree_rounds_total)\{state="(\w+)"\} (\S+)$', re.M)


def rounds(port):
    """The node's round counters, {"consistent": n, "degraded": n} (mesh) or
    {"complete": n, "short": n} (tree); {} if unavailable."""
    try:
        _, body = get(port, "/metrics", timeout=5)
    except (OSError, http.client.HTTPException):
        return {}
    text = body.decode()
    out = {m.group(2): float(m.group(3)) for m in ROUND_METRICS.finditer(text)}
    for name, key in (("ticks_total", "ticks"), ("tick_seconds_total", "tick_s")):
        m = re.search(rf"^gossamer_cluster_{name} (\S+)$", text, re.M)
        if m:
            out[key] = float(m.group(1))
    out["keys"] = sum(float(v) for v in
                      re.findall(r"^gossamer_active_keys\{[^}]*\} (\S+)$", text, re.M))
    return out


class Sampler(threading.Thread):
    """Reads every node's round counters and active keys once a second during the load."""

    def __init__(self, ports, t_start, t_end):
        super().__init__(daemon=True)
        self.ports, self.t_start, self.t_end = ports, t_start, t_end
        self.samples = []  # (s into the load, [rounds() per node])
        self.done = threading.Event()

    def run(self):
        k = 0
        while not self.done.is_set():
            at = self.t_start + k
            if at > self.t_end + 0.5:
                break
            if self.done.wait(max(0.0, at - time.monotonic())):
                break
            self.samples.append((time.monotonic() - self.t_start,
                                 [rounds(p) for p in self.ports]))
            k += 1


def timeline(records, samples):
    """Per second of the load: checks sent, denied, and the nodes' rounds in it (summed over
    nodes), mean ms per tick, active keys summed over nodes and rules at its end."""
    out = []
    for (t0, a), (t1, b) in zip(samples, samples[1:]):
        rs = [r for r in records if t0 <= r[7] - r[3] < t1]
        row = {"from_s": round(t0, 2), "to_s": round(t1, 2), "checks": len(rs),
               "denied": sum(1 for r in rs if r[2] == 429)}
        ticks = tick_s = 0.0
        for x, y in zip(a, b):
            for k, v in y.items():
                if k in ("ticks", "tick_s"):
                    continue
                if k == "keys":
                    row["keys"] = row.get("keys", 0) + int(v)
                else:
                    row[k] = row.get(k, 0) + int(v - x.get(k, 0))
            ticks += y.get("ticks", 0) - x.get("ticks", 0)
            tick_s += y.get("tick_s", 0) - x.get("tick_s", 0)
        if ticks:
            row["ms_per_tick"] = round(1000 * tick_s / ticks, 2)
        out.append(row)
    return out


def frozen_flag(port):
    """gossamer_cluster_tree_start_frozen of the node (None if absent or unreachable)."""
    try:
        _, body = get(port, "/metrics", timeout=5)
    except (OSError, http.client.HTTPException):
        return None
    m = re.search(r"^gossamer_cluster_tree_start_frozen (\S+)$", body.decode(), re.M)
    return float(m.group(1)) if m else None


def interesting_metric(line):
    if line.startswith("#"):
        return False
    if "denied_with_room" in line:
        return True
    if re.match(r"gossamer_checks?_", line) and "_bucket" not in line:
        return True
    return bool(re.match(r"gossamer_cluster_(rounds_total|tree_rounds_total|"
                         r"suspected_peers|held_share|members|tree_start_frozen|"
                         r"tree_members|key_visits_total|transport|ticks_total|tick_seconds_total|"
                         r"sent_bytes_total|full_frames_total)", line))


SENT_BYTES = re.compile(r'^gossamer_cluster_sent_bytes_total\{kind="(\w+)"\} (\S+)$')


def traffic_per_check(metrics, checks):
    """Cluster bytes the nodes sent since they started (`gossamer_cluster_sent_bytes_total`,
    summed over the nodes), per check of the load, by message kind; {} without them."""
    by_kind = defaultdict(float)
    for lines in metrics.values():
        for line in lines:
            m = SENT_BYTES.match(line)
            if m:
                by_kind[m.group(1)] += float(m.group(2))
    if not by_kind or not checks:
        return {}
    return {kind: b / checks for kind, b in sorted(by_kind.items()) if b > 0}


# ---------------------------------------------------------------------------- main


def main():
    ap = argparse.ArgumentParser(
        description="Count false 429s (denials a single exact counter would not give) "
                    "of gossamer nodes on loopback under a throttled multi-user load.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--binary", default=DEFAULT_BINARY, help="the gossamer binary")
    ap.add_argument("--nodes", type=int, default=3, help="cluster size")
    ap.add_argument("--standalone", action="store_true",
                    help="one node without --gossip (ignores --nodes and --exchange)")
    ap.add_argument("--separate", action="store_true",
                    help="--nodes nodes, each without --gossip: the same processes and load "
                         "per node as the cluster, with no cluster (a like-for-like latency "
                         "baseline on a shared machine)")
    ap.add_argument("--exchange", choices=("mesh", "tree"), default="mesh",
                    help="[cluster] exchange; tree loads only the fixed-window rule")
    ap.add_argument("--users", type=int, default=5000)
    ap.add_argument("--duration", type=float, default=5.0, help="seconds of load")
    ap.add_argument("--rate", type=float, default=0.0,
                    help="bursts per second in all (3 checks on average each), paced per thread, "
                         "so clusters are compared at the same offered load; 0: as fast as "
                         "the answers come (a closed loop: checks a node holds slow it down)")
    ap.add_argument("--concurrency", type=int, default=16,
                    help="client threads, each with a keep-alive connection per node")
    ap.add_argument("--procs", type=int, default=min(2, os.cpu_count() or 1),
                    help="client processes to spread the threads over (users are split "
                         "between them), for more load than one Python process can offer")
    ap.add_argument("--stress", type=int, default=0,
                    help="busy-loop processes to run during the load")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--ready-timeout", type=float, default=30.0,
                    help="longest to wait for the nodes to be ready and see each other")
    ap.add_argument("--wait-unfrozen", action="store_true",
                    help="tree: also wait (up to 70 s) until no node reports "
                         "gossamer_cluster_tree_start_frozen 1 before the load")
    ap.add_argument("--next-minute", action="store_true",
                    help="start the load 0.5 s into the next wall-clock minute (up to 61 s "
                         "after the nodes are up): the minute windows open at the start are "
                         "behind, so a clustered node is based in the load's window")
    ap.add_argument("--cluster-option", action="append", default=[], metavar="KEY=VALUE",
                    help="add a line to the config's [cluster] table, e.g. round_nice=0 "
                         "(TOML value; repeatable)")
    ap.add_argument("--rules", metavar="A,B",
                    help="only these of the tiers' rules (bucket, fixed, log, counter, hybrid)")
    ap.add_argument("--json", action="store_true", help="print one JSON object instead")
    ap.add_argument("--records", metavar="FILE",
                    help="also write every check to FILE as CSV (sent_s, answered_s, rule, "
                         "node, user, status, latency_ms, retry_after_ms, remaining, outcome)")
    ap.add_argument("--keep", action="store_true", help="keep the temp dir (configs, logs)")
    args = ap.parse_args()

    if min(args.nodes, args.users, args.concurrency, args.procs) < 1 or args.duration <= 0 \
            or args.stress < 0:
        ap.error("--nodes, --users, --concurrency and --procs must be >= 1, --duration > 0, "
                 "--stress >= 0")
    if any("=" not in o for o in args.cluster_option):
        ap.error("--cluster-option takes KEY=VALUE, e.g. round_nice=0")
    if args.procs > args.concurrency or args.procs > args.users:
        ap.error("--procs cannot exceed --concurrency or --users")
    binary = os.path.abspath(args.binary)
    if not os.access(binary, os.X_OK):
        ap.error(f"{binary}: not an executable")

    # Ctrl-C raises KeyboardInterrupt even if SIGINT was ignored when we were started
    # (a background job of a non-interactive shell); SIGTERM and SIGHUP exit cleanly too.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGHUP, on_signal)
    atexit.register(cleanup)

    work = tempfile.mkdtemp(prefix="gossamer-false-denials-")
    if not args.keep:
        atexit.register(shutil.rmtree, work, True)
    try:
        return run(args, binary, work)
    finally:
        cleanup()
        if args.keep:
            log(f"kept {work}")


def run(args, binary, work):
    clustered = not (args.standalone or args.separate)
    n = 1 if args.standalone else args.nodes
    tree = clustered and args.exchange == "tree"
    rules = ["fixed"] if tree else ["bucket", "fixed", "log", "counter", "hybrid"]
    if args.rules:
        rules = [r for r in args.rules.split(",") if r in rules]
        if not rules:
            sys.exit(f"--rules {args.rules}: none of them can run here (tree: fixed only)")

    config = os.path.join(work, "rules.toml")
    with open(config, "w") as f:
        cluster_lines = (['exchange = "tree"'] if tree else []) + [
            f"{k.strip()} = {v.strip()}" for k, v in
            (o.split("=", 1) for o in args.cluster_option)]
        if cluster_lines:
            f.write("[cluster]\n" + "\n".join(cluster_lines) + "\n")
        for r in rules:
            f.write(RULES[r])

    mode = (f"{n} nodes, exchange {args.exchange}" if clustered
            else f"{n} separate standalone nodes" if args.separate else "standalone")
    ports = pick_ports(n, random.Random())  # not seeded: runs back to back differ
    names = [f"node-{i + 1}" for i in range(n)]
    nodes, logs = [], []
    for i, (http_p, gossip) in enumerate(ports):
        argv = [binary, "serve", "--config", config, "--node-id", names[i],
                "--http", f"127.0.0.1:{http_p}"]
        if clustered:
            argv += ["--gossip", f"127.0.0.1:{gossip}", "--seeds", f"127.0.0.1:{ports[0][1]}"]
        path = os.path.join(work, f"{names[i]}.log")
        logs.append(path)
        with open(path, "w") as lf:
            nodes.append(spawn(argv, stdout=lf, stderr=subprocess.STDOUT,
                               stdin=subprocess.DEVNULL))

    http_ports = [p for p, _ in ports]
    t_launch = time.monotonic()
    deadline = t_launch + args.ready_timeout
    while True:
        states = [node_state(p, n if clustered else None) for p in http_ports]
        if all(ready and alive == (n if clustered else 1) for ready, alive in states):
            break
        dead = [names[i] for i, p in enumerate(nodes) if p.poll() is not None]
        if dead or time.monotonic() > deadline:
            why = f"{', '.join(dead)} exited" if dead else \
                f"not ready with {n} alive members within {args.ready_timeout:.0f} s"
            log(f"false_denials: the cluster did not form: {why}; states {states}")
            for i, path in enumerate(logs):
                log(f"--- {names[i]} log (last lines) ---\n{tail(path)}")
            return 2
        time.sleep(0.1)
    formed_s = time.monotonic() - t_launch
    log(f"false_denials: {mode}: ready and all members alive {formed_s:.2f} s after launch")
    frozen_wait_s = None
    if tree and args.wait_unfrozen:
        t0 = time.monotonic()
        while True:
            frozen = [frozen_flag(p) for p in http_ports]
            if all(f == 0 for f in frozen):
                break
            if time.monotonic() - t0 > 70:
                log(f"false_denials: still start-frozen after 70 s: {frozen}")
                return 2
            time.sleep(0.2)
        frozen_wait_s = time.monotonic() - t0
        log(f"false_denials: start freeze over on every node after {frozen_wait_s:.1f} s more")

    minute_wait_s = None
    if args.next_minute:
        # Minute windows start on whole minutes of the Unix clock (window = now / 60 s).
        wait = 60.0 - (time.time() % 60.0) + 0.5
        log(f"false_denials: waiting {wait:.1f} s for the next minute window")
        time.sleep(wait)
        minute_wait_s = wait

    stressors = []
    if args.stress:
        for _ in range(args.stress):
            stressors.append(spawn([sys.executable, "-c", "while True: pass"],
                                   stdin=subprocess.DEVNULL))

    rounds0 = [rounds(p) for p in http_ports] if clustered else []
    cpu0_nodes = [proc_cpu(p.pid) for p in nodes]
    load0 = os.getloadavg()
    wall_start = time.time()
    t_start = time.monotonic()
    t_end = t_start + args.duration
    # Started after any fork below, so no child is forked while it holds a lock.
    sampler = Sampler(http_ports, t_start, t_end)
    # Threads split as evenly as they go over --procs processes (1: this one).
    split = [args.concurrency // args.procs + (j < args.concurrency % args.procs)
             for j in range(args.procs)]
    pace = args.concurrency / args.rate if args.rate > 0 else 0.0
    parts = [(args.seed * 1000 + 100 * j, http_ports, rules, args.users, (j, args.procs),
              split[j], t_start, t_end, pace) for j in range(args.procs)]
    if args.procs == 1:
        sampler.start()
        results = [drive(*parts[0])]
    else:
        ctx = multiprocessing.get_context("fork")
        children = []
        for j in range(args.procs):
            recv, send = ctx.Pipe(duplex=False)
            c = ctx.Process(target=drive_child, args=(send, *parts[j]), daemon=True)
            c.start()
            send.close()
            children.append((c, recv))
        sampler.start()
        results = []
        try:
            for c, recv in children:
                if not recv.poll(max(0.0, t_end - time.monotonic()) + 60):
                    raise RuntimeError("a client process did not report within 60 s of the end")
                got = recv.recv()
                if isinstance(got, Exception):
                    raise got
                results.append(got)
        finally:
            for c, recv in children:
                c.join(timeout=5)
                if c.is_alive():
                    c.kill()
                    c.join(timeout=5)
                recv.close()
    elapsed = time.monotonic() - t_start
    sampler.done.set()
    if sampler.is_alive():
        sampler.join(timeout=15)
    cpu1_nodes = [proc_cpu(p.pid) for p in nodes]
    load1 = os.getloadavg()
    rounds1 = [rounds(p) for p in http_ports] if clustered else []
    stop(stressors)
    exited = [(names[i], p.returncode) for i, p in enumerate(nodes) if p.poll() is not None]
    for name, code in exited:
        log(f"false_denials: {name} exited during the load (code {code}); last lines:\n"
            f"{tail(logs[names.index(name)])}")
    records = [r for res in results for r in res[0]]
    skipped = sum(res[1] for res in results)
    client_cpu = sum(res[2] for res in results)
    hung = sum(res[3] for res in results)

    node_cpu = [b - a if a is not None and b is not None else None
                for a, b in zip(cpu0_nodes, cpu1_nodes)]

    metrics = {}
    for i, p in enumerate(http_ports):
        try:
            status, body = get(p, "/metrics", timeout=5)
            metrics[names[i]] = [l for l in body.decode(errors="replace").splitlines()
                                 if interesting_metric(l)]
        except (OSError, http.client.HTTPException) as e:
            metrics[names[i]] = [f"(no metrics: {e})"]

    if args.records:
        with open(args.records, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["sent_s", "answered_s", "rule", "node", "user", "status", "latency_ms",
                        "retry_after_ms", "remaining", "outcome"])
            for r in sorted(records, key=lambda r: r[7] - r[3]):
                w.writerow([f"{r[7] - r[3]:.6f}", f"{r[7]:.6f}", r[0], names[r[1]], r[8], r[2],
                            f"{r[3] * 1000:.3f}", r[4], r[5], r[6]])
    rows = summarize(records, rules)
    tl = timeline(records, sampler.samples)
    kinds = by_kind(records, classify(records), rules)
    detail = denial_detail(records, names)
    per_node = []
    for i, name in enumerate(names):
        rs = [r for r in records if r[1] == i]
        per_node.append({"node": name, "checks": len(rs),
                         "denied": sum(1 for r in rs if r[2] == 429)})
    others = sorted({str(r[6]) for r in records if r[2] not in (200, 429)})[:10]
    rounds_during = {}
    for i, (a, b) in enumerate(zip(rounds0, rounds1)):
        d = {k: v - a.get(k, 0) for k, v in b.items()}
        r = {k: int(v) for k, v in d.items() if k not in ("ticks", "tick_s", "keys")}
        if d.get("ticks"):
            r["ms_per_tick"] = round(1000 * d.get("tick_s", 0) / d["ticks"], 3)
        rounds_during[names[i]] = r
    load = {
        "began_unix_s": wall_start,
        "checks": len(records), "elapsed_s": elapsed,
        "checks_per_s": len(records) / elapsed if elapsed > 0 else 0.0,
        "bursts_skipped_by_throttle": skipped,
        "client_cpu_cores": client_cpu / elapsed if elapsed > 0 else None,
        "node_cpu_cores": [None if c is None else c / elapsed for c in node_cpu],
        "loadavg_before": load0[0], "loadavg_after": load1[0],
        "hung_threads": hung,
        "rounds_during_load": rounds_during,
        "nodes_exited": [name for name, _ in exited],
    }
    result = {
        "mode": mode, "nodes": n, "exchange": args.exchange if clustered else None,
        "standalone": not clustered, "users": args.users, "duration_s": args.duration,
        "concurrency": args.concurrency, "procs": args.procs,
        "cluster_options": args.cluster_option, "stress": args.stress, "rules": rules,
        "formed_s": formed_s, "start_freeze_waited_s": frozen_wait_s,
        "next_minute_waited_s": minute_wait_s, "load": load,
        "table": rows, "per_node": per_node,
        "denials": detail, "by_kind": kinds, "timeline": tl, "other_errors": others,
        "metrics": metrics,
        "cluster_bytes_per_check": traffic_per_check(metrics, len(records)),
    }

    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(f"gossamer false denials: {mode}; {args.users} users, {args.duration:g} s, "
              f"concurrency {args.concurrency} in {args.procs} process(es), "
              f"stress {args.stress}; rules {', '.join(rules)}")
        if args.cluster_option:
            print("[cluster] " + "; ".join(args.cluster_option))
        print(f"cluster formed (ready, all alive) {formed_s:.2f} s after launch" + (
            "" if frozen_wait_s is None else
            f"; waited {frozen_wait_s:.1f} s more for the tree's start freeze to end")
          + ("" if minute_wait_s is None else
             f"; load from the next minute window, {minute_wait_s:.1f} s later"))
        ncpu = ", ".join("-" if c is None else f"{c:.2f}" for c in load["node_cpu_cores"])
        began = time.strftime("%H:%M:%S", time.gmtime(wall_start)) + \
            f".{int(wall_start * 1000) % 1000:03d}"
        print(f"load from {began} UTC: {load['checks']} checks in {elapsed:.2f} s = "
              f"{load['checks_per_s']:.0f} checks/s; client CPU {load['client_cpu_cores']:.2f} "
              f"cores, nodes' CPU [{ncpu}] cores; loadavg {load0[0]:.2f} -> {load1[0]:.2f}; "
              f"bursts skipped by the throttle: {skipped}")
        if rounds_during:
            print("rounds during the load: " + ", ".join(
                f"{name} " + (" ".join(f"{v} {k}" for k, v in sorted(r.items())
                                       if k != "ms_per_tick") or "(no metrics)")
                + (f" ({r['ms_per_tick']} ms per tick)" if "ms_per_tick" in r else "")
                for name, r in rounds_during.items()))
        print()
        print_table(rows)
        print()
        print("per node: " + ", ".join(f"{p['node']} {p['denied']}/{p['checks']} denied"
                                       for p in per_node))
        per_check = result["cluster_bytes_per_check"]
        if per_check:
            print(f"cluster traffic: {sum(per_check.values()):.0f} B per check, summed over the "
                  "nodes since they started (" + ", ".join(
                      f"{kind} {b:.0f}" for kind, b in per_check.items()) + ")")
        if detail:
            print()
            print("denials (retry_after_ms min/p50/max; remaining min-max; s into the load):")
            for d in detail:
                print(f"  {d['rule']:<8} {d['node']:<7} {d['denied']:>6}  retry_after_ms "
                      f"{d['retry_after_ms_min']}/{d['retry_after_ms_p50']}/"
                      f"{d['retry_after_ms_max']}  remaining {d['remaining_min']}-"
                      f"{d['remaining_max']}  at {d['first_s']:.2f}-{d['last_s']:.2f} s  "
                      f"outcome {','.join(d['outcomes'])}")
        if tl:
            print()
            cols = [c for c in ("consistent", "degraded", "complete", "short")
                    if any(c in row for row in tl)]
            print("per second of the load (rounds summed over the nodes, keys held by all "
                  "nodes at its end):")
            print(f"  {'s':>9} {'checks':>7} {'denied':>7} {'denied%':>8}"
                  + "".join(f" {c:>10}" for c in cols) + f" {'ms/tick':>8} {'keys':>7}")
            for row in tl:
                pc = 100.0 * row["denied"] / row["checks"] if row["checks"] else 0.0
                tick = row.get("ms_per_tick")
                print(f"  {row['from_s']:4.1f}-{row['to_s']:<4.1f} {row['checks']:>7} "
                      f"{row['denied']:>7} {pc:>7.1f}%"
                      + "".join(f" {row.get(c, 0):>10}" for c in cols)
                      + f" {'-' if tick is None else f'{tick:.1f}':>8} {row.get('keys', 0):>7}")
        print()
        print("denied/checks by how new the key was when the check was sent:")
        for n_, w in KINDS:
            print(f"  {n_:<15}{w}")
        print(f"  {'':<15}" + "".join(f"{r:>16}" for r in rules + ["all"]))
        for row in kinds:
            cells = "".join(f"{row[r]['denied']:>7}/{row[r]['checks']:<8}" for r in rules + ["all"])
            print(f"  {row['kind']:<15}{cells}")
        if others:
            print()
            print("other answers: " + "; ".join(others))
        if hung:
            print(f"\n{hung} client threads had not finished 30 s after the end")
        if exited:
            print("\nnodes that exited during the load: " + ", ".join(
                f"{name} (code {code})" for name, code in exited))
        print()
        has_room_metric = any("denied_with_room" in l for ls in metrics.values() for l in ls)
        print("metrics at the end" + ("" if has_room_metric else
              " (this binary has no gossamer_check_denied_with_room_total)") + ":")
        for name, lines in metrics.items():
            print(f"  {name}:")
            for l in lines:
                print(f"    {l}")
    total = rows[-1]
    return 0 if total["denied"] == 0 and total["other"] == 0 and not hung and not exited else 1


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        cleanup()
        sys.exit(130)
