"""servemesh.replica's asyncio runtime: the model class as an ASGI app,
served by uvicorn (pip install uvicorn starlette).

Many requests are in flight on one event loop:

- an ``async def __call__`` (or any async method the class calls) is
  awaited with a ``starlette.requests.Request``, as Ray Serve 2.x gives:
  ``await request.json()``, ``request.query_params``, ``request.headers``;
- a plain ``def __call__`` runs on a worker thread with a
  ``servemesh.replica.Request``, as under the threaded runtime, so a model
  written for it runs unchanged;
- a generator or async generator returned (or an async generator method)
  is streamed as it yields: each chunk sent when it comes, as
  Server-Sent Events (``data: ...``, a blank line after each) when the
  request accepts ``text/event-stream``, else as they are (str, bytes, or
  anything else as a JSON line); a Starlette response passes as it is;
- ``@servemesh.replica.batch`` on an async method gathers concurrent
  calls into lists on the loop; on a plain one, as the threaded runtime;
- on SIGTERM (the agent stopping the replica) uvicorn stops accepting
  and lets the requests in flight finish, for up to
  ``$SERVEMESH_GRACEFUL_SHUTDOWN_S`` (30 s).

The health, reconfigure and metrics paths, the body limit and the spans
are the threaded runtime's (servemesh.replica).
"""

from __future__ import annotations

import asyncio
import hmac
import inspect
import json
import os
import socket
import traceback
import urllib.parse
from typing import Any, AsyncIterator, Callable, Dict, Iterator, Optional

import uvicorn
from starlette.requests import Request as StarletteRequest
from starlette.responses import Response as StarletteResponse
from starlette.responses import StreamingResponse

from servemesh import replica

GRACE_ENV = "SERVEMESH_GRACEFUL_SHUTDOWN_S"
DEFAULT_GRACE_S = 30.0
EVENT_STREAM = "text/event-stream"


class _BodyTooLarge(Exception):
    pass


def is_async(fn: Any) -> bool:
    """Whether fn (a callable instance, or a method) runs on the loop."""
    call = fn if inspect.isfunction(fn) or inspect.ismethod(fn) else getattr(fn, "__call__", None)
    return bool(call) and (inspect.iscoroutinefunction(call) or inspect.isasyncgenfunction(call) or getattr(call, "servemesh_async", False))


class App:
    """The ASGI app of one model instance."""

    def __init__(self, instance: Any, max_body: Optional[int] = None):
        self.instance = instance
        self.max_body = max_body or int(os.environ.get(replica.MAX_BODY_ENV) or replica.DEFAULT_MAX_BODY)
        self.tracing = replica._Tracing()
        self.on_loop = is_async(instance)

    async def __call__(self, scope: Dict[str, Any], receive: Callable, send: Callable) -> None:
        if scope["type"] != "http":
            return  # lifespan is off; no websockets
        try:
            response = await self._route(scope, self._bounded(scope, receive))
        except _BodyTooLarge:
            response = _plain(f"the body is over this replica's limit of {self.max_body} bytes (${replica.MAX_BODY_ENV})", 413)
        except Exception:
            traceback.print_exc()  # to the replica's log, not the client
            response = _plain("the model raised an exception; its replica's log has it", 500)
        await response(scope, receive, send)

    def _bounded(self, scope: Dict[str, Any], receive: Callable) -> Callable:
        """receive, refusing a body over the limit, sized or chunked."""
        headers = dict(scope.get("headers") or [])
        try:
            declared = int(headers.get(b"content-length", b"0"))
        except ValueError:
            declared = 0
        if declared > self.max_body:
            raise _BodyTooLarge()
        seen = 0

        async def bounded() -> Dict[str, Any]:
            nonlocal seen
            message = await receive()
            seen += len(message.get("body", b""))
            if seen > self.max_body:
                raise _BodyTooLarge()
            return message

        return bounded

    async def _route(self, scope: Dict[str, Any], receive: Callable) -> StarletteResponse:
        path, method = scope["path"], scope["method"]
        if path == replica.HEALTH_PATH:
            return _plain("ok", 200)
        if path == replica.METRICS_PATH and method == "GET":
            return _starlette(replica._metrics(self.instance))
        request = StarletteRequest(scope, receive)
        if path == replica.RECONFIGURE_PATH and method == "POST":
            return _starlette(await self._reconfigure(request))
        headers = {k: v for k, v in request.headers.items()}
        token = replica._model_id.set(request.headers.get(replica.MODEL_ID_HEADER, ""))
        try:
            with self.tracing.span(method, path, headers) as done:
                response = await self._call(request)
                done(response.status_code)
                return response
        finally:
            replica._model_id.reset(token)

    async def _call(self, request: StarletteRequest) -> StarletteResponse:
        accept = request.headers.get("accept", "")
        if self.on_loop:
            result = self.instance(request)
            if inspect.isawaitable(result):
                result = await result
            return _answer(result, accept)
        body = await request.body()
        req = replica.Request(request.method, request.url.path, urllib.parse.parse_qs(request.url.query), dict(request.headers.items()), body)
        return _answer(await asyncio.to_thread(self.instance, req), accept)  # the thread takes the context: the model id

    async def _reconfigure(self, request: StarletteRequest) -> Any:
        want = os.environ.get(replica.RECONFIGURE_TOKEN_ENV, "")
        if want and not hmac.compare_digest(request.headers.get(replica.RECONFIGURE_TOKEN_HEADER, ""), want):
            return replica.Response("only this replica's agent may reconfigure it", status=403)
        method = getattr(self.instance, "reconfigure", None)
        if method is None:
            return replica.Response("the model has no reconfigure method to take user_config", status=400)
        config = json.loads(await request.body() or b"null")
        if is_async(method):
            await method(config)
        else:
            await asyncio.to_thread(method, config)
        return {"reconfigured": True}


