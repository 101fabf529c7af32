"""A job's life through the service: submitted, watched to the end, cancelled, measured, and submitted
from a client install without torch or Ray."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import grpc
import pytest

from rayft.client import Client
from rayft_contract.v1 import finetune_pb2 as pb
from tests.integration.dashboard import train_view_runs
from tests.integration.service.harness import (
    Server,
    assert_the_ray_dashboard_shows_no_lasting_secret,
    free_port,
    kinds,
    sample,
    scrape,
    states,
    tiny_job,
    wait_for,
)

pytestmark = pytest.mark.integration


def test_submit_watch_to_success_and_ray_lists_it(server, tokens, tiny_spec, ray_cluster, tmp_path):
    client = Client(server.address, tokens["team-a"])
    job = client.submit(tiny_job(tiny_spec, "svc-ok"))
    assert job.spec.output.dir == f"{tmp_path}/outputs/team-a/{job.id}"  # the team's root, then the job's own directory
    events = list(client.watch(job.id))

    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    assert states(events) == ["QUEUED", "STARTING", "RUNNING", "SUCCEEDED"]
    progress = [e.progress for e in events if e.WhichOneof("payload") == "progress"]
    assert [p.step for p in progress] == [2, 4, 6, 8, 10] and all(p.tokens_per_s > 0 for p in progress)
    assert kinds(events)[-2] == "summary"  # the summary precedes the final state
    final = client.get(job.id)
    assert final.state == pb.SUCCEEDED and '"steps": 10' in final.summary_json
    assert (Path(job.spec.output.dir) / "svc-ok" / "adapter" / "adapter_model.safetensors").is_file()

    from ray.job_submission import JobSubmissionClient

    info = JobSubmissionClient(ray_cluster.jobs_api).get_job_info(job.id)
    assert info.metadata == {
        "rayft_team": "team-a",
        "rayft_job": "svc-ok",
        "rayft_model": tiny_spec.model.path,
        "rayft_data": tiny_spec.data.path,
    } and str(info.status) in (
        "SUCCEEDED",
        "JobStatus.SUCCEEDED",
    )
    # The dashboard's Train view names the run after the team, the job and its id, and links it to the
    # Ray job above (whose metadata holds the model and the dataset). A one-worker job's run is its early worker's
    # (ray_jobs.warm.train_view); test_warm_pool.py shows Ray Train's beside one.
    (run,) = train_view_runs(ray_cluster, f"team-a.svc-ok.{job.id}")
    assert run["job_id"] == info.job_id and run["status"] == "FINISHED"
    (attempt,) = run["attempts"]
    assert attempt["status"] == "FINISHED" and [w["world_rank"] for w in attempt["workers"]] == [0]


def test_the_metrics_endpoint_shows_a_real_job_moving(ray_cluster, tmp_path, tokens, policy, tiny_spec):
    port = free_port()
    srv = Server(tmp_path / "service", ray_cluster.jobs_api, policy, RAYFT_METRICS_PORT=str(port)).start()
    try:
        client = Client(srv.address, tokens["team-a"])
        with pytest.raises(grpc.RpcError):
            client.get("ft-0000000000000000")  # NOT_FOUND: a refused call is counted by its code
        job = client.submit(tiny_job(tiny_spec, "svc-metrics"))
        during = None
        for event in client.watch(job.id):
            if event.WhichOneof("payload") == "progress" and during is None:
                during = scrape(port)  # mid-job, with the watch stream open
        after = scrape(port)
    finally:
        srv.stop()
    assert sample(during, "rayft_watch_streams", team="team-a") == 1 and sample(after, "rayft_watch_streams", team="team-a") == 0
    assert sample(during, "rayft_jobs", state="RUNNING", team="team-a") == 1
    assert sample(after, "rayft_jobs", state="SUCCEEDED", team="team-a") == 1
    assert sample(after, "rayft_jobs", state="RUNNING", team="team-a") == 0
    assert sample(after, "rayft_rpc_total", method="GetJob", code="NOT_FOUND") == 1
    # At least once: a client or the job retries a call whose answer it did not get (a busy machine).
    assert sample(after, "rayft_rpc_total", method="CreateJob", code="OK") >= 1
    assert sample(after, "rayft_rpc_total", method="ClaimJob", code="OK") >= 1
    reports = (
        sample(during, "rayft_rpc_total", method="Report", code="OK"),
        sample(after, "rayft_rpc_total", method="Report", code="OK"),
    )
    assert 0 < reports[0] < reports[1], reports
    assert sample(after, "rayft_rpc_seconds_count", method="Report") == reports[1]
    assert 0 < sample(after, "rayft_report_lag_seconds_count") <= reports[1]  # each stored report (a retried one is not)
    assert sample(after, "rayft_stream_lag_seconds_count") > sample(during, "rayft_stream_lag_seconds_count") > 0


def test_cancel_a_running_job_stops_it_in_ray(server, tokens, tiny_spec, ray_cluster):
    from ray.job_submission import JobSubmissionClient

    client = Client(server.address, tokens["team-a"])
    job = client.submit(tiny_job(tiny_spec, "svc-cancel", steps=5000))
    wait_for(lambda: client.get(job.id).state == pb.RUNNING)
    assert_the_ray_dashboard_shows_no_lasting_secret(server, ray_cluster, job)
    assert client.cancel(job.id).state == pb.CANCELLED
    ray_jobs = JobSubmissionClient(ray_cluster.jobs_api)
    wait_for(lambda: str(ray_jobs.get_job_status(job.id)).endswith("STOPPED"), timeout=60)
    assert states(client.watch(job.id))[-1] == "CANCELLED"
    with pytest.raises(grpc.RpcError) as info:
        client.cancel(job.id)
    assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION


HEAVY = ("torch", "ray", "transformers")
"""What a team's client install must do without: the job's and the cluster's packages."""


