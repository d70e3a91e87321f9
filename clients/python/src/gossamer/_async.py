"""The asyncio client, on asyncio streams.

Why its own HTTP/1.1 exchange rather than the blocking client in ``run_in_executor``: a call
waiting in an executor holds a thread (the default executor has a handful), cannot be
cancelled (a cancelled task leaves the thread blocked on the socket), and keeps the
keep-alive pool behind a lock shared with threads. The node speaks a small, fixed subset of
HTTP/1.1 (JSON bodies with a Content-Length); reading that on a stream is short, cancels
cleanly (a connection interrupted mid-answer is closed, never reused) and needs no thread.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
import random
import socket
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Generator, Optional, Tuple, TypeVar, Union

from ._common import (
    DEFAULT_CONNECT_TIMEOUT,
    DEFAULT_JITTER,
    DEFAULT_MAX_IDLE,
    DEFAULT_TIMEOUT,
    Costish,
    Decision,
    Endpoint,
    GossamerError,
    Keyish,
    NeverAdmitted,
    RateLimited,
    Settlement,
    Unavailable,
    _Reserved,
    check_arguments,
    check_body,
    fail_open_decision,
    next_wait,
    read_answer,
    read_settlement,
    reserved_from,
    resolve,
    settle_body,
    settle_target,
    status_path,
)
from ._sync import USER_AGENT

log = logging.getLogger("gossamer")

F = TypeVar("F", bound=Callable[..., Awaitable[Any]])

#: The longest status line or header accepted, and the largest body (the node's answers are
#: a few hundred bytes).
_MAX_LINE = 8 * 1024
_MAX_BODY = 1024 * 1024


@dataclass(frozen=True)
class AsyncReservation(_Reserved):
    """What ``await AsyncClient.reserve(...)`` gives: the same as
    :class:`gossamer.Reservation`, with ``settle`` a coroutine and ``async with`` to settle on
    exit (at the reserved cost unless settled in the block)."""

    async def settle(self, cost: int) -> Optional[Settlement]:
        """Settles with the actual `cost` (see :meth:`gossamer.Client.settle`)."""
        return await self._client.settle(self, cost)

    async def __aenter__(self) -> "AsyncReservation":
        self._enter()
        return self

    async def __aexit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if self.settled:
            return
        if exc_type is None:
            await self._client.settle(self, self.cost)
            return
        try:
            await self._client.settle(self, self.cost)
        except GossamerError as e:
            log.warning("gossamer: settling reservation %s at its estimate failed: %s", self.reservation, e)


class _Reserving:
    """What :meth:`AsyncClient.reserve` returns: ``await`` it for the
    :class:`AsyncReservation`, or ``async with`` it to enter only when admitted and settle on
    exit. Each await (or ``async with``) reserves once."""

    def __init__(self, make: Callable[[], Awaitable[AsyncReservation]]):
        self._make = make
        self._reservation: Optional[AsyncReservation] = None

    def __await__(self) -> Generator[Any, None, AsyncReservation]:
        return self._make().__await__()

    async def __aenter__(self) -> AsyncReservation:
        self._reservation = await self._make()
        return await self._reservation.__aenter__()

    async def __aexit__(self, *exc: Any) -> None:
        assert self._reservation is not None
        await self._reservation.__aexit__(*exc)


class _Stale(Exception):
    """A reused connection was closed before any byte of the answer arrived."""


class _Connection:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self.reader = reader
        self.writer = writer

    def close(self) -> None:
        self.writer.close()


class AsyncClient:
    """The asyncio counterpart of :class:`gossamer.Client`: the same arguments and calls, as
    coroutines (``sleep`` is a coroutine function, ``asyncio.sleep`` by default). Its
    connections belong to the event loop that opened them: use one client per loop, and
    ``await client.aclose()`` (or ``async with``) when done. Concurrent calls each use their
    own connection; up to `max_idle` are kept for reuse.

    Here `timeout` bounds the whole exchange of a request (write, then read the answer), and
    `connect_timeout` the connection.
    """

    def __init__(
        self,
        url: str = "http://127.0.0.1:7070",
        *,
        fail_open: bool = False,
        timeout: float = DEFAULT_TIMEOUT,
        connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
        jitter: float = DEFAULT_JITTER,
        max_idle: int = DEFAULT_MAX_IDLE,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        monotonic: Optional[Callable[[], float]] = None,
        rng: Optional[random.Random] = None,
    ):
        if timeout <= 0 or connect_timeout <= 0:
            raise ValueError("timeout and connect_timeout must be positive")
        self.url = url
        self.fail_open = fail_open
        self._endpoint = Endpoint.parse(url)
        self._timeout = timeout
        self._connect_timeout = connect_timeout
        self._jitter = jitter
        self._max_idle = max_idle
        self._sleep = sleep
        self._monotonic = monotonic
        self._rng = rng or random.Random()
        self._idle: list[_Connection] = []

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()

    def __repr__(self) -> str:
        return f"gossamer.AsyncClient({self.url!r}, fail_open={self.fail_open})"

    async def aclose(self) -> None:
        """Closes the idle connections. The client stays usable (it reconnects)."""
        idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()
        for conn in idle:
            try:
                await conn.writer.wait_closed()
            except OSError:
                pass

    async def check(self, rule: str, key: str, cost: int = 1, *, wait_ms: int = 0) -> Decision:
        """See :meth:`gossamer.Client.check`."""
        check_arguments(rule, key, cost)
        body = check_body(rule, key, cost, wait_ms)
        path = f"{self._endpoint.prefix}/v1/check"
        try:
            status, answer = await self._request(
                "POST", path, body, self._timeout + wait_ms / 1000
            )
            return read_answer(status, answer)
        except Unavailable as e:
            if not self.fail_open:
                raise
            log.warning("gossamer unavailable, failing open: rule=%s key=%s: %s", rule, key, e)
            return fail_open_decision(rule, key)

    async def acquire(
        self, rule: str, key: str, cost: int = 1, timeout: float = 10.0
    ) -> Decision:
        """See :meth:`gossamer.Client.acquire`."""
        if timeout < 0:
            raise ValueError("timeout must be >= 0")
        now = self._monotonic or asyncio.get_running_loop().time
        deadline = now() + timeout
        while True:
            decision = await self.check(rule, key, cost)
            if decision.allowed:
                return decision
            if decision.never:
                raise NeverAdmitted(decision)
            wait = next_wait(decision, now(), deadline, self._jitter, self._rng)
            if wait is None:
                raise RateLimited(decision)
            await self._sleep(wait)

    async def status(self, rule: str, key: str) -> Decision:
        """See :meth:`gossamer.Client.status`."""
        check_arguments(rule, key, 1)
        status, answer = await self._request(
            "GET", status_path(self._endpoint.prefix, rule, key), None, self._timeout
        )
        return read_answer(status, answer)

    def reserve(self, rule: str, key: str, cost: int, *, wait_ms: int = 0) -> _Reserving:
        """See :meth:`gossamer.Client.reserve`: ``r = await client.reserve(...)``, or
        ``async with client.reserve(...) as r:`` to settle on exit."""
        check_arguments(rule, key, cost)
        return _Reserving(lambda: self._reserve(rule, key, cost, wait_ms))

    async def _reserve(self, rule: str, key: str, cost: int, wait_ms: int) -> AsyncReservation:
        body = check_body(rule, key, cost, wait_ms)
        path = f"{self._endpoint.prefix}/v1/reserve"
        try:
            status, answer = await self._request(
                "POST", path, body, self._timeout + wait_ms / 1000
            )
            decision = read_answer(status, answer)
        except Unavailable as e:
            if not self.fail_open:
                raise
            log.warning("gossamer unavailable, failing open: rule=%s key=%s: %s", rule, key, e)
            decision = fail_open_decision(rule, key)
        return reserved_from(decision, cost, self, AsyncReservation)

    async def settle(self, reservation: Union[Decision, str], cost: int) -> Optional[Settlement]:
        """See :meth:`gossamer.Client.settle`."""
        target = settle_target(reservation)
        state = reservation._state if isinstance(reservation, _Reserved) else {}
        if target is None:
            state["settled"] = True
            return None
        body = settle_body(target, cost)
        path = f"{self._endpoint.prefix}/v1/settle"
        try:
            status, answer = await self._request("POST", path, body, self._timeout)
        except Unavailable as e:
            if not self.fail_open:
                raise
            log.warning("gossamer unavailable, reservation %s keeps its estimate: %s", target, e)
            state["settled"] = True
            return None
        state["settled"] = True
        settlement = read_settlement(status, answer)
        state["settlement"] = settlement
        return settlement

    def rate_limited(
        self, rule: str, *, key: Keyish, cost: Costish = 1, timeout: float = 0.0
    ) -> Callable[[F], F]:
        """Decorates an ``async def`` function so that each call is first admitted under
        `rule` (see :meth:`gossamer.Client.rate_limited`). A plain function cannot await the
        check: decorate it with a :class:`gossamer.Client` instead."""

        def decorate(fn: F) -> F:
            if not inspect.iscoroutinefunction(fn):
                raise TypeError(
                    f"AsyncClient.rate_limited needs an async def function, got {fn!r}; "
                    "use gossamer.Client.rate_limited for plain functions"
                )

            @functools.wraps(fn)
            async def wrapper(*args: Any, **kwargs: Any) -> Any:
                k, c = resolve(key, args, kwargs), resolve(cost, args, kwargs)
                await self.acquire(rule, k, c, timeout)
                return await fn(*args, **kwargs)

            return wrapper  # type: ignore[return-value]

        return decorate

    async def _request(
        self, method: str, path: str, body: Optional[bytes], timeout: float
    ) -> Tuple[int, bytes]:
        head = [
            f"{method} {path} HTTP/1.1",
            f"Host: {self._endpoint.host_header}",
            f"User-Agent: {USER_AGENT}",
            "Accept: application/json",
        ]
        if body is not None:
            head += ["Content-Type: application/json", f"Content-Length: {len(body)}"]
        request = ("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + (body or b"")
        while True:
            conn, reused = await self._take()
            try:
                status, answer, keep = await asyncio.wait_for(
                    self._exchange(conn, request, reused), timeout
                )
            except _Stale:
                conn.close()
                continue  # only a reused connection is stale: the pool shrinks each time
            except asyncio.TimeoutError:
                conn.close()
                raise Unavailable(f"gossamer at {self.url}: no answer within {timeout} s") from None
            except (OSError, ValueError, asyncio.IncompleteReadError, asyncio.LimitOverrunError) as e:
                conn.close()
                raise Unavailable(f"gossamer at {self.url}: {e!r}") from e
            except BaseException:
                # Cancelled mid-exchange: the connection's state is unknown, never reuse it.
                conn.close()
                raise
            if keep and len(self._idle) < self._max_idle:
                self._idle.append(conn)
            else:
                conn.close()
            return status, answer

    async def _take(self) -> Tuple[_Connection, bool]:
        if self._idle:
            return self._idle.pop(), True
        e = self._endpoint
        try:
            reader, writer = await asyncio.wait_for(
                asyncio.open_connection(e.host, e.port, limit=_MAX_LINE), self._connect_timeout
            )
        except asyncio.TimeoutError:
            raise Unavailable(
                f"gossamer at {self.url}: no connection within {self._connect_timeout} s"
            ) from None
        except OSError as err:
            raise Unavailable(f"gossamer at {self.url}: {err!r}") from err
        sock = writer.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return _Connection(reader, writer), False

    @staticmethod
    async def _exchange(
        conn: _Connection, request: bytes, reused: bool
    ) -> Tuple[int, bytes, bool]:
        """Writes `request` and reads the answer: status, body, and whether the connection
        may be reused."""
        try:
            conn.writer.write(request)
            await conn.writer.drain()
            status_line = await conn.reader.readline()
        except (BrokenPipeError, ConnectionResetError):
            if reused:
                raise _Stale() from None
            raise
        if not status_line:
            if reused:
                raise _Stale()
            raise ValueError("connection closed before an answer")
        parts = status_line.decode("latin-1").split(None, 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/1."):
            raise ValueError(f"not an HTTP/1.x answer: {status_line[:80]!r}")
        status = int(parts[1])
        headers: dict[str, str] = {}
        while True:
            line = await conn.reader.readline()
            if line in (b"\r\n", b"\n"):
                break
            if not line:
                raise ValueError("connection closed inside the headers")
            name, _, value = line.decode("latin-1").partition(":")
            headers[name.strip().lower()] = value.strip()
        keep = headers.get("connection", "").lower() != "close" and parts[0] == "HTTP/1.1"
        if "chunked" in headers.get("transfer-encoding", "").lower():
            body = await _read_chunked(conn.reader)
        elif "content-length" in headers:
            length = int(headers["content-length"])
            if not 0 <= length <= _MAX_BODY:
                raise ValueError(f"answer body of {length} bytes")
            body = await conn.reader.readexactly(length)
        else:
            body = await conn.reader.read(_MAX_BODY)
            keep = False
        return status, body, keep


async def _read_chunked(reader: asyncio.StreamReader) -> bytes:
    chunks: "list[bytes]" = []
    total = 0
    while True:
        size = int((await reader.readline()).split(b";")[0].strip() or b"x", 16)
        if size == 0:
            while (await reader.readline()) not in (b"\r\n", b"\n", b""):
                pass  # trailers
            return b"".join(chunks)
        total += size
        if total > _MAX_BODY:
            raise ValueError("chunked answer too large")
        chunks.append(await reader.readexactly(size))
        await reader.readline()