def _plain(text: str, status: int) -> StarletteResponse:
    return StarletteResponse(text, status_code=status, media_type="text/plain; charset=utf-8")


def _starlette(result: Any) -> StarletteResponse:
    r = replica._encode(result)
    return StarletteResponse(r.body, status_code=r.status, headers=r.headers)


def _streamed(result: Any) -> bool:
    return inspect.isasyncgen(result) or inspect.isgenerator(result) or (
        isinstance(result, Iterator) and not isinstance(result, (str, bytes, dict, list)))


def _answer(result: Any, accept: str) -> StarletteResponse:
    """The response of what the model returned."""
    if isinstance(result, StarletteResponse):
        return result
    if not _streamed(result):
        return _starlette(result)
    if EVENT_STREAM in accept:
        return StreamingResponse(_events(result), media_type=EVENT_STREAM, headers={"Cache-Control": "no-cache"})
    return StreamingResponse(_chunks(result), media_type="application/octet-stream")


def _chunk(item: Any) -> bytes:
    if isinstance(item, bytes):
        return item
    if isinstance(item, str):
        return item.encode("utf-8")
    return json.dumps(item).encode("utf-8") + b"\n"


async def _items(result: Any) -> AsyncIterator[Any]:
    if inspect.isasyncgen(result):
        async for item in result:
            yield item
        return
    done = object()
    while True:  # a plain generator may block: each step on a worker thread
        item = await asyncio.to_thread(next, result, done)
        if item is done:
            return
        yield item


async def _chunks(result: Any) -> AsyncIterator[bytes]:
    async for item in _items(result):
        yield _chunk(item)


async def _events(result: Any) -> AsyncIterator[bytes]:
    """Server-Sent Events: each item a data field (its lines each one), a
    blank line after it."""
    async for item in _items(result):
        text = item.decode("utf-8") if isinstance(item, bytes) else item if isinstance(item, str) else json.dumps(item)
        yield "".join(f"data: {line}\n" for line in text.split("\n")).encode("utf-8") + b"\n"


def config(instance: Any, host: str, port: int) -> uvicorn.Config:
    """uvicorn's config for instance on host:port."""
    grace = float(os.environ.get(GRACE_ENV) or DEFAULT_GRACE_S)
    return uvicorn.Config(App(instance), host=host, port=port, lifespan="off", log_level="warning", access_log=False,
                          timeout_graceful_shutdown=grace, server_header=False)


def bind(host: str, port: int) -> socket.socket:
    """A listening socket on host:port (port 0 picks one)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(1024)
    sock.set_inheritable(True)
    return sock


def serve(instance: Any, host: str, port: int, announce: Callable[[int], None] = lambda port: None) -> None:
    """Serves instance on host:port until SIGTERM or SIGINT, then lets the
    requests in flight finish."""
    sock = bind(host, port)
    announce(sock.getsockname()[1])
    uvicorn.Server(config(instance, host, port)).run(sockets=[sock])
