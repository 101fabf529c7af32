"""ray_jobs.warm_pool's settings and which jobs a warm worker may run (the pool itself: tests/integration)."""

from __future__ import annotations

import dataclasses

import pytest

from ray_jobs.warm_pool import Shape, WarmSettings


def test_the_pool_is_off_unless_the_operator_sets_how_many_workers_to_keep():
    assert WarmSettings.from_env({}) == WarmSettings(workers=0, idle_s=600.0)
    assert WarmSettings.from_env({"RAYFT_WARM_WORKERS": "2", "RAYFT_WARM_IDLE_S": "90"}) == WarmSettings(2, 90.0)


@pytest.mark.parametrize(
    ("environ", "message"),
    [
        ({"RAYFT_WARM_WORKERS": "two"}, "RAYFT_WARM_WORKERS='two': a whole number of workers, e.g. RAYFT_WARM_WORKERS=1"),
        ({"RAYFT_WARM_IDLE_S": "-5"}, "RAYFT_WARM_IDLE_S='-5': 0 or more"),
    ],
)
def test_a_bad_setting_names_its_variable_and_the_fix(environ, message):
    with pytest.raises(ValueError) as raised:
        WarmSettings.from_env(environ)
    assert str(raised.value) == message


def test_only_a_one_worker_job_has_a_shape_a_warm_worker_can_take(tiny_spec):
    one = tiny_spec.replace(scaling=dataclasses.replace(tiny_spec.scaling, num_workers=1, cpus_per_worker=2))
    assert Shape.of(one) == Shape(gpus=0.0, cpus=2.0)
    gpu = one.replace(scaling=dataclasses.replace(one.scaling, use_gpu=True))
    assert Shape.of(gpu) == Shape(gpus=1.0, cpus=2.0)
    assert Shape.of(tiny_spec) is None, "two DDP workers: Ray Train's"
