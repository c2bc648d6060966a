"""The official OpenAI SDK reads the mesh's own answer to a model no
backend serves, on an endpoint routed by model: a NotFoundError whose
message and code are the mesh's (a text answer gave only "Error code:
404"). Arguments: the node's public address and the unknown model."""

import sys

import openai

public, model = sys.argv[1], sys.argv[2]
client = openai.OpenAI(base_url=f"http://{public}/v1", api_key="not-checked", max_retries=0, timeout=30)
try:
    client.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}])
except openai.NotFoundError as e:
    assert "serves no such model" in e.message, e.message
    assert e.code == "model_not_found" and e.param == "model", (e.code, e.param)
    print(f"{public}: {e.message}")
else:
    sys.exit(f"model {model!r} was answered")
