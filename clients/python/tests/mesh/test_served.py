"""Ray Serve's calls return once the change is served: a request sent
right after each one, through either node, gets the new state's answer."""

import json
import time
import urllib.error
import urllib.request

import servemesh
from servemesh import Client


def _process(mesh):
    command, *args = mesh["replica"]
    return {"command": command, "args": args, "health_path": "/-/healthz", "reconfigure_path": "/-/reconfigure"}


def _get(public, path):
    """(status, the answering backend) of GET path through a node."""
    try:
        with urllib.request.urlopen(f"http://{public}{path}", timeout=5) as resp:
            return resp.status, json.loads(resp.read()).get("backend", "")
    except urllib.error.HTTPError as e:
        return e.code, ""


def _all_from(mesh, path, backend, n=10):
    """n requests through each node, right now: every one from backend."""
    got = [_get(public, path) for public in mesh["public"] for _ in range(n)]
    assert got == [(200, backend)] * len(got), f"right after the call, {path} answered {sorted(set(got))}; want 200 from {backend} every time"


def _timed(what, call):
    start = time.monotonic()
    result = call()
    print(f"{what}: returned after {time.monotonic() - start:.2f}s")
    return result


def test_a_request_right_after_each_call_is_served(mesh):
    c = Client(mesh["server"], token_file=mesh["token_file"])
    config = {"num_replicas": 2, "cpus": 0.5}
    _timed("create_backend a", lambda: c.create_backend("served-a", process=_process(mesh), config=config))
    a = next(b for b in c.status()["backends"] if b["name"] == "served-a")
    assert a["ready"] == 2, f"create_backend returned with {a['ready']} of 2 replicas ready"
    _timed("create_endpoint", lambda: c.create_endpoint("served", backend="served-a", route="/served"))
    _all_from(mesh, "/served", "served-a")

    _timed("create_backend b", lambda: c.create_backend("served-b", process=_process(mesh), config={"num_replicas": 1, "cpus": 0.5}))
    for i in range(4):  # each switch is served at once, both ways
        to = ("served-b", "served-a")[i % 2]
        _timed(f"set_traffic to {to}", lambda: c.set_traffic("served", {to: 1}))
        _all_from(mesh, "/served", to)

    _timed("update_backend_config b: 3 replicas", lambda: c.update_backend_config("served-b", {"num_replicas": 3}))
    b = next(b for b in c.status()["backends"] if b["name"] == "served-b")
    assert b["ready"] == 3, f"update_backend_config returned with {b['ready']} of 3 replicas ready"
    _timed("set_traffic to b", lambda: c.set_traffic("served", {"served-b": 1}))
    _all_from(mesh, "/served", "served-b", n=20)
    _timed("shadow_traffic to a", lambda: c.shadow_traffic("served", "served-a", 1.0))
    _all_from(mesh, "/served", "served-b")  # the answers are still b's; a gets copies
    _timed("shadow_traffic removed", lambda: c.shadow_traffic("served", "served-a", 0))
    _all_from(mesh, "/served", "served-b")

    # A user_config reaches every replica (reconfigure) before the call returns.
    _timed("update_backend_config b: user_config", lambda: c.update_backend_config("served-b", {"user_config": {"threshold": 0.7}}))
    configs = []
    for public in mesh["public"]:
        for _ in range(20):
            with urllib.request.urlopen(f"http://{public}/served", timeout=5) as resp:
                configs.append(json.loads(resp.read())["config"])
    assert configs == [{"threshold": 0.7}] * len(configs), f"right after the user_config change, replicas answered with {configs}"

    _timed("delete_endpoint", lambda: c.delete_endpoint("served"))
    got = [_get(public, "/served")[0] for public in mesh["public"]]
    assert got == [404] * len(got), f"right after delete_endpoint, /served answered {got}; want 404 on every node"
    c.delete_backend("served-b")
    c.delete_backend("served-a")


def test_a_crash_looping_backend_fails_the_call(mesh):
    c = Client(mesh["server"], token_file=mesh["token_file"], wait_timeout=90)
    process = {"command": mesh["replica"][0], "args": ["-c", "import sys; sys.exit(3)"]}
    start = time.monotonic()
    try:
        c.create_backend("served-crash", process=process, config={"num_replicas": 1, "cpus": 0.5})
        raise AssertionError("create_backend of a replica that exits at once returned")
    except servemesh.NotServedError as e:
        assert "crash-looping" in e.failed and not isinstance(e, TimeoutError), e
        print(f"create_backend of a crash-looping replica failed after {time.monotonic() - start:.1f}s: {e.failed[:120]}")
    finally:
        c.delete_backend("served-crash", wait=False)
