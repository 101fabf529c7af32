"""Two local clusters on one machine (a test session beside `rayft serve`, say) each keep a working Jobs API."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

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
print(client.get_job_status(job), client.get_job_logs(job).strip().splitlines()[-1] == info["gcs_address"], info["temp_dir"])
"""
"""The job's driver says which cluster it joined: this one (before ``_publish_address`` it was any GCS on
the machine, so about half the time the session's). The process then exits without stopping its cluster."""


def run_to_end(client, entrypoint: str) -> str:
    job = client.submit_job(entrypoint=entrypoint)
    while not client.get_job_status(job).is_terminal():
        time.sleep(0.5)
    return str(client.get_job_status(job))


def test_a_second_local_cluster_beside_the_sessions_runs_jobs_and_so_does_the_first(ray_cluster):
    """And the second one's files in /tmp go when the process that started it exits (as ``rayft train``'s)."""
    from ray.job_submission import JobSubmissionClient

    second = subprocess.run([sys.executable, "-c", SECOND_CLUSTER], capture_output=True, text=True, timeout=600)
    assert second.returncode == 0, second.stderr[-3000:]
    status, joined_its_own, temp_dir = second.stdout.split()
    assert (status, joined_its_own) == ("SUCCEEDED", "True"), second.stdout  # its driver joined its own cluster
    assert temp_dir.startswith("/tmp/ray-") and not Path(temp_dir).exists()
    assert run_to_end(JobSubmissionClient(ray_cluster.jobs_api), "python -c 'print(1)'").endswith("SUCCEEDED")


KEPT = """
from ray_jobs.local_ray import start_local_cluster, stop_local_cluster
info = start_local_cluster(num_cpus=1)
stop_local_cluster(info["temp_dir"], keep_logs=True)
print(info["temp_dir"])
"""
"""A cluster stopped with its logs kept (a failed test session's, a crashed ``rayft serve``'s), then its process exits."""


def test_a_cluster_stopped_with_its_logs_kept_keeps_them_past_its_process_exit():
    import shutil

    kept = subprocess.run([sys.executable, "-c", KEPT], capture_output=True, text=True, timeout=600)
    assert kept.returncode == 0, kept.stderr[-3000:]
    temp_dir = Path(kept.stdout.strip())
    try:
        assert (temp_dir / "session_latest" / "logs").is_dir()
        assert f"the local Ray cluster's logs are kept in {temp_dir}" in kept.stderr
    finally:
        shutil.rmtree(temp_dir, ignore_errors=True)


def test_a_job_whose_actors_hold_most_cpus_keeps_its_task_workers_between_tasks(ray_cluster):
    """A cache fill's tokenizer actors hold nearly every CPU while its reading, re-cut and writing tasks (a
    quarter CPU each) come and go. Ray kills idle workers beyond the node's free CPUs after a second idle,
    so each next task waited for a new Python process (ray_jobs.local_ray: num_workers_soft_limit). Here 3
    actors hold 3 of the session cluster's 4 CPUs, and bursts of 3 such tasks come 2 s apart: with Ray's
    default the bursts after the first ran on 2 new processes each."""
    import collections
    import os

    import ray

    @ray.remote(num_cpus=1)
    class HoldsACpu:
        def ready(self) -> bool:
            return True

    @ray.remote(num_cpus=0)
    class Gate:
        def __init__(self) -> None:
            self.arrived: collections.Counter[int] = collections.Counter()

        def arrive(self, burst: int) -> None:
            self.arrived[burst] += 1

        def count(self, burst: int) -> int:
            return self.arrived[burst]

    @ray.remote(num_cpus=0.25)
    def pid(gate, burst: int) -> int:
        ray.get(gate.arrive.remote(burst))
        while ray.get(gate.count.remote(burst)) < 3:  # all three at once: a worker each, however slow the machine
            time.sleep(0.05)
        return os.getpid()

    holders = [HoldsACpu.remote() for _ in range(3)]
    gate = Gate.remote()
    try:
        ray.get([h.ready.remote() for h in holders], timeout=120)
        pids: list[set[int]] = []
        for burst in range(4):
            pids.append(set(ray.get([pid.remote(gate, burst) for _ in range(3)], timeout=120)))
            time.sleep(2.0)  # idle for twice Ray's kill threshold (idle_worker_killing_time_threshold_ms)
    finally:
        for actor in [*holders, gate]:
            ray.kill(actor)
    assert len(set().union(*pids)) == 3, f"worker processes per burst: {pids}"


BEFORE_THE_EARLY_WORKER = """
import dataclasses, sys
from ray_jobs import local_ray
local_ray.connect(sys.argv[1])
from ray_jobs.train.session import train_run_name  # what ray_jobs.run imports before the start, as it does
from ray_jobs.warm import early
from ray_jobs.warm.settings import WarmSettings
from rayft_contract.spec import FineTuneSpec

spec = FineTuneSpec.load("ray_jobs/presets/tiny_cpu.yaml")
gpu = spec.replace(scaling=dataclasses.replace(spec.scaling, num_workers=1, use_gpu=True))
assert early.why_not(gpu, False, "", WarmSettings(), cluster_cpus=4) == "", "a one-GPU job gets one"
print(",".join(m for m in ("ray.data", "pandas", "ray.train", "torch", "transformers") if m in sys.modules) or "none")
local_ray.quiet_ray_data()
print("ray.data" in sys.modules)
"""
"""What a job's driver (``ray_jobs.run``) does before it starts its early worker: joins the cluster, and decides."""


def test_a_driver_joins_its_cluster_and_decides_on_its_early_worker_before_it_imports_ray_data_pandas_or_torch(ray_cluster):
    """The early worker's imports and base load are the path to a one-GPU job's first step, so the driver starts it
    before its own heavy imports. With them before it (Ray Data's in ``connect``), the worker's process started 0.6-0.9 s
    later on 2 cores, and the first step 0.85 s later by the median of five runs each (``bench/early_start.py``)."""
    root = Path(__file__).resolve().parents[2]
    driver = subprocess.run(
        [sys.executable, "-c", BEFORE_THE_EARLY_WORKER, ray_cluster.gcs], capture_output=True, text=True, timeout=300, cwd=root
    )
    assert driver.returncode == 0, driver.stderr[-3000:]
    imported, quieted = driver.stdout.split()
    assert imported == "none", f"imported before the early worker's start: {imported}"
    assert quieted == "True", "quiet_ray_data imports Ray Data, once the worker is on its way"
