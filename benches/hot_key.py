#!/usr/bin/env python3
"""A hot key busy at other nodes: does each node get its share of the room every round?

What it measures
----------------
It starts gossamer nodes on loopback as the README's "A cluster" section does (the helpers of
`benches/false_denials.py`), with one global rule, `--algorithm` (default `fixed_window`) of
`--limit` (100) per second, and sends one key `--load` times its limit (1.5) for
`--duration` seconds (6), paced evenly, each check to a node drawn by `--split`
(default `80,10,10`: 80% to node 1). Every answer is recorded with the client's send time
(the nodes share the machine's clock).

Then it judges every check by the invariant of design.md §3.3.3, on the counts the client
saw, which are the true ones, since every check goes through it. With C' = C − ⌊C/20⌋, a
check of the key at node i, in round r (100 ms rounds on the clock), *must* be admitted when

    count + 1 ≤ C'   and   N · (own + 1) ≤ C' − count

where `count` is what the cluster admitted of the key in the fixed window so far and `own`
is what node i admitted in round r. It prints how many checks the invariant covered, how many
of those were denied (false 429s), the admitted count per window against the limit, and
the p50/p99 latency. (`--algorithm` other than `fixed_window` still sends the same load, but
only a fixed window is judged, since `count` is a fixed window's.)

How to run
----------
    cargo build --release
    python3 benches/hot_key.py                    # 3 nodes, 80/10/10
    python3 benches/hot_key.py --split 60,10,10,10,10
    python3 benches/hot_key.py --standalone       # one node, no cluster: the baseline
    python3 benches/hot_key.py --separate         # 3 nodes, each without --gossip: the
                                                  # latency baseline on a shared machine
"""

import argparse
import http.client
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import false_denials as fd  # noqa: E402

ROUND_NS = 100_000_000
SECOND_NS = 1_000_000_000


def judge(records, limit, nodes):
    """(must admit, of which denied, per-window admitted) over `records` of
    (t_ns, node, allowed), in send order."""
    room = limit - limit // 20
    counts = {}  # window -> admitted
    own = {}  # (node, round) -> admitted
    must = denied = 0
    for t, node, allowed in records:
        w, r = t // SECOND_NS, t // ROUND_NS
        count = counts.get(w, 0)
        mine = own.get((node, r), 0)
        if count + 1 <= room and nodes * (mine + 1) <= room - count:
            must += 1
            denied += not allowed
        if allowed:
            counts[w] = count + 1
            own[(node, r)] = mine + 1
    return must, denied, counts


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--binary", default=os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "..", "target", "release", "gossamer"))
    ap.add_argument("--standalone", action="store_true", help="one node without --gossip")
    ap.add_argument("--separate", action="store_true",
                    help="as many nodes as --split has, each without --gossip and with its own "
                         "limit: the same processes and load as the cluster with no cluster, a "
                         "like-for-like latency baseline where the nodes share a machine's cores "
                         "(the invariant is not judged)")
    ap.add_argument("--split", default="80,10,10",
                    help="per cent of the checks per node (its length is the cluster size)")
    ap.add_argument("--algorithm", default="fixed_window")
    ap.add_argument("--limit", type=int, default=100, help="per second")
    ap.add_argument("--load", type=float, default=1.5, help="times the limit")
    ap.add_argument("--duration", type=float, default=6.0)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--ready-timeout", type=float, default=30.0)
    args = ap.parse_args()
    split = [1.0] if args.standalone else [float(x) for x in args.split.split(",")]
    n = len(split)
    signal.signal(signal.SIGTERM, fd.on_signal)
    with tempfile.TemporaryDirectory(prefix="gossamer-hot-") as work:
        try:
            return run(args, os.path.abspath(args.binary), work, split, n)
        finally:
            fd.cleanup()


def run(args, binary, work, split, n):
    config = os.path.join(work, "rules.toml")
    with open(config, "w") as f:
        f.write(f'[[rule]]\nname = "hot"\nalgorithm = "{args.algorithm}"\n'
                f'limit = {args.limit}\nperiod = "1s"\n')
    ports = fd.pick_ports(n, random.Random())
    procs, logs = [], []
    for i, (http_p, gossip) in enumerate(ports):
        argv = [binary, "serve", "--config", config, "--node-id", f"node-{i + 1}",
                "--http", f"127.0.0.1:{http_p}"]
        if not (args.standalone or args.separate):
            argv += ["--gossip", f"127.0.0.1:{gossip}", "--seeds", f"127.0.0.1:{ports[0][1]}"]
        path = os.path.join(work, f"node-{i + 1}.log")
        logs.append(path)
        with open(path, "w") as lf:
            procs.append(fd.spawn(argv, stdout=lf, stderr=subprocess.STDOUT,
                                  stdin=subprocess.DEVNULL))
    http_ports = [p for p, _ in ports]
    deadline = time.monotonic() + args.ready_timeout
    while True:
        alone = args.standalone or args.separate
        states = [fd.node_state(p, None if alone else n) for p in http_ports]
        if all(ready and alive == (1 if alone else n) for ready, alive in states):
            break
        if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
            fd.log(f"hot_key: the cluster did not form: {states}")
            for path in logs:
                fd.log(fd.tail(path))
            return 2
        time.sleep(0.1)
    # Past the windows the cluster started in: a key's first window is then like any other.
    time.sleep(2.0 - time.time() % 1.0)
    conns = [http.client.HTTPConnection("127.0.0.1", p, timeout=5) for p in http_ports]
    rng = random.Random(args.seed)
    rate = args.limit * args.load
    records, latencies = [], []
    start = time.time()
    sent = 0
    while True:
        due = start + sent / rate
        if due >= start + args.duration:
            break
        pause = due - time.time()
        if pause > 0:
            time.sleep(pause)
        node = rng.choices(range(n), weights=split)[0]
        body = json.dumps({"rule": "hot", "key": "k", "cost": 1})
        t0 = time.time_ns()
        conns[node].request("POST", "/v1/check", body, {"Content-Type": "application/json"})
        resp = conns[node].getresponse()
        resp.read()
        latencies.append((time.time_ns() - t0) / 1e6)
        if resp.status not in (200, 429):
            fd.log(f"hot_key: unexpected HTTP {resp.status}")
            return 1
        records.append((t0, node, resp.status == 200))
        sent += 1
    latencies.sort()
    latency = f"latency p50 {fd.pct(latencies, 50):.2f} ms, p99 {fd.pct(latencies, 99):.2f} ms"
    if args.separate:
        print(f"hot_key: {n} separate standalone nodes, split {args.split}, {args.algorithm} "
              f"{args.limit}/s each: {len(records)} checks; {latency}")
        return 0
    waits = 0
    for p in http_ports:
        status, body = fd.get(p, "/metrics")
        for line in body.decode().splitlines():
            if line.startswith("gossamer_check_lease_waits_total "):
                waits += int(float(line.split()[1]))
    latency += f"; {waits} checks held for a lease (gossamer_check_lease_waits_total)"
    must, denied, counts = judge(records, args.limit, n)
    windows = [counts.get(w, 0) for w in sorted({t // SECOND_NS for t, _, _ in records})]
    mode = "standalone" if args.standalone else f"{n} nodes, split {args.split}"
    print(f"hot_key: {mode}, {args.algorithm} {args.limit}/s at {args.load}x: "
          f"{len(records)} checks, {must} the invariant covers, {denied} of those denied "
          f"({100.0 * denied / max(must, 1):.1f}%); admitted per window {windows}; {latency}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
