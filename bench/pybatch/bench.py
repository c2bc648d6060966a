"""Throughput of the Python replica runtime with and without batching, for
a handler whose every call costs a fixed time whatever its batch and runs
one at a time (a model's forward pass on its one accelerator, roughly: a
lock holds the other calls while one runs).

    python3 bench/pybatch/bench.py [--cost-ms 20] [--clients 32] [--seconds 5] [--runs 3]

Each run serves the same model twice on loopback, once with calls one by
one and once batched (servemesh.replica.batch, max_batch_size 8 and 16,
batch_wait_timeout_s 2 ms), and drives each with the same number of
clients, each sending its next request when its last is answered; it
prints requests per second and the median latency of each, and the
medians over the runs.
"""

import argparse
import os
import statistics
import sys
import threading
import time
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "clients", "python", "src"))

from servemesh import replica  # noqa: E402


def model(cost_s, max_batch_size):
    device = threading.Lock()  # one forward pass at a time

    class OneByOne:
        def __call__(self, request):
            with device:
                time.sleep(cost_s)
            return "ok"

    class Batched:
        @replica.batch(max_batch_size=max_batch_size, batch_wait_timeout_s=0.002)
        def __call__(self, requests):
            with device:
                time.sleep(cost_s)
            return ["ok"] * len(requests)

    return OneByOne() if max_batch_size == 1 else Batched()


def drive(url, clients, seconds):
    latencies, stop = [], time.monotonic() + seconds
    lock = threading.Lock()

    def client():
        mine = []
        while time.monotonic() < stop:
            t0 = time.monotonic()
            with urllib.request.urlopen(url, timeout=30) as resp:
                resp.read()
            mine.append(time.monotonic() - t0)
        with lock:
            latencies.extend(mine)

    threads = [threading.Thread(target=client) for _ in range(clients)]
    start = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return len(latencies) / (time.monotonic() - start), statistics.median(latencies) * 1000


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--cost-ms", type=float, default=20)
    p.add_argument("--clients", type=int, default=32)
    p.add_argument("--seconds", type=float, default=5)
    p.add_argument("--runs", type=int, default=3)
    args = p.parse_args()
    sizes = [1, 8, 16]
    results = {n: [] for n in sizes}
    print(f"handler cost {args.cost_ms} ms a call, {args.clients} clients, {args.seconds} s a measure, {args.runs} runs")
    for run in range(args.runs):
        for n in sizes:
            server = replica.make_server(model(args.cost_ms / 1000, n), "127.0.0.1", 0)
            threading.Thread(target=server.serve_forever, daemon=True).start()
            rps, p50 = drive(f"http://127.0.0.1:{server.server_address[1]}/", args.clients, args.seconds)
            server.shutdown()
            server.server_close()
            results[n].append((rps, p50))
            print(f"run {run + 1}: max_batch_size {n:>2}: {rps:7.1f} req/s, median latency {p50:6.1f} ms", flush=True)
    print("\n| max_batch_size | requests/s (median of runs) | median latency (ms) |\n|---:|---:|---:|")
    for n in sizes:
        print(f"| {n} | {statistics.median(r for r, _ in results[n]):.0f} | {statistics.median(l for _, l in results[n]):.1f} |")


if __name__ == "__main__":
    main()
