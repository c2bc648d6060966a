"""Serve a Python model class as a servemesh replica, with no web framework.

    python -m servemesh.replica module:Class [--path DIR]... [--host HOST] [--port PORT]

(or python3 .../servemesh/replica.py ..., which needs nothing installed)
loads Class from module (searched in each --path folder first, then the
current folder and Python's path; servemesh refuses $PYTHONPATH in a
backend's environment, so a backend names its folders with --path),
makes one instance (its __init__ may load weights: the replica is not
ready until it returns), and serves HTTP on $HOST:$PORT, which the agent
sets:

- GET /-/healthz answers 200 once the instance is made: the backend's
  process health_path;
- POST /-/reconfigure passes the JSON body, the backend's user_config, to
  the instance's reconfigure method (Ray Serve's): the backend's process
  reconfigure_path; the agent posts it on start and on every change, with
  the replica's secret ($SERVEMESH_RECONFIGURE_TOKEN), and nobody else may;
- GET /-/metrics lists the models the instance's multiplexed methods
  hold, as vLLM's vllm:lora_requests_info gauge, which the node's picker
  reads (the backend's load_aware metrics_path);
- any other request calls the instance with a Request. A method decorated
  with servemesh.replica.batch receives a list of Requests instead, up to
  max_batch_size at a time (Ray Serve's accept_batch). A method decorated
  with servemesh.replica.multiplexed loads a model by its id and keeps
  the last max_num_models_per_replica loaded (Ray Serve's
  serve.multiplexed); get_multiplexed_model_id() is the id the request
  being served names (its serve_multiplexed_model_id header).

What the instance returns is the answer: a Response, bytes or str (as
text), or anything else as JSON. An exception answers 500 and is printed
to the replica's log; its text never reaches the client. A body (sized or
chunked) may be up to $SERVEMESH_MAX_BODY_BYTES (16 MiB by default); a
longer one is answered 413 without being read.

Tracing: with the OpenTelemetry API installed, each request is a span
("replica <METHOD>", of kind server) continuing the trace of its
traceparent header (the mesh's Envoy sends it), current while the
instance runs, so the model's own spans are its children. The runtime
sends them itself when the OpenTelemetry SDK and its OTLP/gRPC exporter
are installed, $OTEL_EXPORTER_OTLP_ENDPOINT (or its _TRACES_ form) is set
(the backend's env, such as http://127.0.0.1:4317) and the model set no
tracer provider of its own; otherwise the model's provider (or none)
decides.

The replica's working folder is not on Python's path: a module is found in
the --path folders and Python's own, so a file planted in the folder is
never imported in place of one of them.
"""

from __future__ import annotations

import os
import sys

# python -m puts the working folder first on the path: take it off before
# anything else is imported from there.
sys.path[:] = [p for p in sys.path if p not in ("", os.getcwd())]

import argparse
import asyncio
import contextlib
import contextvars
import functools
import importlib
import inspect
import hmac
import json
import threading
import time
import traceback
import urllib.parse
from collections import OrderedDict
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, Dict, Iterator, List, Optional

HEALTH_PATH = "/-/healthz"
METRICS_PATH = "/-/metrics"
MODEL_ID_HEADER = "serve_multiplexed_model_id"
RECONFIGURE_PATH = "/-/reconfigure"
RECONFIGURE_TOKEN_ENV = "SERVEMESH_RECONFIGURE_TOKEN"
RECONFIGURE_TOKEN_HEADER = "x-servemesh-reconfigure-token"
MAX_BODY_ENV = "SERVEMESH_MAX_BODY_BYTES"
DEFAULT_MAX_BODY = 16 << 20


class _BodyTooLarge(Exception):
    pass


class _BadBody(Exception):
    pass


class Request:
    """One HTTP request, as the model's code sees it."""

    def __init__(self, method: str, path: str, query: Dict[str, List[str]], headers: Dict[str, str], body: bytes):
        self.method, self.path, self.query, self.headers, self.body = method, path, query, headers, body

    def json(self) -> Any:
        return json.loads(self.body or b"null")

    def text(self) -> str:
        return self.body.decode("utf-8")


