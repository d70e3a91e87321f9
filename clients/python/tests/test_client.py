"""The Python client against a real gossamer node (tests/node.py starts it).

Run from the repository root, after `cargo build --bin gossamer`:

    PYTHONPATH=clients/python/src python3 -m unittest discover -s clients/python/tests -v

Waits are asserted on what the client asked to sleep (an injected sleep function records
it), not on wall-clock thresholds; every wait is bounded by a timeout.
"""

from __future__ import annotations

import asyncio
import random
import sys
import threading
import time
import unittest
import uuid

import gossamer
from node import Node, Silent, closed_port

RULES = """
[[rule]]
# 10 per second, one at a time: a denial waits about 100 ms.
name = "tenth"
algorithm = "token_bucket"
limit = 10
period = "1s"
burst = 1

[[rule]]
# One a minute: a denial waits about 60 s.
name = "minute"
algorithm = "token_bucket"
limit = 1
period = "1m"
burst = 1

[[rule]]
# Two an hour: for counting admissions.
name = "pair"
algorithm = "token_bucket"
limit = 2
period = "1h"
burst = 2

[[rule]]
# A shaping leaky bucket: 2 a second, callers may be held up to 2 s.
name = "shaped"
algorithm = "leaky_bucket"
limit = 2
period = "1s"
burst = 1
max_wait = "2s"

[[rule]]
# Ten an hour: for concurrent checks.
name = "ten"
algorithm = "token_bucket"
limit = 10
period = "1h"
burst = 10
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


class Recorder:
    """A sleep that records what it was asked, and actually sleeps only if `real`."""

    def __init__(self, real: bool = True):
        self.real = real
        self.asked: list[float] = []

    def __call__(self, seconds: float) -> None:
        self.asked.append(seconds)
        if self.real:
            time.sleep(seconds)


class FakeTime:
    """A monotonic clock that only moves when slept on: a test of the timeout's arithmetic
    that takes no wall time."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.asked: list[float] = []

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.asked.append(seconds)
        self.now += seconds

    async def async_sleep(self, seconds: float) -> None:
        self.sleep(seconds)


