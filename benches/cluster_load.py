#!/usr/bin/env python3
"""Load generator and figure keeper for benches/cluster_figures.sh (python3 standard library only).

Subcommands (each appends JSON lines to --out, one per figure; `report` turns them into Markdown):

  wait-cluster --http P1,P2,..          until every node's /v1/cluster lists all N members alive
  scenario --http P1,.. --pattern uniform|skew|rotate --label L --key-prefix K [--rate 200]
                                       run `tb` and `win` together for one aligned 10 s window
  heal --http P1,P2,P3 --cut-ports G,Q --runs 3 --key-prefix K
                                       cut the last node off with nftables for 3 s while loading
                                       `win`, heal, time until every node reports the same remaining
  traffic --http P1,.. --secs 20 --label L
                                       bytes_sent / frames_sent per node per second from /metrics
  report --out FILE                     print the Markdown tables

Arrivals: a scenario offers RATE checks per second per rule, evenly spaced in time, each given
to a node drawn at random (seeded) with the pattern's weights at that moment:
  uniform  1/N each
  skew     80% to node 1, the rest split evenly (80/10/10, 80/5/5/5/5)
  rotate   80% to one node, the hot node moving to the next every 2 s, the rest split evenly
Every node has one sender thread per rule with its own keep-alive connection; it sends each of
its arrivals at its scheduled time (or as soon as it can, if behind) and records the wall-clock
time just before sending. Those recorded times are the arrivals fed to the ideal limiter:

  win (fixed_window 1000 per 10 s): a central window admits min(arrivals, 1000) per epoch-
       aligned 10 s window. The run is aligned to start at a 10 s boundary (first arrival
       20 ms after it, last 20 ms before the next), so it covers exactly one window.
  tb  (token_bucket 100/s, burst 100): the arrivals replayed through an exact bucket that
       starts full (a fresh key).
"""

import argparse
import http.client
import json
import math
import random
import statistics
import subprocess
import sys
import threading
import time

NFT_TABLE = "gossamer_figures"

RULES = {
    # name: (kind, limit, period_s, burst)
    "tb": ("bucket", 100, 1.0, 100),
    "win": ("window", 1000, 10.0, None),
}


def ports(s):
    return [int(p) for p in s.split(",") if p]


def emit(out, rec):
    with open(out, "a") as f:
        f.write(json.dumps(rec) + "\n")


def get_json(port, path, timeout=2.0):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        c.request("GET", path)
        r = c.getresponse()
        return r.status, json.loads(r.read() or b"null")
    finally:
        c.close()


# ---------------------------------------------------------------------------------------------
# wait-cluster


def cmd_wait_cluster(a):
    hp = ports(a.http)
    deadline = time.time() + a.timeout
    while time.time() < deadline:
        ok = True
        for p in hp:
            try:
                _, body = get_json(p, "/v1/cluster")
                alive = [m for m in body.get("members", []) if m.get("alive")]
                if len(alive) < len(hp):
                    ok = False
            except Exception:
                ok = False
        if ok:
            return 0
        time.sleep(0.2)
    print("cluster did not form within %.0f s" % a.timeout, file=sys.stderr)
    return 1


# ---------------------------------------------------------------------------------------------
# load


def weights(pattern, n, t_rel):
    if pattern == "uniform":
        return [1.0 / n] * n
    if pattern == "skew":
        hot = 0
    elif pattern == "rotate":
        hot = int(t_rel // 2.0) % n
    else:
        raise SystemExit("unknown pattern " + pattern)
    w = [0.2 / (n - 1)] * n
    w[hot] = 0.8
    return w


class Sender(threading.Thread):
    """Sends one node's arrivals for one rule over a keep-alive connection."""

    def __init__(self, port, rule, key, times):
        super().__init__(daemon=True)
        self.port, self.rule, self.key, self.times = port, rule, key, times
        self.results = []  # (sent_ts, allowed, remaining)
        self.errors = 0
        self.late = 0.0  # worst lateness behind schedule, seconds

    def run(self):
        body = json.dumps({"rule": self.rule, "key": self.key, "cost": 1})
        hdr = {"content-type": "application/json"}
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=5)
        for due in self.times:
            d = due - time.time()
            if d > 0:
                time.sleep(d)
            else:
                self.late = max(self.late, -d)
            ts = time.time()
            try:
                c.request("POST", "/v1/check", body, hdr)
                r = c.getresponse()
                data = json.loads(r.read())
                self.results.append((ts, bool(data.get("allowed")), data.get("remaining")))
            except Exception:
                self.errors += 1
                c.close()
                c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=5)
        c.close()