class Response:
    """An answer with its own status and headers."""

    def __init__(self, body: Any = b"", status: int = 200, headers: Optional[Dict[str, str]] = None):
        self.body, self.status, self.headers = body, status, dict(headers or {})


def _encode(result: Any) -> Response:
    if isinstance(result, Response):
        r = result
    else:
        r = Response(result)
    body = r.body
    if isinstance(body, bytes):
        r.headers.setdefault("Content-Type", "application/octet-stream")
    elif isinstance(body, str):
        body = body.encode("utf-8")
        r.headers.setdefault("Content-Type", "text/plain; charset=utf-8")
    else:
        body = json.dumps(body).encode("utf-8")
        r.headers.setdefault("Content-Type", "application/json")
    r.body = body
    return r


class _Batcher:
    """Collects the calls of one batched method into lists: a call waits
    until its batch is full (max_batch_size) or batch_wait_timeout_s has
    passed since the batch's first call, then the method runs once for the
    batch, on one thread, and each call gets its own result."""

    def __init__(self, fn: Callable[[Any, List[Any]], List[Any]], instance: Any, max_batch_size: int, timeout_s: float):
        self.fn, self.instance, self.max, self.timeout = fn, instance, max_batch_size, timeout_s
        self.cond = threading.Condition()
        self.pending: List[list] = []  # [request, result, error, done]
        threading.Thread(target=self._run, daemon=True, name="servemesh-batcher").start()

    def call(self, request: Any) -> Any:
        item = [request, None, None, threading.Event()]
        with self.cond:
            self.pending.append(item)
            self.cond.notify_all()
        item[3].wait()
        if item[2] is not None:
            raise item[2]
        return item[1]

    def _take(self) -> List[list]:
        with self.cond:
            while not self.pending:
                self.cond.wait()
            deadline = time.monotonic() + self.timeout
            while len(self.pending) < self.max:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self.cond.wait(left)
            batch, self.pending = self.pending[: self.max], self.pending[self.max :]
            return batch

    def _run(self) -> None:
        while True:
            batch = self._take()
            try:
                results = self.fn(self.instance, [item[0] for item in batch])
                if not isinstance(results, list) or len(results) != len(batch):
                    raise TypeError(f"{self.fn.__name__} must return a list of {len(batch)} results, one per request; it returned {type(results).__name__}")
                for item, result in zip(batch, results):
                    item[1] = result
            except Exception as e:  # every call of the batch gets the error
                for item in batch:
                    item[2] = e
            for item in batch:
                item[3].set()


def _per_instance(instance: Any, attr: str, lock: threading.Lock, make: Callable[[], Any]) -> Any:
    """instance's helper stored in attr, made (by make) by the first call
    that needs it, once, whatever the threads."""
    helper = instance.__dict__.get(attr)
    if helper is None:
        with lock:
            helper = instance.__dict__.get(attr)
            if helper is None:
                helper = instance.__dict__[attr] = make()
    return helper


def batch(_fn: Optional[Callable] = None, *, max_batch_size: int = 8, batch_wait_timeout_s: float = 0.0):
    """Makes a method that takes a list of requests and returns a list of
    results (one each) serve requests one by one: concurrent requests are
    gathered into lists of up to max_batch_size, waiting at most
    batch_wait_timeout_s for a batch to fill (Ray Serve's accept_batch and
    serve.batch)."""
    if max_batch_size < 1:
        raise ValueError("max_batch_size must be at least 1")
    if batch_wait_timeout_s < 0:
        raise ValueError("batch_wait_timeout_s must not be negative")

    def decorate(fn: Callable) -> Callable:
        attr = "_servemesh_batcher_" + fn.__name__
        if inspect.iscoroutinefunction(fn):
            return functools.wraps(fn)(_batched_on_loop(fn, attr, max_batch_size, batch_wait_timeout_s))
        lock = threading.Lock()

        @functools.wraps(fn)
        def call_one(self: Any, request: Any) -> Any:
            batcher = _per_instance(self, attr, lock, lambda: _Batcher(fn, self, max_batch_size, batch_wait_timeout_s))
            return batcher.call(request)

        call_one.servemesh_batched = True  # type: ignore[attr-defined]
        return call_one

    return decorate(_fn) if _fn is not None else decorate


