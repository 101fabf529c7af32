"""A backup of the job store taken while the service writes (service/backup.py)."""

from __future__ import annotations

import threading
import time

import pytest

from rayft_contract.spec import SpecError
from rayft_contract.states import JobState
from service.backup import backup
from service.store import JobRecord
from service.store_sqlite import SqliteJobStore


def test_backups_taken_while_a_job_reports_are_each_one_whole_snapshot(tmp_path):
    """Each event and its job's ``last_seq`` are written in one transaction: a copy torn between the two (``cp``
    of a WAL store mid-write) would show a job whose events and ``last_seq`` disagree."""
    store = SqliteJobStore(tmp_path / "jobs.db")
    store.add_token("team-a", "0" * 64)
    now = time.time()
    store.create(JobRecord("ft-busy", "team-a", JobState.QUEUED, {"name": "busy"}, now, now))
    stop, written = threading.Event(), threading.Semaphore(0)

    def report() -> None:
        while not stop.is_set():
            store.append_event("ft-busy", "progress", {"step": 1})
            written.release()

    writer = threading.Thread(target=report)
    writer.start()
    try:
        copies = []
        for i in range(3):
            for _ in range(20):  # the job reported more since the last copy
                assert written.acquire(timeout=60)
            copies.append(backup(tmp_path / "jobs.db", tmp_path / f"copy-{i}.db"))
    finally:
        stop.set()
        writer.join(timeout=60)
    store.close()
    seen = []
    for copy in copies:
        restored = SqliteJobStore(copy.path)
        job = restored.get("ft-busy")
        seqs = [e.seq for e in restored.events("ft-busy", limit=100_000)]
        assert seqs == list(range(1, job.last_seq + 1)) and copy.events == job.last_seq  # gap-free, and whole
        assert copy.jobs == 1 and copy.tokens == 1 and restored.team_for_token("0" * 64) == "team-a"
        assert oct(copy.path.stat().st_mode & 0o777) == "0o600"  # token hashes and every team's specs
        seen.append(job.last_seq)
        restored.close()
    assert seen == sorted(set(seen))  # three snapshots, each later than the one before


def test_a_backup_never_replaces_a_file_and_names_what_to_fix(tmp_path):
    SqliteJobStore(tmp_path / "jobs.db").close()
    there = tmp_path / "there.db"
    there.write_text("a file of the operator's")
    with pytest.raises(SpecError, match="^dest: .*there.db exists"):
        backup(tmp_path / "jobs.db", there)
    assert there.read_text() == "a file of the operator's"
    with pytest.raises(SpecError, match="^data-dir: no job store at"):
        backup(tmp_path / "elsewhere" / "jobs.db", tmp_path / "new.db")
    with pytest.raises(SpecError, match="^dest: .* is not a directory"):
        backup(tmp_path / "jobs.db", tmp_path / "no-such-dir" / "new.db")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["jobs.db", "there.db"]  # no copy, whole or partial
