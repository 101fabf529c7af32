"""A one-worker job's own worker, started as soon as its driver is connected (``RAYFT_EARLY_WORKER``).

It is a warm worker (``ray_jobs.warm.pool.WarmWorker``) of the job's shape, lent to that job alone: the driver leases it
in ``pool.take``, and ``pool.fit`` runs the loop on it with Ray Train behind it, as for a pool's worker. On an
H200 a new dataset's job reached its first step in 33.2-39.0 s this way, against 67.8 s through Ray Train
(bench/RESULTS.md). ``ray_jobs.train.compile_ahead.launch`` stops it on a node that has not compiled the job's kernels yet
and cannot take them from the cluster's kernel store (``ray_jobs.train.kernel_store``).
"""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING, Any

from ray_jobs.warm.settings import Shape, WarmSettings

if TYPE_CHECKING:
    from rayft_contract.spec import FineTuneSpec

log = logging.getLogger(__name__)

ENV = "RAYFT_EARLY_WORKER"


def start(spec: FineTuneSpec, resumes_ray_train: bool, setting: str | None = None) -> Any | None:
    """This job's own worker, started as soon as the driver is connected, or ``None`` (:func:`why_not`).

    Why: through Ray Train, a one-GPU job's worker starts once the data is ready, then launches (controller, placement
    group, process), imports and loads its base, one after the other: 48.9 s on an H200 node where a new dataset
    filled in 7.4 s (bench/RESULTS.md). This worker, a ``ray_jobs.warm.pool.WarmWorker`` of the job's shape, imports
    and loads the base while the driver fetches the model and prepares the data; then it runs the loop and is stopped
    with the job. It holds the job's worker's resources from the connect on, and Ray queues it as it would Ray Train's.
    It compiles nothing on the base: that cost 7.6-9.6 s more than it saved on the H200, where the node had the
    kernels. On a node without them, where the cluster's kernel store has none either, ``ray_jobs.train.compile_ahead.launch``
    stops it for Ray Train and a copy."""
    import ray

    setting = os.environ.get(ENV, "") if setting is None else setting
    cluster_cpus = ray.cluster_resources().get("CPU", 0.0)
    if why := why_not(spec, resumes_ray_train, setting, WarmSettings.from_env(), cluster_cpus):
        log.info("no early worker: %s", why)
        return None
    from ray_jobs.warm.pool import worker_class

    shape = Shape.of(spec)
    assert shape is not None
    return worker_class().options(num_gpus=shape.gpus, num_cpus=shape.cpus).remote(spec, early=True)


def why_not(spec: FineTuneSpec, resumes_ray_train: bool, setting: str, settings: WarmSettings, cluster_cpus: float) -> str:
    """Why :func:`start` starts no worker, with ``setting`` as ``RAYFT_EARLY_WORKER``; empty where it starts one.

    ``0``: never. Unset: one-GPU jobs, and one-worker CPU jobs on a cluster of ``cluster_cpus`` that holds the worker
    and the data's tokenizers at once (:func:`cpus_beside`). ``1``: every one-worker job.

    Why CPU jobs too: on 2 cores, a tiny one-worker job's first step came 11.4-11.5 s after its start this way, against
    20.9-22.1 s through Ray Train (bench/cpu_job_start.py; bench/RESULTS.md, "CPU jobs' start"). Why the room check:
    the worker holds its CPUs from the connect on, so on a cluster too small for both, the fill's tokenizer actors
    would wait for a worker that waits for them."""
    if setting not in ("", "0", "1"):
        raise ValueError(f"{ENV}={setting!r}: 0 (never), 1 (every one-worker job), or unset (where there is room)")
    if setting == "0":
        return f"{ENV}=0"
    if Shape.of(spec) is None:
        return "a job of several workers runs on Ray Train"
    if not spec.scaling.use_gpu and setting != "1" and cluster_cpus < (need := cpus_beside(spec)):
        return (
            f"a CPU job on a cluster of {cluster_cpus:g} CPUs: the worker and the data's tokenizers need {need:g} at "
            f"once ({ENV}=1 starts one all the same)"
        )
    if settings.workers:
        return "the operator's warm pool serves one-worker jobs (RAYFT_WARM_WORKERS)"
    if resumes_ray_train:
        return "Ray Train resumes the run it began"
    return ""


def cpus_beside(spec: FineTuneSpec) -> float:
    """The CPUs a one-worker job holds while its data fills: the worker's, a tokenizer actor's each
    (``ray_jobs.data.pipeline``) and a reading task's (``ray_jobs.data.reading.HELPER_CPUS``)."""
    from ray_jobs.data.reading import HELPER_CPUS

    return spec.scaling.cpus_per_worker + spec.data.tokenize_workers + HELPER_CPUS
