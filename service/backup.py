"""A backup of the job store taken while the service runs: SQLite's online backup, into a new file.

    rayft backup /backups/jobs-2026-12-05.db [--data-dir .rayft/service]

``jobs.db`` is the service's only state (every team's jobs, events, specs and token hashes). Copying it with
``cp`` while the service writes can copy a torn store: in WAL mode the newest pages sit in ``jobs.db-wal``
until SQLite moves them into the main file. SQLite's backup API copies one consistent snapshot in one read
transaction, which in WAL mode neither waits for the service's writer nor holds it up. A library would add
nothing here: the standard library's ``sqlite3`` has the backup API, and this adds the checks around it.

The copy is made beside its destination under a hidden name, checked (``PRAGMA integrity_check``), and then
given its name, so a backup that failed halfway leaves no file that looks whole. It is readable by its owner
alone, like the store, and never replaces a file already there.

To restore: stop the service; put the copy in the data dir as ``jobs.db``, removing ``jobs.db-wal`` and
``jobs.db-shm`` beside it; start the service. Keep ``launch.key`` (beside ``jobs.db``) too: a new key only
invalidates the launch tickets of jobs that had not yet started, which then fail their claim.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import sqlite3
from pathlib import Path

from rayft_contract.spec import SpecError


@dataclasses.dataclass(frozen=True)
class Backup:
    path: Path
    jobs: int
    events: int
    tokens: int
    bytes: int


TABLES = ("jobs", "events", "tokens")


def backup(store: Path, dest: Path) -> Backup:
    """Copy the SQLite store at ``store`` to ``dest``, a new file. Raises ``SpecError`` naming what to fix."""
    if not store.is_file():
        raise SpecError("data-dir", f"no job store at {store}: give the service's data dir (RAYFT_DATA_DIR)")
    if dest.exists():
        raise SpecError("dest", f"{dest} exists: a backup never replaces a file; name a new one")
    if not dest.parent.is_dir():
        raise SpecError("dest", f"{dest.parent} is not a directory: make it first")
    partial = dest.with_name(f".{dest.name}.partial")
    os.close(os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    try:
        with contextlib.closing(sqlite3.connect(store)) as source, contextlib.closing(sqlite3.connect(partial)) as copy:
            source.backup(copy)  # every page in one step: one read transaction, one snapshot
            check = copy.execute("PRAGMA integrity_check").fetchone()[0]
            if check != "ok":
                raise RuntimeError(f"the copy failed its integrity check: {check}")
            jobs, events, tokens = (copy.execute(f"SELECT count(*) FROM {table}").fetchone()[0] for table in TABLES)
        os.link(partial, dest)  # its name only now, and never over a file that appeared meanwhile
    finally:
        partial.unlink(missing_ok=True)
    return Backup(dest, jobs, events, tokens, dest.stat().st_size)
