"""Handles between endpoints: inside a replica, call another endpoint of
the mesh as Ray Serve's deployment handles do.

    embed = servemesh.get_handle("embeddings")
    vector = embed.remote({"text": "hi"}).result()          # from plain code
    vector = await embed.remote({"text": "hi"})             # from async code
    for token in embed.options(stream=True).remote(body):   # streamed, or async for
        ...

A call goes to the node's mesh listener ($SERVEMESH_MESH_LISTENER, which
the agent sets), naming the endpoint as its Host, so the endpoint's split,
shadows, retries and the mesh's mTLS between nodes apply as to any caller
in the mesh. remote() sends the request at once, on a worker thread; the
answer is JSON decoded (or text, or bytes, by its Content-Type). A
streamed answer asks for Server-Sent Events and yields each event's data
as it comes (JSON decoded when it is JSON). An answer that is not a 2xx
raises HandleError. With the OpenTelemetry API installed, the call carries
the current trace context.
"""

from __future__ import annotations

import asyncio
import json
import os
import urllib.error
import urllib.request
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, AsyncIterator, Dict, Iterator, Optional

MESH_LISTENER_ENV = "SERVEMESH_MESH_LISTENER"
DEFAULT_TIMEOUT_S = 300.0

_pool = ThreadPoolExecutor(max_workers=64, thread_name_prefix="servemesh-handle")


class HandleError(Exception):
    """An endpoint answered a handle's call with a status that is not 2xx."""

    def __init__(self, endpoint: str, status: int, body: bytes):
        super().__init__(f"endpoint {endpoint} answered {status}: {body[:300].decode('utf-8', 'replace')}")
        self.endpoint, self.status, self.body = endpoint, status, body


def get_handle(endpoint: str, *, path: str = "/", method: Optional[str] = None) -> "Handle":
    """A handle of endpoint, called at path with method (POST by default,
    as Ray's handles send their arguments; an endpoint that does not take
    POST is called as it does, as Ray's handles ignore HTTP methods)."""
    if not isinstance(endpoint, str) or not endpoint:
        raise TypeError(f"get_handle(): endpoint must be a non-empty str, not {type(endpoint).__name__}")
    listener = os.environ.get(MESH_LISTENER_ENV, "")
    if not listener:
        raise RuntimeError(f"get_handle(): ${MESH_LISTENER_ENV} is not set: handles work inside a replica servemesh runs, on a node with a mesh listener")
    return Handle(listener, endpoint, {"path": path, "method": method or "POST", "stream": False, "headers": {}, "timeout": DEFAULT_TIMEOUT_S,
                                       "method_chosen": method is not None})


