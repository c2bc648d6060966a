"""The asyncio runtime (servemesh.asgi under uvicorn), served in this
process on a free port, and as the module a backend runs."""

import asyncio
import http.client
import json
import os
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import uvicorn

from servemesh import asgi, replica


class AsyncEcho:
    def __init__(self):
        self.config = None
        self.in_flight = self.most = 0
        self.release = None  # an asyncio.Event the stream waits on
        self.slow_until = 0  # /slow holds until this many are in flight (or 10 s pass)
        self.all_in = None  # an asyncio.Event set when they are

    async def reconfigure(self, config):
        self.config = config

    async def __call__(self, request):
        if request.url.path == "/slow":
            # Each holds until every request is in flight (not for a fixed
            # while, which a loaded host's threads may not all reach): on
            # one loop serving them at once they all are; served one at a
            # time, the first waits out the 10 s alone.
            if self.all_in is None:
                self.all_in = asyncio.Event()
            self.in_flight += 1
            self.most = max(self.most, self.in_flight)
            if self.in_flight >= self.slow_until:
                self.all_in.set()
            try:
                await asyncio.wait_for(self.all_in.wait(), 10)
            except asyncio.TimeoutError:
                pass
            self.in_flight -= 1
            return {"slow": True}
        if request.url.path == "/stream":
            return self.stream(int(request.query_params.get("n", "3")))
        if request.url.path == "/sync-stream":
            return iter(["a", "b", {"c": 1}])
        if request.url.path == "/fail":
            raise RuntimeError("broken on purpose")
        return {"method": request.method, "path": request.url.path, "query": dict(request.query_params), "body": await request.json(),
                "header": request.headers.get("x-test"), "config": self.config}

    async def stream(self, n):
        self.release = release = asyncio.Event()
        yield "first"
        await release.wait()  # the test releases it once it read the first chunk
        for i in range(1, n):
            yield {"token": i}


class AsyncBatched:
    def __init__(self):
        self.sizes = []

    @replica.batch(max_batch_size=4, batch_wait_timeout_s=0.2)
    async def __call__(self, requests):
        self.sizes.append(len(requests))
        await asyncio.sleep(0.05)
        bodies = [await r.json() for r in requests]
        return [{"n": b["n"], "batch": len(requests)} for b in bodies]


class SyncEcho:
    def __call__(self, request):
        return {"path": request.path, "body": request.json(), "model": replica.get_multiplexed_model_id()}


@pytest.fixture
def serve():
    started = []

    def start(instance):
        sock = asgi.bind("127.0.0.1", 0)
        server = uvicorn.Server(asgi.config(instance, "127.0.0.1", 0))
        loop = asyncio.new_event_loop()
        thread = threading.Thread(target=loop.run_until_complete, args=(server.serve(sockets=[sock]),), daemon=True)
        thread.start()
        deadline = time.monotonic() + 5
        while not server.started and time.monotonic() < deadline:
            time.sleep(0.01)
        started.append((server, thread, loop))
        return sock.getsockname()[1], loop

    yield start
    for server, thread, _ in started:
        server.should_exit = True
        thread.join(5)


def request(port, method="GET", path="/", body=None, headers=None):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    data = None if body is None else json.dumps(body)
    conn.request(method, path, body=data, headers={"Content-Type": "application/json", **(headers or {})})
    resp = conn.getresponse()
    return resp.status, resp.getheader("Content-Type"), resp.read()


def test_async_handlers_get_starlette_requests(serve):
    port, _ = serve(AsyncEcho())
    status, ctype, body = request(port, "POST", "/echo?x=1", {"a": 2}, {"X-Test": "yes"})
    assert status == 200 and ctype == "application/json"
    assert json.loads(body) == {"method": "POST", "path": "/echo", "query": {"x": "1"}, "body": {"a": 2}, "header": "yes", "config": None}
    assert request(port, "GET", replica.HEALTH_PATH)[0] == 200
    assert request(port, "POST", replica.RECONFIGURE_PATH, {"t": 0.5})[0] == 200
    assert json.loads(request(port, "POST", "/echo", {})[2])["config"] == {"t": 0.5}
    status, _, body = request(port, "GET", "/fail")
    assert status == 500 and b"broken" not in body


