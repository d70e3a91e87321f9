"""examples/python/tiers_app.py, run as its docstring says against a real node with
examples/python/tiers.toml, and driven over HTTP: a free user is held to 60 requests a
minute, a reservation of more tokens than the user has left is refused, settling below the
estimate gives the rest back, the node down fails closed (or open when asked), and --demo.

Every wait is bounded; the app and the node are killed at the end of each test (the app) and
of the module (the node).
"""

from __future__ import annotations

import json
import math
import os
import queue
import re
import subprocess
import sys
import threading
import time
import unittest
import urllib.error
import urllib.request
import uuid
from typing import Optional

import gossamer
from node import REPO, Node, closed_port

APP = os.path.join(REPO, "examples", "python", "tiers_app.py")
RULES = os.path.join(REPO, "examples", "python", "tiers.toml")
#: Where the client under test lives (this checkout's src, or site-packages when installed).
PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(gossamer.__file__)))
#: The longest the app may take to start and say where it serves.
START_TIMEOUT = 20.0
#: The free tier's token budget refills at 10,000 a minute.
FREE_TOKENS_PER_SECOND = 10_000 / 60

node: Node


def setUpModule() -> None:
    global node
    with open(RULES) as f:
        node = Node(f.read())
    node.start()


def tearDownModule() -> None:
    node.stop()


