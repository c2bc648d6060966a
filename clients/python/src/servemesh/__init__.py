"""servemesh for Python: a client of the controller with Ray Serve's verbs
(servemesh.Client); in servemesh.replica, a runtime that serves a model
class as a servemesh replica (servemesh.asgi: on asyncio); and, inside a
replica, handles that call the mesh's other endpoints
(servemesh.get_handle)."""

# Nothing is imported until it is asked for (PEP 562): python -m
# servemesh.replica imports this package first, from a replica's folder
# on sys.path, and the runtime takes that folder off the path before it
# imports anything (a json.py planted there must not run).
_FROM = {
    "Client": "client",
    "ConflictError": "client",
    "ForbiddenError": "client",
    "InvalidError": "client",
    "NotFoundError": "client",
    "NotLeaderError": "client",
    "NotServedError": "client",
    "ServedTimeoutError": "client",
    "ServemeshError": "client",
    "UnauthorizedError": "client",
    "UnavailableError": "client",
    "HandleError": "handle",
    "get_handle": "handle",
}


def __getattr__(name):
    import importlib

    module = _FROM.get(name)
    if module is None:  # a submodule, as servemesh.handle
        try:
            return importlib.import_module("." + name, __name__)
        except ModuleNotFoundError as e:
            if e.name != f"{__name__}.{name}":
                raise  # the submodule needs a package that is missing
            raise AttributeError(f"module 'servemesh' has no attribute {name!r}") from None
    value = getattr(importlib.import_module("." + module, __name__), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(list(globals()) + list(_FROM))


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
