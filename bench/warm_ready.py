"""Wait until the warm pool on the running Ray cluster (``--address auto``) holds a worker whose imports are done;
print the pool's state. Used between runs by bench/startup_7b.sh (WARM=...)."""

from __future__ import annotations

import sys
import time

import ray

from ray_jobs.warm_pool import NAMESPACE, POOL_NAME

ray.init(address="auto", logging_level="ERROR")
pool = ray.get_actor(POOL_NAME, namespace=NAMESPACE)
deadline = time.monotonic() + float(sys.argv[1] if len(sys.argv) > 1 else 300)
while (state := ray.get(pool.describe.remote()))["ready"] < 1 and time.monotonic() < deadline:
    time.sleep(1.0)
print(f"warm pool: {state}")