def schedule(pattern, n, rate, start, secs, rng):
    """Evenly spaced arrivals over [start, start+secs), each assigned to a node by weight."""
    count = int(round(rate * secs))
    step = secs / count
    per_node = [[] for _ in range(n)]
    for k in range(count):
        t_rel = (k + 0.5) * step
        w = weights(pattern, n, t_rel)
        i = rng.choices(range(n), weights=w)[0]
        per_node[i].append(start + t_rel)
    return per_node


def next_boundary(period, margin):
    now = time.time()
    b = math.ceil(now / period) * period
    if b - now < margin:
        b += period
    return b


# ---------------------------------------------------------------------------------------------
# ideal limiters and bounds


def ideal_window(ts, limit, period):
    per = {}
    for t in ts:
        w = int(t // period)
        per[w] = per.get(w, 0) + 1
    return sum(min(c, limit) for c in per.values())


def ideal_bucket(ts, rate, burst):
    tokens, last, admitted = float(burst), None, 0
    for t in sorted(ts):
        if last is not None:
            tokens = min(float(burst), tokens + (t - last) * rate)
        last = t
        if tokens >= 1.0:
            tokens -= 1.0
            admitted += 1
    return admitted


def ideal_bucket_times(ts, rate, burst):
    tokens, last, out = float(burst), None, []
    for t in sorted(ts):
        if last is not None:
            tokens = min(float(burst), tokens + (t - last) * rate)
        last = t
        if tokens >= 1.0:
            tokens -= 1.0
            out.append(t)
    return out


def worst_per_window(adm_ts, period):
    per = {}
    for t in adm_ts:
        w = int(t // period)
        per[w] = per.get(w, 0) + 1
    return max(per.values()) if per else 0


def bucket_excess(adm_ts, rate, burst):
    """max over intervals [a_i, a_j] of (admissions in it) - (burst + rate * length).

    A central bucket keeps this <= 0: it is the over-admission above the bucket's envelope."""
    best_i = -math.inf
    worst = -math.inf
    for j, t in enumerate(sorted(adm_ts)):
        best_i = max(best_i, rate * t - j)  # i = j allowed
        worst = max(worst, (j + 1) - rate * t + best_i - burst)
    return worst if worst > -math.inf else 0.0


def cmd_scenario(a):
    hp = ports(a.http)
    n = len(hp)
    rules = a.rules.split(",")
    rng = random.Random(a.seed)
    start = next_boundary(10.0, 1.0)
    # First arrival 20 ms after the boundary, last 20 ms before the next: one window exactly.
    t0, secs = start + 0.02, 10.0 - 0.04
    senders = []
    for rule in rules:
        key = "%s-%s" % (a.key_prefix, rule)
        plan = schedule(a.pattern, n, a.rate * 10.0 / secs, t0, secs, rng)
        for i, p in enumerate(hp):
            senders.append((rule, i, Sender(p, rule, key, plan[i])))
    time.sleep(max(0.0, start - 0.5 - time.time()))
    m1 = [metrics(p) for p in hp]
    for _, _, s in senders:
        s.start()
    for _, _, s in senders:
        s.join()
    m2 = [metrics(p) for p in hp]
    cons = sum(y.get("rounds_consistent", 0) - x.get("rounds_consistent", 0) for x, y in zip(m1, m2))
    degr = sum(y.get("rounds_degraded", 0) - x.get("rounds_degraded", 0) for x, y in zip(m1, m2))
    degraded_pct = 100.0 * degr / (cons + degr) if cons + degr else 0.0
    for rule in rules:
        kind, limit, period, burst = RULES[rule]
        mine = [s for r, _, s in senders if r == rule]
        arrivals = sorted(ts for s in mine for ts, _, _ in s.results)
        adm = sorted(ts for s in mine for ts, ok, _ in s.results if ok)
        per_node = [sum(1 for _, ok, _ in s.results if ok) for s in mine]
        offered_node = [len(s.results) for s in mine]
        if kind == "window":
            ideal = ideal_window(arrivals, limit, period)
            worst = worst_per_window(adm, period)
            ideal_worst = worst_per_window(arrivals, period) and min(limit, worst_per_window(arrivals, period))
            excess = None
            steady = None
            windows = len({int(t // period) for t in arrivals})
        else:
            ideal_ts = ideal_bucket_times(arrivals, limit / period, burst)
            ideal = len(ideal_ts)
            worst = worst_per_window(adm, 1.0)
            ideal_worst = worst_per_window(ideal_ts, 1.0)
            excess = bucket_excess(adm, limit / period, burst)
            windows = None
            # After the first 2 s both the cluster and the central bucket run at the refill
            # rate: this error leaves out the fresh key's initial burst.
            cut = t0 + 2.0
            late_adm = sum(1 for t in adm if t >= cut)
            late_ideal = sum(1 for t in ideal_ts if t >= cut)
            steady = 100.0 * (late_adm - late_ideal) / late_ideal if late_ideal else 0.0
        rec = {
            "type": "scenario", "label": a.label, "n": n, "rule": rule,
            "offered": len(arrivals), "admitted": len(adm), "ideal": ideal,
            "error_pct": 100.0 * (len(adm) - ideal) / ideal if ideal else 0.0,
            "steady_error_pct": steady, "degraded_rounds_pct": round(degraded_pct, 1),
            "worst_window": worst, "ideal_worst_window": ideal_worst,
            "bucket_excess": excess, "windows": windows,
            "per_node_admitted": per_node, "per_node_offered": offered_node,
            "errors": sum(s.errors for s in mine),
            "max_late_ms": round(1000 * max(s.late for s in mine), 1),
        }
        emit(a.out, rec)
        print(json.dumps(rec), file=sys.stderr)
    return 0


# ---------------------------------------------------------------------------------------------
# partition heal


def nft(script):
    subprocess.run(["nft", "-f", "-"], input=script.encode(), check=True)


def nft_delete():
    subprocess.run(["nft", "delete", "table", "inet", NFT_TABLE],
                   stderr=subprocess.DEVNULL, check=False)


def cut_script(cut_ports):
    ps = ", ".join(str(p) for p in cut_ports)
    return ("table inet %s {\n chain input { type filter hook input priority 0; policy accept;\n"
            "  udp dport { %s } drop\n  udp sport { %s } drop\n }\n}\n") % (NFT_TABLE, ps, ps)


def status_all(conns, key):
    out = []
    for c in conns:
        c.request("GET", "/v1/status?rule=win&key=" + key)
        out.append(json.loads(c.getresponse().read()).get("remaining"))
    return out


def cmd_heal(a):
    hp = ports(a.http)
    cut_ports = ports(a.cut_ports)
    for run in range(1, a.runs + 1):
        key = "%s-%d" % (a.key_prefix, run)
        rng = random.Random(a.seed + run)
        b = next_boundary(10.0, 1.0)
        # Load 200/s uniform from b+0.5 to the heal at b+4.5; the cut is [b+1.5, b+4.5).
        load_start, cut_at, heal_at = b + 0.5, b + 1.5, b + 4.5
        plan = schedule("uniform", len(hp), a.rate, load_start, heal_at - load_start, rng)
        senders = [Sender(p, "win", key, plan[i]) for i, p in enumerate(hp)]
        time.sleep(max(0.0, load_start - 0.2 - time.time()))
        for s in senders:
            s.start()
        time.sleep(max(0.0, cut_at - time.time()))
        nft(cut_script(cut_ports))
        time.sleep(max(0.0, heal_at - time.time()))
        for s in senders:
            s.join()
        before = None
        conns = [http.client.HTTPConnection("127.0.0.1", p, timeout=2) for p in hp]
        before = status_all(conns, key)
        nft_delete()
        healed = time.time()
        agreed, polls, last = None, 0, before
        while time.time() - healed < a.timeout:
            polls += 1
            last = status_all(conns, key)
            if len(set(last)) == 1:
                agreed = time.time() - healed
                break
            nxt = healed + polls * 0.020
            time.sleep(max(0.0, nxt - time.time()))
        for c in conns:
            c.close()
        adm = [sum(1 for _, ok, _ in s.results if ok) for s in senders]
        rec = {"type": "heal", "run": run, "agree_ms": None if agreed is None else round(agreed * 1000),
               "remaining_before": before, "remaining_after": last, "admitted_per_node": adm,
               "offered": sum(len(s.results) for s in senders), "polls": polls,
               "window_end_margin_s": round(b + 10 - time.time(), 2)}
        emit(a.out, rec)
        print(json.dumps(rec), file=sys.stderr)
    return 0


# ---------------------------------------------------------------------------------------------
# traffic


def metrics(port):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    c.request("GET", "/metrics")
    text = c.getresponse().read().decode()
    c.close()
    vals = {}
    for line in text.splitlines():
        if line.startswith("gossamer_cluster_transport{"):
            what = line.split('what="', 1)[1].split('"', 1)[0]
            vals[what] = float(line.rsplit(" ", 1)[1])
        elif line.startswith("gossamer_cluster_rounds_total{"):
            st = line.split('state="', 1)[1].split('"', 1)[0]
            vals["rounds_" + st] = float(line.rsplit(" ", 1)[1])
    return vals


def cmd_traffic(a):
    hp = ports(a.http)
    t1 = time.time()
    m1 = [metrics(p) for p in hp]
    time.sleep(a.secs)
    t2 = time.time()
    m2 = [metrics(p) for p in hp]
    dt = t2 - t1
    per = []
    for x, y in zip(m1, m2):
        per.append({k: (y.get(k, 0) - x.get(k, 0)) / dt for k in
                    ("bytes_sent", "frames_sent", "bytes_received", "frames_received",
                     "rounds_consistent", "rounds_degraded", "send_failures", "queue_drops")})
    rec = {"type": "traffic", "label": a.label, "secs": round(dt, 2), "per_node": per,
           "checks_per_s": a.checks_per_s, "denied_pct": a.denied_pct}
    emit(a.out, rec)
    print(json.dumps(rec), file=sys.stderr)
    return 0


# ---------------------------------------------------------------------------------------------
# report


def fmt_pct(x):
    return "%+.1f%%" % x


def cmd_report(a):
    recs = [json.loads(l) for l in open(a.out) if l.strip()]
    pr = print
    sc = [r for r in recs if r["type"] == "scenario"]
    if sc:
        pr("### Accuracy against a central limiter (load 2x the limit, 10 s, one aligned 10 s window)")
        pr()
        pr("| scenario | N | rule | offered | admitted | ideal | error vs ideal | worst per-window total | admitted per node | notes |")
        pr("|---|---:|---|---:|---:|---:|---:|---:|---|---|")
        for r in sc:
            if r["rule"] == "win":
                worst = "%d in the 10 s window (limit 1000)" % r["worst_window"]
                if r["windows"] != 1:
                    worst += "; arrivals spanned %d windows" % r["windows"]
                note = ""
            else:
                worst = "%d per 1 s (central: %d)" % (r["worst_window"], r["ideal_worst_window"])
                note = "error after the first 2 s: %s; max excess over 100 + 100/s·τ: %.1f" % (
                    fmt_pct(r["steady_error_pct"]), r["bucket_excess"])
            note += "; degraded rounds %.1f%%" % r.get("degraded_rounds_pct", 0)
            if r["errors"]:
                note += "; %d request errors" % r["errors"]
            if r["max_late_ms"] > 50:
                note += "; sender up to %.0f ms late" % r["max_late_ms"]
            pr("| %s | %d | %s | %d | %d | %d | %s | %s | %s | %s |" % (
                r["label"], r["n"], r["rule"], r["offered"], r["admitted"], r["ideal"],
                fmt_pct(r["error_pct"]), worst, "/".join(str(x) for x in r["per_node_admitted"]),
                note.lstrip("; ")))
        pr()
    he = [r for r in recs if r["type"] == "heal"]
    if he:
        pr("### Partition heal (3 nodes; node 3 cut off for 3 s under `win` load at 200/s; time from deleting the nftables table until all nodes report the same `remaining`, polled every 20 ms)")
        pr()
        pr("| run | heal → agreement | remaining at heal (n1/n2/n3) | agreed remaining | admitted during the run per node |")
        pr("|---:|---:|---|---|---|")
        vals = []
        for r in he:
            ag = "not within timeout" if r["agree_ms"] is None else "%d ms" % r["agree_ms"]
            if r["agree_ms"] is not None:
                vals.append(r["agree_ms"])
            pr("| %d | %s | %s | %s | %s |" % (r["run"], ag, "/".join(map(str, r["remaining_before"])),
                                               "/".join(map(str, r["remaining_after"])),
                                               "/".join(map(str, r["admitted_per_node"]))))
        if vals:
            pr()
            pr("Median heal → agreement: **%d ms** (runs: %s)." % (statistics.median(vals),
                                                                  ", ".join("%d ms" % v for v in vals)))
        pr()
    tr = [r for r in recs if r["type"] == "traffic"]
    if tr:
        pr("### Cluster traffic per node (3 nodes, `/metrics` `gossamer_cluster_transport` over 20 s)")
        pr()
        pr("| load | checks/s (cluster) | checks denied | node | bytes sent/s | frames sent/s | bytes received/s | rounds consistent/s | degraded/s |")
        pr("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
        for r in tr:
            for i, p in enumerate(r["per_node"], 1):
                pr("| %s | %s | %s | %d | %.0f | %.1f | %.0f | %.1f | %.1f |" % (
                    r["label"], r["checks_per_s"] or "0",
                    "-" if r.get("denied_pct") is None else "%s%%" % r["denied_pct"], i, p["bytes_sent"], p["frames_sent"],
                    p["bytes_received"], p["rounds_consistent"], p["rounds_degraded"]))
        pr()
    la = [r for r in recs if r["type"] == "latency"]
    if la:
        pr("### Check latency: one node of a 3-node cluster vs a standalone node (wrk -t2 -c16 -d10s, benches/check.lua, global token bucket `default`, 10,000 keys)")
        pr()
        pr("| target | run | checks/s | p50 µs | p99 µs | p99.9 µs | non-2xx |")
        pr("|---|---:|---:|---:|---:|---:|---:|")
        for r in la:
            pr("| %s | %d | %.0f | %d | %d | %d | %d |" % (r["target"], r["run"], r["rps"], r["p50_us"],
                                                         r["p99_us"], r["p999_us"], r["non2xx"]))
        med = {}
        for t in ("clustered", "standalone"):
            rs = [r for r in la if r["target"] == t]
            if rs:
                med[t] = {k: statistics.median(r[k] for r in rs) for k in ("rps", "p50_us", "p99_us")}
        if len(med) == 2:
            pr()
            pr("| median | checks/s | p50 µs | p99 µs |")
            pr("|---|---:|---:|---:|")
            for t in ("clustered", "standalone"):
                pr("| %s | %.0f | %.0f | %.0f |" % (t, med[t]["rps"], med[t]["p50_us"], med[t]["p99_us"]))
            c, s = med["clustered"], med["standalone"]
            pr("| ratio clustered/standalone | %.2f | %.2f | %.2f |" % (
                c["rps"] / s["rps"], c["p50_us"] / s["p50_us"], c["p99_us"] / s["p99_us"]))
        pr()
    return 0


def cmd_latency_record(a):
    line = a.line.split()
    v = dict(kv.split("=", 1) for kv in line[1:])
    emit(a.out, {"type": "latency", "target": a.target, "run": a.run, "rps": float(v["rps"]),
                 "p50_us": int(v["p50_us"]), "p99_us": int(v["p99_us"]), "p999_us": int(v["p999_us"]),
                 "non2xx": int(v["non2xx"])})
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("wait-cluster")
    p.add_argument("--http", required=True)
    p.add_argument("--timeout", type=float, default=30)
    p.set_defaults(fn=cmd_wait_cluster)
    p = sub.add_parser("scenario")
    p.add_argument("--http", required=True)
    p.add_argument("--pattern", required=True, choices=["uniform", "skew", "rotate"])
    p.add_argument("--label", required=True)
    p.add_argument("--key-prefix", required=True)
    p.add_argument("--rules", default="tb,win")
    p.add_argument("--rate", type=float, default=200.0, help="checks/s per rule, all nodes")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--out", required=True)
    p.set_defaults(fn=cmd_scenario)
    p = sub.add_parser("heal")
    p.add_argument("--http", required=True)
    p.add_argument("--cut-ports", required=True)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--rate", type=float, default=200.0)
    p.add_argument("--timeout", type=float, default=4.0)
    p.add_argument("--key-prefix", required=True)
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--out", required=True)
    p.set_defaults(fn=cmd_heal)
    p = sub.add_parser("traffic")
    p.add_argument("--http", required=True)
    p.add_argument("--secs", type=float, default=20)
    p.add_argument("--label", required=True)
    p.add_argument("--checks-per-s", default=None)
    p.add_argument("--denied-pct", default=None)
    p.add_argument("--out", required=True)
    p.set_defaults(fn=cmd_traffic)
    p = sub.add_parser("latency-record")
    p.add_argument("--target", required=True)
    p.add_argument("--run", type=int, required=True)
    p.add_argument("--line", required=True)
    p.add_argument("--out", required=True)
    p.set_defaults(fn=cmd_latency_record)
    p = sub.add_parser("report")
    p.add_argument("--out", required=True)
    p.set_defaults(fn=cmd_report)
    a = ap.parse_args()
    sys.exit(a.fn(a))


if __name__ == "__main__":
    main()
