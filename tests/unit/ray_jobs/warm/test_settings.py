"""ray_jobs.warm.pool's settings and which jobs a warm worker may run (the pool itself: tests/integration)."""

from __future__ import annotations

import dataclasses

import pytest

from ray_jobs.warm.settings import Shape, WarmSettings
from tests.paths import PRESETS


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


def test_rayft_warm_start_refuses_a_spec_no_warm_worker_serves_before_it_connects_and_names_the_fix(tiny, capsys, monkeypatch):
    """Usage errors (exit 2), found before any cluster is reached: the address here leads nowhere, and an attempt to
    reach it would exit 3."""

    from rayft.cli import main

    preset = PRESETS / "tiny_cpu.yaml"  # two DDP workers
    paths = [f"model.path={tiny / 'model'}", f"data.path={tiny / 'train.jsonl'}"]
    argv = ["warm", "start", str(preset), "--address", "127.0.0.1:1", *(a for p in paths for a in ("--set", p))]
    assert main(argv) == 2
    assert (
        "scaling.num_workers is 2: warm workers serve jobs of one worker only; prime the pool with a one-worker spec"
        in capsys.readouterr().err
    )

    monkeypatch.setenv("RAYFT_WARM_WORKERS", "0")
    assert main([*argv, "--set", "scaling.num_workers=1"]) == 2
    assert "RAYFT_WARM_WORKERS is 0: set how many warm workers to keep" in capsys.readouterr().err
