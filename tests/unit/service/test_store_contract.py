"""The JobStore contract: every implementation passes these (today: SQLite, in a file)."""

from __future__ import annotations

import threading
import time
import uuid

import pytest

from rayft_contract.states import TERMINAL, TRANSITIONS, JobState, TransitionError
from service.store import JobRecord, ReportOutOfOrder, StoreError
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


def test_the_whole_log_is_followed_in_the_order_it_was_stored_from_a_position(store):
    start = store.log_position()
    a, _ = store.create(record())
    b, _ = store.create(record())
    store.append_event(b.id, "progress", {"step": 1})
    store.append_event(a.id, "progress", {"step": 1})
    events, position = store.events_since(start)
    assert [(e.job_id, e.seq) for e in events] == [(a.id, 1), (b.id, 1), (b.id, 2), (a.id, 2)]
    assert position == store.log_position()
    assert store.events_since(position) == ([], position)  # nothing new: the same position back
    first, middle = store.events_since(start, limit=1)
    assert [(e.job_id, e.seq) for e in first] == [(a.id, 1)]
    assert [(e.job_id, e.seq) for e in store.events_since(middle)[0]] == [(b.id, 1), (b.id, 2), (a.id, 2)]


def _ended_job_with_progress(store, steps, state=JobState.SUCCEEDED):
    job, _ = store.create(record())
    store.transition(job.id, JobState.STARTING)
    store.transition(job.id, JobState.RUNNING)
    for step in range(1, steps + 1):
        store.append_event(job.id, "progress", {"step": step})
        if step == 3:
            store.append_event(job.id, "phase", {"phase": "training"})
    store.append_report(job.id, 1, "summary", {"steps": steps})
    if state is not JobState.RUNNING:
        store.transition(job.id, state, "done")
    return job


def test_an_ended_job_keeps_its_first_last_and_evenly_spaced_progress_and_every_other_event_when_thinned(store):
    job = _ended_job_with_progress(store, 250)
    before = store.events(job.id)
    assert store.thin_events(time.time() + 1, keep_progress=6) == (1, 244)
    after = store.events(job.id)
    assert [e.data["step"] for e in after if e.kind == "progress"] == [1, 51, 101, 150, 200, 250]
    others = [(e.seq, e.kind, e.data) for e in before if e.kind != "progress"]
    assert [(e.seq, e.kind, e.data) for e in after if e.kind != "progress"] == others  # states, phase, summary
    assert [kind for _, kind, _ in others] == ["state", "state", "state", "phase", "summary", "state"]
    assert store.get(job.id).summary == {"steps": 250} and store.get(job.id).last_seq == before[-1].seq
    assert store.thin_events(time.time() + 1, keep_progress=6) == (0, 0)  # once a job


def test_only_jobs_that_ended_before_the_cutoff_are_thinned_a_page_at_a_time(store):
    running = _ended_job_with_progress(store, 20, state=JobState.RUNNING)
    old = [_ended_job_with_progress(store, 20, state=s) for s in (JobState.FAILED, JobState.CANCELLED)]
    cutoff = time.time() + 0.001
    while time.time() <= cutoff:  # the next job ends after the cutoff, on any clock resolution
        time.sleep(0.001)
    recent = _ended_job_with_progress(store, 20)
    assert store.thin_events(cutoff, keep_progress=2, jobs=1) == (1, 18)
    assert store.thin_events(cutoff, keep_progress=2, jobs=5) == (1, 18)
    progress = {j.id: sum(e.kind == "progress" for e in store.events(j.id)) for j in (running, *old, recent)}
    assert progress == {running.id: 20, old[0].id: 2, old[1].id: 2, recent.id: 20}
    with pytest.raises(ValueError, match="keep_progress"):
        store.thin_events(time.time() + 1, keep_progress=1)


def test_a_thinned_store_never_gives_a_new_event_a_position_a_follower_has_read(store):
    job = _ended_job_with_progress(store, 30)
    late = store.append_event(job.id, "progress", {"step": 31})  # a report that came after the end: the newest row
    position = store.log_position()
    assert store.thin_events(time.time() + 1, keep_progress=2) == (1, 29)
    assert [e.data["step"] for e in store.events(job.id) if e.kind == "progress"] == [1, 31]
    other, _ = store.create(record())
    events, _ = store.events_since(position)
    assert [(e.job_id, e.seq) for e in events] == [(other.id, 1)]  # not a rowid SQLite freed and gave again
    assert store.events(job.id)[-1] == late


