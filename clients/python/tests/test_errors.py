"""Errors as Ray Serve raises them: a wrong argument type is a TypeError,
raised before anything is sent (so these need no controller: the client
points at a port nothing listens on); the controller's refusals of a
value are ValueErrors."""

import pytest

import servemesh
from servemesh import Client

NOWHERE = "127.0.0.1:9"  # discard: nothing answers, and nothing should be sent


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda c: c.create_backend(42, replicas=["127.0.0.1:9101"]), r"create_backend\(\): name must be a str"),
        (lambda c: c.create_backend("b", replicas="127.0.0.1:9101"), r"replicas must be a list of str, not str"),
        (lambda c: c.create_backend("b", replicas=[9101]), r"replicas's items must be str, not int"),
        (lambda c: c.create_backend("b", replicas=["a:1"], config=["num_replicas", 2]), r"config must be a mapping"),
        (lambda c: c.create_endpoint("e", backend=7), r"create_endpoint\(\): backend must be a str or None, not int"),
        (lambda c: c.create_endpoint("e"), r"create_endpoint\(\): backend must be specified"),
        (lambda c: c.create_endpoint("e", traffic={"v1": "0.5"}), r"traffic\['v1'\] must be a number, not str"),
        (lambda c: c.create_endpoint("e", backend="v1", methods="GET"), r"methods must be a list of str"),
        (lambda c: c.set_traffic("e", [("v1", 1.0)]), r"set_traffic\(\): traffic must be a mapping"),
        (lambda c: c.set_traffic("e", {1: 1.0}), r"traffic's keys must be str, not int"),
        (lambda c: c.set_traffic("e", {"v1": True}), r"traffic\['v1'\] must be a number, not bool"),
        (lambda c: c.shadow_traffic("e", "v2", "0.1"), r"shadow_traffic\(\): proportion must be a number, not str"),
        (lambda c: c.update_backend_config("b", None), r"config_options must be a mapping"),
        (lambda c: c.get_backend(None), r"get_backend\(\): backend must be a str"),
        (lambda c: c.delete_endpoint(3), r"delete_endpoint\(\): endpoint must be a str"),
        (lambda c: c.apply({"backends": []}, dry_run="yes"), r"dry_run must be a bool"),
        (lambda c: c.set_traffic("e", {"a": 1}, wait="yes"), r"set_traffic\(\): wait must be a bool or None"),
        (lambda c: c.create_endpoint("e", backend="a", wait=1), r"create_endpoint\(\): wait must be a bool or None"),
        (lambda c: Client(NOWHERE, wait="no"), r"Client\(\): wait must be a bool"),
        (lambda c: Client(NOWHERE, wait_timeout="60"), r"Client\(\): wait_timeout must be a number"),
    ],
)
def test_wrong_types_are_type_errors(call, match):
    c = Client(NOWHERE, failover_wait=0)
    with pytest.raises(TypeError, match=match):
        call(c)


def test_refused_values_are_value_errors(mesh):
    c = Client(mesh["leader"], token_file=mesh["token_file"], wait=False)
    c.create_backend("py-err", replicas=["127.0.0.1:9121"])
    c.create_endpoint("py-err", backend="py-err", route="/py-err")
    with pytest.raises(ValueError, match="sum to 1"):
        c.set_traffic("py-err", {"py-err": 0.5})  # InvalidError
    with pytest.raises(ValueError):
        c.set_traffic("py-no-such-endpoint", {"py-err": 1})  # NotFoundError
    with pytest.raises(ValueError):
        c.delete_backend("py-err")  # ConflictError: py-err's traffic goes there
    for cls in (servemesh.InvalidError, servemesh.NotFoundError, servemesh.ConflictError):
        assert issubclass(cls, ValueError) and issubclass(cls, servemesh.ServemeshError)
    assert c.delete_endpoint("py-err") is True
    assert c.delete_backend("py-err") is True
