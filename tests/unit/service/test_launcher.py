"""Launching on Ray's Jobs API: which of its errors fail the job alone, which pause launches (service/launcher.py)."""

from __future__ import annotations

import pytest

from service.launcher import LaunchRejected, RayUnavailable, _submit_error

# The text Ray's SDK raises for an HTTP error (ray/dashboard/modules/dashboard_sdk.py, _raise_error).
RAY_ERROR = "Request failed with status code {code}: {body}."


@pytest.mark.parametrize(
    ("code", "body"),
    [(400, "Traceback ...\nValueError: invalid runtime_env"), (413, "Request Entity Too Large"), (422, "bad field")],
)
def test_a_submission_ray_refuses_fails_that_job_alone(code, body):
    error = _submit_error(RuntimeError(RAY_ERROR.format(code=code, body=body)))
    assert isinstance(error, LaunchRejected) and f"status code {code}" in str(error) and "\n" not in str(error)


@pytest.mark.parametrize(
    "text",
    [
        RAY_ERROR.format(code=500, body="No available agent to submit job, please try again later."),
        RAY_ERROR.format(code=503, body="Service Unavailable"),
        "Failed to connect to Ray at address: http://127.0.0.1:9.",
    ],
)
def test_a_cluster_side_failure_pauses_launches_instead(text):
    assert isinstance(_submit_error(RuntimeError(text)), RayUnavailable)


def _spec(tiny_spec, **scaling):
    import dataclasses

    return tiny_spec.replace(scaling=dataclasses.replace(tiny_spec.scaling, **scaling))


def test_workers_fit_when_the_nodes_whole_bundles_add_up(tiny_spec):
    from service.launcher import Capacity

    two_nodes = Capacity(({"CPU": 16.0, "GPU": 2.0}, {"CPU": 8.0, "GPU": 1.0}))
    assert two_nodes.refusal(_spec(tiny_spec, num_workers=3, use_gpu=True, cpus_per_worker=4)) is None
    why = two_nodes.refusal(_spec(tiny_spec, num_workers=4, use_gpu=True, cpus_per_worker=4))
    assert why.startswith("scaling.num_workers: 4 workers of GPU each") and "hold 3" in why, why
    # 3 GPUs in all, but one whole bundle of 9 CPUs + 1 GPU: the 8-CPU node holds none.
    assert "hold 1" in two_nodes.refusal(_spec(tiny_spec, num_workers=2, use_gpu=True, cpus_per_worker=9))


def test_a_job_the_cluster_can_never_place_is_named_by_its_field(tiny_spec):
    from service.launcher import Capacity

    cpus_only = Capacity(({"CPU": 4.0},))
    assert cpus_only.refusal(_spec(tiny_spec, use_gpu=True)).startswith("scaling.use_gpu: the Ray cluster has no GPU")
    assert cpus_only.refusal(_spec(tiny_spec, cpus_per_worker=8)).startswith("scaling.cpus_per_worker: 8 CPUs per worker")
    assert cpus_only.refusal(_spec(tiny_spec, num_workers=2, cpus_per_worker=2)) is None
    assert Capacity(()).refusal(_spec(tiny_spec, num_workers=1)).startswith("scaling.cpus_per_worker")
