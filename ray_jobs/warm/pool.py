"""Warm workers: processes that imported the training stack before a job came, for one-worker jobs to take over.

Why: on an H200 (bench/RESULTS.md) about 18 s of a warm job's time to its first step were imports in fresh
processes (torch, transformers, peft, bitsandbytes; Ray Train's controller's, then its worker's), and 7-16 s
more the controller, its placement group and the worker's launch. Ray Train cannot adopt a process that is
already running, and Ray hands an idle process only to tasks of the same job and runtime environment. So a
process that outlives a job is an actor of its own, and it runs the loop itself (``ray_jobs.train.session``).

The operator turns the pool on for every job (the service passes its settings on): ``RAYFT_WARM_WORKERS`` is
how many to keep (0, the default: none) and ``RAYFT_WARM_IDLE_S`` how long they wait for a job before they are
stopped and their GPUs are free again. Rules that keep the pool from costing anyone:
- A worker runs one job, then it is stopped: nothing of a team's job (its environment, the kernels it patched
  in, its GPU memory) is there when the next job starts. A replacement starts in its place.
- Only jobs of one worker take one (``scaling.num_workers: 1``), of the shape the pool was made for.
- A job that does not take one stands the pool down first: its idle workers stop and no new one starts while
  that job runs, so a GPU held by a warm worker never keeps a job waiting.
- New workers start only onto resources free at that moment; they never queue behind jobs.
- A job whose warm worker fails resumes on Ray Train from the warm worker's last checkpoint.

A job with no pool may get a warm worker of its own, started at its connect (``ray_jobs.warm.early``): a lease of
this module's with no pool behind it.
"""

from __future__ import annotations

import dataclasses
import importlib
import logging
import os
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ray_jobs.warm.settings import PoolState, Shape, WarmSettings

if TYPE_CHECKING:
    from ray_jobs.storage import Location
    from ray_jobs.train.loop import LoopConfig
    from rayft_contract.spec import FineTuneSpec

log = logging.getLogger(__name__)

POOL_NAME, NAMESPACE = "rayft-warm-pool", "rayft"
WARM_IMPORTS = (
    "torch",
    "transformers",
    "transformers.models.llama.modeling_llama",
    "peft",
    "bitsandbytes",
    "liger_kernel.transformers",
    "liger_kernel.transformers.monkey_patch",
    "ray.train.torch",
    "ray.data",
    "ray_jobs.train.loop",
)
"""What a worker imports before any job: what a job's set-up imported on the H200 (``python -X importtime``). Liger's
``monkey_patch`` too, before the worker compiles anything: it defines transformers output classes, each registered as a
pytree node, and every compiled function's guards count those. Imported by the job's kernels after the worker's
compiles, it made the job's first step compile flex attention's mask and kernel and FP8's row scaling again (H100,
2026-12-06: about 2.5 s of dynamo in that step)."""
READY_WAIT_S = 120.0
"""How long a job waits for a warm worker that is still importing, rather than stand the pool down."""


