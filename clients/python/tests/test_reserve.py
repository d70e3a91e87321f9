"""Reserve, then settle, through the Python client against a real node (tests/node.py).

The node runs on the wall clock: the rules' windows are long (a year), so no window ends
between a reserve and its settle, and every figure asserted is exact.
"""

from __future__ import annotations

import asyncio
import unittest
import uuid

import gossamer
from node import Node, closed_port

RULES = """
[[rule]]
# Tokens of a model's completions: 10,000 a window of a year (no window ends mid-test).
name = "llm"
algorithm = "fixed_window"
limit = 10000
period = "366d"

[[rule]]
name = "one"
algorithm = "fixed_window"
limit = 1
period = "366d"
"""

node: Node


def setUpModule() -> None:
    global node
    node = Node(RULES)
    node.start()


def tearDownModule() -> None:
    node.stop()


def fresh_key() -> str:
    return f"k-{uuid.uuid4().hex[:12]}"


class ReserveTest(unittest.TestCase):
    def setUp(self) -> None:
        self.client = gossamer.Client(node.url)

    def tearDown(self) -> None:
        self.client.close()

    def remaining(self, key: str) -> int:
        remaining = self.client.status("llm", key).remaining
        assert remaining is not None
        return remaining

    def test_reserve_charges_at_once_and_settle_gives_back_the_rest(self) -> None:
        key = fresh_key()
        r = self.client.reserve("llm", key, 2000)
        self.assertIsInstance(r, gossamer.Decision)
        self.assertEqual((r.allowed, r.outcome, r.status, r.remaining, r.cost), (True, "allowed", 200, 8000, 2000))
        self.assertIsNotNone(r.reservation)
        self.assertEqual(len(r.reservation or ""), 32)
        self.assertFalse(r.settled)
        self.assertEqual(self.remaining(key), 8000)
        s = self.client.settle(r, 500)
        assert s is not None
        self.assertEqual(
            (s.reservation, s.rule, s.key, s.reserved, s.cost, s.refunded, s.charged, s.unpaid),
            (r.reservation, "llm", key, 2000, 500, 1500, 0, 0),
        )
        self.assertEqual((s.limit, s.remaining), (10000, 9500))
        self.assertEqual(self.remaining(key), 9500)
        self.assertTrue(r.settled)
        self.assertEqual(r.settlement, s)

    def test_settle_by_id_and_above_the_reservation(self) -> None:
        key = fresh_key()
        r = self.client.reserve("llm", key, 2000)
        assert r.reservation is not None
        s = self.client.settle(r.reservation, 12_000)
        assert s is not None
        self.assertEqual((s.refunded, s.charged, s.remaining), (0, 10_000, 0))
        # Past the limit: later checks are refused.
        self.assertFalse(self.client.check("llm", key).allowed)

    def test_refused_settles_raise_bad_request_with_the_nodes_error(self) -> None:
        r = self.client.reserve("llm", fresh_key(), 10)
        cases = [
            (lambda: self.client.settle(r, -1), 400, "invalid_cost"),
            (lambda: self.client.settle(r, 1 << 41), 400, "invalid_cost"),
            (lambda: self.client.settle("0" * 32, 1), 404, "unknown_reservation"),
            (lambda: self.client.settle("not-an-id", 1), 404, "unknown_reservation"),
        ]
        for call, status, error in cases:
            with self.assertRaises(gossamer.BadRequest) as caught:
                call()
            self.assertEqual((caught.exception.status, caught.exception.error), (status, error))
        self.assertIsNotNone(self.client.settle(r.reservation or "", 5))
        with self.assertRaises(gossamer.BadRequest) as caught:
            self.client.settle(r, 5)
        self.assertEqual((caught.exception.status, caught.exception.error), (409, "already_settled"))
        with self.assertRaises(TypeError):
            self.client.settle(r, 1.5)  # type: ignore[arg-type]
        with self.assertRaises(TypeError):
            self.client.settle(42, 1)  # type: ignore[arg-type]

    def test_a_denied_reserve_has_no_reservation_and_nothing_to_settle(self) -> None:
        key = fresh_key()
        self.assertTrue(self.client.check("one", key).allowed)
        r = self.client.reserve("one", key, 1)
        self.assertEqual((r.allowed, r.outcome, r.status, r.reservation), (False, "denied", 429, None))
        with self.assertRaises(ValueError):
            self.client.settle(r, 0)
        never = self.client.reserve("one", fresh_key(), 2)
        self.assertTrue(never.never)

    def test_context_manager_settles_what_the_block_says(self) -> None:
        key = fresh_key()
        with self.client.reserve("llm", key, 2000) as r:
            self.assertEqual(self.remaining(key), 8000)
            s = r.settle(300)
        assert s is not None
        self.assertEqual(s.refunded, 1700)
        self.assertEqual(self.remaining(key), 9700)

    def test_context_manager_left_without_a_settle_settles_at_the_estimate(self) -> None:
        key = fresh_key()
        with self.client.reserve("llm", key, 2000) as r:
            pass
        self.assertTrue(r.settled)
        assert r.settlement is not None
        self.assertEqual((r.settlement.cost, r.settlement.refunded), (2000, 0))
        self.assertEqual(self.remaining(key), 8000)
        # An exception in the block: settled at the estimate too, and the error goes on.
        with self.assertRaises(KeyError):
            with self.client.reserve("llm", key, 1000) as r2:
                raise KeyError("boom")
        self.assertTrue(r2.settled)
        self.assertEqual(self.remaining(key), 7000)
        with self.assertRaises(gossamer.BadRequest) as caught:
            self.client.settle(r2.reservation or "", 0)
        self.assertEqual(caught.exception.error, "already_settled")

    def test_context_manager_does_not_enter_when_denied(self) -> None:
        key = fresh_key()
        self.client.check("one", key)
        ran = []
        with self.assertRaises(gossamer.RateLimited) as caught:
            with self.client.reserve("one", key, 1):
                ran.append(1)
        self.assertEqual(ran, [])
        self.assertEqual(caught.exception.decision.outcome, "denied")
        with self.assertRaises(gossamer.NeverAdmitted):
            with self.client.reserve("one", key, 2):
                ran.append(1)
        self.assertEqual(ran, [])

    def test_node_down_fails_open_or_closed(self) -> None:
        url = f"http://127.0.0.1:{closed_port()}"
        with gossamer.Client(url) as closed:
            with self.assertRaises(gossamer.Unavailable):
                closed.reserve("llm", "k", 1)
            with self.assertRaises(gossamer.Unavailable):
                closed.settle("0" * 32, 1)
        with gossamer.Client(url, fail_open=True) as open_:
            ran = []
            with open_.reserve("llm", "k", 1) as r:
                ran.append(r.outcome)
                self.assertIsNone(r.settle(0))
            self.assertEqual(ran, ["fail_open"])
            self.assertIsNone(r.reservation)
            # A real id the node cannot be asked about: it keeps its estimate.
            self.assertIsNone(open_.settle("0" * 32, 1))


