"""The official OpenAI SDK reads the mesh's own answers on an endpoint
routed by model: the models it may name (GET /v1/models, the mesh's list
of the endpoint's models), and a model no backend serves, a NotFoundError
whose message and code are the mesh's (a text answer gave only "Error
code: 404"). Arguments: the node's public address, the unknown model and
the models the endpoint routes, comma-separated."""

import sys

import openai

public, model, routed = sys.argv[1], sys.argv[2], sys.argv[3].split(",")
client = openai.OpenAI(base_url=f"http://{public}/v1", api_key="not-checked", max_retries=0, timeout=30)
listed = [m.id for m in client.models.list()]
assert listed == routed, f"models listed {listed}, want {routed}"
print(f"{public}: models {listed}")
try:
    client.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}])
except openai.NotFoundError as e:
    assert "serves no such model" in e.message, e.message
    assert e.code == "model_not_found" and e.param == "model", (e.code, e.param)
    print(f"{public}: {e.message}")
else:
    sys.exit(f"model {model!r} was answered")
