"""Handles, against a stand-in for the node's mesh listener in this
process: the endpoint named as the Host, answers decoded, streams read as
they come. e2e TestPythonPipeline runs them through a real mesh."""

import asyncio
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

import servemesh


class MeshListener(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    gate = threading.Event()

    def log_message(self, *args):
        pass

    def do_GET(self):
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self._send(200, "application/json", json.dumps({"endpoint": self.headers["Host"], "method": "GET", "got": json.loads(body or b"null")}).encode())

    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        host = self.headers["Host"]
        if host == "missing":
            return self._send(404, "text/plain", b"no such endpoint")
        if host == "get-only":  # as the mesh answers a method an endpoint does not take
            self.send_response(405)
            self.send_header("Allow", "GET")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        if "text/event-stream" in self.headers.get("Accept", ""):
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for i, data in enumerate(['{"token": 0}', "plain words", '{"token": 2}']):
                if i == 1:
                    MeshListener.gate.wait(5)  # the test has read the first event
                chunk = f"data: {data}\n\n".encode()
                self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                self.wfile.flush()
            self.wfile.write(b"0\r\n\r\n")
            return
        self._send(200, "application/json", json.dumps({"endpoint": host, "path": self.path, "got": json.loads(body or b"null")}).encode())

    def _send(self, status, ctype, body):
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture
def listener(monkeypatch):
    server = ThreadingHTTPServer(("127.0.0.1", 0), MeshListener)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setenv(servemesh.handle.MESH_LISTENER_ENV, f"127.0.0.1:{server.server_address[1]}")
    yield
    server.shutdown()


def test_calls_name_the_endpoint(listener):
    h = servemesh.get_handle("embeddings", path="/embed")
    assert h.remote({"text": "hi"}).result(5) == {"endpoint": "embeddings", "path": "/embed", "got": {"text": "hi"}}
    assert h.options(path="/other").remote([1]).result(5)["path"] == "/other"

    async def from_async():
        return await asyncio.gather(h.remote({"n": 1}), h.remote({"n": 2}))

    assert [r["got"]["n"] for r in asyncio.run(from_async())] == [1, 2]
    with pytest.raises(servemesh.HandleError, match="endpoint missing answered 404: no such endpoint"):
        servemesh.get_handle("missing").remote({}).result(5)


def test_streams_come_as_they_are_sent(listener):
    MeshListener.gate.clear()
    stream = servemesh.get_handle("tokens").options(stream=True).remote({"prompt": "hi"})
    assert next(stream) == {"token": 0}  # before the rest is sent
    MeshListener.gate.set()
    assert list(stream) == ["plain words", {"token": 2}]

    async def from_async():
        return [e async for e in servemesh.get_handle("tokens").options(stream=True).remote({})]

    assert asyncio.run(from_async()) == [{"token": 0}, "plain words", {"token": 2}]


def test_handles_need_a_mesh_listener(monkeypatch):
    monkeypatch.delenv(servemesh.handle.MESH_LISTENER_ENV, raising=False)
    with pytest.raises(RuntimeError, match="SERVEMESH_MESH_LISTENER is not set"):
        servemesh.get_handle("x")
    with pytest.raises(TypeError):
        servemesh.get_handle(3)


def test_a_call_reaches_an_endpoint_whatever_its_methods(listener):
    # Ray's handles ignore the HTTP methods of a deployment's route: a call
    # to an endpoint that takes GET alone goes again as a GET, body and all.
    got = servemesh.get_handle("get-only").remote({"x": 1}).result(5)
    assert got == {"endpoint": "get-only", "method": "GET", "got": {"x": 1}}
    # A method the caller chose is kept, and refused.
    with pytest.raises(servemesh.HandleError) as e:
        servemesh.get_handle("get-only").options(method="POST").remote({"x": 1}).result(5)
    assert e.value.status == 405