def _batched_on_loop(fn: Callable, attr: str, max_batch_size: int, timeout_s: float) -> Callable:
    """An async method taking one request, gathering concurrent calls into
    lists for fn (an async method taking a list): batch's, on the
    asyncio runtime's loop (servemesh.asgi)."""

    async def call_one(self: Any, request: Any) -> Any:
        batcher = self.__dict__.get(attr)
        if batcher is None:
            batcher = self.__dict__[attr] = _AsyncBatcher(fn, self, max_batch_size, timeout_s)
        return await batcher.call(request)

    call_one.servemesh_async = True  # type: ignore[attr-defined]
    return call_one


class _AsyncBatcher:
    """The loop's batcher: a call waits until its batch is full or
    timeout_s passed since the batch's first call; batches run one at a
    time."""

    def __init__(self, fn: Callable, instance: Any, max_batch_size: int, timeout_s: float):
        self.fn, self.instance, self.max, self.timeout = fn, instance, max_batch_size, timeout_s
        self.pending: List[tuple] = []
        self.arrived = asyncio.Event()
        self.running: Optional[asyncio.Task] = None

    async def call(self, request: Any) -> Any:
        future = asyncio.get_running_loop().create_future()
        self.pending.append((request, future))
        self.arrived.set()
        if self.running is None or self.running.done():
            self.running = asyncio.ensure_future(self._run())
        return await future

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while self.pending:
            deadline = loop.time() + self.timeout
            while len(self.pending) < self.max and (left := deadline - loop.time()) > 0:
                self.arrived.clear()
                try:
                    await asyncio.wait_for(self.arrived.wait(), left)
                except asyncio.TimeoutError:
                    break
            batch, self.pending = self.pending[: self.max], self.pending[self.max :]
            try:
                results = await self.fn(self.instance, [r for r, _ in batch])
                if not isinstance(results, list) or len(results) != len(batch):
                    raise TypeError(f"{self.fn.__name__} must return a list of {len(batch)} results, one per request; it returned {type(results).__name__}")
                for (_, future), result in zip(batch, results):
                    if not future.done():
                        future.set_result(result)
            except Exception as e:  # every call of the batch gets the error
                for _, future in batch:
                    if not future.done():
                        future.set_exception(e)


_request = threading.local()  # the model id of the request this thread serves
_model_id: contextvars.ContextVar[str] = contextvars.ContextVar("servemesh_model_id", default="")  # the same, on the loop (asgi)


def get_multiplexed_model_id() -> str:
    """The model id the request being served names (its
    serve_multiplexed_model_id header, Ray Serve's), or ""."""
    return _model_id.get() or getattr(_request, "model_id", "")


class _Models:
    """A replica's loaded models of one multiplexed method, the least
    recently used dropped first (released, as Ray Serve drops them): one
    load per model at a time, others waiting for it."""

    def __init__(self, load: Callable[[str], Any], capacity: int):
        self.load, self.capacity = load, capacity
        self.lock = threading.Lock()
        self.models: "OrderedDict[str, Any]" = OrderedDict()
        self.loading: Dict[str, threading.Event] = {}

    def get(self, model_id: str) -> Any:
        while True:
            with self.lock:
                if model_id in self.models:
                    self.models.move_to_end(model_id)
                    return self.models[model_id]
                done = self.loading.get(model_id)
                if done is None:
                    done = self.loading[model_id] = threading.Event()
                    break
            done.wait()  # another thread loads it
        try:
            model = self.load(model_id)
        finally:
            with self.lock:
                del self.loading[model_id]
            done.set()
        with self.lock:
            self.models[model_id] = model
            while len(self.models) > self.capacity:
                self.models.popitem(last=False)  # released: its __del__ runs once nothing else holds it
        return model

    def ids(self) -> List[str]:
        with self.lock:
            return list(self.models)


