"""What the sync and asyncio clients share and that does no I/O: the decision, the errors,
reading an answer, the wait between attempts, and the arguments of the decorator."""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field, fields
from typing import Any, Callable, Dict, Mapping, Optional, Union
from urllib.parse import quote, urlsplit

#: How long to wait for a TCP connection to the node. Short: the node is on this machine (or
#: this pod's node), so a connection that takes longer is a node that is not there.
DEFAULT_CONNECT_TIMEOUT = 0.25
#: How long to wait for the node's answer once connected. A check takes microseconds at the
#: node; this is for a node that is overloaded or stopped.
DEFAULT_TIMEOUT = 1.0
#: Extra wait, as a fraction of the node's `retry_after_ms`, drawn uniformly for each retry
#: so that callers denied together do not all come back in the same millisecond. Only ever
#: added: retrying before `retry_after_ms` would be denied again.
DEFAULT_JITTER = 0.1
#: Idle keep-alive connections kept per client.
DEFAULT_MAX_IDLE = 8

#: `Decision.outcome` of a decision made by the client when the node could not be reached
#: and the client fails open.
FAIL_OPEN = "fail_open"


@dataclass(frozen=True)
class Decision:
    """What the node said about one check (or status): the body of its answer.

    ``allowed``: admitted (for a status: whether a check of cost 1 would be admitted now).
    ``remaining``: units that could be spent right now. ``retry_after_ms``: until the same
    check would be admitted, 0 when admitted, ``None`` when it never can be (outcome
    ``"never"``). ``reset_after_ms``: until the key is back to a fresh state. ``limit``: the
    binding limit's units per period. ``outcome``: ``"allowed"``, ``"denied"``, ``"never"``,
    ``"store_full"``, or :data:`FAIL_OPEN` when the node could not be reached and the client
    fails open (then the figures are ``None``). ``waited_ms``: how long a shaping rule held
    the call. ``status``: the HTTP status (200 or 429; 0 for a fail-open decision).
    ``reservation``: an admitted reservation's id (``reserve``; ``None`` otherwise).
    """

    allowed: bool
    rule: str
    key: str
    limit: Optional[int]
    remaining: Optional[int]
    reset_after_ms: Optional[int]
    retry_after_ms: Optional[int]
    outcome: str
    waited_ms: Optional[int] = None
    status: int = 0
    reservation: Optional[str] = None

    @property
    def failed_open(self) -> bool:
        """True when the node could not be reached and the client admitted the call anyway."""
        return self.outcome == FAIL_OPEN

    @property
    def never(self) -> bool:
        """True when the cost can never be admitted under the rule: retrying cannot help."""
        return self.outcome == "never"


class GossamerError(Exception):
    """The base of every error this package raises."""


class RateLimited(GossamerError):
    """The node denied the call, and the caller's timeout (0 for at once) passed.

    ``decision`` is the last denial: ``retry_after_ms`` says how long until it could pass.
    """

    def __init__(self, decision: Decision, message: Optional[str] = None):
        self.decision = decision
        if message is None:
            message = (
                f"rate limited: rule {decision.rule!r}, key {decision.key!r} "
                f"({decision.outcome}, retry after {decision.retry_after_ms} ms)"
            )
        super().__init__(message)

    @property
    def retry_after_ms(self) -> Optional[int]:
        """Milliseconds until the same call could be admitted; ``None`` if it never can."""
        return self.decision.retry_after_ms


class NeverAdmitted(RateLimited):
    """The cost exceeds what the rule can ever admit at once (outcome ``"never"``): waiting
    cannot help, so ``acquire`` raises this at once whatever its timeout."""


class Unavailable(GossamerError):
    """The node could not be reached, did not answer in time, or answered with something
    that is not a gossamer answer (a 5xx, a body that is not JSON). Raised only when the
    client fails closed; failing open, the call is admitted instead."""


class BadRequest(GossamerError):
    """The node refused the request as malformed (a 4xx other than 429), for example an
    unknown rule (404, ``error == "unknown_rule"``) or a cost of 0 (400,
    ``"invalid_cost"``). A bug in the caller, not an outage, so it is raised whether the
    client fails open or closed, and nothing was counted.
    """

    def __init__(self, status: int, error: str, message: str):
        self.status = status
        self.error = error
        self.message = message
        super().__init__(f"HTTP {status} {error}: {message}")


