"""The blocking client, on http.client with a small pool of keep-alive connections."""

from __future__ import annotations

import asyncio
import functools
import http.client
import inspect
import logging
import random
import socket
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional, Tuple, TypeVar, Union

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

log = logging.getLogger("gossamer")

F = TypeVar("F", bound=Callable[..., Any])

USER_AGENT = "gossamer-python/0.1.0"

# A connection taken from the pool may have been closed by the node while idle; the request
# then fails before any answer arrives. Only these errors, and only on a reused connection,
# are retried (once, on a new connection).
_STALE = (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError)


@dataclass(frozen=True)
class Reservation(_Reserved):
    """What :meth:`Client.reserve` returns: the node's :class:`Decision` (``allowed``,
    ``remaining``, ... and ``reservation``, the id when admitted), the reserved ``cost``, and
    a way to settle it.

    As a context manager it enters only when admitted (else raises :class:`RateLimited`, or
    :class:`NeverAdmitted`) and makes sure the reservation is settled when the block ends::

        with client.reserve("llm", user, 2000) as r:
            reply = model.complete(prompt)
            r.settle(reply.usage.total_tokens)

    A block left without a settle (an exception, or none was made) settles at the reserved
    cost: the estimate stands, and the node forgets the reservation at once instead of at
    its ``reservation_timeout``.
    """

    def settle(self, cost: int) -> Optional[Settlement]:
        """Settles with the actual `cost` (see :meth:`Client.settle`)."""
        return self._client.settle(self, cost)

    def __enter__(self) -> "Reservation":
        self._enter()
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if self.settled:
            return
        if exc_type is None:
            self._client.settle(self, self.cost)
            return
        # Already failing: do not hide that error behind one of the settle's.
        try:
            self._client.settle(self, self.cost)
        except GossamerError as e:
            log.warning("gossamer: settling reservation %s at its estimate failed: %s", self.reservation, e)


class _Connection(http.client.HTTPConnection):
    """An HTTPConnection whose connect has its own (short) timeout, then uses `timeout` for
    every read and write."""

    def __init__(self, host: str, port: int, connect_timeout: float, timeout: float):
        super().__init__(host, port, timeout=timeout)
        self._connect_timeout = connect_timeout

    def connect(self) -> None:
        self.sock = socket.create_connection((self.host, self.port), self._connect_timeout)
        self.sock.settimeout(self.timeout)
        # Small requests, answered at once: do not let Nagle hold the next one back.
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