class WarmWorker:
    """One process that imported :data:`WARM_IMPORTS` (and made its CUDA context) before its job came."""

    def __init__(self, base: FineTuneSpec | None = None, early: bool = False) -> None:
        """``base``: the spec of the job before, whose base (if on this node's disk) is loaded now and kept for a
        job with the same, flex attention's kernels compiled on it (``ray_jobs.train.held.hold_base``). ``early``: the
        worker is its job's own (``ray_jobs.warm.early``) and ``base`` that job's: its first step compiles."""
        start = time.time()
        import_training_stack()
        import torch

        device = torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
        torch.zeros(1, device=device)  # the CUDA context
        if base is not None:
            from ray_jobs.train.held import hold_base

            try:
                hold_base(base, device, compile=not early)
            except Exception:  # optional: the job loads its base itself, and reports what fails then
                log.warning("warm worker: the base of %s was not loaded ahead", base.model.path, exc_info=True)
        self.started, self.ready_s, self.early = start, time.time() - start, early

    def ready(self) -> float:
        """Returns once the imports are done: how long they took."""
        return self.ready_s

    def where(self) -> Any:
        """This worker's place, for the job's run in the Train view (``ray_jobs.warm.train_view``)."""
        from ray_jobs.warm.train_view import here

        return here()

    def train(self, loop: LoopConfig, datasets: dict[str, Any], queue: Any, checkpoints: Location, env: dict[str, str]) -> Any:
        """Run ``loop`` as rank 0 of 1, in the environment of the job that took this worker; returns the last
        checkpoint persisted, else the one it resumed from (as Ray Train's result does: a re-run already at its
        end then says where it is), else ``None``."""
        import ray

        from ray_jobs.train import session
        from ray_jobs.train.loop import train_loop_per_worker

        inherited = (ray.get_runtime_context().runtime_env or {}).get("env_vars") or {}
        for name in inherited:  # the job that made the pool's: not this job's business
            os.environ.pop(name, None)
        os.environ.update(env)
        runner = session.WarmSession(
            queue, checkpoints, datasets, loop.resume_from, ready_for_s=time.time() - self.started, early=self.early
        )
        session.use(runner)
        train_loop_per_worker({"loop": loop})
        runner.wait()
        return runner.latest or loop.resume_from