@dataclass(frozen=True)
class Settlement:
    """What the node did when a reservation was settled (``POST /v1/settle``).

    ``reserved``: the reserved cost; ``cost``: the actual cost settled. ``refunded``: units
    given back (less than ``reserved - cost`` when the window closed or the bucket refilled
    meanwhile: the node gives back only what a check of the actual cost would have left).
    ``charged``: units charged beyond the reservation (the key may go past its limit).
    ``unpaid``: units beyond it the node could not charge (a clustered key whose node held no
    room). ``limit``, ``remaining``, ``reset_after_ms``: where the key stands now.
    """

    reservation: str
    rule: str
    key: str
    reserved: int
    cost: int
    refunded: int
    charged: int
    unpaid: int
    limit: Optional[int] = None
    remaining: Optional[int] = None
    reset_after_ms: Optional[int] = None


@dataclass(frozen=True)
class _Reserved(Decision):
    """What the sync and asyncio reservations share: a :class:`Decision` of a reserve, the
    reserved ``cost``, and the settlement once made."""

    cost: int = 0
    _client: Any = field(default=None, repr=False, compare=False)
    _state: Dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @property
    def settlement(self) -> Optional[Settlement]:
        """The node's answer to this reservation's settle, once settled through it."""
        return self._state.get("settlement")

    @property
    def settled(self) -> bool:
        """Whether this reservation was settled through it (or needs none: fail-open)."""
        return "settled" in self._state or self.reservation is None

    def _enter(self) -> None:
        if self.allowed:
            return
        if self.never:
            raise NeverAdmitted(self)
        raise RateLimited(self)


def reserved_from(decision: Decision, cost: int, client: Any, cls: type) -> Any:
    """`decision` (of a reserve of `cost`) as a reservation of type `cls` bound to `client`."""
    values = {f.name: getattr(decision, f.name) for f in fields(Decision)}
    return cls(**values, cost=cost, _client=client)


def settle_target(reservation: Union[Decision, str]) -> Optional[str]:
    """The id to settle: a reservation id, or a reserve's decision (``None``: a fail-open
    decision, nothing to settle)."""
    if isinstance(reservation, str):
        if not reservation:
            raise ValueError("an empty reservation id")
        return reservation
    if isinstance(reservation, Decision):
        if reservation.reservation is not None:
            return reservation.reservation
        if reservation.failed_open:
            return None
        raise ValueError(
            f"nothing to settle: the reserve was not admitted ({reservation.outcome})"
        )
    raise TypeError(
        f"settle takes a reserve's Decision or its reservation id, got {type(reservation).__name__}"
    )


def settle_body(reservation: str, cost: int) -> bytes:
    if isinstance(cost, bool) or not isinstance(cost, int):
        raise TypeError(f"cost must be an int, got {type(cost).__name__}")
    return json.dumps({"reservation": reservation, "cost": cost}, separators=(",", ":")).encode()


def read_settlement(status: int, body: bytes) -> Settlement:
    """The settlement in an answer: 200 carries one; a 4xx raises :class:`BadRequest`
    (``unknown_reservation`` 404, ``already_settled`` 409, ``reservation_expired`` 410,
    ``invalid_cost`` 400); anything else :class:`Unavailable`."""
    try:
        parsed = json.loads(body) if body else None
    except ValueError:
        parsed = None
    if status == 200:
        if not isinstance(parsed, dict):
            raise Unavailable(f"HTTP 200 without a settlement body: {body[:200]!r}")
        try:
            return Settlement(
                reservation=str(parsed["reservation"]),
                rule=str(parsed["rule"]),
                key=str(parsed["key"]),
                reserved=int(parsed["reserved"]),
                cost=int(parsed["cost"]),
                refunded=int(parsed["refunded"]),
                charged=int(parsed["charged"]),
                unpaid=int(parsed["unpaid"]),
                limit=_int_or_none(parsed.get("limit")),
                remaining=_int_or_none(parsed.get("remaining")),
                reset_after_ms=_int_or_none(parsed.get("reset_after_ms")),
            )
        except (KeyError, TypeError, ValueError) as e:
            raise Unavailable(f"HTTP 200 with a malformed settlement: {e!r}") from None
    return _refused(status, parsed, body)