@pytest.mark.no_ray
def test_a_light_client_install_has_no_torch_or_ray_and_submits_watches_and_cancels(paused_server, tokens, tiny_spec, tmp_path):
    """`pip install rayft` (no extras) into a fresh virtualenv: no torch, no Ray, and its `rayft` submits a job (a dry
    run first), watches it and cancels it, the watch ending with the job. The service launches nothing here: that the
    client drives a job that trains to SUCCEEDED is the next test's (the install took 40 s of the Ray tests' time)."""
    root = Path(__file__).resolve().parents[3]
    venv = tmp_path / "light"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    py = venv / "bin" / "python"
    pip = [str(py), "-m", "pip", "install", "-q", "--disable-pip-version-check", "-c", str(root / "constraints.txt")]
    source = tmp_path / "src"  # a copy: building in the checkout would leave build/ and *.egg-info there
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(root / name, source / name)
    for package in ("rayft", "rayft_contract", "ray_jobs", "service"):
        shutil.copytree(root / package, source / package, ignore=shutil.ignore_patterns("__pycache__"))
    subprocess.run([*pip, str(source)], check=True, capture_output=True, text=True, timeout=900)
    absent = subprocess.run(
        [str(py), "-c", f"import importlib.util as u; print([m for m in {HEAVY!r} if u.find_spec(m)])"],
        check=True,
        capture_output=True,
        text=True,
    )
    assert absent.stdout.strip() == "[]"

    rayft = str(venv / "bin" / "rayft")
    spec_file = _job_file(tiny_spec, "svc-light", tmp_path)
    env = {**os.environ, "RAYFT_ADDRESS": paused_server.address, "RAYFT_TOKEN": tokens["team-a"]}
    checked = subprocess.run([rayft, "submit", spec_file, "--dry-run"], env=env, capture_output=True, text=True, timeout=120)
    assert checked.returncode == 0 and "the service would take it: team team-a" in checked.stdout, checked.stderr
    watching = subprocess.Popen(
        [rayft, "submit", spec_file, "--watch"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        client = Client(paused_server.address, tokens["team-a"])
        wait_for(lambda: len(list(client.list())) == 1)
        (job,) = client.list()
        cancelled = subprocess.run([rayft, "cancel", job.id], env=env, capture_output=True, text=True, timeout=120)
        assert cancelled.returncode == 0 and job.id in cancelled.stdout, cancelled.stderr
        out, err = watching.communicate(timeout=120)
    finally:
        watching.kill()
    assert watching.returncode == 1 and "CANCELLED" in out, out[-2000:] + err[-2000:]  # 1: the job did not succeed
    assert client.get(job.id).state == pb.CANCELLED and job.spec.name == "svc-light"


def test_the_client_drives_a_job_to_success_without_importing_torch_or_ray(server, tokens, tiny_spec, tmp_path):
    """`rayft submit --watch` with torch, Ray and transformers made unimportable in its process (the light install's
    case, the test above): the job trains to SUCCEEDED, and every event on the way renders without them."""
    blocked = f"import sys; sys.modules.update(dict.fromkeys({HEAVY!r})); from rayft.cli import main; sys.exit(main())"
    env = {**os.environ, "RAYFT_ADDRESS": server.address, "RAYFT_TOKEN": tokens["team-a"]}
    done = subprocess.run(
        [sys.executable, "-c", blocked, "submit", _job_file(tiny_spec, "svc-light", tmp_path), "--watch"],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "SUCCEEDED" in done.stdout
    (job,) = Client(server.address, tokens["team-a"]).list()
    assert job.state == pb.SUCCEEDED and job.spec.name == "svc-light"


def _job_file(tiny_spec, name: str, tmp_path: Path) -> str:
    import yaml

    spec_file = tmp_path / "job.yaml"
    spec_file.write_text(yaml.safe_dump(tiny_job(tiny_spec, name, steps=4).to_dict()))
    return str(spec_file)