class Client:
    """A blocking client of one gossamer node. Thread-safe: threads share its pool of
    keep-alive connections. Use one per process (or per node URL) and close it at exit, or
    use it as a context manager.

    - `url`: the node, ``http://host:port`` (a path prefix is kept, for a node behind a proxy).
    - `fail_open`: when the node cannot be reached, does not answer within the timeouts, or
      answers with a 5xx, ``True`` admits the call (a :class:`Decision` with outcome
      ``"fail_open"``, logged as a warning) and ``False`` raises :class:`Unavailable`.
      A 4xx is the caller's mistake and always raises :class:`BadRequest`.
    - `timeout`: seconds to wait for each read or write of a request once connected;
      `connect_timeout`: seconds to wait for a connection (short: the node is local).
    - `jitter`: up to this fraction of the node's wait is added to each wait of
      :meth:`acquire`, so denied callers do not return together.
    - `sleep`, `monotonic`, `rng`: what :meth:`acquire` sleeps with, reads the time from and
      draws jitter from; tests replace them.
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
        sleep: Callable[[float], None] = time.sleep,
        monotonic: Callable[[], float] = time.monotonic,
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
        self._lock = threading.Lock()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"gossamer.Client({self.url!r}, fail_open={self.fail_open})"

    def close(self) -> None:
        """Closes the idle connections. The client stays usable (it reconnects)."""
        with self._lock:
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()

    def check(self, rule: str, key: str, cost: int = 1, *, wait_ms: int = 0) -> Decision:
        """Asks whether `key` may spend `cost` under `rule` now, and spends it if so.

        Returns the node's :class:`Decision`, admitted or not (a denial is an answer, not an
        error). `wait_ms`: on a shaping leaky-bucket rule, let the node hold the call up to
        this long rather than deny it (the read timeout grows by as much).
        """
        check_arguments(rule, key, cost)
        body = check_body(rule, key, cost, wait_ms)
        path = f"{self._endpoint.prefix}/v1/check"
        try:
            status, answer = self._request("POST", path, body, self._timeout + wait_ms / 1000)
            return read_answer(status, answer)
        except Unavailable as e:
            if not self.fail_open:
                raise
            log.warning("gossamer unavailable, failing open: rule=%s key=%s: %s", rule, key, e)
            return fail_open_decision(rule, key)

    def acquire(self, rule: str, key: str, cost: int = 1, timeout: float = 10.0) -> Decision:
        """Checks until admitted, sleeping between attempts for the node's ``retry_after_ms``
        (plus jitter), and returns the admitting :class:`Decision`.

        Raises :class:`RateLimited` as soon as the node's wait would end after `timeout`
        seconds from the call (at once for ``timeout=0`` or a wait longer than the timeout:
        it never sleeps past it), and :class:`NeverAdmitted` at once when the cost can never
        fit. Each attempt may add up to the client's own timeout when the node is slow.
        """
        if timeout < 0:
            raise ValueError("timeout must be >= 0")
        deadline = self._monotonic() + timeout
        while True:
            decision = self.check(rule, key, cost)
            if decision.allowed:
                return decision
            if decision.never:
                raise NeverAdmitted(decision)
            wait = next_wait(decision, self._monotonic(), deadline, self._jitter, self._rng)
            if wait is None:
                raise RateLimited(decision)
            self._sleep(wait)

    def status(self, rule: str, key: str) -> Decision:
        """The key's state under `rule` without spending anything (``GET /v1/status``):
        ``allowed`` and ``retry_after_ms`` say whether a check of cost 1 would pass now.
        Raises :class:`Unavailable` when the node cannot be reached, failing open or not:
        nothing is admitted here, so there is nothing to fail open to."""
        check_arguments(rule, key, 1)
        status, answer = self._request(
            "GET", status_path(self._endpoint.prefix, rule, key), None, self._timeout
        )
        return read_answer(status, answer)

    def reserve(self, rule: str, key: str, cost: int, *, wait_ms: int = 0) -> Reservation:
        """Checks `cost` as :meth:`check` does (the node charges it at once) and, admitted,
        holds it as a reservation to settle with the actual cost once known (the tokens of
        a completion): a :class:`Reservation`, whose ``reservation`` is the node's id (``None``
        when denied, or when failing open). Also a context manager that settles on exit.

        A reservation not settled within the node's ``reservation_timeout`` (10 minutes by
        default) expires, and its estimate stands.
        """
        check_arguments(rule, key, cost)
        body = check_body(rule, key, cost, wait_ms)
        path = f"{self._endpoint.prefix}/v1/reserve"
        try:
            status, answer = self._request("POST", path, body, self._timeout + wait_ms / 1000)
            decision = read_answer(status, answer)
        except Unavailable as e:
            if not self.fail_open:
                raise
            log.warning("gossamer unavailable, failing open: rule=%s key=%s: %s", rule, key, e)
            decision = fail_open_decision(rule, key)
        return reserved_from(decision, cost, self, Reservation)

    def settle(self, reservation: Union[Decision, str], cost: int) -> Optional[Settlement]:
        """Settles a reservation (a :meth:`reserve` decision, or its ``reservation`` id) with
        the `cost` the work actually had: the node gives back the difference below the
        reservation (as far as its window is still open or its bucket has not refilled), or
        charges the excess above it. Returns the node's :class:`Settlement`.

        Raises :class:`BadRequest` when the node refuses: ``unknown_reservation`` (404),
        ``already_settled`` (409), ``reservation_expired`` (410: the estimate stood),
        ``invalid_cost`` (400). When the node cannot be reached, raises
        :class:`Unavailable`, or with ``fail_open=True`` logs a warning and returns ``None``
        (the reservation keeps its estimate). A fail-open reservation has nothing to settle:
        ``None``. A denied one raises ``ValueError``.
        """
        target = settle_target(reservation)
        state = reservation._state if isinstance(reservation, _Reserved) else {}
        if target is None:
            state["settled"] = True
            return None
        body = settle_body(target, cost)
        path = f"{self._endpoint.prefix}/v1/settle"
        try:
            status, answer = self._request("POST", path, body, self._timeout)
        except Unavailable as e:
            if not self.fail_open:
                raise
            log.warning("gossamer unavailable, reservation %s keeps its estimate: %s", target, e)
            state["settled"] = True
            return None
        # The node answered: settled, or refused for good (settling again cannot help).
        state["settled"] = True
        settlement = read_settlement(status, answer)
        state["settlement"] = settlement
        return settlement

    def rate_limited(
        self, rule: str, *, key: Keyish, cost: Costish = 1, timeout: float = 0.0
    ) -> Callable[[F], F]:
        """Decorates a function (sync or ``async def``) so that each call is first admitted
        under `rule`.

        `key` and `cost` are values or callables given the function's arguments
        (``key=lambda user, **_: user.id``). With ``timeout=0`` a denied call raises
        :class:`RateLimited` at once; otherwise it waits as :meth:`acquire` does. An
        ``async def`` function's check runs in a worker thread (``asyncio.to_thread``), so
        the event loop is not blocked; prefer :class:`AsyncClient` in async code.
        """

        def decorate(fn: F) -> F:
            if inspect.iscoroutinefunction(fn):

                @functools.wraps(fn)
                async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
                    k, c = resolve(key, args, kwargs), resolve(cost, args, kwargs)
                    await asyncio.to_thread(self.acquire, rule, k, c, timeout)
                    return await fn(*args, **kwargs)

                return async_wrapper  # type: ignore[return-value]

            @functools.wraps(fn)
            def wrapper(*args: Any, **kwargs: Any) -> Any:
                self.acquire(rule, resolve(key, args, kwargs), resolve(cost, args, kwargs), timeout)
                return fn(*args, **kwargs)

            return wrapper  # type: ignore[return-value]

        return decorate

    def _request(
        self, method: str, path: str, body: Optional[bytes], timeout: float
    ) -> Tuple[int, bytes]:
        """One request on a pooled connection: the status and the whole body. Every failure
        to get an answer becomes :class:`Unavailable`."""
        headers = {"User-Agent": USER_AGENT, "Accept": "application/json"}
        if body is not None:
            headers["Content-Type"] = "application/json"
        while True:
            conn, reused = self._take()
            conn.timeout = timeout
            if conn.sock is not None:
                conn.sock.settimeout(timeout)
            try:
                conn.request(method, path, body=body, headers=headers)
                response = conn.getresponse()
                answer = response.read()
            except _STALE as e:
                conn.close()
                if reused:
                    continue  # the next _take may reuse another idle one, or connect anew
                raise Unavailable(f"gossamer at {self.url}: {e!r}") from e
            except (OSError, http.client.HTTPException) as e:
                conn.close()
                raise Unavailable(f"gossamer at {self.url}: {e!r}") from e
            if response.will_close:
                conn.close()
            else:
                self._give(conn)
            return response.status, answer

    def _take(self) -> Tuple[_Connection, bool]:
        with self._lock:
            if self._idle:
                return self._idle.pop(), True
        e = self._endpoint
        return _Connection(e.host, e.port, self._connect_timeout, self._timeout), False

    def _give(self, conn: _Connection) -> None:
        with self._lock:
            if len(self._idle) < self._max_idle:
                self._idle.append(conn)
                return
        conn.close()
