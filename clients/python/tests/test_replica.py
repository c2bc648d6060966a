"""The replica runtime, served in this process on a free port."""

import json
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest

from servemesh import replica


class Echo:
    def __init__(self):
        self.config = None

    def reconfigure(self, config):
        self.config = config

    def __call__(self, request):
        if request.path == "/fail":
            raise RuntimeError("broken on purpose")
        if request.path == "/text":
            return "hello"
        return {"method": request.method, "path": request.path, "body": request.json(), "config": self.config,
                "shadow": request.headers.get("X-Servemesh-Shadow")}


class Batched:
    def __init__(self):
        self.sizes = []

    @replica.batch(max_batch_size=4, batch_wait_timeout_s=0.2)
    def __call__(self, requests):
        self.sizes.append(len(requests))
        time.sleep(0.05)  # a fixed cost per call, whatever the batch
        return [{"n": r.json()["n"], "batch": len(requests)} for r in requests]


@pytest.fixture
def serve():
    servers = []

    def start(instance):
        server = replica.make_server(instance, "127.0.0.1", 0)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return f"http://127.0.0.1:{server.server_address[1]}"

    yield start
    for s in servers:
        s.shutdown()


def call(url, method="GET", body=None, headers=None):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, resp.headers.get("Content-Type"), resp.read()
    except urllib.error.HTTPError as e:
        return e.code, e.headers.get("Content-Type"), e.read()


def test_serves_health_reconfigure_and_calls(serve):
    url = serve(Echo())
    assert call(url + replica.HEALTH_PATH)[0] == 200
    status, _, body = call(url + replica.RECONFIGURE_PATH, "POST", {"threshold": 0.5})
    assert status == 200 and json.loads(body) == {"reconfigured": True}
    status, ctype, body = call(url + "/predict", "POST", {"x": 1}, {"X-Servemesh-Shadow": "model"})
    assert status == 200 and ctype == "application/json"
    assert json.loads(body) == {"method": "POST", "path": "/predict", "body": {"x": 1}, "config": {"threshold": 0.5}, "shadow": "model"}
    assert call(url + "/text")[1:] == ("text/plain; charset=utf-8", b"hello")
    status, _, body = call(url + "/fail")
    assert status == 500 and b"broken on purpose" not in body and b"log" in body  # no exception text to clients


def test_reconfigure_needs_the_agents_secret(serve, monkeypatch):
    # Issue 34: anyone who could call a replica (a public client of a route
    # of "/", another backend's replica) rewrote its user_config.
    monkeypatch.setenv(replica.RECONFIGURE_TOKEN_ENV, "s3cret")
    model = Echo()
    url = serve(model)
    for headers in ({}, {replica.RECONFIGURE_TOKEN_HEADER: "guess"}):
        status, _, body = call(url + replica.RECONFIGURE_PATH, "POST", {"threshold": 99}, headers)
        assert status == 403 and model.config is None, (status, body)
    status, _, _ = call(url + replica.RECONFIGURE_PATH, "POST", {"threshold": 0.5}, {replica.RECONFIGURE_TOKEN_HEADER: "s3cret"})
    assert status == 200 and model.config == {"threshold": 0.5}


def test_bodies_are_bounded_and_may_be_chunked(serve, monkeypatch):
    # Issue 34: any body was read whole, and a chunked one was dropped.
    monkeypatch.setenv(replica.MAX_BODY_ENV, "64")
    url = serve(Echo())

    def chunks(*parts):
        for p in parts:
            yield p

    req = urllib.request.Request(url + "/chunked", data=chunks(b'{"a": ', b'[1, 2]}'), method="POST",
                                 headers={"Transfer-Encoding": "chunked"})
    with urllib.request.urlopen(req, timeout=10) as resp:
        assert json.loads(resp.read())["body"] == {"a": [1, 2]}
    status, _, body = call(url + "/big", "POST", {"x": "y" * 100})
    assert status == 413 and b"64 bytes" in body
    req = urllib.request.Request(url + "/big", data=chunks(b"x" * 40, b"x" * 40), method="POST", headers={"Transfer-Encoding": "chunked"})
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req, timeout=10)
    assert e.value.code == 413


def test_reconfigure_without_the_method_is_refused(serve):
    class Plain:
        def __call__(self, request):
            return "x"

    status, _, body = call(serve(Plain()) + replica.RECONFIGURE_PATH, "POST", {"a": 1})
    assert status == 400 and b"no reconfigure method" in body


def test_batches_concurrent_requests(serve):
    model = Batched()
    url = serve(model)
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda n: json.loads(call(url + "/", "POST", {"n": n})[2]), range(8)))
    assert sorted(a["n"] for a in answers) == list(range(8))  # each request got its own result
    assert sum(model.sizes) == 8 and max(model.sizes) <= 4
    assert max(model.sizes) > 1, f"no batch of more than one request: {model.sizes}"