class CheckTest(unittest.TestCase):
    def setUp(self) -> None:
        self.client = gossamer.Client(node.url)

    def tearDown(self) -> None:
        self.client.close()

    def test_check_admits_then_answers_429_as_a_decision(self) -> None:
        key = fresh_key()
        first = self.client.check("pair", key)
        self.assertEqual(
            (first.allowed, first.outcome, first.status, first.remaining, first.limit),
            (True, "allowed", 200, 1, 2),
        )
        self.assertEqual((first.rule, first.key, first.retry_after_ms), ("pair", key, 0))
        self.client.check("pair", key)
        denied = self.client.check("pair", key)
        self.assertEqual((denied.allowed, denied.outcome, denied.status), (False, "denied", 429))
        self.assertEqual(denied.remaining, 0)
        # 1 per 30 minutes: the node's wait is in milliseconds, close to 1,800,000.
        self.assertGreater(denied.retry_after_ms, 1_700_000)
        self.assertLessEqual(denied.retry_after_ms, 1_800_000)

    def test_cost_larger_than_the_burst_is_never_admitted(self) -> None:
        decision = self.client.check("pair", fresh_key(), cost=3)
        self.assertEqual((decision.allowed, decision.outcome), (False, "never"))
        self.assertTrue(decision.never)
        self.assertIsNone(decision.retry_after_ms)

    def test_status_spends_nothing(self) -> None:
        key = fresh_key()
        before = self.client.status("pair", key)
        again = self.client.status("pair", key)
        self.assertTrue(before.allowed)
        self.assertEqual(before.remaining, 2)
        self.assertEqual(again.remaining, 2)
        self.client.check("pair", key)
        self.assertEqual(self.client.status("pair", key).remaining, 1)

    def test_status_of_an_exhausted_key_is_200_and_not_allowed(self) -> None:
        key = fresh_key()
        self.client.check("minute", key)
        status = self.client.status("minute", key)
        self.assertEqual((status.status, status.allowed), (200, False))
        self.assertGreater(status.retry_after_ms, 50_000)

    def test_unknown_rule_is_a_bad_request_with_the_servers_error(self) -> None:
        with self.assertRaises(gossamer.BadRequest) as caught:
            self.client.check("no-such-rule", "k")
        self.assertEqual((caught.exception.status, caught.exception.error), (404, "unknown_rule"))
        self.assertIn("no-such-rule", caught.exception.message)

    def test_invalid_cost_is_a_bad_request_even_failing_open(self) -> None:
        client = gossamer.Client(node.url, fail_open=True)
        with self.assertRaises(gossamer.BadRequest) as caught:
            client.check("pair", "k", cost=0)
        self.assertEqual((caught.exception.status, caught.exception.error), (400, "invalid_cost"))
        client.close()

    def test_keys_and_rules_are_sent_as_given(self) -> None:
        key = "user/42 &?=é\"quote"
        decision = self.client.check("pair", key)
        self.assertEqual(decision.key, key)
        self.assertEqual(self.client.status("pair", key).remaining, 1)

    def test_requests_reuse_one_keep_alive_connection(self) -> None:
        connects = []
        original = gossamer._sync._Connection.connect

        def counting(conn):  # type: ignore[no-untyped-def]
            connects.append(1)
            original(conn)

        gossamer._sync._Connection.connect = counting  # type: ignore[method-assign]
        try:
            for _ in range(20):
                self.client.check("ten", fresh_key())
        finally:
            gossamer._sync._Connection.connect = original  # type: ignore[method-assign]
        self.assertEqual(len(connects), 1)

    def test_wait_ms_lets_a_shaping_rule_hold_the_call_past_the_read_timeout(self) -> None:
        key = fresh_key()
        with gossamer.Client(node.url, timeout=0.2) as client:
            self.assertTrue(client.check("shaped", key).allowed)
            self.assertFalse(client.check("shaped", key).allowed)  # no wait_ms: denied
            held = client.check("shaped", key, wait_ms=1500)
        # Held up to 500 ms by the node, past the 200 ms read timeout: it grew by wait_ms.
        self.assertTrue(held.allowed)
        self.assertGreater(held.waited_ms, 200)
        self.assertLessEqual(held.waited_ms, 500)

    def test_threads_share_one_client(self) -> None:
        key = fresh_key()
        admitted = []

        def worker() -> None:
            for _ in range(5):
                admitted.append(self.client.check("ten", key).allowed)

        threads = [threading.Thread(target=worker) for _ in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=30)
        self.assertEqual((len(admitted), sum(admitted)), (30, 10))
        self.assertLessEqual(len(self.client._idle), 6)

    def test_type_errors_are_caught_before_the_network(self) -> None:
        with self.assertRaises(TypeError):
            self.client.check("pair", 42)  # type: ignore[arg-type]
        with self.assertRaises(TypeError):
            self.client.check("pair", "k", cost=1.5)  # type: ignore[arg-type]


