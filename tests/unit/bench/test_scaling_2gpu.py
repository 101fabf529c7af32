"""bench/scaling_2gpu.sh checks every run's spec before it builds anything: a pair the spec refuses (FP8 under FSDP,
as its FSDP run once asked for) would otherwise be found only on a lent pair of GPUs, after the model was built."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.paths import REPO


def check_only(mode: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "CHECK_ONLY": "1", "PY": sys.executable}
    return subprocess.run(["bash", "bench/scaling_2gpu.sh", mode], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("mode", ["ddp", "fsdp"])
def test_every_run_of_the_two_gpu_benchmark_is_a_spec_the_job_accepts(mode):
    done = check_only(mode)
    assert done.returncode == 0, done.stderr


def test_the_two_gpu_benchmark_names_its_modes_when_given_another():
    done = check_only("zero")
    assert done.returncode == 2 and "ddp|fsdp" in done.stderr
