"""The replica runtime continues a request's trace: its span is the child
of the traceparent the mesh's Envoy sent, the model's own span is its
child, and both reach a real Jaeger (started by e2e TestPythonClient,
named by SERVEMESH_TEST_JAEGER_OTLP and SERVEMESH_TEST_JAEGER_QUERY)
through the OTLP exporter the runtime sets up from the environment."""

import json
import os
import secrets
import threading
import time
import urllib.request

import pytest

from servemesh import replica


def _env(name):
    value = os.environ.get(name)
    if not value:
        pytest.fail(f"${name} is not set: this test needs a real Jaeger; run it through e2e TestPythonClient (make test)")
    return value


class Traced:
    def __call__(self, request):
        from opentelemetry import trace

        with trace.get_tracer("model").start_as_current_span("model work"):
            return {"path": request.path}


def test_replica_continues_the_trace(monkeypatch):
    otlp, query = _env("SERVEMESH_TEST_JAEGER_OTLP"), _env("SERVEMESH_TEST_JAEGER_QUERY")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://" + otlp)
    monkeypatch.setenv("OTEL_SERVICE_NAME", "servemesh-replica-pytest")
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "100")
    server = replica.make_server(Traced(), "127.0.0.1", 0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        trace_id, parent = secrets.token_hex(16), secrets.token_hex(8)
        req = urllib.request.Request(f"http://127.0.0.1:{server.server_address[1]}/v1/infer",
                                     headers={"traceparent": f"00-{trace_id}-{parent}-01"})
        with urllib.request.urlopen(req, timeout=10) as resp:
            assert json.load(resp) == {"path": "/v1/infer"}
        spans = _spans(query, trace_id, 2)
    finally:
        server.shutdown()
    by_name = {s["operationName"]: s for s in spans}
    assert set(by_name) == {"replica GET", "model work"}, spans
    runtime, model = by_name["replica GET"], by_name["model work"]
    assert _parent(runtime) == parent, "the runtime's span is not the child of the request's traceparent"
    assert _parent(model) == runtime["spanID"], "the model's span is not the child of the runtime's"
    tags = {t["key"]: t["value"] for t in runtime["tags"]}
    assert tags.get("url.path") == "/v1/infer" and tags.get("http.response.status_code") == 200, tags


def _spans(query, trace_id, want, timeout_s=30):
    deadline, last = time.time() + timeout_s, None
    while time.time() < deadline:
        try:
            with urllib.request.urlopen(f"{query}/api/traces/{trace_id}", timeout=5) as resp:
                data = json.load(resp)["data"]
            if data and len(data[0]["spans"]) >= want:
                return data[0]["spans"]
            last = data
        except Exception as e:  # not there yet: Jaeger answers 404
            last = e
        time.sleep(0.2)
    pytest.fail(f"trace {trace_id} did not reach Jaeger with {want} spans within {timeout_s} s: {last}")


def _parent(span):
    refs = [r["spanID"] for r in span["references"] if r["refType"] == "CHILD_OF"]
    return refs[0] if refs else ""
