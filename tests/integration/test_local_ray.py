"""Two local clusters on one machine (a test session beside `rayft serve`, say) each keep a working Jobs API."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

pytestmark = pytest.mark.integration

SECOND_CLUSTER = """
import time
from ray.job_submission import JobSubmissionClient
from ray_jobs.local_ray import start_local_cluster

info = start_local_cluster(num_cpus=1, dashboard=True)
client = JobSubmissionClient(f"http://{info['dashboard_url']}")
job = client.submit_job(entrypoint="python -c 'print(6 * 7)'")
while not client.get_job_status(job).is_terminal():
    time.sleep(0.5)
print(client.get_job_status(job), client.get_job_logs(job).strip().splitlines()[-1])
"""


def run_to_end(client, entrypoint: str) -> str:
    job = client.submit_job(entrypoint=entrypoint)
    while not client.get_job_status(job).is_terminal():
        time.sleep(0.5)
    return str(client.get_job_status(job))


def test_a_second_local_cluster_beside_the_sessions_runs_jobs_and_so_does_the_first(ray_cluster):
    from ray.job_submission import JobSubmissionClient

    second = subprocess.run([sys.executable, "-c", SECOND_CLUSTER], capture_output=True, text=True, timeout=600)
    assert second.returncode == 0, second.stderr[-3000:]
    assert second.stdout.split() == ["SUCCEEDED", "42"], second.stdout
    assert run_to_end(JobSubmissionClient(ray_cluster.jobs_api), "python -c 'print(1)'").endswith("SUCCEEDED")