def test_batch_must_return_one_result_per_request(serve, capfd):
    class Wrong:
        @replica.batch(max_batch_size=2)
        def __call__(self, requests):
            return []

    status, _, body = call(serve(Wrong()) + "/")
    assert status == 500 and b"must return" not in body  # the client gets no exception text...
    assert "must return a list of 1 results" in capfd.readouterr().err  # ...the replica's log does


def test_bad_batch_settings_are_refused():
    with pytest.raises(ValueError):
        replica.batch(max_batch_size=0)
    with pytest.raises(ValueError):
        replica.batch(batch_wait_timeout_s=-1)


@pytest.mark.parametrize("server", ["threads", "asyncio"])
def test_runs_as_a_module(tmp_path, server):
    # python -m servemesh.replica module:Class, as a backend's process runs
    # it: loads the class from a --path folder, then listens and answers its
    # health path; the class's batches and Responses are the runtime's own.
    import os
    import subprocess
    import sys

    (tmp_path / "tiny.py").write_text(
        "from servemesh.replica import Response, batch\n"
        "class Tiny:\n"
        "    @batch(max_batch_size=2)\n"
        "    def __call__(self, requests):\n"
        "        return [Response('tiny', headers={'X-Model': 'tiny'}) for _ in requests]\n")
    # A module planted in the working folder (the replica's own) is not
    # imported in place of the standard library's or the model's.
    work = tmp_path / "work"
    work.mkdir()
    (work / "tiny.py").write_text("raise SystemExit('the planted module ran')\n")
    (work / "hmac.py").write_text("raise SystemExit('the planted hmac ran')\n")
    # json: the package's client imported it before the runtime took the
    # folder off the path (issue 58, a low).
    (work / "json.py").write_text("raise SystemExit('the planted json ran')\n")
    models = tmp_path / "models"
    models.mkdir()
    (tmp_path / "tiny.py").rename(models / "tiny.py")
    src = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "src"))
    proc = subprocess.Popen([sys.executable, "-m", "servemesh.replica", "--path", str(models), "--port", "0", "--server", server, "tiny:Tiny"],
                            cwd=work, stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": src})
    try:
        line = proc.stdout.readline()
        assert f"serving tiny:Tiny ({server}) on 127.0.0.1:" in line, line
        url = "http://127.0.0.1:" + line.rsplit(":", 1)[1].strip()
        assert call(url + replica.HEALTH_PATH)[0] == 200
        assert call(url + "/x")[1:] == ("text/plain; charset=utf-8", b"tiny")
    finally:
        proc.terminate()
        proc.wait(10)


class Adapters:
    """Ray Serve's multiplexing: a model per id, two held at a time."""

    def __init__(self):
        self.loads = []
        self.dropped = []

    @replica.multiplexed(max_num_models_per_replica=2)
    def get_model(self, model_id):
        self.loads.append(model_id)
        time.sleep(0.05)  # a load takes time: concurrent requests for it wait
        owner = self

        class Loaded:
            def __del__(self):
                owner.dropped.append(model_id)

        return Loaded()

    def __call__(self, request):
        self.get_model()
        return {"model": replica.get_multiplexed_model_id()}


def test_multiplexed_models_load_once_and_least_recent_go(serve):
    model = Adapters()
    url = serve(model)
    header = lambda m: {replica.MODEL_ID_HEADER: m}
    with ThreadPoolExecutor(6) as pool:  # six requests for one model: one load
        answers = list(pool.map(lambda _: json.loads(call(url + "/", "POST", {}, header("a"))[2]), range(6)))
    assert answers == [{"model": "a"}] * 6 and model.loads == ["a"]
    for m in ("b", "a", "c"):  # c drops b, the least recently used
        assert json.loads(call(url + "/", "POST", {}, header(m))[2]) == {"model": m}
    assert model.loads == ["a", "b", "c"] and model.dropped == ["b"]
    status, ctype, body = call(url + replica.METRICS_PATH)
    assert status == 200 and ctype.startswith("text/plain")
    assert 'vllm:lora_requests_info{max_lora="2",running_lora_adapters="a,c",waiting_lora_adapters=""}' in body.decode()
    status, _, _ = call(url + "/", "POST", {})  # no model id: the method refuses
    assert status == 500


def test_the_threaded_server_takes_bursts_of_connections():
    # bench/pybatch/runtimes.py at 64 in flight: with the standard
    # library's backlog of 5, connections past it were dropped and waited a
    # second or more (one timed out after 30 s).
    server = replica.make_server(Echo(), "127.0.0.1", 0)
    try:
        assert server.request_queue_size >= 1024 and server.daemon_threads
    finally:
        server.server_close()