class AcquireTest(unittest.TestCase):
    def test_a_10_per_second_rule_waits_about_100_ms_not_a_second(self) -> None:
        sleep = Recorder()
        with gossamer.Client(node.url, sleep=sleep) as client:
            key = fresh_key()
            client.check("tenth", key)
            started = time.monotonic()
            decision = client.acquire("tenth", key, timeout=5.0)
            elapsed = time.monotonic() - started
        self.assertTrue(decision.allowed)
        # One wait of at most the node's 100 ms plus 10% jitter; Retry-After would say 1 s.
        self.assertGreaterEqual(len(sleep.asked), 1)
        self.assertLessEqual(len(sleep.asked), 2)
        self.assertGreater(sleep.asked[0], 0)
        self.assertLessEqual(sleep.asked[0], 0.1 * 1.1 + 1e-9)
        self.assertLess(elapsed, 0.9, "waited like a whole-second Retry-After")

    def test_jitter_only_adds_to_the_nodes_wait(self) -> None:
        fake = FakeTime()
        client = gossamer.Client(
            node.url, sleep=fake.sleep, monotonic=fake.monotonic, rng=random.Random(7), jitter=0.5
        )
        key = fresh_key()
        client.check("minute", key)
        denied = client.check("minute", key)
        with self.assertRaises(gossamer.RateLimited):
            client.acquire("minute", key, timeout=300.0)
        # Each sleep is between the node's wait and 1.5 times it, never past the deadline.
        self.assertGreaterEqual(len(fake.asked), 3)
        for asked in fake.asked:
            self.assertGreaterEqual(asked, 50.0)
            self.assertLessEqual(asked, denied.retry_after_ms / 1000 * 1.5 + 0.01)
        self.assertLessEqual(sum(fake.asked), 300.0)
        client.close()

    def test_acquire_never_sleeps_past_its_timeout(self) -> None:
        fake = FakeTime()
        client = gossamer.Client(node.url, sleep=fake.sleep, monotonic=fake.monotonic)
        key = fresh_key()
        client.check("minute", key)
        with self.assertRaises(gossamer.RateLimited) as caught:
            client.acquire("minute", key, timeout=150.0)
        # The node's clock does not move with the fake one: every attempt is denied for
        # ~60 s (up to 66 with jitter), so the client sleeps twice (120-132 s) and gives up
        # rather than sleep a third time past 150 s.
        self.assertEqual(len(fake.asked), 2)
        self.assertLessEqual(sum(fake.asked), 150.0)
        self.assertFalse(caught.exception.decision.allowed)
        client.close()

    def test_a_wait_longer_than_the_timeout_raises_at_once(self) -> None:
        sleep = Recorder()
        with gossamer.Client(node.url, sleep=sleep) as client:
            key = fresh_key()
            client.check("minute", key)
            started = time.monotonic()
            with self.assertRaises(gossamer.RateLimited) as caught:
                client.acquire("minute", key, timeout=2.0)
            elapsed = time.monotonic() - started
        self.assertEqual(sleep.asked, [])
        self.assertLess(elapsed, 1.0)
        self.assertGreater(caught.exception.retry_after_ms, 50_000)

    def test_timeout_zero_is_one_check(self) -> None:
        sleep = Recorder()
        with gossamer.Client(node.url, sleep=sleep) as client:
            key = fresh_key()
            self.assertTrue(client.acquire("tenth", key, timeout=0).allowed)
            with self.assertRaises(gossamer.RateLimited):
                client.acquire("tenth", key, timeout=0)
        self.assertEqual(sleep.asked, [])

    def test_a_cost_that_can_never_fit_raises_never_admitted_without_waiting(self) -> None:
        sleep = Recorder()
        with gossamer.Client(node.url, sleep=sleep) as client:
            with self.assertRaises(gossamer.NeverAdmitted) as caught:
                client.acquire("pair", fresh_key(), cost=5, timeout=10.0)
        self.assertEqual(sleep.asked, [])
        self.assertIsInstance(caught.exception, gossamer.RateLimited)
        self.assertIsNone(caught.exception.retry_after_ms)


class NodeDownTest(unittest.TestCase):
    def test_no_node_fails_closed_with_unavailable(self) -> None:
        client = gossamer.Client(f"http://127.0.0.1:{closed_port()}")
        with self.assertRaises(gossamer.Unavailable):
            client.check("pair", "k")
        with self.assertRaises(gossamer.Unavailable):
            client.acquire("pair", "k", timeout=1.0)
        with self.assertRaises(gossamer.Unavailable):
            client.status("pair", "k")

    def test_no_node_fails_open_with_an_admitting_decision(self) -> None:
        client = gossamer.Client(f"http://127.0.0.1:{closed_port()}", fail_open=True)
        with self.assertLogs("gossamer", "WARNING"):
            decision = client.check("pair", "k")
        self.assertTrue(decision.allowed)
        self.assertTrue(decision.failed_open)
        self.assertEqual(decision.outcome, gossamer.FAIL_OPEN)
        self.assertIsNone(decision.remaining)
        with self.assertLogs("gossamer", "WARNING"):
            self.assertTrue(client.acquire("pair", "k", timeout=1.0).failed_open)
        # Nothing is admitted by a status, so it does not fail open.
        with self.assertRaises(gossamer.Unavailable):
            client.status("pair", "k")

    def test_a_node_that_never_answers_times_out(self) -> None:
        with Silent() as silent:
            for fail_open in (False, True):
                client = gossamer.Client(silent.url, timeout=0.3, fail_open=fail_open)
                started = time.monotonic()
                if fail_open:
                    with self.assertLogs("gossamer", "WARNING"):
                        self.assertTrue(client.check("pair", "k").failed_open)
                else:
                    with self.assertRaises(gossamer.Unavailable):
                        client.check("pair", "k")
                self.assertLess(time.monotonic() - started, 2.0)
                client.close()

    def test_a_node_killed_between_calls_is_unavailable_then_failed_open(self) -> None:
        with Node(RULES) as own:
            closed = gossamer.Client(own.url)
            opened = gossamer.Client(own.url, fail_open=True)
            self.assertTrue(closed.check("pair", "k").allowed)
            self.assertEqual(opened.check("pair", "k").outcome, "allowed")
            own.stop()
            # The pooled keep-alive connection is dead: retried once on a new one, refused.
            with self.assertRaises(gossamer.Unavailable):
                closed.check("pair", "k")
            with self.assertLogs("gossamer", "WARNING"):
                self.assertTrue(opened.check("pair", "k").failed_open)


    def test_a_restarted_node_is_reached_through_a_stale_keep_alive_connection(self) -> None:
        port = closed_port()
        client = gossamer.Client(f"http://127.0.0.1:{port}")
        with Node(RULES, port=port):
            self.assertTrue(client.check("pair", "k").allowed)
        self.assertEqual(len(client._idle), 1)  # the dead node's connection, still pooled
        with Node(RULES, port=port):
            # A new node, new counts: the pooled connection fails unanswered and the check is
            # sent again on a new one.
            decision = client.check("pair", "k")
            self.assertEqual((decision.allowed, decision.remaining), (True, 1))
        client.close()


