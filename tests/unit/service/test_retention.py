"""service.retention: an ended job's progress events thinned once it is old enough, on a real SQLite store."""

from __future__ import annotations

import asyncio
import time

import pytest

from rayft_contract.states import JobState
from service.metrics import ServiceMetrics
from service.retention import DAY_S, KEEP_PROGRESS, EventRetention
from service.settings import ServiceSettings
from service.store import AsyncJobStore, JobRecord
from service.store_sqlite import SqliteJobStore


@pytest.fixture
def store(tmp_path):
    sync = SqliteJobStore(tmp_path / "jobs.db")
    yield sync
    sync.close()


def _job(store, job_id: str, reports: int, end: JobState | None = JobState.SUCCEEDED) -> None:
    now = time.time()
    store.create(JobRecord(id=job_id, team="t", state=JobState.QUEUED, spec={"name": job_id}, created_at=now, updated_at=now))
    store.transition(job_id, JobState.STARTING)
    store.transition(job_id, JobState.RUNNING)
    for step in range(reports):
        store.append_event(job_id, "progress", {"step": step})
    if end is not None:
        store.transition(job_id, end)


def _progress(store, job_id: str) -> int:
    return sum(e.kind == "progress" for e in store.events(job_id, limit=10_000))


def test_a_job_keeps_every_event_until_it_has_been_over_for_the_days_set_then_keeps_a_hundred(store):
    _job(store, "ended", 1000)
    _job(store, "running", 1000, end=None)
    metrics = ServiceMetrics()
    retention = EventRetention(AsyncJobStore(store), keep_days=30, metrics=metrics)
    ended = store.get("ended").updated_at
    assert asyncio.run(retention.once(now=ended + 29 * DAY_S)) == (0, 0)
    assert _progress(store, "ended") == 1000
    assert asyncio.run(retention.once(now=ended + 31 * DAY_S)) == (1, 1000 - KEEP_PROGRESS)
    assert (_progress(store, "ended"), _progress(store, "running")) == (KEEP_PROGRESS, 1000)
    assert metrics.registry.get_sample_value("rayft_events_thinned_total") == 1000 - KEEP_PROGRESS
    assert [e.data["state"] for e in store.events("ended", limit=10_000) if e.kind == "state"][-1] == "SUCCEEDED"


def test_a_pass_thins_at_most_its_page_of_jobs_and_the_next_goes_on(store):
    for job_id in ("a", "b", "c"):
        _job(store, job_id, 150)
    retention = EventRetention(AsyncJobStore(store), keep_days=1)
    retention.JOBS_PER_PASS = 2
    later = time.time() + 2 * DAY_S
    assert asyncio.run(retention.once(now=later)) == (2, 2 * (150 - KEEP_PROGRESS))
    assert asyncio.run(retention.once(now=later)) == (1, 150 - KEEP_PROGRESS)
    assert asyncio.run(retention.once(now=later)) == (0, 0)


def test_keep_days_zero_keeps_every_event_for_ever(store):
    _job(store, "ended", 300)
    retention = EventRetention(AsyncJobStore(store), keep_days=0)
    assert asyncio.run(retention.once(now=time.time() + 3650 * DAY_S)) == (0, 0)
    assert _progress(store, "ended") == 300


def test_the_service_runs_retention_in_the_background_at_its_interval(store):
    _job(store, "ended", 500)

    async def main() -> None:
        retention = EventRetention(AsyncJobStore(store), keep_days=1e-9, interval_s=0.01)
        task = asyncio.create_task(retention.run_forever())
        while _progress(store, "ended") != KEEP_PROGRESS:
            await asyncio.sleep(0.01)
        task.cancel()

    asyncio.run(asyncio.wait_for(main(), timeout=60))


def test_the_days_come_from_their_variable_and_a_negative_number_is_refused_by_name(monkeypatch):
    assert ServiceSettings().events_keep_days == 30
    monkeypatch.setenv("RAYFT_EVENTS_KEEP_DAYS", "7.5")
    assert ServiceSettings.from_env().events_keep_days == 7.5
    with pytest.raises(ValueError, match="RAYFT_EVENTS_KEEP_DAYS"):
        ServiceSettings(events_keep_days=-1)
