"""The official OpenAI SDK against the real model server through the mesh:
for each node's public listener given, a whole chat completion (with the
engine's usage), a streamed one, and the model list, as an application
using the SDK would read them. Prints one line per node; exits non-zero
on the first thing the SDK could not read."""

import sys

import openai

for public in sys.argv[1:]:
    client = openai.OpenAI(base_url=f"http://{public}/v1", api_key="not-checked", max_retries=0, timeout=120)
    models = [m.id for m in client.models.list()]
    assert models, "no model listed"
    messages = [{"role": "user", "content": "Say hello to the mesh."}]
    answer = client.chat.completions.create(model="tiny", messages=messages, max_tokens=8)
    assert answer.object == "chat.completion" and answer.choices[0].message.role == "assistant", answer
    usage = answer.usage
    assert usage.prompt_tokens > 0 and usage.completion_tokens > 0, usage
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens, usage
    chunks = list(client.chat.completions.create(model="tiny", messages=messages, max_tokens=8, stream=True))
    deltas = [c for c in chunks if c.choices and c.choices[0].delta.content is not None]
    assert deltas, chunks
    finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finish and finish[-1] in ("length", "stop"), chunks
    print(f"{public}: models {models}; whole answer usage {usage.prompt_tokens}+{usage.completion_tokens}; {len(deltas)} streamed deltas, finish {finish[-1]}")
