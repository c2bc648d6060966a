"""A model class served by servemesh's Python replica runtime in e2e
TestPythonBackend: it says which backend answered and what config it took,
and batches its calls."""

import os

from servemesh.replica import Response, batch


class Model:
    def __init__(self):
        self.backend = os.environ.get("SERVEMESH_BACKEND", "")
        self.replica = os.environ.get("SERVEMESH_REPLICA_TAG", "")
        self.config = None

    def reconfigure(self, config):
        self.config = config

    @batch(max_batch_size=4, batch_wait_timeout_s=0.005)
    def __call__(self, requests):
        return [Response({"backend": self.backend, "replica": self.replica, "config": self.config, "batch": len(requests)},
                         headers={"X-Servemesh-Backend": self.backend}) for _ in requests]
