"""The stand-in model server answers as OpenAI's API does: the official
openai SDK, pointed at either node's public listener of the default mesh
(mTLS, two nodes), reads its answers whole and streamed, usage included
(issue 40: an OpenAI SDK pointed at the demo could not parse them)."""

import os
import subprocess

import openai


def _cli(mesh, *args):
    servemesh = os.environ["SERVEMESH_TEST_BIN"]
    client = ["--server", mesh["server"]] + (["--token-file", mesh["token_file"]] if mesh["token_file"] else [])
    done = subprocess.run([servemesh, *args, *client], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_the_openai_sdk_reads_the_stand_in_model_server(mesh):
    servemesh = os.environ["SERVEMESH_TEST_BIN"]
    _cli(mesh, "backend", "create", "oai-llm", "--command", servemesh, "--arg", "demo-model-server", "--arg", "--backend",
         "--arg", "oai-llm", "--arg", "--listen", "--arg", "${HOST}:${PORT}", "--health-path", "/health", "--num-replicas", "2",
         "--wait", "--timeout", "60s")
    _cli(mesh, "endpoint", "create", "oai", "--route", "/oai", "--methods", "POST", "--backend", "oai-llm", "--wait", "--timeout", "60s")
    try:
        for public in mesh["public"]:
            client = openai.OpenAI(base_url=f"http://{public}/oai/v1", api_key="not-checked", max_retries=0, timeout=10)
            answer = client.chat.completions.create(model="mistral-7b", messages=[{"role": "user", "content": "hello"}], max_tokens=5)
            assert answer.id.startswith("chatcmpl-") and answer.object == "chat.completion" and answer.created > 0
            assert answer.choices[0].message.role == "assistant" and answer.choices[0].finish_reason == "stop"
            assert "mistral-7b" in answer.choices[0].message.content
            assert answer.usage.completion_tokens == 5 and answer.usage.total_tokens == answer.usage.prompt_tokens + 5

            chunks = list(client.chat.completions.create(model="mistral-7b", messages=[{"role": "user", "content": "hello"}],
                                                         max_tokens=4, stream=True, stream_options={"include_usage": True}))
            text = "".join(c.choices[0].delta.content for c in chunks if c.choices)
            assert text == "token0 token1 token2 token3 ", text
            assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 4
            assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    finally:
        _cli(mesh, "endpoint", "delete", "oai")
        _cli(mesh, "backend", "delete", "oai-llm")
