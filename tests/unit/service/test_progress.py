"""service.progress: job events as streams, on a real SQLite store."""

from __future__ import annotations

import asyncio
import time

import pytest

from rayft_contract.states import JobState
from service.progress import JobEvents
from service.store import AsyncJobStore, JobRecord
from service.store_sqlite import SqliteJobStore

FOLLOWERS = 8


@pytest.fixture
def events(tmp_path):
    sync = SqliteJobStore(tmp_path / "jobs.db")
    now = time.time()
    sync.create(JobRecord(id="job", team="t", state=JobState.QUEUED, spec={"name": "j"}, created_at=now, updated_at=now))
    yield JobEvents(AsyncJobStore(sync))
    sync.close()


async def _follow(events: JobEvents, seen: list[int], after: int) -> None:
    async for event in events.follow("job", after_seq=after):
        seen.append(event.seq)


async def _until(condition, timeout_s: float = 60.0) -> None:
    """Wait until ``condition()`` holds (the store's calls run in threads: no count of loop turns is enough)."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "never held"
        await asyncio.sleep(0.001)


def test_every_follower_sees_every_event_once_in_order_and_none_is_left_waiting_after(events):
    async def main():
        history = (await events.store.get("job")).last_seq  # the queued state's event
        seen = [[] for _ in range(FOLLOWERS)]
        tasks = [asyncio.create_task(_follow(events, s, history)) for s in seen]
        for i in range(3):
            await events.append("job", "log", {"line": str(i)})
        await events.transition("job", JobState.CANCELLED, "done")
        await asyncio.wait_for(asyncio.gather(*tasks), timeout=60)
        return seen, history

    seen, history = asyncio.run(main())
    assert all(s == list(range(history + 1, history + 5)) for s in seen), seen
    assert "job" not in events._next


def test_a_followed_event_costs_no_store_read_per_stream_only_state_events_do(tmp_path):
    """With 32 streams on a job that reports 5 times a second, each woken stream used to read the store twice
    after every event it sent (bench/tenant_bench.py): the store is now read when memory cannot tell."""
    sync = CountingStore(tmp_path / "jobs.db")
    now = time.time()
    sync.create(JobRecord(id="job", team="t", state=JobState.QUEUED, spec={"name": "j"}, created_at=now, updated_at=now))
    events = JobEvents(AsyncJobStore(sync))
    logs = 20

    async def main():
        history = (await events.store.get("job")).last_seq
        seen = [[] for _ in range(FOLLOWERS)]
        tasks = [asyncio.create_task(_follow(events, s, history)) for s in seen]
        await _until(lambda: sync.calls["get"] >= FOLLOWERS + 1 and "job" in events._next)
        before = dict(sync.calls)
        for i in range(logs):
            await events.append("job", "log", {"line": str(i)})
            await _until(lambda n=i + 1: all(len(s) == n for s in seen))
        await events.transition("job", JobState.CANCELLED, "done")
        await asyncio.wait_for(asyncio.gather(*tasks), timeout=60)
        return seen, before

    seen, before = asyncio.run(main())
    assert all(len(s) == logs + 1 for s in seen)
    assert sync.calls["events"] - before["events"] <= 1  # the transition's own read of its state event
    assert sync.calls["get"] - before["get"] == FOLLOWERS  # once each, after the terminal state event
    sync.close()


class CountingStore(SqliteJobStore):
    """The real store, counting its reads."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.calls = {"get": 0, "events": 0}

    def get(self, *args, **kwargs):
        self.calls["get"] += 1
        return super().get(*args, **kwargs)

    def events(self, *args, **kwargs):
        self.calls["events"] += 1
        return super().events(*args, **kwargs)