class DecoratorTest(unittest.TestCase):
    def test_sync_function_runs_only_when_admitted(self) -> None:
        client = gossamer.Client(node.url)
        calls = []
        prefix = fresh_key()

        @client.rate_limited("pair", key=lambda user: f"{prefix}-{user}")
        def handle(user: str) -> str:
            calls.append(user)
            return f"done {user}"

        self.assertEqual(handle("ann"), "done ann")
        self.assertEqual(handle("ann"), "done ann")
        with self.assertRaises(gossamer.RateLimited):
            handle("ann")
        self.assertEqual(handle("bob"), "done bob")  # another key
        self.assertEqual(calls, ["ann", "ann", "bob"])
        self.assertEqual(handle.__name__, "handle")
        client.close()

    def test_fixed_key_and_callable_cost(self) -> None:
        client = gossamer.Client(node.url)
        key = fresh_key()

        @client.rate_limited("ten", key=key, cost=lambda n: n)
        def spend(n: int) -> int:
            return n

        self.assertEqual(spend(6), 6)
        with self.assertRaises(gossamer.RateLimited):
            spend(5)
        self.assertEqual(spend(4), 4)
        self.assertEqual(client.status("ten", key).remaining, 0)
        client.close()

    def test_decorator_with_timeout_waits_in_milliseconds(self) -> None:
        sleep = Recorder()
        client = gossamer.Client(node.url, sleep=sleep)
        key = fresh_key()

        @client.rate_limited("tenth", key=key, timeout=2.0)
        def work() -> str:
            return "ok"

        self.assertEqual([work(), work(), work()], ["ok", "ok", "ok"])
        self.assertGreaterEqual(len(sleep.asked), 2)
        self.assertTrue(all(s <= 0.11 for s in sleep.asked), sleep.asked)
        client.close()

    def test_sync_client_decorates_async_functions(self) -> None:
        client = gossamer.Client(node.url)
        key = fresh_key()

        @client.rate_limited("pair", key=key)
        async def handle() -> str:
            await asyncio.sleep(0)
            return "ok"

        async def main() -> list:
            results = [await handle(), await handle()]
            with self.assertRaises(gossamer.RateLimited):
                await handle()
            return results

        self.assertEqual(asyncio.run(main()), ["ok", "ok"])
        client.close()