@dataclass(frozen=True)
class Endpoint:
    """Where the node is: host, port and a path prefix (empty, or e.g. ``/gossamer``)."""

    host: str
    port: int
    prefix: str

    @staticmethod
    def parse(url: str) -> "Endpoint":
        parts = urlsplit(url)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"invalid gossamer URL {url!r}: expected http://host:port")
        if parts.query or parts.fragment:
            raise ValueError(f"invalid gossamer URL {url!r}: no query or fragment allowed")
        return Endpoint(parts.hostname, parts.port or 80, parts.path.rstrip("/"))

    @property
    def host_header(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"


def check_body(rule: str, key: str, cost: int, wait_ms: int) -> bytes:
    body: dict[str, Any] = {"rule": rule, "key": key, "cost": cost}
    if wait_ms:
        body["wait_ms"] = wait_ms
    return json.dumps(body, separators=(",", ":")).encode()


def status_path(prefix: str, rule: str, key: str) -> str:
    return f"{prefix}/v1/status?rule={quote(rule, safe='')}&key={quote(key, safe='')}"


def read_answer(status: int, body: bytes) -> Decision:
    """The decision in an answer with this status and body.

    200 and 429 carry a decision; any other 4xx raises :class:`BadRequest`; anything else
    (a 5xx, a body that is not a decision) raises :class:`Unavailable`.
    """
    try:
        parsed = json.loads(body) if body else None
    except ValueError:
        parsed = None
    if status in (200, 429):
        if not isinstance(parsed, dict):
            raise Unavailable(f"HTTP {status} without a decision body: {body[:200]!r}")
        try:
            return Decision(
                allowed=bool(parsed["allowed"]),
                rule=str(parsed["rule"]),
                key=str(parsed["key"]),
                limit=_int_or_none(parsed.get("limit")),
                remaining=_int_or_none(parsed.get("remaining")),
                reset_after_ms=_int_or_none(parsed.get("reset_after_ms")),
                retry_after_ms=_int_or_none(parsed.get("retry_after_ms")),
                outcome=str(parsed["outcome"]),
                waited_ms=_int_or_none(parsed.get("waited_ms")),
                status=status,
                reservation=_str_or_none(parsed.get("reservation")),
            )
        except (KeyError, TypeError, ValueError) as e:
            raise Unavailable(f"HTTP {status} with a malformed decision: {e!r}") from None
    return _refused(status, parsed, body)


def _refused(status: int, parsed: Any, body: bytes) -> Any:
    """Raises what an answer that is not the expected one means."""
    # 408 means the node did not receive the request in time: the network, not the caller.
    if 400 <= status < 500 and status != 408:
        if isinstance(parsed, dict) and "error" in parsed:
            raise BadRequest(status, str(parsed["error"]), str(parsed.get("message", "")))
        raise BadRequest(status, "http_error", body[:200].decode("utf-8", "replace"))
    raise Unavailable(f"HTTP {status}: {body[:200].decode('utf-8', 'replace')}")


def _int_or_none(value: Any) -> Optional[int]:
    return None if value is None else int(value)


def _str_or_none(value: Any) -> Optional[str]:
    return None if value is None else str(value)


def fail_open_decision(rule: str, key: str) -> Decision:
    return Decision(
        allowed=True,
        rule=rule,
        key=key,
        limit=None,
        remaining=None,
        reset_after_ms=None,
        retry_after_ms=None,
        outcome=FAIL_OPEN,
    )


def next_wait(
    decision: Decision, now: float, deadline: float, jitter: float, rng: random.Random
) -> Optional[float]:
    """Seconds to sleep before asking again after the denial `decision`, or ``None`` to give
    up (raise :class:`RateLimited`): when the node's wait ends after `deadline`.

    The wait is the node's ``retry_after_ms`` (milliseconds, not the whole-second
    ``Retry-After`` header, which would turn a 10/s rule's 100 ms into a second) plus up to
    `jitter` of it; jitter never takes the sleep past the deadline.
    """
    if decision.retry_after_ms is None:
        return None
    # A denial always carries at least 1 ms; guard against 0 so a loop cannot spin.
    wait = max(decision.retry_after_ms, 1) / 1000.0
    left = deadline - now
    if wait > left:
        return None
    return min(wait * (1.0 + rng.uniform(0.0, jitter)), left)


Keyish = Union[str, Callable[..., str]]
Costish = Union[int, Callable[..., int]]


def resolve(value: Any, args: "tuple[Any, ...]", kwargs: Mapping[str, Any]) -> Any:
    """The decorator's `key` or `cost`: the value itself, or what a callable makes of the
    decorated function's arguments."""
    return value(*args, **kwargs) if callable(value) else value


def check_arguments(rule: str, key: str, cost: int) -> None:
    """Refuses what the node would refuse anyway, before the network, when it is a type error
    in the caller's code (the node's own 4xx covers values)."""
    if not isinstance(rule, str) or not isinstance(key, str):
        raise TypeError(f"rule and key must be str, got {type(rule).__name__} and {type(key).__name__}")
    if isinstance(cost, bool) or not isinstance(cost, int):
        raise TypeError(f"cost must be an int, got {type(cost).__name__}")
