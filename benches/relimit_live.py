#!/usr/bin/env python3
"""A global limit changed live, node by node, under load (docs/design.md §3.8).

With `--add`, a global rule is added live instead: the files start with `api` alone, a second
global fixed window `new` of 100/s is added to node-1's file at 4.0 s, node-2's at 6.3 s and
node-3's at 8.6 s, and removed from node-2's at 13.2 s; the load checks `new` (a node without
it answers 404, counted apart), and each line says what was admitted, denied and unknown.

Starts three release nodes on loopback as the README's "A cluster" does, each with its own
copy of a rules file holding one global fixed window `api` of 100/s. One key is checked
`--rate` times a second at each node (300: three times the higher limit) for `--duration`
seconds, while each node's file is rewritten in turn, as a ConfigMap reaches the nodes of a
real cluster apart: raised to 300/s at 4.0, 6.3 and 8.6 s, cut back to 100/s at 13.2, 15.5
and 17.8 s (a node reads its file every second). Prints the checks admitted and denied in
each wall-clock second (the window's slots are aligned to the wall clock, so each line is one
window), and what each node's `/v1/cluster` says is in force at the end.

    cargo build --release && python3 benches/relimit_live.py
    BIN=path/to/gossamer python3 benches/relimit_live.py --rate 300 --duration 22

Ports: HTTP 18181-18183, gossip 18110/18120/18130 (each node also takes the port above
for QUIC). Nodes and the temp directory are removed at exit.
"""
import argparse
import collections
import http.client
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time

RULES = '[[rule]]\nname = "api"\nalgorithm = "fixed_window"\nlimit = {}\nperiod = "1s"\n'
EDITS = [(1, 300, 4.0), (2, 300, 6.3), (3, 300, 8.6), (3, 100, 13.2), (1, 100, 15.5), (2, 100, 17.8)]
NEW = '\n[[rule]]\nname = "new"\nalgorithm = "fixed_window"\nlimit = 100\nperiod = "1s"\nscope = "global"\n'
# (node, whether its file has `new`, when): with --add.
ADDS = [(1, True, 4.0), (2, True, 6.3), (3, True, 8.6), (2, False, 13.2)]


def get(port, path, timeout=2):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    c.request("GET", path)
    r = c.getresponse()
    return r.status, r.read()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rate", type=float, default=300, help="checks a second at each node")
    ap.add_argument("--duration", type=float, default=22)
    ap.add_argument("--add", action="store_true", help="add and remove a global rule instead")
    args = ap.parse_args()
    rule = "new" if args.add else "api"
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    binary = os.environ.get("BIN", os.path.join(root, "target", "release", "gossamer"))
    work = tempfile.mkdtemp(prefix="gossamer-relimit-")
    nodes = []
    try:
        for i in (1, 2, 3):
            path = os.path.join(work, f"rules{i}.toml")
            with open(path, "w") as f:
                f.write(RULES.format(100))
            log = open(os.path.join(work, f"node{i}.log"), "w")
            nodes.append(subprocess.Popen(
                [binary, "serve", "--config", path, "--node-id", f"node-{i}",
                 "--http", f"127.0.0.1:1818{i}", "--gossip", f"127.0.0.1:181{i}0",
                 "--seeds", "127.0.0.1:18110"],
                stdout=subprocess.DEVNULL, stderr=log))
        deadline = time.time() + 30
        while True:
            try:
                views = [json.loads(get(18180 + i, "/v1/cluster")[1]) for i in (1, 2, 3)]
                ready = [get(18180 + i, "/readyz")[0] for i in (1, 2, 3)]
                if ready == [200] * 3 and all(
                        sum(m["alive"] for m in v["members"]) == 3 for v in views):
                    break
            except OSError:
                pass
            if time.time() > deadline:
                sys.exit("the cluster did not form within 30 s")
            time.sleep(0.2)
        # Start on a whole second, so the edits fall at the same points of the windows.
        time.sleep(1 - time.time() % 1)
        t0 = time.time()
        seen = collections.Counter()
        lock = threading.Lock()

        def load(port):
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            n = 0
            while time.time() - t0 < args.duration:
                wait = t0 + n / args.rate - time.time()
                if wait > 0:
                    time.sleep(wait)
                n += 1
                c.request("POST", "/v1/check", '{"rule":"%s","key":"k"}' % rule,
                          {"Content-Type": "application/json"})
                r = c.getresponse()
                r.read()
                with lock:
                    seen[(int(time.time() - t0), r.status)] += 1

        def edit(i, limit, at):
            time.sleep(max(0.0, t0 + at - time.time()))
            path = os.path.join(work, f"rules{i}.toml")
            with open(path + ".tmp", "w") as f:
                if args.add:
                    f.write(RULES.format(100) + (NEW if limit else ""))
                else:
                    f.write(RULES.format(limit))
            os.rename(path + ".tmp", path)
            what = ("has `new`" if limit else "lacks `new`") if args.add else f"limit = {limit}"
            print(f"t={time.time() - t0:5.1f} s  node-{i}'s file: {what}", flush=True)

        threads = [threading.Thread(target=load, args=(18180 + i,)) for i in (1, 2, 3)]
        threads += [threading.Thread(target=edit, args=e) for e in (ADDS if args.add else EDITS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        print("\n| second | admitted | denied | no such rule (404) |\n|---:|---:|---:|---:|")
        for s in sorted({s for s, _ in seen}):
            print(f"| {s} | {seen[(s, 200)]} | {seen[(s, 429)]} | {seen[(s, 404)]} |")
        for i in (1, 2, 3):
            v = json.loads(get(18180 + i, "/v1/cluster")[1])
            print(f"node-{i}: limits_in_force {v.get('limits_in_force')}")
    finally:
        for p in nodes:
            p.terminate()
        for p in nodes:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