def test_many_requests_in_flight_on_one_loop(serve):
    model = AsyncEcho()
    model.slow_until = 64
    port, _ = serve(model)
    with ThreadPoolExecutor(64) as pool:
        results = list(pool.map(lambda _: request(port, "GET", "/slow")[0], range(64)))
    assert results == [200] * 64
    assert model.most == 64, f"at most {model.most} of 64 requests were in flight at once; want all, on one loop"


def test_streams_each_chunk_as_it_comes(serve):
    model = AsyncEcho()
    port, loop = serve(model)
    for accept, first, rest in [("", b"first", b'{"token": 1}\n{"token": 2}\n'),
                                ("text/event-stream", b"data: first\n\n", b'data: {"token": 1}\n\ndata: {"token": 2}\n\n')]:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        conn.request("GET", "/stream?n=3", headers={"Accept": accept} if accept else {})
        resp = conn.getresponse()
        assert resp.status == 200 and resp.getheader("Transfer-Encoding") == "chunked"
        # The first chunk arrives while the generator waits for this test:
        # nothing is buffered until the end.
        assert resp.read1(len(first)) == first
        loop.call_soon_threadsafe(model.release.set)
        assert resp.read() == rest
        if accept:
            assert resp.getheader("Content-Type").startswith("text/event-stream")
    assert request(port, "GET", "/sync-stream")[2] == b'ab{"c": 1}\n'


def test_async_batches(serve):
    model = AsyncBatched()
    port, _ = serve(model)
    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(lambda n: json.loads(request(port, "POST", "/", {"n": n})[2]), range(8)))
    assert [r["n"] for r in results] == list(range(8))
    assert max(model.sizes) > 1 and sum(model.sizes) == 8 and max(model.sizes) <= 4, model.sizes


def test_plain_handlers_run_on_threads(serve):
    port, _ = serve(SyncEcho())
    status, _, body = request(port, "POST", "/p", {"k": 1}, {replica.MODEL_ID_HEADER: "lora-7"})
    assert status == 200 and json.loads(body) == {"path": "/p", "body": {"k": 1}, "model": "lora-7"}


def test_bodies_are_bounded(serve, monkeypatch):
    monkeypatch.setenv(replica.MAX_BODY_ENV, "100")
    port, _ = serve(AsyncEcho())
    status, _, body = request(port, "POST", "/echo", {"x": "y" * 200})
    assert status == 413 and b"limit of 100 bytes" in body


def test_sigterm_lets_requests_in_flight_finish(tmp_path):
    (tmp_path / "slowmodel.py").write_text(
        "import asyncio\n"
        "class Slow:\n"
        "    async def __call__(self, request):\n"
        "        await asyncio.sleep(1)\n"
        "        return 'done'\n")
    src = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "src"))
    proc = subprocess.Popen([sys.executable, "-m", "servemesh.replica", "--path", str(tmp_path), "--port", "0", "slowmodel:Slow"],
                            stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": src})
    try:
        line = proc.stdout.readline()
        assert "serving slowmodel:Slow (asyncio) on 127.0.0.1:" in line, line
        port = int(line.rsplit(":", 1)[1])
        with ThreadPoolExecutor(1) as pool:
            answer = pool.submit(request, port, "GET", "/")
            time.sleep(0.3)  # the request is in flight
            proc.send_signal(signal.SIGTERM)
            assert answer.result(timeout=10)[0::2] == (200, b"done")
        assert proc.wait(10) in (0, -signal.SIGTERM)  # uvicorn re-raises the signal once it has shut down
    finally:
        proc.kill()