def multiplexed(_fn: Optional[Callable] = None, *, max_num_models_per_replica: int = 3):
    """Makes a method that loads a model by its id keep the last
    max_num_models_per_replica loaded, and load each at most once at a
    time (Ray Serve's serve.multiplexed). Called with no id, it loads the
    one the request names (get_multiplexed_model_id). Set the backend's
    load_aware max_models_per_replica to the same number and its
    metrics_path to /-/metrics, and each node's picker sends a model's
    requests to a replica holding it."""
    if max_num_models_per_replica < 1:
        raise ValueError("max_num_models_per_replica must be at least 1")

    def decorate(fn: Callable) -> Callable:
        attr = "_servemesh_models_" + fn.__name__
        lock = threading.Lock()

        @functools.wraps(fn)
        def get(self: Any, model_id: Optional[str] = None) -> Any:
            model_id = model_id or get_multiplexed_model_id()
            if not model_id:
                raise ValueError(f"{fn.__name__}: no model id: the request names none in its {MODEL_ID_HEADER} header")
            models = _per_instance(self, attr, lock, lambda: _Models(lambda i: fn(self, i), max_num_models_per_replica))
            return models.get(model_id)

        get.servemesh_multiplexed = max_num_models_per_replica  # type: ignore[attr-defined]
        return get

    return decorate(_fn) if _fn is not None else decorate


def _loaded_models(instance: Any) -> List[str]:
    """The models instance's multiplexed methods hold."""
    out: List[str] = []
    for key, value in vars(instance).items() if hasattr(instance, "__dict__") else []:
        if key.startswith("_servemesh_models_") and isinstance(value, _Models):
            out += [i for i in value.ids() if i not in out]
    return out


def _metrics(instance: Any) -> Response:
    ids = ",".join(i.replace("\\", "").replace('"', "").replace("\n", "") for i in _loaded_models(instance))
    capacity = max([getattr(getattr(type(instance), n, None), "servemesh_multiplexed", 0) for n in dir(type(instance))] + [0])
    body = ("# TYPE vllm:lora_requests_info gauge\n"
            f'vllm:lora_requests_info{{max_lora="{capacity}",running_lora_adapters="{ids}",waiting_lora_adapters=""}} {time.time():.3f}\n')
    return Response(body, headers={"Content-Type": "text/plain; version=0.0.4"})


def load(target: str, paths: Optional[List[str]] = None) -> Any:
    """Makes the instance that module:Class (or module:function) names,
    looking in the folders paths first."""
    module_name, sep, attr = target.partition(":")
    if not sep or not module_name or not attr:
        raise SystemExit(f"servemesh.replica: {target!r}: name the model as module:Class, such as model:Model")
    sys.path[:0] = [p for p in (paths or []) if p]
    obj = getattr(importlib.import_module(module_name), attr)
    return obj() if isinstance(obj, type) else obj


class _Tracing:
    """The runtime's part in a request's trace, with the OpenTelemetry API
    if it is installed (else every call just runs)."""

    def __init__(self) -> None:
        try:
            from opentelemetry import propagate, trace
        except ImportError:
            self._trace = None
            return
        self._trace, self._propagate = trace, propagate
        _configure_sdk(trace)
        self._tracer = trace.get_tracer("servemesh.replica")

    def call(self, method: str, path: str, headers: Dict[str, str], fn: Callable[[], Response]) -> Response:
        """fn's answer, in a span continuing headers' trace context."""
        with self.span(method, path, headers) as done:
            r = fn()
            done(r.status)
            return r

    @contextlib.contextmanager
    def span(self, method: str, path: str, headers: Dict[str, str]) -> Iterator[Callable[[int], None]]:
        """A span continuing headers' trace context, current inside; what
        it yields records the answer's status."""
        if self._trace is None:
            yield lambda status: None
            return
        ctx = self._propagate.extract({k.lower(): v for k, v in headers.items()})
        attrs = {"http.request.method": method, "url.path": path}
        with self._tracer.start_as_current_span(f"replica {method}", context=ctx, kind=self._trace.SpanKind.SERVER, attributes=attrs) as span:

            def done(status: int) -> None:
                span.set_attribute("http.response.status_code", status)
                if status >= 500:
                    span.set_status(self._trace.Status(self._trace.StatusCode.ERROR))

            yield done