class WarmPool:
    """The detached actor (``rayft/rayft-warm-pool``) that keeps the workers, lends them and stands them down."""

    CHECK_S = 2.0

    def __init__(self, settings: WarmSettings, shape: Shape) -> None:
        self.settings, self.shape = settings, shape
        self.idle: list[tuple[Any, Any]] = []
        """Workers not lent, with their ``ready()`` refs."""
        self.tokens: list[tuple[Any, Any]] = []
        """(token, worker or None): a job holding a lent worker, or one that stood the pool down (worker None).
        A token is the job's event queue actor: it dies with the job, and then the lease ends."""
        self.last_taken = time.monotonic()
        self.base: FineTuneSpec | None = None
        """The last job's spec: a new worker loads its base ahead (``WarmWorker``)."""
        self.started = self.lent = 0
        self.lock = threading.Lock()
        threading.Thread(target=self._tend, name="rayft-warm-pool", daemon=True).start()

    def take(self, shape: Shape | None, token: Any, spec: FineTuneSpec | None = None) -> Any:
        """A ready worker for a job of ``shape`` (``spec``'s), lent until ``token`` dies; or ``None``, and then the pool
        stands down until it does. Waits up to :data:`READY_WAIT_S` for a worker still importing."""
        import ray

        with self.lock:
            self.last_taken = time.monotonic()
            self.base = spec if shape == self.shape else self.base
            candidates = list(self.idle) if shape == self.shape else []
        if candidates:
            ready, _ = ray.wait([ref for _, ref in candidates], num_returns=1, timeout=READY_WAIT_S)
            with self.lock:
                found = next(((w, r) for w, r in self.idle if ready and r == ready[0]), None)
                if found is not None:
                    self.idle.remove(found)
            if found is not None and _started(found[1]):
                with self.lock:
                    self.tokens.append((token, found[0]))
                    self.lent += 1
                return found[0]
            if found is not None:
                ray.kill(found[0])
        with self.lock:
            self._stop_idle()
            self.tokens.append((token, None))
        return None

    def prime(self, shape: Shape, spec: FineTuneSpec) -> bool:
        """The operator's base (``ray_jobs.warm.control.prime``): the pool's next workers load it ahead, before any job came. Idle
        workers loading another base (or none) are stopped for them. False for a spec of another shape than the pool's."""
        with self.lock:
            if shape != self.shape:
                return False
            same = self.base is not None and (self.base.model, self.base.quantization) == (spec.model, spec.quantization)
            self.base, self.last_taken = spec, time.monotonic()  # the idle time counts from the operator's start
            if not same:
                self._stop_idle()
            return True

    def describe(self) -> PoolState:
        import ray

        with self.lock:
            refs = [ref for _, ref in self.idle]
            ready, _ = ray.wait(refs, num_returns=len(refs), timeout=0) if refs else ([], [])
            return PoolState(
                idle=len(self.idle),
                ready=len(ready),
                lent=sum(w is not None for _, w in self.tokens),
                standing_down_for=sum(w is None for _, w in self.tokens),
                started=self.started,
                lent_in_all=self.lent,
                shape=self.shape,
                settings=self.settings,
                base=self.base.model.path if self.base is not None else None,
            )

    def release(self, token: Any) -> None:
        """The job holding ``token`` is done with its worker: stop it now (the pool would see the token die soon)."""
        import ray

        with self.lock:
            ended = [(t, w) for t, w in self.tokens if t == token]
            self.tokens = [pair for pair in self.tokens if pair not in ended]
        for _, worker in ended:
            if worker is not None:
                ray.kill(worker)

    def _tend(self) -> None:
        """End the leases of jobs that ended, stop idle workers past the idle time, start what is missing."""
        while True:
            time.sleep(self.CHECK_S)
            try:
                self._tend_once()
            except Exception:  # the pool must outlive one bad look at the cluster; the next look retries
                log.exception("warm pool: tending failed")

    def _tend_once(self) -> None:
        import ray

        with self.lock:
            tokens = list(self.tokens)
        ended = [(t, w) for t, w in tokens if not _alive(t)]
        for _, worker in ended:
            if worker is not None:
                ray.kill(worker)
        with self.lock:
            self.tokens = [pair for pair in self.tokens if pair not in ended]
            if time.monotonic() - self.last_taken > self.settings.idle_s:
                self._stop_idle()
                return
            if any(w is None for _, w in self.tokens):
                return  # a job that took none is running: its resources are its own
            while len(self.idle) < self.settings.workers and self._room():
                worker = worker_class().options(num_gpus=self.shape.gpus, num_cpus=self.shape.cpus).remote(self.base)
                self.idle.append((worker, worker.ready.remote()))
                self.started += 1

    def _room(self) -> bool:
        import ray

        free = ray.available_resources()
        return free.get("GPU", 0.0) >= self.shape.gpus and free.get("CPU", 0.0) >= self.shape.cpus

    def _stop_idle(self) -> None:
        import ray

        for worker, _ in self.idle:
            ray.kill(worker)
        self.idle = []


def import_training_stack() -> None:
    """:data:`WARM_IMPORTS`, those this cluster has."""
    for name in WARM_IMPORTS:
        try:
            importlib.import_module(name)
        except ImportError:  # optional kernels (bitsandbytes, Liger) that this cluster does not have
            log.info("warm worker: %s is not installed", name)


def _started(ready: Any) -> bool:
    """Whether a worker's start (its ``ready()``) went well; one that failed is logged, and no job gets it."""
    import ray

    try:
        ray.get(ready)
        return True
    except ray.exceptions.RayError:
        log.warning("warm pool: a worker failed to start; the job runs on Ray Train", exc_info=True)
        return False


def _alive(token: Any) -> bool:
    import ray

    try:
        ray.get(token.qsize.remote(), timeout=10)
        return True
    except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
        return False


def worker_class() -> Any:
    import ray

    return ray.remote(WarmWorker)


@dataclasses.dataclass
class Lease:
    worker: Any
    pool: Any | None
    """``None`` for the job's own early worker (``ray_jobs.warm.early``)."""
    token: Any

    def end(self) -> None:
        """Stop the worker and free its resources now (the pool would also, once the job's queue is gone)."""
        import ray

        if self.pool is None:
            ray.kill(self.worker)
        else:
            ray.get(self.pool.release.remote(self.token))


