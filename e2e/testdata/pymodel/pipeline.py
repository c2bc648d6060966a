"""A two-stage pipeline for e2e TestPythonPipeline: Router, an async model
class, calls the embed endpoint through a handle (the node's mesh
listener) and streams back its answer and embed's streamed tokens;
Embed answers both."""

import asyncio
import os

import servemesh


class Embed:
    def __init__(self):
        self.backend = os.environ.get("SERVEMESH_BACKEND", "")

    async def __call__(self, request):
        body = await request.json()
        if request.url.path == "/tokens":
            async def tokens():
                for i in range(3):
                    yield {"backend": self.backend, "token": i}
                    await asyncio.sleep(0)
            return tokens()
        return {"backend": self.backend, "vector": [len(body.get("text", ""))]}


class Router:
    def __init__(self):
        self.embed = servemesh.get_handle("embed", path="/embed")
        self.tokens = servemesh.get_handle("embed", path="/tokens").options(stream=True)

    async def __call__(self, request):
        body = await request.json()
        vector = await self.embed.remote(body)

        async def answer():
            yield {"stage": "router", "embedded_by": vector["backend"], "vector": vector["vector"]}
            async for token in self.tokens.remote(body):
                yield token
        return answer()