class App:
    """``with App(node_url) as app:`` runs tiers_app.py on a free port; ``app.url``."""

    def __init__(self, node_url: str, *extra: str):
        self.args = [sys.executable, APP, "--node", node_url, "--port", "0", *extra]
        self.url = ""
        self.lines: list[str] = []

    def __enter__(self) -> "App":
        self.process = subprocess.Popen(
            self.args,
            env={**os.environ, "PYTHONPATH": PACKAGE, "PYTHONDONTWRITEBYTECODE": "1"},
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        lines: "queue.Queue[str]" = queue.Queue()
        self.reader = threading.Thread(target=self._read, args=(lines,), daemon=True)
        self.reader.start()
        deadline = time.monotonic() + START_TIMEOUT
        try:
            while not self.url:
                left = deadline - time.monotonic()
                if left <= 0 or self.process.poll() is not None:
                    raise RuntimeError(f"tiers_app.py did not start: {self.lines[-20:]}")
                try:
                    line = lines.get(timeout=min(left, 0.5))
                except queue.Empty:
                    continue
                found = re.search(r"serving the fake model API on (http://\S+),", line)
                if found:
                    self.url = found[1]
        except BaseException:
            self.__exit__()
            raise
        return self

    def _read(self, lines: "queue.Queue[str]") -> None:
        assert self.process.stderr is not None
        for line in self.process.stderr:
            self.lines.append(line.rstrip())
            lines.put(line)

    def __exit__(self, *exc: object) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(timeout=10)
        self.reader.join(timeout=5)
        if self.process.stderr is not None:
            self.process.stderr.close()

    def complete(self, user: str, tier: str, prompt: str, max_tokens: int) -> tuple[int, dict, dict]:
        """POSTs /v1/complete: (status, headers, JSON body)."""
        body = {"user": user, "tier": tier, "prompt": prompt, "max_tokens": max_tokens}
        request = urllib.request.Request(f"{self.url}/v1/complete", data=json.dumps(body).encode())
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                return response.status, dict(response.headers), json.load(response)
        except urllib.error.HTTPError as e:
            with e:
                return e.code, dict(e.headers), json.load(e)


def fresh_user() -> str:
    return f"user-{uuid.uuid4().hex[:12]}"


class TiersAppTest(unittest.TestCase):
    app: App

    @classmethod
    def setUpClass(cls) -> None:
        cls.app = App(node.url).__enter__()

    @classmethod
    def tearDownClass(cls) -> None:
        cls.app.__exit__()

    def assertRetryInfo(self, headers: dict, body: dict) -> int:
        ms = body["retry_after_ms"]
        self.assertIsInstance(ms, int, body)
        self.assertGreater(ms, 0, body)
        self.assertEqual(headers.get("Retry-After"), str(math.ceil(ms / 1000)), (headers, body))
        return ms

    def spend_most_tokens(self, user: str) -> int:
        """A free user's call that uses all it reserved, 8,800 of the 10,000 tokens: 800
        words of prompt, which the fake model answers with 8,000 (its max_tokens). Returns
        the budget left."""
        status, _, body = self.app.complete(user, "free", "word " * 800, 8000)
        self.assertEqual(status, 200, body)
        self.assertEqual(body["usage"]["total_tokens"], 8800, body["usage"])
        self.assertEqual((body["tokens"]["reserved"], body["tokens"]["refunded"]), (8800, 0), body["tokens"])
        remaining = body["tokens"]["remaining"]
        self.assertLess(remaining, 2000, body["tokens"])
        return remaining

    def test_free_user_is_held_to_60_requests_then_admitted_after_retry_after(self) -> None:
        user = fresh_user()
        served = 0
        for _ in range(200):  # 60, and the one a second the bucket refills meanwhile
            status, headers, body = self.app.complete(user, "free", "hi", 1)
            if status != 200:
                break
            served += 1
        self.assertEqual(status, 429, body)
        self.assertGreaterEqual(served, 60)
        self.assertLess(served, 200)
        self.assertEqual((body["error"], body["limit"], body["rule"]), ("rate_limited", "requests", "free"), body)
        ms = self.assertRetryInfo(headers, body)
        self.assertLessEqual(ms, 1000, body)  # one request a second refills
        # A pro user is not held by the free user's limit.
        self.assertEqual(self.app.complete(user, "pro", "hi", 1)[0], 200)
        # The node's wait, in milliseconds, is enough: the next call is admitted.
        time.sleep(ms / 1000 + 0.02)
        status, _, body = self.app.complete(user, "free", "hi", 1)
        self.assertEqual(status, 200, body)

    def test_reserving_more_tokens_than_are_left_is_refused(self) -> None:
        user = fresh_user()
        left = self.spend_most_tokens(user)
        # 5,001 tokens (1 of prompt + 5,000 max_tokens) against about 1,200 left.
        status, headers, body = self.app.complete(user, "free", "hi", 5000)
        self.assertEqual(status, 429, body)
        self.assertEqual((body["limit"], body["rule"]), ("tokens", "free-tokens"), body)
        ms = self.assertRetryInfo(headers, body)
        # Refilled at 10,000 a minute, the missing ~3,800 take more than 20 s.
        self.assertGreater(ms, (5001 - left - 500) / FREE_TOKENS_PER_SECOND * 1000, body)
        # The refusal charged no tokens: a call that fits is still admitted.
        status, _, body = self.app.complete(user, "free", "hi", left - 1)
        self.assertEqual(status, 200, body)

    def test_settling_below_the_estimate_gives_the_rest_back(self) -> None:
        user = fresh_user()
        self.spend_most_tokens(user)  # about 1,200 left
        # Reserves 1,001 (1 + max_tokens 1,000); the model uses 11: 990 come back.
        status, _, body = self.app.complete(user, "free", "hi", 1000)
        self.assertEqual(status, 200, body)
        settled_at = time.monotonic()
        self.assertEqual(body["usage"]["total_tokens"], 11, body["usage"])
        self.assertEqual((body["tokens"]["reserved"], body["tokens"]["refunded"]), (1001, 990), body["tokens"])
        remaining = body["tokens"]["remaining"]
        # 1,100 tokens now fit only thanks to the refund: without it, what was left (less the
        # refill until the next call) would be short of them.
        status, _, body = self.app.complete(user, "free", "hi", 1099)
        refilled = (time.monotonic() - settled_at) * FREE_TOKENS_PER_SECOND
        self.assertLess(remaining - 990 + refilled, 1100, "the machine was too slow for this test to show the refund")
        self.assertEqual(status, 200, body)
        self.assertEqual(body["tokens"]["reserved"], 1100, body["tokens"])

    def test_bad_requests_are_400(self) -> None:
        for max_tokens, error in ((20000, "over_budget"), (0, "bad_request")):
            status, _, body = self.app.complete(fresh_user(), "free", "hi", max_tokens)
            self.assertEqual((status, body["error"]), (400, error), body)
        status, _, body = self.app.complete(fresh_user(), "gold", "hi", 1)
        self.assertEqual((status, body["error"]), (400, "bad_request"), body)


class NodeDownTest(unittest.TestCase):
    def test_fails_closed_by_default_and_open_when_asked(self) -> None:
        down = f"http://127.0.0.1:{closed_port()}"
        with App(down) as app:
            status, _, body = app.complete(fresh_user(), "free", "hi", 5)
            self.assertEqual((status, body["error"]), (503, "rate_limiter_unavailable"), body)
        with App(down, "--fail-open") as app:
            status, _, body = app.complete(fresh_user(), "free", "hi", 5)
            self.assertEqual(status, 200, body)
            self.assertIs(body["metered"], False, body)


class DemoTest(unittest.TestCase):
    def test_demo_holds_the_free_tier_to_its_burst(self) -> None:
        run = subprocess.run(
            [sys.executable, APP, "--node", node.url, "--demo"],
            env={**os.environ, "PYTHONPATH": PACKAGE},
            capture_output=True,
            text=True,
            timeout=120,
        )
        self.assertEqual(run.returncode, 0, run.stderr)
        rows = {
            m[0]: tuple(int(n) for n in m[1:])
            for m in re.findall(
                r"^(\S+)\s+(\d+) served,\s+(\d+) over requests,\s+(\d+) over tokens,\s+(\d+) other; "
                r"(\d+) tokens used, (\d+) reserved and given back$",
                run.stdout,
                re.M,
            )
        }
        self.assertEqual(set(rows), {"free", "pro", "enterprise"}, run.stdout)
        served, requests, tokens, other, used, refunded = rows["free"]
        # A burst of 60, refilled at 1 a second while the 70 calls run: 60 and maybe a few
        # more, never all 70. Tokens never run out: each call reserves 259 and is settled at
        # 33, and 60 calls reserve more (15,540) than the 10,000 a minute.
        self.assertGreaterEqual(served, 60, run.stdout)
        self.assertGreaterEqual(requests, 1, run.stdout)
        self.assertEqual((served + requests, tokens, other), (70, 0, 0), run.stdout)
        self.assertEqual(used, 33 * served, run.stdout)
        self.assertGreater(refunded, 0, run.stdout)
        for tier in ("pro", "enterprise"):
            self.assertEqual(rows[tier][:4], (70, 0, 0, 0), run.stdout)


if __name__ == "__main__":
    unittest.main()
