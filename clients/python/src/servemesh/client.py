"""A client of servemesh's controller API (/v1/) with Ray Serve 1.x's verbs.

It uses the standard library alone. Every call is idempotent, as the API's
are: a call that reaches no leader, or whose answer is lost, is sent again,
to the leader a follower names (if it is one of the servers given) or to
the next server, until a leader answers or ``failover_wait`` seconds pass.

A call that changes the state returns, as Ray Serve's do, once the change
is served: every connected node serves it, and the backends it names (or
its endpoint sends to) run their replicas, all ready. It asks the
controller (GET /v1/served) until then, or raises NotServedError after
``wait_timeout`` seconds, or at once when it will not be served, saying
what is not. ``wait=False`` (on the client, or on a call) returns once the
controller has stored the change.
"""

from __future__ import annotations

import json
import os
import ssl
import time
import urllib.error
import urllib.parse
import urllib.request
import warnings
from typing import Any, Dict, List, Mapping, Optional, Sequence, Union

from . import _args

LEADER_HEADER = "X-Servemesh-Leader"


class ServemeshError(Exception):
    """An error the controller answered: its HTTP status, kind and message."""

    def __init__(self, status: int, kind: str, message: str, leader: str = ""):
        super().__init__(f"{message} (HTTP {status}, {kind})")
        self.status, self.kind, self.message, self.leader = status, kind, message, leader


class InvalidError(ServemeshError, ValueError):
    """400: the request or the state it would make is invalid (a
    ValueError, as Ray Serve raises for a bad value)."""


class UnauthorizedError(ServemeshError):
    """401: no token, or not one of the controller's."""


class ForbiddenError(ServemeshError):
    """403: the token's scope does not allow it."""


class NotFoundError(ServemeshError, ValueError):
    """404: no such backend or endpoint (a ValueError, as Ray Serve's)."""


class ConflictError(ServemeshError, ValueError):
    """409: it conflicts with the state (a backend in use, a name taken; a
    ValueError, as Ray Serve's)."""


class NotServedError(ServemeshError):
    """The change was stored but is not served: ``waiting`` says what is
    not yet (a line each), ``failed`` why it will not be without another
    change (a replica crash-looping, replicas that cannot be placed)."""

    def __init__(self, message: str, waiting: Sequence[str] = (), failed: str = ""):
        super().__init__(200, "not_served", message)
        self.waiting, self.failed = list(waiting), failed


class ServedTimeoutError(NotServedError, TimeoutError):
    """wait_timeout passed before the change was served."""


class NotLeaderError(ServemeshError):
    """503: no controller given leads (after failover_wait)."""


class UnavailableError(ServemeshError):
    """503: the controller could not reach its store."""


_ERRORS = {
    "invalid": InvalidError,
    "unauthorized": UnauthorizedError,
    "forbidden": ForbiddenError,
    "not_found": NotFoundError,
    "conflict": ConflictError,
    "not_leader": NotLeaderError,
    "unavailable": UnavailableError,
}


def _error(status: int, body: bytes, leader: str) -> ServemeshError:
    try:
        data = json.loads(body)
        kind, message = data.get("kind", ""), data.get("error", "")
        leader = leader or data.get("leader", "")
    except (ValueError, AttributeError):
        kind, message = "", body.decode("utf-8", "replace")[:300]
    cls = _ERRORS.get(kind, ServemeshError)
    return cls(status, kind or "unknown", message or f"HTTP {status}", leader)


