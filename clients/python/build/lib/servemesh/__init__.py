"""servemesh for Python: a client of the controller with Ray Serve's verbs
(servemesh.Client); in servemesh.replica, a runtime that serves a model
class as a servemesh replica (servemesh.asgi: on asyncio); and, inside a
replica, handles that call the mesh's other endpoints
(servemesh.get_handle)."""

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
from .handle import HandleError, get_handle

__all__ = [
    "Client",
    "get_handle",
    "HandleError",
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
