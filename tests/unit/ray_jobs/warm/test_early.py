"""ray_jobs.warm.early: which jobs get a worker of their own at the connect (the worker itself: tests/integration)."""

from __future__ import annotations

import dataclasses

import pytest

from ray_jobs.warm.early import cpus_beside, why_not
from ray_jobs.warm.settings import WarmSettings


def test_a_job_gets_an_early_worker_of_its_own_only_where_one_worker_runs_it_and_nothing_else_serves_it(tiny_spec):
    one = tiny_spec.replace(scaling=dataclasses.replace(tiny_spec.scaling, num_workers=1))
    gpu = one.replace(scaling=dataclasses.replace(one.scaling, use_gpu=True))
    off, pool = WarmSettings(), WarmSettings(workers=1)
    assert why_not(gpu, False, "", off, cluster_cpus=1) == "", "a one-GPU job gets one by default"
    assert cpus_beside(one) == 1 + 1 + 0.25, "the worker's CPU, the preset's one tokenizer actor's, a reading task's"
    assert why_not(one, False, "", off, cluster_cpus=2.25) == "", "a CPU job where the worker and its fill fit at once"
    assert why_not(one, False, "", off, cluster_cpus=2) == (
        "a CPU job on a cluster of 2 CPUs: the worker and the data's tokenizers need 2.25 at once "
        "(RAYFT_EARLY_WORKER=1 starts one all the same)"
    )
    assert why_not(one, False, "1", off, cluster_cpus=2) == ""
    assert why_not(gpu, False, "0", off, cluster_cpus=4) == "RAYFT_EARLY_WORKER=0"
    assert why_not(tiny_spec, False, "1", off, cluster_cpus=4) == "a job of several workers runs on Ray Train"
    assert why_not(gpu, False, "", pool, cluster_cpus=4) == "the operator's warm pool serves one-worker jobs (RAYFT_WARM_WORKERS)"
    assert why_not(gpu, True, "", off, cluster_cpus=4) == "Ray Train resumes the run it began"
    with pytest.raises(ValueError, match=r"RAYFT_EARLY_WORKER='yes': 0 \(never\), 1 \(every one-worker job\), or unset"):
        why_not(gpu, False, "yes", off, cluster_cpus=4)