def test_reports_are_stored_once(store):
    job, _ = store.create(record())
    assert store.append_report(job.id, 1, "progress", {"step": 1}).seq == 2
    assert store.append_report(job.id, 1, "progress", {"step": 1}) is None  # a retry
    assert store.append_report(job.id, 2, "progress", {"step": 2}).seq == 3
    assert [e.data.get("step") for e in store.events(job.id)] == [None, 1, 2]


def test_a_report_number_ahead_of_the_next_is_refused_and_cannot_silence_the_job(store):
    job, _ = store.create(record())
    store.append_report(job.id, 1, "progress", {"step": 1})
    for forged in (3, 10**12):
        with pytest.raises(ReportOutOfOrder) as info:
            store.append_report(job.id, forged, "progress", {"step": -1})
        assert info.value.expected == 2
    assert store.append_report(job.id, 2, "progress", {"step": 2}).seq == 3  # the job's next real report still lands
    assert [e.data.get("step") for e in store.events(job.id)] == [None, 1, 2]


def test_a_summary_report_is_the_jobs_summary_and_a_repeat_changes_nothing(store):
    job, _ = store.create(record())
    store.append_report(job.id, 1, "summary", {"steps": 3})
    assert store.append_report(job.id, 1, "summary", {"steps": 999}) is None
    assert store.get(job.id).summary == {"steps": 3}


def test_a_list_without_specs_names_each_job_and_reads_nothing_else_of_its_spec(store):
    job, _ = store.create(record(spec={"name": "named", "data": {"path": "/d" * 1000}}))
    nameless, _ = store.create(record(spec={"data": {"path": "/d"}}))
    by_id = {j.id: j for j in store.list("team-a", specs=False)}
    assert by_id[job.id].spec == {"name": "named"} and by_id[nameless.id].spec == {"name": ""}
    assert by_id[job.id].state is JobState.QUEUED and by_id[job.id].last_seq == 1
    assert {j.id: j.spec for j in store.list("team-a")}[job.id]["data"]["path"] == "/d" * 1000


def test_a_list_of_every_team_pages_newest_first_across_teams(store):
    """The operator's list (team None): one order over all teams, its pages neither skipping nor repeating a job."""
    jobs = [store.create(record(team=f"team-{'ab'[i % 2]}", at=1000.0 + i))[0] for i in range(5)]
    page1 = store.list(None, limit=2)
    page2 = store.list(None, limit=2, after=page1[-1].id)
    page3 = store.list(None, limit=2, after=page2[-1].id)
    assert [j.id for j in page1 + page2 + page3] == [j.id for j in reversed(jobs)]
    assert {j.team for j in page1} == {"team-a", "team-b"}
    store.transition(jobs[1].id, JobState.CANCELLED)
    assert [j.id for j in store.list(None, states=[JobState.CANCELLED], specs=False)] == [jobs[1].id]


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
    assert [j.id for j in store.ended_since(time.time() - 60, JobState.CANCELLED)] == [jobs[0].id]
    assert store.ended_since(time.time() - 60, JobState.FAILED) == []
    assert store.count_by_state() == {
        (JobState.QUEUED, "team-a"): 6,
        (JobState.CANCELLED, "team-a"): 1,
        (JobState.QUEUED, "team-b"): 1,
    }
    store.transition(jobs[1].id, JobState.CANCELLED)
    assert [j.id for j in store.ended_since(time.time() - 60, JobState.CANCELLED, limit=1)] == [jobs[0].id]  # first ended
    (named,) = store.ended_since(time.time() - 60, JobState.CANCELLED, specs=False, limit=1)
    assert named.id == jobs[0].id and named.spec == {"name": jobs[0].spec["name"]}


def test_a_report_token_is_bound_once_and_a_retry_of_the_same_is_accepted(store):
    job, _ = store.create(record())
    assert store.bind_report_token(job.id, "h1") and store.bind_report_token(job.id, "h1")
    assert not store.bind_report_token(job.id, "h2")  # someone else's claim with the same ticket
    assert store.get(job.id).report_token_hash == "h1"


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