class AsyncClientTest(unittest.TestCase):
    def run_async(self, coroutine):  # type: ignore[no-untyped-def]
        return asyncio.run(asyncio.wait_for(coroutine, 30))

    def test_check_status_and_429(self) -> None:
        async def main() -> None:
            async with gossamer.AsyncClient(node.url) as client:
                key = fresh_key()
                self.assertTrue((await client.check("pair", key)).allowed)
                self.assertEqual((await client.status("pair", key)).remaining, 1)
                await client.check("pair", key)
                denied = await client.check("pair", key)
                self.assertEqual((denied.allowed, denied.status), (False, 429))
                self.assertGreater(denied.retry_after_ms, 1_700_000)
                with self.assertRaises(gossamer.BadRequest) as caught:
                    await client.check("no-such-rule", key)
                self.assertEqual(caught.exception.error, "unknown_rule")

        self.run_async(main())

    def test_concurrent_checks_admit_exactly_the_limit(self) -> None:
        async def main() -> list:
            async with gossamer.AsyncClient(node.url) as client:
                key = fresh_key()
                return await asyncio.gather(*(client.check("ten", key) for _ in range(25)))

        decisions = self.run_async(main())
        self.assertEqual(sum(d.allowed for d in decisions), 10)
        self.assertEqual(sum(d.status == 429 for d in decisions), 15)

    def test_acquire_waits_in_milliseconds(self) -> None:
        asked: list[float] = []

        async def sleep(seconds: float) -> None:
            asked.append(seconds)
            await asyncio.sleep(seconds)

        async def main() -> gossamer.Decision:
            async with gossamer.AsyncClient(node.url, sleep=sleep) as client:
                key = fresh_key()
                await client.check("tenth", key)
                return await client.acquire("tenth", key, timeout=5.0)

        self.assertTrue(self.run_async(main()).allowed)
        self.assertIn(len(asked), (1, 2))
        self.assertTrue(0 < asked[0] <= 0.11, asked)

    def test_acquire_never_sleeps_past_its_timeout(self) -> None:
        fake = FakeTime()

        async def main() -> None:
            async with gossamer.AsyncClient(
                node.url, sleep=fake.async_sleep, monotonic=fake.monotonic
            ) as client:
                key = fresh_key()
                await client.check("minute", key)
                with self.assertRaises(gossamer.RateLimited):
                    await client.acquire("minute", key, timeout=150.0)
                with self.assertRaises(gossamer.NeverAdmitted):
                    await client.acquire("pair", key, cost=9, timeout=5)

        self.run_async(main())
        self.assertEqual(len(fake.asked), 2)
        self.assertLessEqual(sum(fake.asked), 150.0)

    def test_decorator(self) -> None:
        calls = []

        async def main() -> None:
            async with gossamer.AsyncClient(node.url) as client:
                prefix = fresh_key()

                @client.rate_limited("pair", key=lambda user: f"{prefix}-{user}")
                async def handle(user: str) -> str:
                    calls.append(user)
                    return user

                self.assertEqual(await handle("ann"), "ann")
                self.assertEqual(await handle("ann"), "ann")
                with self.assertRaises(gossamer.RateLimited):
                    await handle("ann")

                with self.assertRaises(TypeError):

                    @client.rate_limited("pair", key="k")
                    def plain() -> None:
                        pass

        self.run_async(main())
        self.assertEqual(calls, ["ann", "ann"])

    def test_node_down_and_silent(self) -> None:
        async def main() -> None:
            down = f"http://127.0.0.1:{closed_port()}"
            async with gossamer.AsyncClient(down) as client:
                with self.assertRaises(gossamer.Unavailable):
                    await client.check("pair", "k")
            async with gossamer.AsyncClient(down, fail_open=True) as client:
                with self.assertLogs("gossamer", "WARNING"):
                    self.assertTrue((await client.acquire("pair", "k", timeout=1)).failed_open)
            with Silent() as silent:
                async with gossamer.AsyncClient(silent.url, timeout=0.3) as client:
                    started = time.monotonic()
                    with self.assertRaises(gossamer.Unavailable):
                        await client.check("pair", "k")
                    self.assertLess(time.monotonic() - started, 2.0)

        self.run_async(main())

    def test_a_node_killed_between_calls(self) -> None:
        async def main() -> None:
            with Node(RULES) as own:
                async with gossamer.AsyncClient(own.url) as client:
                    self.assertTrue((await client.check("pair", "k")).allowed)
                    own.stop()
                    with self.assertRaises(gossamer.Unavailable):
                        await client.check("pair", "k")

        self.run_async(main())

    def test_a_restarted_node_is_reached_through_a_stale_keep_alive_connection(self) -> None:
        port = closed_port()

        async def main() -> gossamer.Decision:
            async with gossamer.AsyncClient(f"http://127.0.0.1:{port}") as client:
                with Node(RULES, port=port):
                    await client.check("pair", "k")
                self.assertEqual(len(client._idle), 1)
                with Node(RULES, port=port):
                    return await client.check("pair", "k")

        decision = self.run_async(main())
        self.assertEqual((decision.allowed, decision.remaining), (True, 1))

    def test_cancelling_a_call_cancels_it_even_failing_open(self) -> None:
        # Cancellation is the caller's, not an outage: it must not become a fail-open
        # admission, and the interrupted connection must not go back to the pool.
        async def main() -> int:
            with Silent() as silent:
                async with gossamer.AsyncClient(silent.url, timeout=5, fail_open=True) as client:
                    task = asyncio.ensure_future(client.check("pair", "k"))
                    await asyncio.sleep(0.1)
                    task.cancel()
                    with self.assertRaises(asyncio.CancelledError):
                        await task
                    return len(client._idle)

        self.assertEqual(self.run_async(main()), 0)

    def test_keep_alive_reuse(self) -> None:
        async def main() -> int:
            async with gossamer.AsyncClient(node.url) as client:
                for _ in range(10):
                    await client.check("ten", fresh_key())
                return len(client._idle)

        self.assertEqual(self.run_async(main()), 1)


if __name__ == "__main__":
    sys.exit(unittest.main())
