"""What an operator does with the warm pool (``ray_jobs.warm.pool``) from outside a job: start it ahead with the base
its workers load (``rayft warm start``), wait for it, look at it. A team's job never calls these: it takes what it finds.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from ray_jobs.warm.pool import pool_of
from ray_jobs.warm.settings import PoolState, Shape, WarmSettings

if TYPE_CHECKING:
    from rayft_contract.spec import FineTuneSpec


def primed_shape(spec: FineTuneSpec, settings: WarmSettings) -> Shape:
    """The shape of the jobs a pool primed with ``spec`` serves; ``ValueError`` naming the fix where it would serve none."""
    if not settings.workers:
        raise ValueError("RAYFT_WARM_WORKERS is 0: set how many warm workers to keep, e.g. RAYFT_WARM_WORKERS=1")
    shape = Shape.of(spec)
    if shape is None:
        raise ValueError(
            f"scaling.num_workers is {spec.scaling.num_workers}: warm workers serve jobs of one worker only; "
            "prime the pool with a one-worker spec (--set scaling.num_workers=1)"
        )
    return shape


def prime(spec: FineTuneSpec, settings: WarmSettings | None = None) -> Any:
    """The pool, made now for jobs of ``spec``'s shape, its workers loading ``spec``'s base ahead for the cluster's first
    job. ``ValueError`` where none could serve ``spec`` (:func:`primed_shape`) or a pool of another shape runs."""
    import ray

    settings = settings or WarmSettings.from_env()
    shape = primed_shape(spec, settings)
    pool = pool_of(settings, shape)
    if not ray.get(pool.prime.remote(shape, spec)):
        running = state_of(pool).shape
        raise ValueError(f"a pool for jobs of {running} runs; `rayft warm stop` it first to keep jobs of {shape}")
    return pool


def state_of(pool: Any) -> PoolState:
    import ray

    return ray.get(pool.describe.remote())


def until_ready(pool: Any, timeout_s: float = 600.0) -> PoolState:
    """Polls ``pool`` until an idle worker's start (imports, the base loaded ahead) is done: a condition; the deadline
    only ends a hang, with ``TimeoutError``."""
    deadline = time.monotonic() + timeout_s
    while (state := state_of(pool)).ready < 1:
        if time.monotonic() > deadline:
            raise TimeoutError(f"no warm worker was ready after {timeout_s:.0f} s: {state.line()}")
        time.sleep(1.0)
    return state
