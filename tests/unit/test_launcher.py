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
