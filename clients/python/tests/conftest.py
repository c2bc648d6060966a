"""The tests run against a live controller that e2e TestPythonClient starts
(the real Consul, two controllers: a leader and a standby), named by
SERVEMESH_TEST_LEADER, SERVEMESH_TEST_STANDBY (https://, its certificate
signed by SERVEMESH_TEST_CA_FILE) and SERVEMESH_TEST_TOKEN_FILE.
Without them the tests fail: run them through `make test`."""

import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "src"))


def _env(name):
    value = os.environ.get(name)
    if not value:
        pytest.fail(f"${name} is not set: these tests need a live controller; run them through e2e TestPythonClient (make test)")
    return value


@pytest.fixture
def mesh():
    return {"leader": _env("SERVEMESH_TEST_LEADER"), "standby": _env("SERVEMESH_TEST_STANDBY"),
            "token_file": _env("SERVEMESH_TEST_TOKEN_FILE"), "ca_file": _env("SERVEMESH_TEST_CA_FILE")}