class Client:
    """A client of one mesh's controllers.

    servers: "host:port", "https://host:port", or several comma-separated
    (or a list); default $SERVEMESH_SERVER, else 127.0.0.1:18001.
    token, or token_file (default $SERVEMESH_TOKEN_FILE): the bearer token.
    ca_file: the CA bundle that signs an https:// controller's certificate.
    wait: whether calls that change the state return once it is served
    (the default, as Ray Serve's) or once it is stored; wait_timeout bounds
    the wait, in seconds.
    """

    def __init__(
        self,
        servers: Union[str, Sequence[str], None] = None,
        *,
        token: Optional[str] = None,
        token_file: Optional[str] = None,
        ca_file: Optional[str] = None,
        timeout: float = 10.0,
        failover_wait: float = 15.0,
        wait: bool = True,
        wait_timeout: float = 120.0,
    ):
        _args.flag("Client", "wait", wait)
        _args.number("Client", "wait_timeout", wait_timeout)
        if servers is None:
            servers = os.environ.get("SERVEMESH_SERVER", "127.0.0.1:18001")
        if isinstance(servers, str):
            servers = [s for s in (x.strip() for x in servers.split(",")) if s]
        if not servers:
            raise ValueError("servers: name at least one controller, as host:port")
        self._servers = [s if "://" in s else "http://" + s for s in servers]
        token_file = token_file or os.environ.get("SERVEMESH_TOKEN_FILE")
        if token is None and token_file:
            with open(token_file, encoding="utf-8") as f:
                token = f.read().strip()
        self._token = token or ""
        self._context = ssl.create_default_context(cafile=ca_file) if ca_file else None
        self._timeout, self._failover_wait = timeout, failover_wait
        self._leader = 0  # the index of the server that answered last
        self._wait, self._wait_timeout = wait, wait_timeout
        self._served_unknown = False  # the controller predates /v1/served

    # Ray Serve's verbs.

    def create_backend(
        self,
        name: str,
        *,
        replicas: Optional[Sequence[str]] = None,
        process: Optional[Mapping[str, Any]] = None,
        config: Optional[Mapping[str, Any]] = None,
        protocol: Optional[str] = None,
        wait: Optional[bool] = None,
    ) -> bool:
        """Creates a backend: listed replicas ("host:port"), or a process
        spec ({"command": ..., "args": [...], "health_path": ...}) whose
        config["num_replicas"] replicas servemesh runs. Returns whether it
        changed anything (False: the same backend exists), once its
        replicas are ready and every node serves them."""
        _args.name("create_backend", "name", name)
        _args.optional_flag("create_backend", "wait", wait)
        _args.strings("create_backend", "replicas", replicas)
        _args.mapping("create_backend", "process", process, optional=True)
        _args.mapping("create_backend", "config", config, optional=True)
        _args.optional_str("create_backend", "protocol", protocol)
        spec: Dict[str, Any] = {"name": name}
        if replicas is not None:
            spec["replicas"] = [{"address": a} for a in replicas]
        if process is not None:
            spec["process"] = dict(process)
        if config:
            spec["config"] = dict(config)
        if protocol:
            spec["protocol"] = protocol
        return self._changed(self._call("POST", "/v1/backends", spec), wait, backends=[name])

    def create_endpoint(
        self,
        name: str,
        *,
        backend: Optional[str] = None,
        route: Optional[str] = None,
        methods: Optional[Sequence[str]] = None,
        traffic: Optional[Mapping[str, float]] = None,
        models: Optional[Mapping[str, Mapping[str, Any]]] = None,
        model_field: Optional[str] = None,
        criticality: Optional[str] = None,
        wait: Optional[bool] = None,
    ) -> bool:
        """Creates an endpoint sending all its traffic to backend (or split
        by traffic), served at route (none: headless, in the mesh only).
        With models instead ({"llama-3-8b": {"traffic": {...}, "shadows":
        {...}}}), it routes by the model a request's JSON body names (in
        model_field, "model" by default). criticality is what its requests
        are when they do not say: "critical" (the default) or "sheddable".
        Returns once every node routes it to its backends' ready replicas."""
        verb = "create_endpoint"
        _args.name(verb, "name", name)
        _args.optional_flag(verb, "wait", wait)
        for arg, value in (("backend", backend), ("route", route), ("model_field", model_field), ("criticality", criticality)):
            _args.optional_str(verb, arg, value)
        _args.strings(verb, "methods", methods)
        _args.weights(verb, "traffic", traffic, optional=True)
        _args.mapping(verb, "models", models, optional=True)
        given = sum(x is not None for x in (backend, traffic, models))
        if given == 0:  # as Ray Serve raised it: an argument missing
            raise TypeError("create_endpoint(): backend must be specified when creating an endpoint (or traffic, or models)")
        if given > 1:
            raise ValueError("create_endpoint(): give backend, traffic or models, one of the three")
        e: Dict[str, Any] = {"name": name}
        if models is not None:
            e["model_routing"] = {"models": {m: dict(p) for m, p in models.items()}}
            if model_field:
                e["model_routing"]["field"] = model_field
        else:
            e["traffic"] = {backend: 1.0} if backend is not None else dict(traffic or {})
        if criticality:
            e["criticality"] = criticality
        if route:
            e["route"] = route
        if methods:
            e["methods"] = list(methods)
        return self._changed(self._call("POST", "/v1/endpoints", e), wait, endpoints=[name])

    def set_traffic(self, endpoint: str, traffic: Mapping[str, float], *, wait: Optional[bool] = None) -> bool:
        """Splits an endpoint's requests over backends by weights summing to
        1; returns once every node splits them so."""
        _args.name("set_traffic", "endpoint", endpoint)
        _args.optional_flag("set_traffic", "wait", wait)
        _args.weights("set_traffic", "traffic", traffic)
        answer = self._call("PUT", f"/v1/endpoints/{_seg(endpoint)}/traffic", {"traffic": dict(traffic)})
        return self._changed(answer, wait, endpoints=[endpoint])

    def shadow_traffic(self, endpoint: str, backend: str, proportion: float, *, wait: Optional[bool] = None) -> bool:
        """Mirrors a proportion (0 to 1; 0 removes it) of an endpoint's
        requests to a backend, whose answers are dropped."""
        _args.name("shadow_traffic", "endpoint", endpoint)
        _args.optional_flag("shadow_traffic", "wait", wait)
        _args.name("shadow_traffic", "backend", backend)
        _args.number("shadow_traffic", "proportion", proportion)
        answer = self._call("PUT", f"/v1/endpoints/{_seg(endpoint)}/shadows/{_seg(backend)}", {"proportion": proportion})
        return self._changed(answer, wait, endpoints=[endpoint])

    def update_backend_config(self, backend: str, config_options: Mapping[str, Any], *, wait: Optional[bool] = None) -> bool:
        """Changes a backend's config: num_replicas, max_concurrent_queries,
        user_config (reaches running replicas without a restart), ... The
        options are a JSON merge patch (RFC 7386): None removes a field
        (back to its default), a dict merges into the one it names."""
        _args.name("update_backend_config", "backend", backend)
        _args.optional_flag("update_backend_config", "wait", wait)
        _args.mapping("update_backend_config", "config_options", config_options)
        answer = self._call("PATCH", f"/v1/backends/{_seg(backend)}", dict(config_options))
        return self._changed(answer, wait, backends=[backend])

    def get_backend(self, backend: str) -> Dict[str, Any]:
        _args.name("get_backend", "backend", backend)
        return self._call("GET", f"/v1/backends/{_seg(backend)}")

    def get_backend_config(self, backend: str) -> Dict[str, Any]:
        return self.get_backend(backend).get("config", {})

    def list_backends(self) -> Dict[str, Dict[str, Any]]:
        """The backends, by name."""
        return {b["name"]: b for b in self._call("GET", "/v1/backends")}

    def get_endpoint(self, endpoint: str) -> Dict[str, Any]:
        _args.name("get_endpoint", "endpoint", endpoint)
        return self._call("GET", f"/v1/endpoints/{_seg(endpoint)}")

    def list_endpoints(self) -> Dict[str, Dict[str, Any]]:
        """The endpoints, by name."""
        return {e["name"]: e for e in self._call("GET", "/v1/endpoints")}

    def get_traffic(self, endpoint: str) -> Dict[str, float]:
        return dict(self.get_endpoint(endpoint).get("traffic", {}))

    def get_shadows(self, endpoint: str) -> Dict[str, float]:
        return dict(self.get_endpoint(endpoint).get("shadows") or {})

    def delete_backend(self, backend: str, *, wait: Optional[bool] = None) -> bool:
        _args.name("delete_backend", "backend", backend)
        _args.optional_flag("delete_backend", "wait", wait)
        return self._changed(self._call("DELETE", f"/v1/backends/{_seg(backend)}"), wait)

    def delete_endpoint(self, endpoint: str, *, wait: Optional[bool] = None) -> bool:
        """Deletes an endpoint; returns once no node routes to it."""
        _args.name("delete_endpoint", "endpoint", endpoint)
        _args.optional_flag("delete_endpoint", "wait", wait)
        return self._changed(self._call("DELETE", f"/v1/endpoints/{_seg(endpoint)}"), wait)

    # servemesh's own.

    def apply(self, spec: Mapping[str, Any], dry_run: bool = False, *, wait: Optional[bool] = None,
              prune_rollouts: bool = False) -> Dict[str, Any]:
        """Makes the whole state the one given ({"backends": [...],
        "endpoints": [...]}), in one change, and returns once it is served;
        dry_run only says what would change. Ended rollouts the spec does
        not declare keep their records (history) unless prune_rollouts."""
        _args.mapping("apply", "spec", spec)
        _args.flag("apply", "dry_run", dry_run)
        _args.optional_flag("apply", "wait", wait)
        _args.flag("apply", "prune_rollouts", prune_rollouts)
        query = "&".join(name + "=true" for name, on in (("dry_run", dry_run), ("prune_rollouts", prune_rollouts)) if on)
        result = self._call("POST", "/v1/apply" + ("?" + query if query else ""), dict(spec))
        if not dry_run:
            backends = [b["name"] for b in spec.get("backends") or [] if isinstance(b, Mapping) and "name" in b]
            self._changed(result, wait, backends=backends)
        return result

    # Waiting for a change to be served.

    def wait_served(self, revision: int = 0, *, backends: Sequence[str] = (), endpoints: Sequence[str] = (),
                    timeout: Optional[float] = None) -> None:
        """Returns once every connected node serves the stored state at
        revision (0: the current one) and the backends named, and those the
        endpoints named send to, run their replicas, all ready. Raises
        NotServedError when it will not be, ServedTimeoutError after
        timeout seconds (default: the client's wait_timeout)."""
        query = [("revision", str(revision))] + [("backend", b) for b in backends] + [("endpoint", e) for e in endpoints]
        path = "/v1/served?" + urllib.parse.urlencode(query)
        deadline = time.monotonic() + (self._wait_timeout if timeout is None else timeout)
        pause = 0.01  # a node ACKs a change in milliseconds: ask soon, then less often
        while True:
            try:
                report = self._call("GET", path)
            except ServemeshError as e:
                if e.status == 404 and e.kind == "unknown":  # no such route: the controller predates it
                    self._warn_served_unknown()
                    return
                raise
            if report.get("failed"):
                raise NotServedError("the change is stored but will not be served: " + report["failed"], report.get("waiting") or [], report["failed"])
            if report.get("served"):
                return
            if time.monotonic() >= deadline:
                waiting: List[str] = report.get("waiting") or []
                raise ServedTimeoutError("the change is stored but not served yet: " + "; ".join(waiting), waiting)
            time.sleep(pause)
            pause = min(pause * 2, 0.2)

    def _changed(self, answer: Mapping[str, Any], wait: Optional[bool], *, backends: Sequence[str] = (),
                 endpoints: Sequence[str] = ()) -> bool:
        """answer's "changed", once the change is served (wait, or the
        client's default)."""
        if self._wait if wait is None else wait:
            self.wait_served(int(answer.get("revision") or 0), backends=backends, endpoints=endpoints)
        return bool(answer.get("changed"))

    def _warn_served_unknown(self) -> None:
        if not self._served_unknown:
            self._served_unknown = True
            warnings.warn("the controller cannot tell when a change is served (it predates /v1/served): calls return once it is stored; upgrade it",
                          RuntimeWarning, stacklevel=3)

    def status(self) -> Dict[str, Any]:
        """What is configured next to what is happening (GET /v1/status)."""
        return self._call("GET", "/v1/status")

    def leader(self) -> Dict[str, Any]:
        return self._call("GET", "/v1/leader")

    # The transport.

    def _call(self, method: str, path: str, body: Any = None) -> Any:
        data = None if body is None else json.dumps(body).encode("utf-8")
        deadline = time.monotonic() + self._failover_wait
        last: Optional[Exception] = None
        i = self._leader
        tried = 0
        while True:
            server = self._servers[i % len(self._servers)]
            try:
                result = self._send(server, method, path, data)
                self._leader = i % len(self._servers)
                return result
            except ServemeshError as e:
                if e.status != 503:
                    raise
                last = e
                if e.leader:
                    named = [j for j, s in enumerate(self._servers) if _hostport(s) == _hostport(e.leader)]
                    if named:  # a follower names the leader: ask it, if it is one of ours
                        i = named[0]
                        tried += 1
                        if tried <= len(self._servers):
                            continue
            except (urllib.error.URLError, OSError) as e:
                last = e
            i += 1
            tried += 1
            if time.monotonic() >= deadline:
                break
            if tried % len(self._servers) == 0:
                time.sleep(0.2)  # every server tried: wait for a leader
        if isinstance(last, ServemeshError):
            if last.kind == "not_leader":
                raise NotLeaderError(last.status, last.kind, f"no controller of {', '.join(self._servers)} leads: {last.message}", last.leader)
            raise last
        raise NotLeaderError(503, "not_leader", f"no controller of {', '.join(self._servers)} answered: {last}")

    def _send(self, server: str, method: str, path: str, data: Optional[bytes]) -> Any:
        req = urllib.request.Request(server + path, data=data, method=method)
        if data is not None:
            req.add_header("Content-Type", "application/json")
        if self._token:
            req.add_unredirected_header("Authorization", "Bearer " + self._token)
        opener = urllib.request.build_opener(_NoRedirect(), urllib.request.HTTPSHandler(context=self._context))
        try:
            with opener.open(req, timeout=self._timeout) as resp:
                return json.loads(resp.read() or b"null")
        except urllib.error.HTTPError as e:
            raise _error(e.code, e.read(), e.headers.get(LEADER_HEADER, "")) from None


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """Follows no redirect: the API sends none, and following one would
    send the token to whichever host it names. A 3xx is an error."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):  # noqa: D102
        return None


def _seg(name: str) -> str:
    return urllib.parse.quote(name, safe="")


def _hostport(server: str) -> str:
    return server.split("://", 1)[-1].rstrip("/")

