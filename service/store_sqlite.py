"""SQLite job store: one file, WAL journal, numbered schema migrations, one writer lock.

Every change that must be atomic (a state change and its event, an event and the job's ``last_seq``)
is one transaction, so a crash between them cannot leave a gap in a job's event log.

Locks time out after ``LOCK_TIMEOUT_S`` (SQLite's busy timeout and this process's own lock alike), and
every SQLite fault leaves as a ``StoreError`` saying what kind it is, never as raw SQLite text. The file
is checked (``PRAGMA quick_check``) when opened, so a damaged store stops the service at start-up with
one line, instead of a service that reports SERVING while every call fails.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import sqlite3
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rayft_contract.records import StateChange
from rayft_contract.states import TERMINAL, JobState, TransitionError
from service.sqlite_locks import LOCK_TIMEOUT_S, Shared, Transaction, WriterLock, with_faults
from service.store import EventRecord, JobRecord, ReportOutOfOrder, StoreError
from service.store_tokens import SqliteTokens

MIGRATIONS = [
    # 1: jobs, events, tokens
    """
    CREATE TABLE jobs (
        id TEXT PRIMARY KEY, team TEXT NOT NULL, state TEXT NOT NULL, spec TEXT NOT NULL,
        created_at REAL NOT NULL, updated_at REAL NOT NULL, idempotency_key TEXT NOT NULL DEFAULT '',
        request_hash TEXT NOT NULL DEFAULT '', message TEXT NOT NULL DEFAULT '',
        ray_submission_id TEXT NOT NULL DEFAULT '', last_seq INTEGER NOT NULL DEFAULT 0,
        summary TEXT, report_token_hash TEXT NOT NULL DEFAULT ''
    );
    CREATE UNIQUE INDEX jobs_idempotency ON jobs(team, idempotency_key) WHERE idempotency_key != '';
    CREATE INDEX jobs_team_created ON jobs(team, created_at DESC, id DESC);
    CREATE TABLE events (
        job_id TEXT NOT NULL REFERENCES jobs(id), seq INTEGER NOT NULL, time REAL NOT NULL,
        kind TEXT NOT NULL, data TEXT NOT NULL, PRIMARY KEY (job_id, seq)
    );
    CREATE TABLE tokens (token_hash TEXT PRIMARY KEY, team TEXT NOT NULL, created_at REAL NOT NULL);
    """,
    # 2: the running job numbers its reports; a retried report is not stored twice
    """
    ALTER TABLE jobs ADD COLUMN last_report_seq INTEGER NOT NULL DEFAULT 0;
    """,
    # 3: tokens expire and can be revoked
    """
    ALTER TABLE tokens ADD COLUMN expires_at REAL;
    ALTER TABLE tokens ADD COLUMN revoked_at REAL;
    """,
    # 4: an ended job's progress events are thinned once, long after it ended (``thin_events``)
    """
    ALTER TABLE jobs ADD COLUMN events_thinned_at REAL;
    """,
    # 5: the operator lists every team's jobs, newest first, a page at a time
    """
    CREATE INDEX jobs_created ON jobs(created_at DESC, id DESC);
    """,
]
_TERMINAL = sorted(s.value for s in TERMINAL)
THIN_ROWS = 1000
"""Progress events one transaction of ``thin_events`` deletes, about: another writer waits at most 8.4 ms for it
(``bench/store_retention.py``, 2-core machine)."""
_UPDATABLE = {"ray_submission_id", "summary", "report_token_hash"}


@with_faults
class SqliteJobStore(SqliteTokens):
    def __init__(self, path: str | Path):
        if str(path) != ":memory:":  # the service's user alone reads the store (tokens, every team's specs)
            Path(path).parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            Path(path).touch(mode=0o600, exist_ok=True)
        self.path = str(path)
        self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None, timeout=LOCK_TIMEOUT_S)
        self._db.row_factory = sqlite3.Row
        self._lock = threading.RLock()
        """This process's writer lock (and, for ``:memory:``, everything's)."""
        self._local = threading.local()
        self._readers: list[sqlite3.Connection] = []
        """Every thread's read connection, to close with the store."""
        self._readers_lock = threading.Lock()
        try:
            self._open()
        except sqlite3.DatabaseError as exc:
            self._db.close()
            raise StoreError("broken", f"the job store {self.path} cannot be opened: {exc}") from exc

    def _open(self) -> None:
        check = self._db.execute("PRAGMA quick_check").fetchone()[0]
        if check != "ok":
            raise sqlite3.DatabaseError(f"quick_check: {check}")
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA foreign_keys=ON")
        self._migrate()

    def _read(self) -> contextlib.AbstractContextManager[sqlite3.Connection]:
        """The connection a read uses: this thread's own, read-only. With WAL, readers on their own connections
        never wait for the writer, and the writer waits for no reader. Measured in bench/tenant_bench.py:
        reads shared the writer's connection and lock, so a GetJob or a refused CreateJob waited behind other
        teams' commits (an fsync each): p99 28 ms server-side for a refused CreateJob beside a noisy team."""
        if self.path == ":memory:":  # one database per connection: share the writer's
            return Shared(self._db, self._lock)
        reader = getattr(self._local, "reader", None)
        if reader is None:
            reader = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None, timeout=LOCK_TIMEOUT_S)
            reader.row_factory = sqlite3.Row
            reader.execute("PRAGMA query_only=ON")
            self._local.reader = reader
            with self._readers_lock:
                self._readers.append(reader)
        return contextlib.nullcontext(reader)

    def _migrate(self) -> None:
        with self._tx() as db:
            version = db.execute("PRAGMA user_version").fetchone()[0]
            for number, script in enumerate(MIGRATIONS[version:], start=version + 1):
                for statement in filter(str.strip, script.split(";")):
                    db.execute(statement)
                db.execute(f"PRAGMA user_version = {number}")

    def _tx(self) -> Transaction:
        return Transaction(self._db, self._lock)

    # -- jobs --------------------------------------------------------------------------------

    def create(self, record: JobRecord) -> tuple[JobRecord, bool]:
        with self._tx() as db:
            if record.idempotency_key:
                row = db.execute(
                    "SELECT * FROM jobs WHERE team = ? AND idempotency_key = ?", (record.team, record.idempotency_key)
                ).fetchone()
                if row is not None:
                    return _job(row), False
            db.execute(
                "INSERT INTO jobs (id, team, state, spec, created_at, updated_at, idempotency_key, request_hash) VALUES (?,?,?,?,?,?,?,?)",
                (
                    record.id,
                    record.team,
                    JobState.QUEUED.value,
                    json.dumps(record.spec),
                    record.created_at,
                    record.created_at,
                    record.idempotency_key,
                    record.request_hash,
                ),
            )
            self._append(db, record.id, "state", StateChange(JobState.QUEUED.value).to_dict(), record.created_at)
            return _job(db.execute("SELECT * FROM jobs WHERE id = ?", (record.id,)).fetchone()), True

    def get(self, job_id: str) -> JobRecord | None:
        with self._read() as db:
            row = db.execute("SELECT * FROM jobs WHERE id = ?", (job_id,)).fetchone()
        return _job(row) if row else None

    def by_key(self, team: str, idempotency_key: str) -> JobRecord | None:
        with self._read() as db:
            row = db.execute("SELECT * FROM jobs WHERE team = ? AND idempotency_key = ?", (team, idempotency_key)).fetchone()
        return _job(row) if row else None

    def list(
        self, team: str | None, states: Sequence[JobState] = (), limit: int = 50, after: str = "", specs: bool = True
    ) -> list[JobRecord]:
        where, args = ("team = ?", [team]) if team is not None else ("1", [])
        sql = f"SELECT {'*' if specs else _WITHOUT_SPEC} FROM jobs WHERE {where}"
        if states:
            sql += f" AND state IN ({','.join('?' * len(states))})"
            args += [JobState(s).value for s in states]
        if after:
            anchor = self.get(after)
            if anchor is not None:
                sql += " AND (created_at < ? OR (created_at = ? AND id < ?))"
                args += [anchor.created_at, anchor.created_at, anchor.id]
        sql += " ORDER BY created_at DESC, id DESC LIMIT ?"
        with self._read() as db:
            return [_job(r) for r in db.execute(sql, [*args, limit]).fetchall()]

    def transition(self, job_id: str, state: JobState, message: str = "") -> JobRecord:
        with self._tx() as db:
            row = db.execute("SELECT state FROM jobs WHERE id = ?", (job_id,)).fetchone()
            if row is None:
                raise KeyError(job_id)
            current = JobState(row["state"])
            if not current.can_become(state):
                raise TransitionError(f"job {job_id} is {current.value}; it cannot become {state.value}")
            now = time.time()
            db.execute("UPDATE jobs SET state = ?, message = ?, updated_at = ? WHERE id = ?", (state.value, message, now, job_id))
            self._append(db, job_id, "state", StateChange(state.value, message).to_dict(), now)
            return _job(db.execute("SELECT * FROM jobs WHERE id = ?", (job_id,)).fetchone())

    def update(self, job_id: str, **fields: Any) -> JobRecord:
        unknown = set(fields) - _UPDATABLE
        if unknown:
            raise ValueError(f"cannot update {sorted(unknown)}")
        values = {k: json.dumps(v) if k == "summary" else v for k, v in fields.items()}
        with self._tx() as db:
            assignments = ", ".join(f"{k} = ?" for k in values)
            db.execute(f"UPDATE jobs SET {assignments}, updated_at = ? WHERE id = ?", (*values.values(), time.time(), job_id))
            row = db.execute("SELECT * FROM jobs WHERE id = ?", (job_id,)).fetchone()
        if row is None:
            raise KeyError(job_id)
        return _job(row)

    def bind_report_token(self, job_id: str, token_hash: str) -> bool:
        with self._tx() as db:
            row = db.execute("SELECT report_token_hash FROM jobs WHERE id = ?", (job_id,)).fetchone()
            if row is None:
                raise KeyError(job_id)
            if row["report_token_hash"] not in ("", token_hash):
                return False
            db.execute("UPDATE jobs SET report_token_hash = ? WHERE id = ?", (token_hash, job_id))
            return True

    def active(self) -> list[JobRecord]:
        terminal = _TERMINAL
        with self._read() as db:
            rows = db.execute(
                f"SELECT * FROM jobs WHERE state NOT IN ({','.join('?' * len(terminal))}) ORDER BY created_at", terminal
            )
            return [_job(r) for r in rows.fetchall()]

    def ended_since(
        self, since: float, state: JobState | None = None, specs: bool = True, limit: int | None = None
    ) -> list[JobRecord]:
        terminal = [state.value] if state is not None else _TERMINAL
        with self._read() as db:
            rows = db.execute(
                f"SELECT {'*' if specs else _WITHOUT_SPEC} FROM jobs WHERE state IN ({','.join('?' * len(terminal))}) AND updated_at >= ? ORDER BY updated_at LIMIT ?",
                [*terminal, since, -1 if limit is None else limit],
            )
            return [_job(r) for r in rows.fetchall()]

    def count_active(self, team: str) -> int:
        terminal = _TERMINAL
        with self._read() as db:
            row = db.execute(
                f"SELECT COUNT(*) FROM jobs WHERE team = ? AND state NOT IN ({','.join('?' * len(terminal))})", (team, *terminal)
            ).fetchone()
        return int(row[0])

    def count_by_state(self) -> dict[tuple[JobState, str], int]:
        with self._read() as db:
            rows = db.execute("SELECT state, team, COUNT(*) FROM jobs GROUP BY state, team").fetchall()
        return {(JobState(state), team): count for state, team, count in rows}

    # -- events ------------------------------------------------------------------------------

    def append_event(self, job_id: str, kind: str, data: dict[str, Any], time: float | None = None) -> EventRecord:
        with self._tx() as db:
            return self._append(db, job_id, kind, data, time)

    def append_report(self, job_id: str, report_seq: int, kind: str, data: dict[str, Any]) -> EventRecord | None:
        with self._tx() as db:
            row = db.execute("SELECT last_report_seq FROM jobs WHERE id = ?", (job_id,)).fetchone()
            if row is None:
                raise KeyError(job_id)
            if report_seq <= row["last_report_seq"]:
                return None
            if report_seq != row["last_report_seq"] + 1:
                raise ReportOutOfOrder(row["last_report_seq"] + 1, report_seq)
            db.execute("UPDATE jobs SET last_report_seq = ? WHERE id = ?", (report_seq, job_id))
            if kind == "summary":
                db.execute("UPDATE jobs SET summary = ? WHERE id = ?", (json.dumps(data), job_id))
            return self._append(db, job_id, kind, data, None)

    def _append(self, db: sqlite3.Connection, job_id: str, kind: str, data: dict[str, Any], at: float | None) -> EventRecord:
        row = db.execute("SELECT last_seq FROM jobs WHERE id = ?", (job_id,)).fetchone()
        if row is None:
            raise KeyError(job_id)
        event = EventRecord(job_id, row["last_seq"] + 1, at if at is not None else time.time(), kind, data)
        db.execute(
            "INSERT INTO events (job_id, seq, time, kind, data) VALUES (?,?,?,?,?)",
            (job_id, event.seq, event.time, kind, json.dumps(data)),
        )
        db.execute("UPDATE jobs SET last_seq = ? WHERE id = ?", (event.seq, job_id))
        return event

    def events(self, job_id: str, after_seq: int = 0, limit: int = 1000) -> list[EventRecord]:
        with self._read() as db:
            rows = db.execute(
                "SELECT * FROM events WHERE job_id = ? AND seq > ? ORDER BY seq LIMIT ?", (job_id, after_seq, limit)
            )
            return [EventRecord(r["job_id"], r["seq"], r["time"], r["kind"], json.loads(r["data"])) for r in rows.fetchall()]

    def thin_events(self, ended_before: float, keep_progress: int, jobs: int = 100) -> tuple[int, int]:
        """The progress events between two kept ones go by ranges of seq, a few ranges (about :data:`THIN_ROWS` rows)
        a transaction, the writer lock handed to any call waiting for it between two: measured with
        ``bench/store_retention.py``, one transaction a job held it 35-66 ms for 10,000 reports, and another team's
        report waited up to 80 ms. A job's newest event is a state change or its last progress event,
        both kept, so the table's newest row is never deleted and SQLite never hands out its rowid again
        (``events_since`` relies on that)."""
        terminal = _TERMINAL
        with self._read() as db:
            ids = [
                row[0]
                for row in db.execute(
                    f"SELECT id FROM jobs WHERE state IN ({','.join('?' * len(terminal))}) AND updated_at < ? "
                    "AND events_thinned_at IS NULL ORDER BY updated_at LIMIT ?",
                    [*terminal, ended_before, jobs],
                )
            ]
        deleted = 0
        for job_id in ids:
            with self._read() as db:
                seqs = [
                    r[0]
                    for r in db.execute("SELECT seq FROM events WHERE job_id = ? AND kind = 'progress' ORDER BY seq", (job_id,))
                ]
            kept = [seqs[i] for i in sorted(_evenly_spaced(len(seqs), keep_progress))]
            gaps = [(low, high) for low, high in zip(kept, kept[1:]) if high > low + 1]
            while gaps:
                with self._tx() as db:
                    rows = 0
                    while gaps and rows < THIN_ROWS:
                        low, high = gaps.pop(0)
                        rows += db.execute(
                            "DELETE FROM events WHERE job_id = ? AND seq > ? AND seq < ? AND kind = 'progress'",
                            (job_id, low, high),
                        ).rowcount
                    deleted += rows
                time.sleep(0.001)  # the lock's waiters go first: a release alone lets this thread take it straight back
            with self._tx() as db:
                db.execute("UPDATE jobs SET events_thinned_at = ? WHERE id = ?", (time.time(), job_id))
        return len(ids), deleted

    def log_position(self) -> int:
        with self._read() as db:
            return db.execute("SELECT COALESCE(MAX(rowid), 0) FROM events").fetchone()[0]

    def events_since(self, position: int, limit: int = 1000) -> tuple[list[EventRecord], int]:
        # SQLite gives each row a rowid above every row stored before it, and one writer at a time commits:
        # a reader that sees rowid N has seen every row below it. The newest row is never deleted (``thin_events``).
        with self._read() as db:
            rows = db.execute("SELECT rowid, * FROM events WHERE rowid > ? ORDER BY rowid LIMIT ?", (position, limit)).fetchall()
        events = [EventRecord(r["job_id"], r["seq"], r["time"], r["kind"], json.loads(r["data"])) for r in rows]
        return events, rows[-1]["rowid"] if rows else position

    def close(self) -> None:
        with WriterLock(self._lock):
            self._db.close()
        with self._readers_lock:
            for reader in self._readers:
                reader.close()
            self._readers.clear()


_WITHOUT_SPEC = ", ".join(
    "json_object('name', COALESCE(json_extract(spec, '$.name'), '')) AS spec" if f.name == "spec" else f.name
    for f in dataclasses.fields(JobRecord)
)
"""A job's columns with its spec cut to its name, in SQLite: a list of 500 jobs with 64 KB specs parsed 30 MB
of JSON into Python objects for names alone (16 such lists at once: 466 MB of the server's memory)."""


def _job(row: sqlite3.Row) -> JobRecord:
    data = dict(row)
    data["state"] = JobState(data["state"])
    data["spec"] = json.loads(data["spec"])
    data["summary"] = json.loads(data["summary"]) if data["summary"] else None
    return JobRecord(**{f.name: data[f.name] for f in dataclasses.fields(JobRecord)})


def _evenly_spaced(count: int, keep: int) -> set[int]:
    """Which of ``count`` items to keep, at most ``keep`` (2 or more): the first, the last and evenly spaced ones."""
    if keep < 2:
        raise ValueError(f"keep_progress: 2 or more (the first and the last), not {keep}")
    if count <= keep:
        return set(range(count))
    return {round(i * (count - 1) / (keep - 1)) for i in range(keep)}
