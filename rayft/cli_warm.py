"""``rayft warm start|status|stop``: the operator's warm pool (``ray_jobs/warm/pool.py``) on a running cluster.

rayft warm start SPEC.yaml --address auto [--set model.path=...] [--wait]   # keep SPEC's base loaded for the next jobs
rayft warm status --address auto                                             # workers idle, ready, lent; the base they load
rayft warm stop --address auto                                               # stop the pool and free its GPUs

Without ``start``, the pool is made by the first job that could take a warm worker (``RAYFT_WARM_WORKERS``), so the
first job after the cluster starts, or after the pool's idle time, runs on Ray Train: on an H200 the 7B preset's first
step came 51-95 s after start that way, against 11-13 s on a warm worker holding its base (``bench/RESULTS.md``).
``start`` makes the pool now, and its workers import the training stack and load SPEC's base before any job comes.
After a job, the next worker loads that job's base, as it does without ``start``: the pool follows what teams run. A
worker that cannot load a base logs why and serves jobs without it (the job loads its own).
The settings are the service's: ``RAYFT_WARM_WORKERS`` (here 1 unless set) and ``RAYFT_WARM_IDLE_S``; a pool that
already runs keeps the settings it was made with.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any


def add_commands(sub: Any, add_overrides: Any) -> None:
    p = sub.add_parser("warm", help="the warm pool: keep a base loaded for the next one-worker jobs (operators)")
    verbs = p.add_subparsers(required=True, metavar="VERB")
    start = verbs.add_parser("start", help="make the pool now, its workers loading SPEC's base ahead")
    start.add_argument("spec", help="a job spec whose base, dtype, quantization and shape the pool serves")
    add_overrides(start)
    start.add_argument(
        "--wait", action="store_true", help="return once a worker holds the base (up to 10 minutes: warm_control.until_ready)"
    )
    start.set_defaults(command=cmd_start)
    status = verbs.add_parser("status", help="the pool's workers and the base they load")
    status.set_defaults(command=cmd_status)
    stop = verbs.add_parser("stop", help="stop the pool and its workers, freeing their GPUs")
    stop.set_defaults(command=cmd_stop)
    for q in (start, status, stop):
        q.add_argument("--address", required=True, help="the Ray cluster's address (auto: the one on this node)")


def cmd_start(args: argparse.Namespace) -> int:
    from ray_jobs.warm import control as warm_control
    from ray_jobs.warm.settings import WarmSettings
    from rayft import exits
    from rayft.cli import load_spec

    spec = load_spec(args.spec, args.set).with_absolute_paths()
    try:
        settings = WarmSettings.from_env({"RAYFT_WARM_WORKERS": "1", **os.environ})
        warm_control.primed_shape(spec, settings)  # before connecting: a spec no warm worker serves is a usage error
        _connect(args.address, spec)
        pool = warm_control.prime(spec, settings)
    except ValueError as exc:  # the settings, the spec's shape or the running pool's: each message names the fix
        print(f"error: {exc}", file=sys.stderr)
        return exits.USAGE
    state = warm_control.until_ready(pool) if args.wait else warm_control.state_of(pool)
    print(f"warm pool: {state.line()}")
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    from ray_jobs.warm import control as warm_control

    pool = _running(args.address)
    print(f"warm pool: {warm_control.state_of(pool).line()}" if pool is not None else "warm pool: none on this cluster")
    return 0


def cmd_stop(args: argparse.Namespace) -> int:
    import ray

    pool = _running(args.address)
    if pool is None:
        print("warm pool: none on this cluster")
        return 0
    ray.kill(pool)  # its workers are its own actors: they end with it
    print("warm pool: stopped; its workers' resources are free")
    return 0


def _connect(address: str, spec: Any = None) -> None:
    from ray_jobs import local_ray

    local_ray.connect(address, spec)


def _running(address: str) -> Any:
    from ray_jobs.warm.pool import running_pool

    _connect(address)
    return running_pool()
