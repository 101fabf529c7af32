"""Compiling ahead (ray_jobs.train.compile_ahead) on the session's Ray cluster, which has no GPU: a compile ahead that
failed or never ran costs the job nothing, and an operator's ``--keep`` says there is no GPU node to keep kernels on.
What runs on one node, without Ray, is in tests/unit/ray_jobs/train/test_compile_ahead.py and test_kernel_store.py."""

from __future__ import annotations

import pytest

from ray_jobs.train import compile_ahead
from tests.unit.ray_jobs.train.test_compile_ahead import one_gpu
from tests.unit.ray_jobs.train.test_kernel_store import compiled_spec, python_on

pytestmark = pytest.mark.integration


def _fails() -> None:
    raise RuntimeError("CUDA error: out of memory")


def _fails_without_a_message() -> None:
    raise MemoryError()


def test_a_failed_or_absent_compile_ahead_never_fails_the_job(ray_cluster, tiny_spec):
    import ray

    assert compile_ahead.wait(None) == ""
    said = compile_ahead.wait(ray.remote(max_retries=0)(_fails).remote())
    assert "compiling ahead failed" in said and "out of memory" in said and "the job compiles" in said
    said = compile_ahead.wait(ray.remote(max_retries=0)(_fails_without_a_message).remote())
    assert said == "compiling ahead failed (MemoryError); the job compiles", "an error with no words still says its kind"
    assert compile_ahead.launch(one_gpu(tiny_spec), gpus_free=0) == (None, None), "the session's cluster has no GPU free"


def test_keeping_kernels_on_a_cluster_without_a_gpu_node_says_so(ray_cluster, tiny_spec, tmp_path):
    spec_file = compiled_spec(tiny_spec, tmp_path)
    cli = [
        "-m",
        "ray_jobs.train.compile_ahead",
        str(spec_file),
        "--set",
        "train.max_steps=2",
        "--keep",
        "--address",
        ray_cluster.gcs,
    ]
    done = python_on(tmp_path / "operator", cli, tmp_path / "store")
    assert done.returncode != 0 and f"no GPU node in the Ray cluster at {ray_cluster.gcs}" in done.stderr, done.stderr[-2000:]
    assert not (tmp_path / "store").exists()
