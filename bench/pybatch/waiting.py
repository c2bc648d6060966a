"""Models of bench/pybatch/runtimes.py: a handler that waits COST_MS per
call (for I/O: another service, a model server's answer), written for
each runtime: a plain method that sleeps on its thread, and an async one
that awaits on the loop."""

import asyncio
import os
import time

COST_S = float(os.environ.get("COST_MS", "0")) / 1000


class Sleeps:
    def __call__(self, request):
        if COST_S:
            time.sleep(COST_S)
        return "ok"


class Awaits:
    async def __call__(self, request):
        if COST_S:
            await asyncio.sleep(COST_S)
        return "ok"
