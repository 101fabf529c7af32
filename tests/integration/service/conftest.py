"""The service's fixtures: a team policy and tokens, and a `rayft serve` on the session's Ray cluster, or one
that cannot reach Ray (its jobs wait, so nothing runs)."""

from __future__ import annotations

from pathlib import Path

import pytest

from service import auth
from service.store_sqlite import SqliteJobStore
from tests.integration.service.harness import Server, running_ray_jobs, wait_for


@pytest.fixture
def policy(tmp_path, tiny) -> Path:
    """Every team writes under tmp_path/outputs/{team}, reads the tiny assets and tmp_path/data, and models from the
    tiny assets and tmp_path/models."""
    import yaml

    path = tmp_path / "policy.yaml"
    models = [str(tiny), f"{tmp_path}/models"]
    default = {"output_root": f"{tmp_path}/outputs/{{team}}", "data": [str(tiny), f"{tmp_path}/data"], "models": models}
    path.write_text(yaml.safe_dump({"default": default}))
    return path


@pytest.fixture
def tokens(tmp_path):
    store = SqliteJobStore(tmp_path / "service" / "jobs.db")
    made = {team: auth.new_token() for team in ("team-a", "team-b")}
    for team, token in made.items():
        store.add_token(team, auth.hash_token(token))
    store.close()
    return made


@pytest.fixture
def server(ray_cluster, tmp_path, tokens, policy):
    srv = Server(tmp_path / "service", ray_cluster.jobs_api, policy).start()
    yield srv
    srv.stop()
    # Every job a test cancelled must be gone from Ray, or it would starve the next test of CPUs.
    try:
        wait_for(lambda: not running_ray_jobs(ray_cluster.jobs_api), timeout=60)
    except TimeoutError:
        from ray.job_submission import JobSubmissionClient

        jobs = JobSubmissionClient(ray_cluster.jobs_api).list_jobs()
        raise AssertionError(
            f"Ray jobs left running: {[(j.submission_id, str(j.status), j.start_time, j.message) for j in jobs]}\n{srv.log.read_text()[-3000:]}"
        ) from None


@pytest.fixture
def paused_server(tmp_path, tokens, policy):
    """A service that stores and queues jobs but launches none (RAYFT_LAUNCH_PAUSED): for the API's
    own behaviour (auth, idempotency, listing, validation), which needs no training to run."""
    srv = Server.paused(tmp_path / "service", policy).start()
    yield srv
    srv.stop()