def test_tokens_expire_and_are_revoked_by_their_id(store):
    live = store.add_token("team-a", "a" * 64)
    store.add_token("team-a", "b" * 64, expires_at=time.time() - 1)  # expired a second ago
    store.add_token("team-b", "c" * 64, expires_at=time.time() + 3600)
    assert store.team_for_token("a" * 64) == "team-a" and store.team_for_token("c" * 64) == "team-b"
    assert store.team_for_token("b" * 64) is None
    assert [t.id for t in store.tokens("team-a")] == ["a" * 12, "b" * 12] and len(store.tokens()) == 3
    assert "a" * 13 not in repr(store.tokens())  # a listing never shows more of the hash than its id
    assert store.revoke_token("a" * 6) is None  # a prefix could name several: refused
    revoked = store.revoke_token(live.id)
    assert revoked.team == "team-a" and revoked.revoked_at is not None
    assert store.team_for_token("a" * 64) is None and store.revoke_token("f" * 12) is None


def test_data_survives_reopening(tmp_path):
    store = SqliteJobStore(tmp_path / "jobs.db")
    job, _ = store.create(record(key="k"))
    store.append_event(job.id, "progress", {"step": 1})
    store.close()
    reopened = SqliteJobStore(tmp_path / "jobs.db")
    assert reopened.get(job.id) == store_job_after(job)
    assert [e.seq for e in reopened.events(job.id)] == [1, 2]
    reopened.close()


def test_a_full_disk_is_a_store_error_of_its_own_and_loses_nothing_stored(tmp_path):
    """SQLite's own limit on the file's pages stands in for a full disk: the same SQLITE_FULL error."""
    store = SqliteJobStore(tmp_path / "jobs.db")
    job, _ = store.create(record())
    pages = store._db.execute("PRAGMA page_count").fetchone()[0]
    store._db.execute(f"PRAGMA max_page_count = {pages}")
    with pytest.raises(StoreError) as info:
        for i in range(200):  # until the file would have to grow
            store.append_event(job.id, "progress", {"step": i, "pad": "x" * 2000})
    assert info.value.kind == "full" and "disk is full" in str(info.value)
    grown = len(store.events(job.id))
    assert store.get(job.id).last_seq == grown  # every event before the fault is there, and no half of one


def test_a_lock_held_by_another_process_is_busy_not_raw_sqlite_text(tmp_path):
    import sqlite3

    store = SqliteJobStore(tmp_path / "jobs.db")
    job, _ = store.create(record())
    other = sqlite3.connect(tmp_path / "jobs.db", isolation_level=None)
    other.execute("BEGIN IMMEDIATE")  # a backup, or `rayft token create`, holding the write lock
    try:
        assert store.get(job.id).id == job.id  # WAL: reads go on
        with pytest.raises(StoreError) as info:
            store.append_event(job.id, "progress", {"step": 1})
        assert info.value.kind == "busy" and "database is locked" not in str(info.value)
    finally:
        other.execute("ROLLBACK")
        other.close()
    assert store.append_event(job.id, "progress", {"step": 1}).seq == 2


@pytest.mark.parametrize("damage", ["garbage", "truncated"])
def test_a_damaged_store_is_refused_when_opened(tmp_path, damage):
    path = tmp_path / "jobs.db"
    store = SqliteJobStore(path)
    for _ in range(20):
        store.create(record())
    store.close()
    data = path.read_bytes()
    path.write_bytes(b"not a database at all" * 200 if damage == "garbage" else data[: len(data) // 2 + 100])
    with pytest.raises(StoreError) as info:
        SqliteJobStore(path)
    assert info.value.kind == "broken" and str(path) in str(info.value)


def store_job_after(job):
    import dataclasses

    return dataclasses.replace(job, last_seq=2)


def test_a_read_does_not_wait_for_a_write_in_progress(store):
    """Reads have connections of their own: with WAL they see the last commit while a writer holds the lock.
    Before, a read waited for this process's writer lock, behind other teams' commits."""
    job, _ = store.create(record())
    holding, release = threading.Event(), threading.Event()

    def write_slowly():
        with store._tx() as db:  # the writer lock, held until released
            db.execute("UPDATE jobs SET message = 'being written' WHERE id = ?", (job.id,))
            holding.set()
            release.wait(30)

    writer = threading.Thread(target=write_slowly)
    writer.start()
    try:
        assert holding.wait(30)
        seen = store.get(job.id)  # the old lock would hold this for LOCK_TIMEOUT_S, then answer "busy"
        assert seen.message == "" and writer.is_alive(), "the last committed state, read beside the open write"
        assert store.count_active(job.team) == 1
    finally:
        release.set()
        writer.join(30)
    assert store.get(job.id).message == "being written"
