"""An async model class streaming its answer, served by servemesh's
asyncio runtime in e2e TestPythonAsyncStreaming: the first chunk at once,
the rest once the file the request names (release=) exists, so the test
sees the first chunk arrive before the model has made the rest."""

import asyncio
import os


class Streamer:
    def __init__(self):
        self.backend = os.environ.get("SERVEMESH_BACKEND", "")

    async def __call__(self, request):
        release = request.query_params.get("release", "")
        body = await request.body()

        async def tokens():
            yield {"backend": self.backend, "chunk": 0, "bytes": len(body)}
            for _ in range(500):  # at most 5 s
                if not release or os.path.exists(release):
                    break
                await asyncio.sleep(0.01)
            for i in range(1, 4):
                yield {"backend": self.backend, "chunk": i}

        return tokens()