class AsyncReserveTest(unittest.TestCase):
    def run_async(self, coroutine):  # type: ignore[no-untyped-def]
        return asyncio.run(asyncio.wait_for(coroutine, 30))

    def test_reserve_settle_and_async_with(self) -> None:
        key = fresh_key()

        async def main() -> tuple:
            async with gossamer.AsyncClient(node.url) as client:
                r = await client.reserve("llm", key, 2000)
                self.assertIsInstance(r, gossamer.AsyncReservation)
                s1 = await client.settle(r, 500)
                async with client.reserve("llm", key, 1000) as r2:
                    s2 = await r2.settle(250)
                async with client.reserve("llm", key, 100):
                    pass
                with self.assertRaises(gossamer.BadRequest):
                    await client.settle(r, 1)
                with self.assertRaises(gossamer.RateLimited):
                    async with client.reserve("one", key, 1):
                        async with client.reserve("one", key, 1):
                            pass
                status = await client.status("llm", key)
                return s1, s2, status.remaining

        s1, s2, remaining = self.run_async(main())
        self.assertEqual((s1.refunded, s2.refunded), (1500, 750))
        # 500 + 250 + 100 (settled at its estimate).
        self.assertEqual(remaining, 10_000 - 850)

    def test_node_down_fails_open(self) -> None:
        url = f"http://127.0.0.1:{closed_port()}"

        async def main() -> tuple:
            async with gossamer.AsyncClient(url, fail_open=True) as client:
                async with client.reserve("llm", "k", 1) as r:
                    outcome = r.outcome
                return outcome, r.settled

        self.assertEqual(self.run_async(main()), ("fail_open", True))


if __name__ == "__main__":
    unittest.main()