def _configure_sdk(trace: Any) -> None:
    """Sends the replica's spans over OTLP/gRPC when an endpoint is set in
    the environment, the SDK is installed and no provider is set yet."""
    if not (os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") or os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")):
        return
    if not isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):
        return  # the model set its own
    try:
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError:
        print("servemesh.replica: $OTEL_EXPORTER_OTLP_ENDPOINT is set but the OpenTelemetry SDK or its OTLP/gRPC exporter is not installed: "
              "pip install opentelemetry-sdk opentelemetry-exporter-otlp-proto-grpc", file=sys.stderr, flush=True)
        return
    attrs = {} if os.environ.get("OTEL_SERVICE_NAME") else {"service.name": "servemesh-replica"}
    provider = TracerProvider(resource=Resource.create(attrs))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    trace.set_tracer_provider(provider)


def make_server(instance: Any, host: str, port: int) -> ThreadingHTTPServer:
    """An HTTP server of instance on host:port (port 0 picks one)."""

    max_body = int(os.environ.get(MAX_BODY_ENV) or DEFAULT_MAX_BODY)
    tracing = _Tracing()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, fmt: str, *args: Any) -> None:  # no line per request
            pass

        def _answer(self, r: Response) -> None:
            self.send_response(r.status)
            for k, v in r.headers.items():
                self.send_header(k, v)
            self.send_header("Content-Length", str(len(r.body)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(r.body)

        def _read_body(self) -> bytes:
            if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
                return self._read_chunked()
            try:
                length = int(self.headers.get("Content-Length") or 0)
            except ValueError:
                raise _BadBody("Content-Length is not a number")
            if length < 0:
                raise _BadBody("Content-Length is negative")
            if length > max_body:
                raise _BodyTooLarge()
            return self.rfile.read(length) if length else b""

        def _read_chunked(self) -> bytes:
            body = bytearray()
            while True:
                line = self.rfile.readline(1024).split(b";", 1)[0].strip()
                try:
                    size = int(line, 16)
                except ValueError:
                    raise _BadBody("a chunk's size is not hexadecimal")
                if size == 0:
                    while self.rfile.readline(1024) not in (b"\r\n", b"\n", b""):  # trailers
                        pass
                    return bytes(body)
                if len(body) + size > max_body:
                    raise _BodyTooLarge()
                body += self.rfile.read(size)
                self.rfile.readline(1024)  # the chunk's CRLF

        def _handle(self) -> None:
            try:
                body = self._read_body()
            except _BodyTooLarge:
                self.close_connection = True
                self._answer(_encode(Response(f"the body is over this replica's limit of {max_body} bytes (${MAX_BODY_ENV})", status=413)))
                return
            except _BadBody as e:
                self.close_connection = True
                self._answer(_encode(Response(f"bad request body: {e}", status=400)))
                return
            url = urllib.parse.urlsplit(self.path)
            try:
                if url.path == HEALTH_PATH:
                    self._answer(_encode("ok"))
                elif url.path == METRICS_PATH and self.command == "GET":
                    self._answer(_encode(_metrics(instance)))
                elif url.path == RECONFIGURE_PATH and self.command == "POST":
                    self._answer(_encode(self._reconfigure(body)))
                else:
                    headers = dict(self.headers.items())
                    req = Request(self.command, url.path, urllib.parse.parse_qs(url.query), headers, body)
                    _request.model_id = self.headers.get(MODEL_ID_HEADER, "")
                    self._answer(tracing.call(self.command, url.path, headers, lambda: _encode(instance(req))))
            except Exception:
                traceback.print_exc()  # to the replica's log, not the client
                self._answer(_encode(Response("the model raised an exception; its replica's log has it", status=500)))

        def _reconfigure(self, body: bytes) -> Any:
            want = os.environ.get(RECONFIGURE_TOKEN_ENV, "")
            if want and not hmac.compare_digest(self.headers.get(RECONFIGURE_TOKEN_HEADER, ""), want):
                return Response("only this replica's agent may reconfigure it", status=403)
            method = getattr(instance, "reconfigure", None)
            if method is None:
                return Response("the model has no reconfigure method to take user_config", status=400)
            method(json.loads(body or b"null"))
            return {"reconfigured": True}

        do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = do_HEAD = do_OPTIONS = _handle

    server = _Server((host, port), Handler)
    return server


class _Server(ThreadingHTTPServer):
    """The standard library's threaded server, with a listen backlog for
    many callers at once: its default of 5 drops the connections of a
    burst past it, which wait a second or more to be tried again."""

    daemon_threads = True
    request_queue_size = 1024


def main(argv: Optional[List[str]] = None) -> None:
    p = argparse.ArgumentParser(prog="python -m servemesh.replica", description="Serve a Python model class as a servemesh replica.")
    p.add_argument("model", help="module:Class (or module:function) to serve")
    p.add_argument("--path", action="append", default=[], help="a folder to find the model's module in (repeat)")
    p.add_argument("--host", default=os.environ.get("HOST", "127.0.0.1"), help="address to listen on (default $HOST)")
    p.add_argument("--port", type=int, default=int(os.environ.get("PORT", "8000")), help="port to listen on (default $PORT)")
    p.add_argument("--server", choices=("auto", "asyncio", "threads"), default="auto",
                   help="asyncio: an event loop under uvicorn (servemesh.asgi: async handlers, streaming); threads: a thread per request, "
                        "standard library only; auto (the default): asyncio if uvicorn and starlette are installed")
    args = p.parse_args(argv)
    # Run as a script or with -m, this module is __main__: the model's
    # `from servemesh.replica import batch, Response` must find this same
    # module, or its Responses and batches would be another copy's.
    sys.modules.setdefault("servemesh.replica", sys.modules[__name__])
    instance = load(args.model, args.path)  # before listening: not ready until loaded
    if _use_asyncio(args.server, instance):
        from servemesh import asgi

        asgi.serve(instance, args.host, args.port, lambda port: print(f"servemesh.replica: serving {args.model} (asyncio) on {args.host}:{port}", flush=True))
        return
    server = make_server(instance, args.host, args.port)
    print(f"servemesh.replica: serving {args.model} (threads) on {args.host}:{server.server_address[1]}", flush=True)
    server.serve_forever()


def _use_asyncio(choice: str, instance: Any) -> bool:
    """Whether to serve on the asyncio runtime: asked for, or (auto) its
    packages are there. A model with async handlers needs it."""
    if choice == "threads":
        if _has_async(instance):
            raise SystemExit("servemesh.replica: the model's handlers are async def: serve it with --server asyncio")
        return False
    try:
        import starlette  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError:
        if choice == "asyncio" or _has_async(instance):
            raise SystemExit("servemesh.replica: the asyncio runtime needs uvicorn and starlette: pip install uvicorn starlette "
                             "(or name the folder they are installed in with --path)")
        return False
    return True


def _has_async(instance: Any) -> bool:
    call = getattr(instance, "__call__", None)
    return inspect.iscoroutinefunction(call) or inspect.isasyncgenfunction(call) or getattr(call, "servemesh_async", False)


if __name__ == "__main__":
    main()
