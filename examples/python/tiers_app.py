#!/usr/bin/env python3
"""A fake model API gated by tier with gossamer: free 60 calls a minute, pro 600, enterprise
6000 (docs/examples/tiers.toml), and never more than 20 a second for anyone.

Run a node with the tiers' rules, then the app (standard library and clients/python only):

    gossamer serve --config docs/examples/tiers.toml &
    PYTHONPATH=clients/python/src python3 examples/python/tiers_app.py            # :8000
    curl -s localhost:8000/v1/complete -d '{"tenant":"acme-free","prompt":"hello"}'

or see it under load in one command (70 calls from a tenant of each tier, at once):

    PYTHONPATH=clients/python/src python3 examples/python/tiers_app.py --demo

``POST /v1/complete {"tenant","prompt"}`` answers 200 with a fake completion, 429 with
``Retry-After`` and ``retry_after_ms`` once the tenant's tier is spent, 401 for an unknown
tenant, and 503 when gossamer cannot be reached (this app fails closed: set
``GOSSAMER_FAIL_OPEN=1`` to serve anyway). ``GOSSAMER_URL`` is the node (default
http://127.0.0.1:7070).

Two patterns of the client, one per rule:

- the tier (``free``/``pro``/``enterprise``, key = tenant) with ``client.acquire(...,
  timeout=0)``: out of quota answers 429 at once, with the node's wait for the caller;
- the per-second guard with ``@client.rate_limited("per-second", key=..., timeout=1.0)`` on
  the model call: a burst is paced (held up to a second, in the node's milliseconds) rather
  than refused.

Each call costs 1. A model's real cost is its tokens, known only after the completion: once
the node has reserve/settle (``POST /v1/reserve`` and ``/v1/settle``, issue 22), the tier
check will reserve an estimate of the tokens and settle the actual count afterwards,
replacing this fixed cost.
"""

from __future__ import annotations

import argparse
import collections
import json
import math
import os
import sys
import threading
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import gossamer

#: The account database this fake API has: tenant -> tier, the name of its gossamer rule.
TENANTS = {
    "acme-free": "free",
    "globex-pro": "pro",
    "initech-enterprise": "enterprise",
}


def make_app(client: gossamer.Client) -> type[BaseHTTPRequestHandler]:
    """The request handler, closed over `client` (no module-level client)."""

    @client.rate_limited("per-second", key=lambda tenant, prompt: tenant, timeout=1.0)
    def complete(tenant: str, prompt: str) -> dict:
        # The "model": a real app calls its model provider here.
        words = prompt.split()
        return {"completion": " ".join(reversed(words)), "tokens": len(words) + 1}

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:
            if self.path != "/v1/complete":
                return self.answer(404, {"error": "not_found"})
            try:
                length = int(self.headers.get("Content-Length", "0"))
                request = json.loads(self.rfile.read(min(length, 65536)) or b"{}")
                tenant, prompt = str(request["tenant"]), str(request.get("prompt", ""))
            except (ValueError, KeyError, TypeError):
                return self.answer(400, {"error": "expected {\"tenant\":..,\"prompt\":..}"})
            tier = TENANTS.get(tenant)
            if tier is None:
                return self.answer(401, {"error": f"unknown tenant {tenant!r}"})
            try:
                decision = client.acquire(tier, tenant, cost=1, timeout=0)
                result = complete(tenant, prompt)
            except gossamer.RateLimited as e:
                ms = e.retry_after_ms
                headers = {"Retry-After": str(math.ceil(ms / 1000))} if ms is not None else {}
                body = {"error": "rate_limited", "tier": tier, "retry_after_ms": ms}
                return self.answer(429, body, headers)
            except gossamer.Unavailable as e:
                return self.answer(503, {"error": "rate limiter unavailable", "detail": str(e)})
            result["tier"] = tier
            result["remaining"] = decision.remaining
            self.answer(200, result)

        def answer(self, status: int, body: dict, headers: dict | None = None) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            for name, value in (headers or {}).items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: object) -> None:
            pass  # quiet: the demo prints its own summary

    return Handler


def demo(app_url: str, calls: int) -> dict:
    """Sends `calls` requests from one tenant of each tier, the tenants at once; returns
    {tenant: Counter of statuses}."""
    results: dict[str, collections.Counter] = {}

    def tenant_load(tenant: str) -> None:
        counts: collections.Counter = collections.Counter()
        for i in range(calls):
            body = json.dumps({"tenant": tenant, "prompt": f"call number {i}"}).encode()
            request = urllib.request.Request(f"{app_url}/v1/complete", data=body)
            try:
                with urllib.request.urlopen(request, timeout=10) as response:
                    counts[response.status] += 1
            except urllib.error.HTTPError as e:
                counts[e.code] += 1
        results[tenant] = counts

    threads = [threading.Thread(target=tenant_load, args=(t,)) for t in TENANTS]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, default=8000, help="0 picks a free port")
    parser.add_argument("--demo", action="store_true", help="serve on a free port, send load, print")
    parser.add_argument("--calls", type=int, default=70, help="calls per tenant in --demo")
    args = parser.parse_args()
    url = os.environ.get("GOSSAMER_URL", "http://127.0.0.1:7070")
    fail_open = os.environ.get("GOSSAMER_FAIL_OPEN", "") == "1"
    with gossamer.Client(url, fail_open=fail_open, timeout=0.5) as client:
        server = ThreadingHTTPServer(("127.0.0.1", 0 if args.demo else args.port), make_app(client))
        app_url = f"http://127.0.0.1:{server.server_address[1]}"
        if not args.demo:
            print(f"serving the fake model API on {app_url}, gossamer at {url}", file=sys.stderr)
            server.serve_forever()
            return 0
        threading.Thread(target=server.serve_forever, daemon=True).start()
        results = demo(app_url, args.calls)
        server.shutdown()
        server.server_close()
    for tenant in TENANTS:
        counts = results.get(tenant, collections.Counter())
        print(
            f"{tenant:<20} tier {TENANTS[tenant]:<11} {counts[200]:>3} served, "
            f"{counts[429]:>3} rate limited, {sum(counts.values()) - counts[200] - counts[429]:>3} other"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
