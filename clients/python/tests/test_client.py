import pytest

import servemesh
from servemesh import Client


def test_ray_serve_verbs(mesh):
    c = Client(mesh["leader"], token_file=mesh["token_file"], wait=False)
    assert c.create_backend("py-v1", replicas=["127.0.0.1:9101"]) is True
    assert c.create_backend("py-v1", replicas=["127.0.0.1:9101"]) is False  # the same again changes nothing
    c.create_backend("py-v2", replicas=["127.0.0.1:9102"], config={"max_concurrent_queries": 4})
    c.create_backend("py-v3", replicas=["127.0.0.1:9103"])
    assert c.create_endpoint("py", backend="py-v1", route="/py", methods=["GET", "POST"]) is True
    assert c.get_traffic("py") == {"py-v1": 1.0}

    assert c.set_traffic("py", {"py-v1": 0.9, "py-v2": 0.1}) is True
    assert c.get_traffic("py") == {"py-v1": 0.9, "py-v2": 0.1}
    assert c.shadow_traffic("py", "py-v3", 0.25) is True
    assert c.get_shadows("py") == {"py-v3": 0.25}
    assert c.shadow_traffic("py", "py-v3", 0) is True
    assert c.get_shadows("py") == {}

    assert c.update_backend_config("py-v2", {"max_concurrent_queries": 8}) is True
    assert c.get_backend_config("py-v2")["max_concurrent_queries"] == 8
    # A JSON merge patch: None removes a field, a dict merges.
    assert c.update_backend_config("py-v2", {"max_concurrent_queries": None, "outlier": {"consecutive_5xx": 3}}) is True
    assert c.update_backend_config("py-v2", {"outlier": {"interval_s": 2}}) is True
    config = c.get_backend_config("py-v2")
    assert "max_concurrent_queries" not in config
    assert config["outlier"] == {"consecutive_5xx": 3, "interval_s": 2}
    with pytest.raises(servemesh.InvalidError, match="max_concurent_queries"):
        c.update_backend_config("py-v2", {"max_concurent_queries": 1})
    assert set(c.list_backends()) >= {"py-v1", "py-v2", "py-v3"}
    assert c.list_endpoints()["py"]["route"] == "/py"
    assert any(e["name"] == "py" for e in c.status()["endpoints"])

    assert c.set_traffic("py", {"py-v1": 1}) is True
    assert c.delete_backend("py-v2") is True
    assert c.delete_backend("py-v3") is True
    assert c.delete_endpoint("py") is True
    assert c.delete_backend("py-v1") is True


def test_model_endpoint(mesh):
    c = Client(mesh["leader"], token_file=mesh["token_file"], wait=False)
    c.create_backend("py-llama", replicas=["127.0.0.1:9111"])
    c.create_backend("py-mistral", replicas=["127.0.0.1:9112"])
    models = {"llama-3-8b": {"traffic": {"py-llama": 1}, "shadows": {"py-mistral": 0.5}}, "mistral-7b": {"traffic": {"py-mistral": 1}}}
    assert c.create_endpoint("py-chat", route="/py-chat", methods=["POST"], models=models, criticality="sheddable") is True
    e = c.list_endpoints()["py-chat"]
    assert e["model_routing"]["models"]["llama-3-8b"]["shadows"] == {"py-mistral": 0.5}
    assert e["criticality"] == "sheddable"
    with pytest.raises(servemesh.InvalidError, match="model_routing.models.bad.traffic"):
        c.create_endpoint("py-bad", route="/py-bad", models={"bad": {"traffic": {"py-llama": 0.5}}})
    with pytest.raises(ValueError):
        c.create_endpoint("py-both", backend="py-llama", models=models)
    assert c.delete_endpoint("py-chat") is True
    assert c.delete_backend("py-llama") is True
    assert c.delete_backend("py-mistral") is True


def test_typed_errors(mesh):
    c = Client(mesh["leader"], token_file=mesh["token_file"], wait=False)
    c.create_backend("err-a", replicas=["127.0.0.1:9201"])
    c.create_endpoint("err", backend="err-a")
    with pytest.raises(servemesh.InvalidError) as e:
        c.set_traffic("err", {"err-a": 0.5})
    assert "sum" in e.value.message and e.value.status == 400
    with pytest.raises(servemesh.NotFoundError):
        c.get_backend("no-such-backend")
    with pytest.raises(servemesh.ConflictError):
        c.delete_backend("err-a")  # the endpoint still uses it
    with pytest.raises(servemesh.UnauthorizedError):
        Client(mesh["leader"], token="wrong-token", failover_wait=0).list_backends()
    c.delete_endpoint("err")
    c.delete_backend("err-a")


def test_follows_the_leader(mesh):
    # The standby first: it answers a write 503 naming the leader, which
    # the client then asks; a dead server is passed over.
    c = Client([mesh["standby"], "127.0.0.1:1", mesh["leader"]], token_file=mesh["token_file"], ca_file=mesh["ca_file"], failover_wait=10, wait=False)
    assert c.create_backend("follow", replicas=["127.0.0.1:9301"]) is True
    assert c.leader()["leading"] is True
    c.delete_backend("follow")
    only_standby = Client(mesh["standby"], token_file=mesh["token_file"], ca_file=mesh["ca_file"], failover_wait=1, wait=False)
    with pytest.raises(servemesh.NotLeaderError):
        only_standby.create_backend("nowhere", replicas=["127.0.0.1:9302"])


def test_apply_dry_run(mesh):
    c = Client(mesh["leader"], token_file=mesh["token_file"], wait=False)
    res = c.apply({"backends": [{"name": "dry", "replicas": [{"address": "127.0.0.1:9401"}]}]}, dry_run=True)
    assert res["dry_run"] is True and any("dry" in ch for ch in res["changes"])
    with pytest.raises(servemesh.NotFoundError):
        c.get_backend("dry")


def test_https_needs_the_ca(mesh):
    # The standby serves HTTPS: with the CA file its certificate is
    # verified and it answers reads; without, nothing is sent.
    assert Client(mesh["standby"], token_file=mesh["token_file"], ca_file=mesh["ca_file"]).leader()["leading"] is False
    with pytest.raises(servemesh.NotLeaderError) as e:
        Client(mesh["standby"], token_file=mesh["token_file"], failover_wait=0).leader()
    assert "CERTIFICATE_VERIFY_FAILED" in str(e.value)


def test_a_change_no_node_serves_is_not_served(mesh):
    # This controller has no node: a change is stored, but nothing serves
    # it, and a call that waits (the default) says so when its time is up.
    c = Client(mesh["leader"], token_file=mesh["token_file"], wait_timeout=0.5)
    with pytest.raises(servemesh.ServedTimeoutError, match="no node is connected to the controller") as e:
        c.create_backend("py-unserved", replicas=["127.0.0.1:9501"])
    assert isinstance(e.value, TimeoutError) and any("no node" in w for w in e.value.waiting)
    assert c.get_backend("py-unserved")["name"] == "py-unserved"  # stored
    with pytest.raises(TypeError, match=r"delete_backend\(\): wait must be a bool or None"):
        c.delete_backend("py-unserved", wait="no")
    assert c.delete_backend("py-unserved", wait=False) is True
