#!/usr/bin/env python3
"""A fake model API gated by tier with gossamer: requests a minute and tokens a minute per user.

| tier       | requests a minute | tokens a minute |
|------------|-------------------|-----------------|
| free       | 60                | 10,000          |
| pro        | 600               | 100,000         |
| enterprise | 6,000             | 1,000,000       |

Run a node with these rules (examples/python/tiers.toml), then the app, from the repository
root (standard library and clients/python only; the app finds clients/python/src itself when
the client is not installed):

    gossamer serve --config examples/python/tiers.toml
    python3 examples/python/tiers_app.py --node http://127.0.0.1:7070      # serves on :8000

    curl -s localhost:8000/v1/complete \\
      -d '{"user":"ada","tier":"free","prompt":"hello there","max_tokens":256}'

or, instead of serving, see it under load (70 calls from a user of each tier, at once):

    python3 examples/python/tiers_app.py --node http://127.0.0.1:7070 --demo

``POST /v1/complete {"user", "tier", "prompt", "max_tokens"}`` answers:

- 200 with the fake completion, its ``usage`` (tokens) and what gossamer did with them
  (``tokens``: reserved, refunded, remaining);
- 429 when the user's tier is spent, with ``Retry-After`` (seconds, rounded up) and a body
  ``{"error": "rate_limited", "limit": "requests" | "tokens", "retry_after_ms", ...}``:
  ``retry_after_ms`` is the node's wait in milliseconds, which a client should prefer;
- 400 for a malformed request, or a prompt + ``max_tokens`` larger than the tier's whole
  budget (waiting cannot help);
- 503 when gossamer cannot be reached.

**Fail closed by default.** If the node cannot be reached (or does not answer within
0.5 s), the app answers 503 rather than run an unmetered model call. With ``--fail-open``
(or ``GOSSAMER_FAIL_OPEN=1``) it serves anyway, uncounted, and says so in the answer
(``"metered": false``); gossamer's client logs a warning for each such call.

Each call goes through two rules of its tier, keyed by the user:

1. the request rule (``free``, ``pro``, ``enterprise``), with the client's decorator
   ``@client.rate_limited(rule, key=..., timeout=0)``: a spent tier raises
   ``gossamer.RateLimited`` at once (a positive ``timeout`` would wait for it instead);
2. the token rule (``free-tokens``, ...), with reserve, then settle: the cost of a
   completion, its tokens, is known only after the model ran, so the app reserves the most
   it can cost (the prompt's tokens + ``max_tokens``) before the call and settles the tokens
   it actually used after. The node gives the difference back to the user's budget at once,
   so a user asking for ``max_tokens: 4000`` and getting 40 is charged 40, not 4000.

The tier is taken from the request here; a real service would look it up from the caller's
API key. The "model" is a stand-in: a token is a word, and it writes ten words for each
word of the prompt, up to ``max_tokens`` (so its usage is a deterministic function of the
request, which the tests rely on).
"""

from __future__ import annotations

import argparse
import collections
import itertools
import json
import math
import os
import sys
import threading
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

try:
    import gossamer
except ImportError:  # not installed: use the client in this checkout
    sys.path.insert(
        0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "clients", "python", "src")
    )
    import gossamer

#: tier -> (its request rule, its token rule), as named in examples/python/tiers.toml.
TIERS = {
    "free": ("free", "free-tokens"),
    "pro": ("pro", "pro-tokens"),
    "enterprise": ("enterprise", "enterprise-tokens"),
}

#: The largest max_tokens the app takes at all (a tier's own budget may be smaller).
MAX_TOKENS = 100_000


def count_tokens(text: str) -> int:
    """The fake tokenizer: a token is a word."""
    return len(text.split())


def fake_model(prompt: str, max_tokens: int) -> dict:
    """The "model": ten words for each word of the prompt (the prompt backwards, over and
    over), cut at `max_tokens`. A real app calls its model provider here and reads the usage
    from its answer."""
    words = prompt.split() or ["..."]
    completion_tokens = min(max_tokens, 10 * len(words))
    text = " ".join(itertools.islice(itertools.cycle(reversed(words)), completion_tokens))
    prompt_tokens = count_tokens(prompt)
    return {
        "completion": text,
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        },
    }


class BadInput(ValueError):
    pass


def parse(body: bytes) -> tuple[str, str, str, int]:
    """(user, tier, prompt, max_tokens) from a request body, or BadInput."""
    try:
        request = json.loads(body or b"{}")
    except ValueError:
        raise BadInput("the body is not JSON") from None
    if not isinstance(request, dict):
        raise BadInput('expected {"user","tier","prompt","max_tokens"}')
    user, tier = request.get("user"), request.get("tier")
    prompt, max_tokens = request.get("prompt", ""), request.get("max_tokens", 256)
    if not isinstance(user, str) or not user:
        raise BadInput('"user" must be a non-empty string')
    if tier not in TIERS:
        raise BadInput(f'"tier" must be one of {", ".join(TIERS)}')
    if not isinstance(prompt, str):
        raise BadInput('"prompt" must be a string')
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or not 1 <= max_tokens <= MAX_TOKENS:
        raise BadInput(f'"max_tokens" must be a whole number from 1 to {MAX_TOKENS}')
    return user, tier, prompt, max_tokens


