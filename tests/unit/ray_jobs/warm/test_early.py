"""ray_jobs.warm.early: which jobs get a worker of their own at the connect (the worker itself: tests/integration)."""

from __future__ import annotations

import dataclasses

import pytest

from ray_jobs.warm.early import why_not
from ray_jobs.warm.settings import WarmSettings


def test_a_job_gets_an_early_worker_of_its_own_only_where_one_worker_runs_it_and_nothing_else_serves_it(tiny_spec):
    one = tiny_spec.replace(scaling=dataclasses.replace(tiny_spec.scaling, num_workers=1))
    gpu = one.replace(scaling=dataclasses.replace(one.scaling, use_gpu=True))
    off, pool = WarmSettings(), WarmSettings(workers=1)
    assert why_not(gpu, False, "", off) == "", "a one-GPU job gets one by default"
    assert why_not(one, False, "", off) == "a CPU job (RAYFT_EARLY_WORKER=1 starts one for CPU jobs too)"
    assert why_not(one, False, "1", off) == ""
    assert why_not(gpu, False, "0", off) == "RAYFT_EARLY_WORKER=0"
    assert why_not(tiny_spec, False, "1", off) == "a job of several workers runs on Ray Train"
    assert why_not(gpu, False, "", pool) == "the operator's warm pool serves one-worker jobs (RAYFT_WARM_WORKERS)"
    assert why_not(gpu, True, "", off) == "Ray Train resumes the run it began"
    with pytest.raises(ValueError, match=r"RAYFT_EARLY_WORKER='yes': 0 \(never\), 1 \(CPU jobs too\), or unset"):
        why_not(gpu, False, "yes", off)
