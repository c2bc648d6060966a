"""These tests run against a live mesh that e2e TestPythonServed starts:
the real Consul, a controller (SERVEMESH_TEST_MESH_SERVER, its token in
SERVEMESH_TEST_MESH_TOKEN_FILE) and two nodes in the default mode (mTLS),
whose public listeners are SERVEMESH_TEST_MESH_PUBLIC (comma-separated).
Process backends run the Python replica runtime: SERVEMESH_TEST_REPLICA_ARGS
is its command line (JSON), ${HOST} and ${PORT} in it. Without them the
tests fail: run them through `make test`."""

import json
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "src"))


def _env(name):
    value = os.environ.get(name)
    if value is None:
        pytest.fail(f"${name} is not set: these tests need a live mesh; run them through e2e TestPythonServed (make test)")
    return value


@pytest.fixture
def mesh():
    return {"server": _env("SERVEMESH_TEST_MESH_SERVER"), "token_file": _env("SERVEMESH_TEST_MESH_TOKEN_FILE") or None,
            "public": _env("SERVEMESH_TEST_MESH_PUBLIC").split(","), "replica": json.loads(_env("SERVEMESH_TEST_REPLICA_ARGS"))}
