"""Wait until the warm pool on the running Ray cluster (``--address auto``) holds a worker whose imports are done;
print the pool's state. Used between runs by bench/startup_7b.sh (WARM=...)."""

from __future__ import annotations

import sys

import ray

from ray_jobs.warm.control import state_of, until_ready
from ray_jobs.warm.pool import running_pool

ray.init(address="auto", logging_level="ERROR")
pool = running_pool()
try:
    state = until_ready(pool, float(sys.argv[1] if len(sys.argv) > 1 else 300))
except TimeoutError:  # the next run then goes on Ray Train, which its summary says
    state = state_of(pool)
print(f"warm pool: {state.line()}")
