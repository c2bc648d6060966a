"""A model class served by servemesh's Python replica runtime in e2e
TestPythonMultiplexedModels: Ray Serve's multiplexing, two models (say
LoRA adapters) held per replica, loaded on demand by the id each request
names."""

import os
import threading
import time

from servemesh.replica import get_multiplexed_model_id, multiplexed


class Adapters:
    def __init__(self):
        self.replica = os.environ.get("SERVEMESH_REPLICA_TAG", "")
        self.lock = threading.Lock()
        self.loads = 0

    @multiplexed(max_num_models_per_replica=2)
    def get_model(self, model_id):
        time.sleep(0.03)  # loading weights
        with self.lock:
            self.loads += 1
        return {"id": model_id}

    def __call__(self, request):
        model_id = get_multiplexed_model_id()
        if not model_id:  # a probe: which replica answers
            return {"replica": self.replica}
        with self.lock:
            before = self.loads
        model = self.get_model()
        with self.lock:
            loaded = self.loads > before
        return {"replica": self.replica, "model": model["id"], "loaded_model": loaded}