class Handle:
    """Calls one endpoint through the node's mesh listener."""

    def __init__(self, listener: str, endpoint: str, options: Dict[str, Any]):
        self._listener, self._endpoint, self._options = listener, endpoint, options

    def options(self, *, stream: Optional[bool] = None, path: Optional[str] = None, method: Optional[str] = None,
                headers: Optional[Dict[str, str]] = None, timeout: Optional[float] = None) -> "Handle":
        """The same handle with these options changed (Ray's
        handle.options): stream the answer, another path, method, headers
        or timeout (seconds)."""
        changed = dict(self._options)
        for key, value in (("stream", stream), ("path", path), ("method", method), ("headers", headers), ("timeout", timeout)):
            if value is not None:
                changed[key] = value
        if method is not None:
            changed["method_chosen"] = True
        return Handle(self._listener, self._endpoint, changed)

    def remote(self, body: Any = None) -> Any:
        """Sends body (JSON, or bytes or str as they are): a HandleResponse,
        or with stream=True a HandleStream."""
        request = self._request(body)
        if self._options["stream"]:
            return HandleStream(self._endpoint, _pool.submit(self._open, request))
        return HandleResponse(_pool.submit(self._fetch, request))

    def _request(self, body: Any) -> urllib.request.Request:
        headers = {"Host": self._endpoint, **self._options["headers"]}
        if body is None:
            data = None
        elif isinstance(body, (bytes, str)):
            data = body.encode("utf-8") if isinstance(body, str) else body
        else:
            data = json.dumps(body).encode("utf-8")
            headers.setdefault("Content-Type", "application/json")
        if self._options["stream"]:
            headers.setdefault("Accept", "text/event-stream")
        _inject_trace(headers)
        return urllib.request.Request(f"http://{self._listener}{self._options['path']}", data=data, method=self._options["method"], headers=headers)

    def _open(self, request: urllib.request.Request) -> Any:
        try:
            return urllib.request.urlopen(request, timeout=self._options["timeout"])
        except urllib.error.HTTPError as e:
            allowed = [m.strip() for m in (e.headers.get("Allow") or "").split(",") if m.strip()]
            if e.code == 405 and allowed and not self._options.get("method_chosen"):
                # Ray's handles call a deployment whatever the HTTP methods
                # of its route; an endpoint's methods refused nothing yet,
                # so the call goes again as the endpoint takes it.
                e.close()
                again = urllib.request.Request(request.full_url, data=request.data, method=allowed[0], headers=dict(request.header_items()))
                return self._open_as_is(again)
            raise HandleError(self._endpoint, e.code, e.read()) from None

    def _open_as_is(self, request: urllib.request.Request) -> Any:
        try:
            return urllib.request.urlopen(request, timeout=self._options["timeout"])
        except urllib.error.HTTPError as e:
            raise HandleError(self._endpoint, e.code, e.read()) from None

    def _fetch(self, request: urllib.request.Request) -> Any:
        with self._open(request) as resp:
            return _decode(resp.headers.get("Content-Type", ""), resp.read())


class HandleResponse:
    """A call's answer, to wait for: result() from plain code, await from
    async code (Ray's DeploymentResponse)."""

    def __init__(self, future: "Future[Any]"):
        self._future = future

    def result(self, timeout: Optional[float] = None) -> Any:
        return self._future.result(timeout)

    def __await__(self):
        return asyncio.wrap_future(self._future).__await__()


class HandleStream:
    """A streamed answer: each event's data as it comes, by for or async
    for (Ray's DeploymentResponseGenerator)."""

    def __init__(self, endpoint: str, opened: "Future[Any]"):
        self._endpoint, self._opened = endpoint, opened
        self._events: Optional[Iterator[Any]] = None

    def __iter__(self) -> Iterator[Any]:
        return self

    def __next__(self) -> Any:
        if self._events is None:
            self._events = _events(self._opened.result())
        return next(self._events)

    def __aiter__(self) -> AsyncIterator[Any]:
        return self._async_events()

    async def _async_events(self) -> AsyncIterator[Any]:
        done = object()
        while True:
            item = await asyncio.to_thread(next, self, done)
            if item is done:
                return
            yield item


def _events(resp: Any) -> Iterator[Any]:
    """The data of each Server-Sent Event of resp, or each line of an answer
    that is not an event stream."""
    with resp:
        events = resp.headers.get("Content-Type", "").startswith("text/event-stream")
        data: list = []
        for raw in resp:
            line = raw.decode("utf-8").rstrip("\r\n")
            if not events:
                if line:
                    yield _data(line)
                continue
            if line.startswith("data:"):
                data.append(line[5:].removeprefix(" "))
            elif not line and data:
                yield _data("\n".join(data))
                data = []


def _data(text: str) -> Any:
    """An event's data, or a line: JSON decoded when it is JSON."""
    try:
        return json.loads(text)
    except ValueError:
        return text


def _decode(content_type: str, body: bytes) -> Any:
    if "json" in content_type or content_type == "":
        try:
            return json.loads(body)
        except ValueError:
            pass
    if content_type.startswith("text/") or content_type == "":
        return body.decode("utf-8", "replace")
    return body


def _inject_trace(headers: Dict[str, str]) -> None:
    try:
        from opentelemetry import propagate
    except ImportError:
        return
    propagate.inject(headers)
