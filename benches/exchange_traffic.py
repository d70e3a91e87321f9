#!/usr/bin/env python3
"""Bytes per node per second of the exchange, full mesh against tree, on real nodes (loopback).

    cargo build --release && python3 benches/exchange_traffic.py [--sizes 3,6,12] [--secs 10]

For each exchange (`mesh`, `tree`) and each cluster size N it starts N release nodes on
loopback (HTTP 17210+i, gossip 17230+2i, QUIC gossip+1), waits until every node's view has N
members, then offers the simulation's scale workload (`gossamer sim --scale N,10`): 10 keys of
a global fixed window (1,000 per second each, far above the load), each checked once a round
(100 ms) at a node drawn at random. Over `--secs` seconds it reads each node's
`gossamer_cluster_transport{what="bytes_sent"}` (QUIC frames: the exchange, not chitchat's
UDP gossip) before and after, and prints the mean and the most any node sent per second, as a
Markdown table. Standard library only; every node is stopped on exit.
"""

import argparse
import http.client
import os
import random
import re
import subprocess
import sys
import tempfile
import threading
import time

BIN = "target/release/gossamer"
RULES = """
[cluster]
exchange = "{exchange}"

[[rule]]
name = "w"
algorithm = "fixed_window"
limit = 1000
period = "1s"
"""


def metric(port, name, labels=""):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    c.request("GET", "/metrics")
    text = c.getresponse().read().decode()
    c.close()
    pattern = re.escape(name) + (r"\{" + re.escape(labels) + r"\}" if labels else "") + r" (\S+)"
    m = re.search(r"^" + pattern + r"$", text, re.M)
    return float(m.group(1)) if m else None


def view_size(port, exchange):
    try:
        if exchange == "tree":
            return metric(port, "gossamer_cluster_tree_members")
        return metric(port, "gossamer_cluster_members", 'state="alive"')
    except OSError:
        return None


def run(exchange, n, secs, work):
    config = os.path.join(work, f"{exchange}.toml")
    with open(config, "w") as f:
        f.write(RULES.format(exchange=exchange))
    procs = []
    ports = [17210 + i for i in range(n)]
    try:
        for i in range(n):
            gossip = 17230 + 2 * i
            log = open(os.path.join(work, f"{exchange}-{n}-{i}.log"), "w")
            procs.append(subprocess.Popen(
                [BIN, "serve", "--config", config, "--node-id", f"node-{i}",
                 "--http", f"127.0.0.1:{ports[i]}", "--gossip", f"127.0.0.1:{gossip}",
                 "--seeds", "127.0.0.1:17230"],
                stdout=log, stderr=subprocess.STDOUT))
        deadline = time.time() + 60
        while not all(view_size(p, exchange) == n for p in ports):
            if time.time() > deadline:
                sys.exit(f"{exchange} x {n}: the cluster did not form in 60 s (logs in {work})")
            time.sleep(0.2)
        stop = threading.Event()
        answered = [0]

        def load():
            conns = {p: http.client.HTTPConnection("127.0.0.1", p, timeout=5) for p in ports}
            rng = random.Random(7)
            next_round = time.time()
            while not stop.is_set():
                for k in range(10):
                    c = conns[rng.choice(ports)]
                    c.request("POST", "/v1/check", body='{"rule":"w","key":"k%d"}' % k)
                    c.getresponse().read()
                    answered[0] += 1
                next_round += 0.1
                time.sleep(max(0.0, next_round - time.time()))

        t = threading.Thread(target=load)
        t.start()
        time.sleep(2)  # every key active at every node's last totals
        before = [metric(p, "gossamer_cluster_transport", 'what="bytes_sent"') for p in ports]
        t0 = time.time()
        time.sleep(secs)
        after = [metric(p, "gossamer_cluster_transport", 'what="bytes_sent"') for p in ports]
        elapsed = time.time() - t0
        stop.set()
        t.join()
        rates = [(a - b) / elapsed for a, b in zip(after, before)]
        return sum(rates) / n, max(rates)
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="3,6,12")
    ap.add_argument("--secs", type=float, default=10)
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    work = tempfile.mkdtemp(prefix="gossamer-exchange-traffic-")
    rows = []
    for n in sizes:
        for exchange in ("mesh", "tree"):
            mean, most = run(exchange, n, args.secs, work)
            print(f"{exchange} x {n}: mean {mean:.0f} B/s, most {most:.0f} B/s", file=sys.stderr)
            rows.append((n, exchange, mean, most))
    print("| nodes | exchange | mean per node | most of any node |")
    print("|---|---|---|---|")
    for n, exchange, mean, most in rows:
        print(f"| {n} | {exchange} | {mean / 1000:.1f} kB/s | {most / 1000:.1f} kB/s |")


if __name__ == "__main__":
    main()