def take(
    spec: FineTuneSpec, queue: Any, fits: bool = True, settings: WarmSettings | None = None, early: Any | None = None
) -> Lease | None:
    """A warm worker for this job, if the operator keeps a pool (``RAYFT_WARM_WORKERS``) and one fits; the pool is
    made on the first call. Else the job's own ``early`` worker (``ray_jobs.warm.early``), if it has one. ``queue``: the
    job's event queue, whose life is the lease's. ``fits=False``: the job takes none whatever its shape (a pool
    that exists stands down for it, and an early worker is stopped)."""
    import ray

    settings = settings or WarmSettings.from_env()
    shape = Shape.of(spec) if fits and settings.workers else None
    if shape is None:  # no warm worker runs it; a pool that exists (even one since turned off) stands down for it
        pool = running_pool()
    else:
        pool = pool_of(settings, shape)
    worker = ray.get(pool.take.remote(shape, queue.actor, spec if shape is not None else None)) if pool is not None else None
    if worker is not None:
        return Lease(worker, pool, queue.actor)
    if early is not None and fits:
        return Lease(early, None, queue.actor)
    if early is not None:
        ray.kill(early)
    return None


def pool_of(settings: WarmSettings, shape: Shape) -> Any:
    """The cluster's one pool, made here with these settings if none runs yet."""
    import ray

    options = {"name": POOL_NAME, "namespace": NAMESPACE, "lifetime": "detached", "get_if_exists": True}
    return ray.remote(WarmPool).options(**options, num_cpus=0, max_concurrency=4).remote(settings, shape)


def running_pool() -> Any:
    """The cluster's pool, or ``None`` where none runs."""
    import ray

    try:
        return ray.get_actor(POOL_NAME, namespace=NAMESPACE)
    except ValueError:
        return None


def fit(
    lease: Lease | None,
    loop: LoopConfig,
    datasets: dict[str, Any],
    checkpoints: Location,
    queue: Any,
    on_ray_train: Callable[[LoopConfig, int], Any],
) -> Any:
    """Train on the lent worker; without one, or after it failed (reported as a ``failure`` event), on Ray Train
    (``on_ray_train(loop, max_failures)`` fits and returns ``ray_jobs.events``' result)."""
    import ray
    from ray.train import WorkerGroupError

    from ray_jobs.background import in_background
    from ray_jobs.events import Fitted, failure_event
    from ray_jobs.train.session import latest_in
    from ray_jobs.warm import train_view

    failures = loop.spec.train.max_failures
    # An early worker's failed start is no failure of the job's; a pool checked its own worker's before lending it.
    if lease is not None and lease.pool is None and not _started(lease.worker.ready.remote()):
        lease.end()
        lease = None
    if lease is not None:
        # The Train view's records are written beside training, not before it: the cluster's first such job waits
        # for Ray Train's state actor to start. The worker answers where() before it takes train().
        place = lease.worker.where.remote()
        view = in_background(train_view.open_run, loop.spec, loop.identity.owner, lease.worker, place, datasets, checkpoints)
        try:
            env = (ray.get_runtime_context().runtime_env or {}).get("env_vars") or {}
            fitted = Fitted(None, ray.get(lease.worker.train.remote(loop, datasets, queue, checkpoints, env)))
            train_view.end_run(view.result(), None)
            return fitted
        except ray.exceptions.RayError as exc:
            cause = getattr(exc, "cause", None) or exc
            train_view.end_run(view.result(), cause)
            queue.put(failure_event({0: cause}))
            if failures == 0:  # the job's error as Ray Train's would be, whichever worker ran it: "rank 0: ..."
                return Fitted(WorkerGroupError(str(exc), {0: cause}))
            failures -= 1
            loop = dataclasses.replace(loop, resume_from=latest_in(checkpoints) or loop.resume_from)
        finally:
            lease.end()
    return on_ray_train(loop, failures)
