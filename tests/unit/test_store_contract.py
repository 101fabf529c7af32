"""The JobStore contract: every implementation passes these (today: SQLite, in a file)."""

from __future__ import annotations

import threading
import time
import uuid

import pytest

from rayft_contract.states import TERMINAL, TRANSITIONS, JobState, TransitionError
from service.store import JobRecord
from service.store_sqlite import SqliteJobStore

IMPLEMENTATIONS = {"sqlite": lambda tmp_path: SqliteJobStore(tmp_path / "jobs.db")}


@pytest.fixture(params=sorted(IMPLEMENTATIONS))
def store(request, tmp_path):
    impl = IMPLEMENTATIONS[request.param](tmp_path)
    yield impl
    impl.close()


def record(team="team-a", key="", spec=None, at=None):
    now = at if at is not None else time.time()
    return JobRecord(
        id=uuid.uuid4().hex,
        team=team,
        state=JobState.QUEUED,
        spec=spec or {"name": "j"},
        created_at=now,
        updated_at=now,
        idempotency_key=key,
        request_hash=str(spec),
    )


def test_create_logs_the_queued_state(store):
    job, created = store.create(record())
    assert created and job.state is JobState.QUEUED and job.last_seq == 1
    (event,) = store.events(job.id)
    assert (event.seq, event.kind, event.data["state"]) == (1, "state", "QUEUED")
    assert store.get(job.id) == job


def test_idempotency_key_is_per_team(store):
    first, _ = store.create(record(key="k1"))
    again, created = store.create(record(key="k1"))
    assert not created and again.id == first.id
    other, created = store.create(record(team="team-b", key="k1"))
    assert created and other.id != first.id
    assert store.by_key("team-a", "k1").id == first.id and store.by_key("team-a", "k2") is None


def test_concurrent_creates_with_one_key_make_one_job(store):
    results = []
    threads = [threading.Thread(target=lambda: results.append(store.create(record(key="same")))) for _ in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(created for _, created in results) == 1
    assert len({job.id for job, _ in results}) == 1


@pytest.mark.parametrize("start", list(JobState))
@pytest.mark.parametrize("target", list(JobState))
def test_transitions_follow_the_table(store, start, target):
    job, _ = store.create(record())
    path = {
        JobState.QUEUED: [],
        JobState.STARTING: [JobState.STARTING],
        JobState.RUNNING: [JobState.STARTING, JobState.RUNNING],
        JobState.SUCCEEDED: [JobState.STARTING, JobState.RUNNING, JobState.SUCCEEDED],
        JobState.FAILED: [JobState.FAILED],
        JobState.CANCELLED: [JobState.CANCELLED],
    }[start]
    for state in path:
        store.transition(job.id, state)
    if target in TRANSITIONS[start]:
        moved = store.transition(job.id, target, "why")
        assert moved.state is target and moved.message == "why"
        assert store.events(job.id)[-1].data == {"state": target.value, "message": "why"}
    else:
        before = store.get(job.id)
        with pytest.raises(TransitionError):
            store.transition(job.id, target)
        assert store.get(job.id) == before  # nothing stored changed


def test_terminal_states_are_final():
    assert all(not TRANSITIONS[s] for s in TERMINAL)
    assert {s for s in JobState if s.is_terminal} == TERMINAL


def test_events_are_gapless_and_replayable(store):
    job, _ = store.create(record())
    for step in range(1, 6):
        store.append_event(job.id, "progress", {"step": step})
    assert [e.seq for e in store.events(job.id)] == [1, 2, 3, 4, 5, 6]
    assert [e.data["step"] for e in store.events(job.id, after_seq=3)] == [3, 4, 5]
    assert store.get(job.id).last_seq == 6
    with pytest.raises(KeyError):
        store.append_event("nope", "progress", {})


def test_reports_are_stored_once(store):
    job, _ = store.create(record())
    assert store.append_report(job.id, 1, "progress", {"step": 1}).seq == 2
    assert store.append_report(job.id, 1, "progress", {"step": 1}) is None  # a retry
    assert store.append_report(job.id, 2, "progress", {"step": 2}).seq == 3
    assert [e.data.get("step") for e in store.events(job.id)] == [None, 1, 2]


def test_list_filters_and_pages_newest_first(store):
    jobs = [store.create(record(at=1000.0 + i))[0] for i in range(7)]
    store.create(record(team="team-b"))
    store.transition(jobs[0].id, JobState.CANCELLED)
    page1 = store.list("team-a", limit=3)
    page2 = store.list("team-a", limit=3, after=page1[-1].id)
    page3 = store.list("team-a", limit=3, after=page2[-1].id)
    assert [j.id for j in page1 + page2 + page3] == [j.id for j in reversed(jobs)]
    assert [j.id for j in store.list("team-a", states=[JobState.CANCELLED])] == [jobs[0].id]
    assert store.count_active("team-a") == 6
    assert [j.id for j in store.ended_since(time.time() - 60)] == [jobs[0].id]
    assert store.ended_since(time.time() + 60) == []


def test_update_and_summary_round_trip(store):
    job, _ = store.create(record())
    updated = store.update(job.id, ray_submission_id="sub-1", summary={"steps": 3}, report_token_hash="h")
    assert (updated.ray_submission_id, updated.summary, updated.report_token_hash) == ("sub-1", {"steps": 3}, "h")
    with pytest.raises(ValueError):
        store.update(job.id, state="RUNNING")


def test_tokens(store):
    store.add_token("team-a", "hash-a")
    assert store.team_for_token("hash-a") == "team-a"
    assert store.team_for_token("other") is None


def test_data_survives_reopening(tmp_path):
    store = SqliteJobStore(tmp_path / "jobs.db")
    job, _ = store.create(record(key="k"))
    store.append_event(job.id, "progress", {"step": 1})
    store.close()
    reopened = SqliteJobStore(tmp_path / "jobs.db")
    assert reopened.get(job.id) == store_job_after(job)
    assert [e.seq for e in reopened.events(job.id)] == [1, 2]
    reopened.close()


def store_job_after(job):
    import dataclasses

    return dataclasses.replace(job, last_seq=2)
