"""The reconciler against the session's Ray Jobs API (service/reconciler.py)."""

from __future__ import annotations

import asyncio
import time
import uuid

import pytest

from rayft_contract.states import JobState
from service.launcher import RayJobLauncher
from service.progress import JobEvents
from service.reconciler import Reconciler
from service.store import AsyncJobStore, JobRecord
from service.store_sqlite import SqliteJobStore

pytestmark = pytest.mark.integration


class CountingLauncher(RayJobLauncher):
    """The real launcher, counting the questions it asks Ray."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.asked: list[str] = []

    def status(self, submission_id):
        self.asked.append(submission_id)
        return super().status(submission_id)


def test_each_cancelled_job_is_looked_for_in_ray_once_not_at_every_pass(ray_cluster, tmp_path):
    """A team that cancelled many jobs made every pass ask Ray about each of them again (and parse each
    spec), for 10 minutes; now a pass asks about the jobs cancelled since the last pass that reached Ray."""
    sync = SqliteJobStore(tmp_path / "jobs.db")
    now = time.time()
    cancelled = []
    for i in range(20):
        job, _ = sync.create(JobRecord(f"ft-{uuid.uuid4().hex[:12]}", "t", JobState.QUEUED, {"name": f"j{i}"}, now, now))
        sync.transition(job.id, JobState.CANCELLED, "cancelled on request")
        cancelled.append(job.id)
    launcher = CountingLauncher(ray_cluster.jobs_api, "python")
    reconciler = Reconciler(
        JobEvents(AsyncJobStore(sync)), launcher, "127.0.0.1:1", 60.0, launch_paused=True, launch_key=b"k" * 32
    )

    async def passes():
        await reconciler.once()
        first = list(launcher.asked)
        await reconciler.once()
        late, _ = sync.create(JobRecord(f"ft-{uuid.uuid4().hex[:12]}", "t", JobState.QUEUED, {"name": "late"}, now, now))
        sync.transition(late.id, JobState.CANCELLED, "cancelled on request")
        await reconciler.once()
        return first, launcher.asked[len(first) :], late.id

    first, later, late = asyncio.run(passes())
    sync.close()
    assert sorted(first) == sorted(cancelled), "the first pass looks for every recently cancelled job"
    assert later == [late], "later passes look only for what was cancelled since"
