"""A client for gossamer, the cluster-native rate limiter: ask the node on this machine
whether a key may spend a cost under a rule.

    import gossamer

    client = gossamer.Client("http://127.0.0.1:7070", fail_open=True)
    decision = client.check("api", "user-42")          # a Decision, admitted or not
    client.acquire("api", "user-42", timeout=2.0)       # waits, or raises RateLimited

    @client.rate_limited("api", key=lambda user: user)
    def handle(user): ...

:class:`AsyncClient` has the same calls as coroutines. Standard library only.
"""

from ._async import AsyncClient
from ._common import (
    FAIL_OPEN,
    BadRequest,
    Decision,
    GossamerError,
    NeverAdmitted,
    RateLimited,
    Unavailable,
)
from ._sync import Client

__version__ = "0.1.0"

__all__ = [
    "AsyncClient",
    "BadRequest",
    "Client",
    "Decision",
    "FAIL_OPEN",
    "GossamerError",
    "NeverAdmitted",
    "RateLimited",
    "Unavailable",
    "__version__",
]
