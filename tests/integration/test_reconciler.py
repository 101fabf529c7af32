"""The reconciler against the session's Ray Jobs API (service/reconciler.py)."""

from __future__ import annotations

import asyncio
import sys
import time
import uuid

import pytest

from rayft_contract.records import JobPhase
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


def cancel_jobs(sync: SqliteJobStore, n: int, now: float) -> list[str]:
    """``n`` jobs of team "t", stored and cancelled at once; their ids."""
    cancelled = []
    for i in range(n):
        job, _ = sync.create(JobRecord(f"ft-{uuid.uuid4().hex[:12]}", "t", JobState.QUEUED, {"name": f"j{i}"}, now, now))
        sync.transition(job.id, JobState.CANCELLED, "cancelled on request")
        cancelled.append(job.id)
    return cancelled


def test_each_cancelled_job_is_looked_for_in_ray_once_not_at_every_pass(ray_cluster, tmp_path):
    """A team that cancelled many jobs made every pass ask Ray about each of them again (and parse each
    spec), for 10 minutes; now a pass asks about the jobs cancelled since the last pass that reached Ray."""
    sync = SqliteJobStore(tmp_path / "jobs.db")
    now = time.time()
    cancelled = cancel_jobs(sync, 20, now)
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


class CountingStore(SqliteJobStore):
    """The real store, counting the cancelled jobs each sweep reads."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.read: list[int] = []

    def ended_since(self, *args, **kwargs):
        found = super().ended_since(*args, **kwargs)
        self.read.append(len(found))
        return found


def test_the_sweep_reads_a_page_at_a_time_and_with_ray_down_never_rereads_every_cancelled_job(ray_cluster, tmp_path):
    """With Ray down, every pass read every job cancelled in the last 10 minutes, whole, and stopped at the
    first: 3,000 specs parsed every 2 s, which stalled other teams' calls. Now a pass reads a page."""
    sync = CountingStore(tmp_path / "jobs.db")
    now = time.time()
    cancelled = cancel_jobs(sync, 20, now)

    def reconciler(address: str) -> tuple[Reconciler, CountingLauncher]:
        launcher = CountingLauncher(address, "python")
        made = Reconciler(JobEvents(AsyncJobStore(sync)), launcher, "127.0.0.1:1", 60.0, launch_paused=True, launch_key=b"k" * 32)
        made.SWEEP_PAGE = 8
        return made, launcher

    down, nowhere = reconciler("http://127.0.0.1:9")  # nothing listens there

    async def passes(which: Reconciler, n: int) -> None:
        for _ in range(n):
            await which.once()

    asyncio.run(passes(down, 3))
    assert sync.read == [8, 8, 8] and nowhere.asked == [cancelled[0]] * 3, "a page a pass, stopped at the first"
    up, launcher = reconciler(ray_cluster.jobs_api)
    sync.read.clear()
    asyncio.run(passes(up, 4))
    sync.close()
    assert sorted(launcher.asked) == sorted(cancelled), "every cancelled job looked for once, a page at a time"
    assert max(sync.read) <= 8


class PassCountingLauncher(CountingLauncher):
    """The real launcher, counting the reconciler's passes too (each begins with a ping)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.passes = 0

    def ping(self):
        self.passes += 1
        return super().ping()


def test_a_job_that_reported_its_last_event_is_followed_to_its_end_and_what_waited_launches_at_once(
    ray_cluster, tmp_path, tiny_spec
):
    """A job's team heard it ended only at the pass after its driver ended, up to a whole interval later, and a job
    waiting on its team's quota launched no sooner. Told the job reported its last event, the reconciler asks Ray
    about that job until it ends, then runs a pass at once. Here the passes are an hour apart: after the first,
    only that follow can end the job, and only the pass it asks for can launch the one waiting."""
    from ray.job_submission import JobSubmissionClient

    sync = SqliteJobStore(tmp_path / "jobs.db")
    now = time.time()
    spec = tiny_spec.to_dict()
    ending, _ = sync.create(JobRecord(f"ft-{uuid.uuid4().hex[:12]}", "t", JobState.QUEUED, spec, now, now))
    waiting, _ = sync.create(JobRecord(f"ft-{uuid.uuid4().hex[:12]}", "t", JobState.QUEUED, spec, now + 1, now + 1))
    release = tmp_path / "release"  # the Ray job runs until the test creates it: no race with the first pass
    driver = f"import os, time; [time.sleep(0.1) for _ in iter(lambda: os.path.exists({str(release)!r}), True)]"
    JobSubmissionClient(ray_cluster.jobs_api).submit_job(entrypoint=f"{sys.executable} -c {driver!r}", submission_id=ending.id)
    sync.update(ending.id, ray_submission_id=ending.id)
    sync.transition(ending.id, JobState.STARTING, "submitted")
    sync.transition(ending.id, JobState.RUNNING, "the job is reporting")
    launcher = PassCountingLauncher(ray_cluster.jobs_api, sys.executable)
    reconciler = Reconciler(
        JobEvents(AsyncJobStore(sync)), launcher, "127.0.0.1:1", 3600.0, launch_key=b"k" * 32, max_running_per_team=1
    )

    def waits_because(job_id: str) -> str:
        reasons = [JobPhase.from_dict(e.data).detail for e in sync.events(job_id) if e.kind == "phase"]
        return reasons[-1] if reasons else ""

    async def until(predicate):
        while not predicate():
            await asyncio.sleep(0.1)

    async def scenario():
        passes = asyncio.create_task(reconciler.run_forever())
        try:
            await asyncio.wait_for(until(lambda: waits_because(waiting.id)), 120)  # the first pass is over
            assert sync.get(waiting.id).state is JobState.QUEUED and "1 of 1 jobs running" in waits_because(waiting.id)
            reconciler.ending(ending.id)
            reconciler.ending(ending.id)  # told twice (a retried report): followed once
            release.touch()
            await asyncio.wait_for(until(lambda: sync.get(waiting.id).state is not JobState.QUEUED), 120)
            assert launcher.passes == 2, "launched by the one pass the follow asked for"
        finally:
            await reconciler.shutdown()
            passes.cancel()

    try:
        asyncio.run(scenario())
        assert sync.get(ending.id).state is JobState.SUCCEEDED
        assert sync.get(waiting.id).state is JobState.STARTING
    finally:
        launcher.stop(waiting.id)  # its driver cannot claim from 127.0.0.1:1; it would hold a CPU until stopped
        sync.close()
