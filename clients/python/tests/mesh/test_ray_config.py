"""A Ray Serve config file, applied as it is (servemesh apply -f), is
served: its ingress answers at its route_prefix, calling the other
deployment through a handle, on its user_config; it is merged into the
mesh, whose other backends stay."""

import json
import os
import subprocess
import urllib.request

from servemesh import Client


def test_a_ray_serve_config_is_imported_and_served(mesh):
    servemesh = os.environ["SERVEMESH_TEST_BIN"]
    config = os.environ["SERVEMESH_TEST_RAY_CONFIG"]
    flags = json.loads(os.environ["SERVEMESH_TEST_RAY_FLAGS"])
    printed = subprocess.run([servemesh, "import", "ray", "-f", config] + flags, capture_output=True, text=True, check=True).stdout
    assert "# note: proxy_location: servemesh has no equivalent" in printed and "default-summarizer" in printed
    client = ["--server", mesh["server"]] + (["--token-file", mesh["token_file"]] if mesh["token_file"] else [])
    c = Client(mesh["server"], token_file=mesh["token_file"])
    c.create_backend("py-kept", replicas=["127.0.0.1:9131"])  # not the config's: the apply keeps it
    applied = subprocess.run([servemesh, "apply", "-f", config, "--wait", "--wait-timeout", "90s"] + client + flags, capture_output=True, text=True)
    assert applied.returncode == 0, applied.stderr
    assert "note: http_options.port" in applied.stderr and "served by every node" in applied.stdout
    assert "a Ray Serve config is merged into the mesh" in applied.stderr, applied.stderr
    assert "delete" not in applied.stdout, applied.stdout
    assert "py-kept" in c.list_backends()
    c.delete_backend("py-kept")
    for public in mesh["public"]:  # right after apply --wait, through each node
        for _ in range(4):
            req = urllib.request.Request(f"http://{public}/summarize", data=json.dumps({"text": "hello world"}).encode(), method="POST",
                                         headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(req, timeout=10) as resp:
                assert json.loads(resp.read()) == {"summary": "hello", "translated": "hello (german)"}
    for endpoint in ("default", "default-translator"):
        c.delete_endpoint(endpoint)
    for backend in ("default-summarizer", "default-translator"):
        c.delete_backend(backend)
