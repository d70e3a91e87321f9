#!/usr/bin/env python3
"""A cluster's first seconds: new keys at the nodes that joined a node started alone.

What it measures
----------------
Each *start* launches release nodes on loopback as the README's "A cluster" section does:
node-1 first, with itself as its seed (a cluster of one), and `--delay` seconds later
node-2 .. node-N with node-1 as their seed. Once every node's `/readyz` is 200 it sends, for
`--duration` seconds, checks of keys never seen before (`cost` 1) to each later node: in turn
one on a global sliding log of 60/min and one on a global fixed window of 60/min at every
later node, one after the other over one keep-alive connection per node, then a pause of
`--pause-ms` (10 ms). No key comes near its limit, so a
single exact counter admits every one at once: each 429 is a false denial, and each check
over 10 ms waited on the cluster (or on the machine).

The slots a node is *based* in (docs/design.md §3.3.1) depend on when each node's first era
began against the slots' edges (a sliding log of a minute counts in sub-slots of 3.75 s), so
starts differ: `--starts` repeats the whole thing with fresh nodes.

How to run
----------
    cargo build --release
    python3 benches/first_seconds.py                 # 20 starts of 3 nodes, 0.3 s apart
    python3 benches/first_seconds.py --starts 5 --nodes 5 --delay 1

It prints one line per start (checks, denied, over 10 ms, per node and rule) and a total.
"""

import argparse
import http.client
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_BINARY = os.path.join(HERE, "..", "target", "release", "gossamer")
RULES = """
[[rule]]
name = "log"
algorithm = "sliding_window_log"
limit = 60
period = "1m"

[[rule]]
name = "fixed"
algorithm = "fixed_window"
limit = 60
period = "1m"
"""


def free_ports(count):
    """`count` consecutive ports, free for TCP and UDP, below the ephemeral range (an outgoing
    connection's port would collide)."""
    import random
    import socket
    for _ in range(200):
        base = random.randrange(20000, 32000 - count)
        socks = []
        try:
            for p in range(base, base + count):
                for kind in (socket.SOCK_STREAM, socket.SOCK_DGRAM):
                    s = socket.socket(socket.AF_INET, kind)
                    socks.append(s)
                    s.bind(("127.0.0.1", p))
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise SystemExit("no free ports")


class Node:
    """A node on ports P (HTTP), P + 1 (gossip) and P + 2 (QUIC, the gossip port + 1)."""

    def __init__(self, binary, config, work, name, seed_gossip):
        base = free_ports(3)
        self.http, self.gossip = base, base + 1
        argv = [binary, "serve", "--config", config, "--node-id", name,
                "--http", f"127.0.0.1:{self.http}", "--gossip", f"127.0.0.1:{self.gossip}",
                "--seeds", f"127.0.0.1:{seed_gossip or self.gossip}"]
        self.log = open(os.path.join(work, f"{name}.log"), "w")
        self.proc = subprocess.Popen(argv, stdout=self.log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL)
        self.conn = None

    def request(self, method, path, body=None):
        if self.conn is None:
            self.conn = http.client.HTTPConnection("127.0.0.1", self.http, timeout=5)
        try:
            self.conn.request(method, path, body=json.dumps(body) if body else None,
                              headers={"content-type": "application/json"})
            r = self.conn.getresponse()
            return r.status, r.read()
        except (OSError, http.client.HTTPException):
            self.conn.close()
            self.conn = None
            raise

    def ready(self):
        try:
            return self.request("GET", "/readyz")[0] == 200
        except (OSError, http.client.HTTPException):
            return False

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


def one_start(args, start):
    work = tempfile.mkdtemp(prefix="gossamer-first-seconds-")
    config = os.path.join(work, "rules.toml")
    with open(config, "w") as f:
        f.write(RULES)
    nodes = []
    try:
        nodes.append(Node(args.binary, config, work, "node-1", None))
        time.sleep(args.delay)
        for i in range(2, args.nodes + 1):
            nodes.append(Node(args.binary, config, work, f"node-{i}", nodes[0].gossip))
        deadline = time.monotonic() + 30
        while not all(n.ready() for n in nodes):
            if time.monotonic() > deadline:
                raise SystemExit(f"start {start}: not every node ready within 30 s ({work})")
            time.sleep(0.02)
        stats = {}  # (node, rule) -> [checks, denied, slow]
        end = time.monotonic() + args.duration
        n = 0
        while time.monotonic() < end:
            for i, node in enumerate(nodes[1:], start=2):
                for rule in ("log", "fixed"):
                    n += 1
                    t = time.monotonic()
                    status, body = node.request(
                        "POST", "/v1/check", {"rule": rule, "key": f"s{start}k{n}", "cost": 1})
                    ms = (time.monotonic() - t) * 1000
                    s = stats.setdefault((i, rule), [0, 0, 0])
                    s[0] += 1
                    answer = json.loads(body)
                    if status == 429 or not answer.get("allowed", False):
                        s[1] += 1
                        if args.verbose:
                            print(f"  denied {time.monotonic() - end + args.duration:.3f} s in: "
                                  f"node-{i} {rule} after {ms:.1f} ms: {answer}", flush=True)
                    elif ms > 10:
                        s[2] += 1
            time.sleep(args.pause_ms / 1000)
        return stats
    finally:
        for node in nodes:
            node.stop()
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--binary", default=DEFAULT_BINARY)
    ap.add_argument("--nodes", type=int, default=3)
    ap.add_argument("--delay", type=float, default=0.3,
                    help="seconds between node-1 and the others")
    ap.add_argument("--duration", type=float, default=6.0, help="seconds of checks per start")
    ap.add_argument("--starts", type=int, default=20)
    ap.add_argument("--pause-ms", type=float, default=10.0,
                    help="pause after each check of every later node on both rules")
    ap.add_argument("--keep", action="store_true", help="keep each start's logs")
    ap.add_argument("--verbose", action="store_true", help="print every denial")
    args = ap.parse_args()
    if not os.path.exists(args.binary):
        sys.exit(f"no binary at {args.binary}: cargo build --release")
    total = [0, 0, 0]
    refused_starts = 0
    for start in range(1, args.starts + 1):
        stats = one_start(args, start)
        parts = []
        for (node, rule), (checks, denied, slow) in sorted(stats.items()):
            parts.append(f"node-{node} {rule}: {checks} checks, {denied} denied, {slow} over 10 ms")
            total[0] += checks
            total[1] += denied
            total[2] += slow
        refused_starts += any(s[1] for s in stats.values())
        print(f"start {start:>2}: " + "; ".join(parts), flush=True)
    print(f"total: {total[0]} checks, {total[1]} denied, {total[2]} over 10 ms; "
          f"{refused_starts} of {args.starts} starts refused a check")


if __name__ == "__main__":
    main()