def make_app(client: gossamer.Client) -> type[BaseHTTPRequestHandler]:
    """The request handler, closed over `client` (no module-level client)."""

    def complete(user: str, tier: str, prompt: str, max_tokens: int) -> dict:
        # Reserve the most this call can cost, run the model, settle what it used. Entering
        # the block raises RateLimited when the budget lacks the estimate (the model does not
        # run, and nothing is charged). If the model raised, the block would settle at the
        # estimate; settle(0) first if your provider does not bill failed calls.
        estimate = count_tokens(prompt) + max_tokens
        with client.reserve(TIERS[tier][1], user, estimate) as reservation:
            reply = fake_model(prompt, max_tokens)
            settlement = reservation.settle(reply["usage"]["total_tokens"])
        if settlement is None:  # failed open: the node was not asked, nothing was counted
            reply.update(metered=False, tokens={"reserved": estimate})
        else:
            reply.update(
                metered=True,
                tokens={
                    "reserved": settlement.reserved,
                    "refunded": settlement.refunded,
                    "remaining": settlement.remaining,
                },
            )
        return reply

    # The request rule of each tier: the same function behind each tier's decorator.
    by_tier = {
        tier: client.rate_limited(requests, key=lambda user, *_: user, timeout=0)(complete)
        for tier, (requests, _) in TIERS.items()
    }

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            if length > 1 << 20:
                self.close_connection = True
                return self.answer(413, {"error": "too_large"})
            body = self.rfile.read(length)
            if self.path != "/v1/complete":
                return self.answer(404, {"error": "not_found"})
            try:
                user, tier, prompt, max_tokens = parse(body)
            except BadInput as e:
                return self.answer(400, {"error": "bad_request", "message": str(e)})
            try:
                reply = by_tier[tier](user, tier, prompt, max_tokens)
            except gossamer.NeverAdmitted as e:
                budget = e.decision.limit
                return self.answer(400, {
                    "error": "over_budget",
                    "message": f"prompt + max_tokens exceed the {tier} tier's {budget} tokens a minute",
                })
            except gossamer.RateLimited as e:
                ms = e.retry_after_ms
                limit = "tokens" if e.decision.rule == TIERS[tier][1] else "requests"
                headers = {"Retry-After": str(math.ceil(ms / 1000))} if ms is not None else {}
                return self.answer(429, {
                    "error": "rate_limited",
                    "limit": limit,
                    "tier": tier,
                    "rule": e.decision.rule,
                    "retry_after_ms": ms,
                }, headers)
            except gossamer.Unavailable as e:  # only when failing closed
                return self.answer(503, {"error": "rate_limiter_unavailable", "message": str(e)})
            reply["tier"] = tier
            self.answer(200, reply)

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
    """Sends `calls` requests from one user of each tier, the users at once, each asking
    for up to 256 tokens; returns {tier: Counter} of statuses, 429s by limit, and tokens."""
    results: dict[str, collections.Counter] = {}

    def load(tier: str) -> None:
        counts: collections.Counter = collections.Counter()
        for i in range(calls):
            request = {"user": f"demo-{tier}", "tier": tier, "prompt": f"call number {i}", "max_tokens": 256}
            post = urllib.request.Request(f"{app_url}/v1/complete", data=json.dumps(request).encode())
            try:
                with urllib.request.urlopen(post, timeout=10) as response:
                    reply = json.load(response)
                counts["served"] += 1
                counts["used"] += reply["usage"]["total_tokens"]
                counts["refunded"] += reply["tokens"].get("refunded", 0)
            except urllib.error.HTTPError as e:
                counts[json.load(e).get("limit", e.code) if e.code == 429 else "other"] += 1
            except OSError:
                counts["other"] += 1
        results[tier] = counts

    threads = [threading.Thread(target=load, args=(tier,)) for tier in TIERS]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--node", default=os.environ.get("GOSSAMER_URL", "http://127.0.0.1:7070"),
                        help="the gossamer node (default $GOSSAMER_URL or http://127.0.0.1:7070)")
    parser.add_argument("--port", type=int, default=8000, help="port to serve on; 0 picks a free one")
    parser.add_argument("--fail-open", action="store_true",
                        default=os.environ.get("GOSSAMER_FAIL_OPEN", "") == "1",
                        help="serve uncounted when the node cannot be reached (default: 503)")
    parser.add_argument("--demo", action="store_true", help="serve on a free port, send load, print")
    parser.add_argument("--calls", type=int, default=70, help="calls per tier in --demo")
    args = parser.parse_args()
    with gossamer.Client(args.node, fail_open=args.fail_open, timeout=0.5) as client:
        server = ThreadingHTTPServer(("127.0.0.1", 0 if args.demo else args.port), make_app(client))
        server.daemon_threads = True
        app_url = f"http://127.0.0.1:{server.server_address[1]}"
        if not args.demo:
            policy = "open" if args.fail_open else "closed"
            print(f"serving the fake model API on {app_url}, gossamer at {args.node} (failing {policy})",
                  file=sys.stderr, flush=True)
            try:
                server.serve_forever()
            except KeyboardInterrupt:
                pass
            return 0
        threading.Thread(target=server.serve_forever, daemon=True).start()
        results = demo(app_url, args.calls)
        server.shutdown()
        server.server_close()
    for tier in TIERS:
        c = results.get(tier, collections.Counter())
        print(
            f"{tier:<11} {c['served']:>3} served, {c['requests']:>3} over requests, "
            f"{c['tokens']:>3} over tokens, {c['other']:>3} other; "
            f"{c['used']} tokens used, {c['refunded']} reserved and given back"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
