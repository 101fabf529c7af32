"""Two local clusters on one machine (a test session beside `rayft serve`, say) each keep a working Jobs API."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

pytestmark = pytest.mark.integration

SECOND_CLUSTER = """
import sys
import time
from ray.job_submission import JobSubmissionClient
from ray_jobs.local_ray import start_local_cluster

info = start_local_cluster(num_cpus=1, dashboard=True)
client = JobSubmissionClient(f"http://{info['dashboard_url']}")
job = client.submit_job(entrypoint=sys.executable + " -c 'import ray; ray.init(); print(ray.get_runtime_context().gcs_address)'")
while not client.get_job_status(job).is_terminal():
    time.sleep(0.5)
print(client.get_job_status(job), client.get_job_logs(job).strip().splitlines()[-1] == info["gcs_address"])
"""
"""The job's driver says which cluster it joined: this one (before ``_publish_address`` it was any GCS on
the machine, so about half the time the session's)."""


def run_to_end(client, entrypoint: str) -> str:
    job = client.submit_job(entrypoint=entrypoint)
    while not client.get_job_status(job).is_terminal():
        time.sleep(0.5)
    return str(client.get_job_status(job))


def test_a_second_local_cluster_beside_the_sessions_runs_jobs_and_so_does_the_first(ray_cluster):
    from ray.job_submission import JobSubmissionClient

    second = subprocess.run([sys.executable, "-c", SECOND_CLUSTER], capture_output=True, text=True, timeout=600)
    assert second.returncode == 0, second.stderr[-3000:]
    assert second.stdout.split() == ["SUCCEEDED", "True"], second.stdout  # its driver joined its own cluster
    assert run_to_end(JobSubmissionClient(ray_cluster.jobs_api), "python -c 'print(1)'").endswith("SUCCEEDED")
