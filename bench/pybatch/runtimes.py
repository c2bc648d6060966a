"""Requests per second of the Python replica runtime's two servers, side
by side: threads (the standard library's, a thread per connection, a
plain handler that sleeps) and asyncio (servemesh.asgi under uvicorn, an
async handler that awaits), at 1, 8 and 64 requests in flight.

    .tools/py-venv/bin/python bench/pybatch/runtimes.py [--cost-ms 0,20] [--seconds 5] [--runs 3]

Each server is its own process (python -m servemesh.replica), so the
clients, threads of this one, do not share its interpreter; each client
sends its next request when its last is answered. For each handler cost
(0: the runtime's own cost per request; 20 ms: a wait for I/O), each
in-flight count and each run, both servers are measured one after the
other; it prints the medians over the runs.
"""

import argparse
import os
import statistics
import subprocess
import sys
import threading
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.join(HERE, "..", "..", "clients", "python", "src")
RUNTIMES = {"threads": "waiting:Sleeps", "asyncio": "waiting:Awaits"}


def start(runtime, cost_ms):
    env = {**os.environ, "PYTHONPATH": SRC, "COST_MS": str(cost_ms)}
    proc = subprocess.Popen([sys.executable, "-m", "servemesh.replica", "--server", runtime, "--path", HERE, "--port", "0", RUNTIMES[runtime]],
                            stdout=subprocess.PIPE, text=True, env=env)
    line = proc.stdout.readline()
    if "serving" not in line:
        proc.kill()
        raise SystemExit(f"the {runtime} runtime did not start: {line!r}")
    url = "http://127.0.0.1:" + line.rsplit(":", 1)[1].strip() + "/"
    for _ in range(100):
        try:
            urllib.request.urlopen(url, timeout=5).read()
            return proc, url
        except OSError:
            time.sleep(0.05)
    raise SystemExit(f"the {runtime} runtime does not answer at {url}")


def drive(url, clients, seconds):
    """Requests answered per second, and requests that failed."""
    count, failed, stop, lock = [0], [0], time.monotonic() + seconds, threading.Lock()

    def client():
        n = bad = 0
        while time.monotonic() < stop:
            try:
                with urllib.request.urlopen(url, timeout=30) as resp:
                    resp.read()
                n += 1
            except OSError:
                bad += 1
        with lock:
            count[0] += n
            failed[0] += bad

    threads = [threading.Thread(target=client) for _ in range(clients)]
    begin = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return count[0] / (time.monotonic() - begin), failed[0]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--cost-ms", default="0,20", help="handler costs to measure, comma-separated")
    p.add_argument("--in-flight", default="1,8,64")
    p.add_argument("--seconds", type=float, default=5)
    p.add_argument("--runs", type=int, default=3)
    args = p.parse_args()
    costs = [float(c) for c in args.cost_ms.split(",")]
    flights = [int(n) for n in args.in_flight.split(",")]
    results = {}
    for cost in costs:
        servers = {r: start(r, cost) for r in RUNTIMES}
        try:
            for run in range(args.runs):
                for n in flights:
                    for runtime, (_, url) in servers.items():
                        rps, failed = drive(url, n, args.seconds)
                        results.setdefault((cost, n, runtime), []).append(rps)
                        print(f"run {run + 1}: cost {cost:g} ms, {n:>2} in flight, {runtime:>7}: {rps:7.1f} req/s, {failed} failed", flush=True)
        finally:
            for proc, _ in servers.values():
                proc.terminate()
                proc.wait(10)
    print("\n| handler cost | in flight | threads (req/s) | asyncio (req/s) |\n|---:|---:|---:|---:|")
    for cost in costs:
        for n in flights:
            row = [statistics.median(results[(cost, n, r)]) for r in RUNTIMES]
            print(f"| {cost:g} ms | {n} | {row[0]:.0f} | {row[1]:.0f} |")


if __name__ == "__main__":
    main()
