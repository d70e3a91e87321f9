"""Reading the node's answers (no network): what is a decision, what is the caller's mistake,
what is an outage."""

from __future__ import annotations

import random
import unittest

import gossamer
from gossamer._common import Decision, Endpoint, next_wait, read_answer

DENIED = (
    b'{"allowed":false,"rule":"api","key":"u","limit":10,"remaining":0,'
    b'"reset_after_ms":2000,"retry_after_ms":100,"outcome":"denied"}'
)


class ReadAnswerTest(unittest.TestCase):
    def test_429_is_a_decision(self) -> None:
        d = read_answer(429, DENIED)
        self.assertEqual((d.allowed, d.retry_after_ms, d.reset_after_ms, d.status), (False, 100, 2000, 429))
        self.assertIsNone(d.waited_ms)

    def test_4xx_is_a_bad_request_with_the_nodes_error(self) -> None:
        with self.assertRaises(gossamer.BadRequest) as caught:
            read_answer(400, b'{"error":"unknown_field","message":"unknown field \\"cots\\""}')
        self.assertEqual((caught.exception.status, caught.exception.error), (400, "unknown_field"))
        with self.assertRaises(gossamer.BadRequest) as caught:
            read_answer(404, b"not json")
        self.assertEqual(caught.exception.error, "http_error")

    def test_5xx_408_and_garbage_are_outages(self) -> None:
        for status, body in [
            (503, b'{"error":"x"}'),
            (500, b""),
            (408, b'{"error":"request_timeout","message":"m"}'),
            (200, b"<html>proxy</html>"),
            (200, b'{"allowed":true}'),
            (302, b""),
        ]:
            with self.subTest(status=status, body=body):
                with self.assertRaises(gossamer.Unavailable):
                    read_answer(status, body)


class NextWaitTest(unittest.TestCase):
    def denial(self, retry_after_ms):  # type: ignore[no-untyped-def]
        return Decision(False, "r", "k", 1, 0, 0, retry_after_ms, "denied")

    def test_waits_milliseconds_plus_at_most_the_jitter(self) -> None:
        rng = random.Random(1)
        for _ in range(200):
            wait = next_wait(self.denial(100), 0.0, 10.0, 0.1, rng)
            self.assertTrue(0.1 <= wait <= 0.11, wait)

    def test_gives_up_when_the_wait_ends_after_the_deadline(self) -> None:
        rng = random.Random(1)
        self.assertIsNone(next_wait(self.denial(1500), 0.0, 1.0, 0.1, rng))
        self.assertIsNone(next_wait(self.denial(None), 0.0, 100.0, 0.1, rng))
        # Fits, but the jitter would pass the deadline: cut at the deadline.
        self.assertEqual(next_wait(self.denial(1000), 0.0, 1.0, 0.5, random.Random(3)), 1.0)

    def test_zero_wait_on_a_denial_still_sleeps(self) -> None:
        self.assertGreater(next_wait(self.denial(0), 0.0, 1.0, 0.0, random.Random(1)), 0)


class EndpointTest(unittest.TestCase):
    def test_urls(self) -> None:
        self.assertEqual(Endpoint.parse("http://127.0.0.1:7070"), Endpoint("127.0.0.1", 7070, ""))
        self.assertEqual(Endpoint.parse("http://node/gossamer/"), Endpoint("node", 80, "/gossamer"))
        self.assertEqual(Endpoint.parse("http://[::1]:7070").host_header, "[::1]:7070")
        for bad in ["https://x:1", "127.0.0.1:7070", "http://x:1/?a=b", "http://"]:
            with self.subTest(url=bad):
                with self.assertRaises(ValueError):
                    gossamer.Client(bad)


if __name__ == "__main__":
    unittest.main()
