"""A client for gossamer, the cluster-native rate limiter: ask the node on this machine
whether a key may spend a cost under a rule.

    import gossamer

    client = gossamer.Client("http://127.0.0.1:7070", fail_open=True)
    decision = client.check("api", "user-42")          # a Decision, admitted or not
    client.acquire("api", "user-42", timeout=2.0)       # waits, or raises RateLimited

    with client.reserve("llm", "user-42", 2000) as r:   # charge an estimate now...
        r.settle(actual_tokens)                         # ...settle the actual cost after

    @client.rate_limited("api", key=lambda user: user)
    def handle(user): ...

:class:`AsyncClient` has the same calls as coroutines. Standard library only.
"""

from ._async import AsyncClient, AsyncReservation
from ._common import (
    FAIL_OPEN,
    BadRequest,
    Decision,
    GossamerError,
    NeverAdmitted,
    RateLimited,
    Settlement,
    Unavailable,
)
from ._sync import Client, Reservation

__version__ = "0.1.0"

__all__ = [
    "AsyncClient",
    "AsyncReservation",
    "BadRequest",
    "Client",
    "Decision",
    "FAIL_OPEN",
    "GossamerError",
    "NeverAdmitted",
    "RateLimited",
    "Reservation",
    "Settlement",
    "Unavailable",
    "__version__",
]
