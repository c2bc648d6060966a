"""servemesh for Python: a client of the controller with Ray Serve's verbs
(servemesh.Client) and, in servemesh.replica, a runtime that serves a model
class as a servemesh replica."""

from .client import (
    Client,
    ConflictError,
    ForbiddenError,
    InvalidError,
    NotFoundError,
    NotLeaderError,
    NotServedError,
    ServedTimeoutError,
    ServemeshError,
    UnauthorizedError,
    UnavailableError,
)

__all__ = [
    "Client",
    "ServemeshError",
    "InvalidError",
    "UnauthorizedError",
    "ForbiddenError",
    "NotFoundError",
    "ConflictError",
    "NotLeaderError",
    "NotServedError",
    "ServedTimeoutError",
    "UnavailableError",
]
