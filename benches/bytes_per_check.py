#!/usr/bin/env python3
"""Cluster bytes per check: what the exchange sends for each check, by message kind.

    cargo build --release
    python3 benches/bytes_per_check.py [--nodes 3] [--users 100,5000,50000] [--rate 250]
                                       [--secs 10] [--exchange mesh|tree|both] [--settled]

The workload of the issue "Cluster traffic that follows what changed": N release nodes on
loopback (HTTP 17250+i, gossip 17270+2i, QUIC gossip+1, started as the README's "A cluster"
section does), one global rule `fixed` (fixed window, 60 per minute, the per-user tier both
exchanges run), and `--users` users spread evenly over the nodes (user u always goes to node
u mod N). One client thread per node sends one check per request (`POST /v1/check`, a user
drawn at random) on a keep-alive connection, paced so that the cluster gets `--rate` checks a
second in all. After 2 s of warm-up it reads every node's `/metrics` and again `--secs`
seconds later, and prints, per number of users, the checks a second, what each node sent a
second (`gossamer_cluster_sent_bytes_total`, all kinds: QUIC frames handed to peers, not
chitchat's UDP gossip) and the bytes per check summed over the nodes, in all and for round
frames (the mesh's `round`; the tree's `tree_up` and `tree_down`) and anti-entropy (`digest`,
`repair`). Denied checks are counted too (with few users some go over 60 a minute; they are
checks all the same). Standard library only; every node is stopped on exit.
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
name = "fixed"
algorithm = "fixed_window"
limit = 60
period = "1m"
"""
KINDS = ("hello", "round", "digest", "repair", "tree_up", "tree_down", "tree_handoff",
         "tree_carried")


def scrape(port):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    c.request("GET", "/metrics")
    text = c.getresponse().read().decode()
    c.close()
    return text


def value(text, name, labels=""):
    pattern = re.escape(name) + (r"\{" + re.escape(labels) + r"\}" if labels else "") + r" (\S+)"
    m = re.search(r"^" + pattern + r"$", text, re.M)
    return float(m.group(1)) if m else 0.0


def sample(ports):
    """Per node: bytes sent by kind, checks answered, checks denied."""
    out = []
    for p in ports:
        text = scrape(p)
        sent = {k: value(text, "gossamer_cluster_sent_bytes_total", f'kind="{k}"') for k in KINDS}
        checks = sum(value(text, "gossamer_checks_total", f'rule="fixed",outcome="{o}"')
                     for o in ("allowed", "denied", "never", "store_full"))
        denied = value(text, "gossamer_checks_total", 'rule="fixed",outcome="denied"')
        out.append((sent, checks, denied))
    return out


def formed(ports, n, exchange):
    try:
        for p in ports:
            text = scrape(p)
            size = (value(text, "gossamer_cluster_tree_members") if exchange == "tree"
                    else value(text, "gossamer_cluster_members", 'state="alive"'))
            if size != n:
                return False
        return True
    except OSError:
        return False


def run(exchange, n, users, rate, secs, work, settled=False):
    config = os.path.join(work, f"{exchange}.toml")
    with open(config, "w") as f:
        f.write(RULES.format(exchange=exchange))
    ports = [17250 + i for i in range(n)]
    procs = []
    try:
        for i in range(n):
            gossip = 17270 + 2 * i
            log = open(os.path.join(work, f"{exchange}-{users}-{i}.log"), "w")
            procs.append(subprocess.Popen(
                [BIN, "serve", "--config", config, "--node-id", f"node-{i}",
                 "--http", f"127.0.0.1:{ports[i]}", "--gossip", f"127.0.0.1:{gossip}",
                 "--seeds", "127.0.0.1:17270"],
                stdout=log, stderr=subprocess.STDOUT))
        deadline = time.time() + 60
        while not formed(ports, n, exchange):
            if time.time() > deadline:
                sys.exit(f"{exchange}: the cluster did not form in 60 s (logs in {work})")
            time.sleep(0.2)
        if settled:
            # A window every node is based in, with the view settled: the first minute that
            # starts at least 12 s after the cluster formed (digests go out for 10 s after
            # the view changes), half a second in.
            start = (int((time.time() + 12) // 60) + 1) * 60 + 0.5
            time.sleep(max(0.0, start - time.time()))
        stop = threading.Event()

        def load(i):
            c = http.client.HTTPConnection("127.0.0.1", ports[i], timeout=5)
            rng = random.Random(i)
            mine = range(i, users, n)
            gap = n / rate
            due = time.time()
            while not stop.is_set():
                body = '{"rule":"fixed","key":"user-%d"}' % rng.choice(mine)
                c.request("POST", "/v1/check", body=body)
                c.getresponse().read()
                # Paced, without bursts to catch up after a slow answer.
                due = max(due + gap, time.time() - gap)
                time.sleep(max(0.0, due - time.time()))

        threads = [threading.Thread(target=load, args=(i,)) for i in range(n)]
        for t in threads:
            t.start()
        time.sleep(2)
        before = sample(ports)
        t0 = time.time()
        time.sleep(secs)
        after = sample(ports)
        elapsed = time.time() - t0
        stop.set()
        for t in threads:
            t.join()
        sent = {k: sum(a[0][k] - b[0][k] for a, b in zip(after, before)) for k in KINDS}
        checks = sum(a[1] - b[1] for a, b in zip(after, before))
        denied = sum(a[2] - b[2] for a, b in zip(after, before))
        return sent, checks, denied, elapsed
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
    ap.add_argument("--nodes", type=int, default=3)
    ap.add_argument("--users", default="100,5000,50000")
    ap.add_argument("--rate", type=float, default=250.0, help="checks a second, in all")
    ap.add_argument("--secs", type=float, default=10)
    ap.add_argument("--exchange", choices=("mesh", "tree", "both"), default="both")
    ap.add_argument("--settled", action="store_true",
                    help="start the load in the first minute window that opens at least 12 s "
                    "after the cluster formed (every node based, the view settled), "
                    "not at once")
    args = ap.parse_args()
    exchanges = ("mesh", "tree") if args.exchange == "both" else (args.exchange,)
    work = tempfile.mkdtemp(prefix="gossamer-bytes-per-check-")
    rows = []
    for exchange in exchanges:
        for users in (int(u) for u in args.users.split(",")):
            sent, checks, denied, elapsed = run(exchange, args.nodes, users, args.rate,
                                                args.secs, work, args.settled)
            total = sum(sent.values())
            per = lambda b: b / checks if checks else float("nan")  # noqa: E731
            rounds = sent["round"] + sent["tree_up"] + sent["tree_down"]
            entropy = sent["digest"] + sent["repair"]
            row = (exchange, users, checks / elapsed, denied, total / elapsed / args.nodes,
                   per(total), per(rounds), per(entropy))
            print(f"{exchange}, {users} users: {row}", file=sys.stderr)
            rows.append(row)
    print(f"| exchange | users | checks/s | denied | sent per node per s | bytes per check "
          f"(all {args.nodes} nodes) | of which rounds | of which anti-entropy |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for exchange, users, cps, denied, node_rate, all_b, round_b, ae_b in rows:
        print(f"| {exchange} | {users:,} | {cps:.0f} | {denied:.0f} | {node_rate / 1000:.1f} kB "
              f"| {all_b:,.0f} B | {round_b:,.0f} B | {ae_b:,.0f} B |")


if __name__ == "__main__":
    main()
