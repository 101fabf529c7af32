"""This process's side of the SQLite store's locking and faults: its writer lock, with a timeout that answers
"busy", the transaction that holds it, and the decorator that turns SQLite's errors into ``StoreError``
(``service.store_sqlite``, ``service.store_tokens``)."""

from __future__ import annotations

import functools
import sqlite3
import threading
from typing import Any

from service.store import StoreError

LOCK_TIMEOUT_S = 5.0
"""How long a call waits for the database lock before it answers "busy". Short, so that an outside
writer (a backup, ``rayft token create``) delays calls by seconds, not half a minute."""


class WriterLock:
    """``with``: this process's lock on the connection, or ``StoreError("busy")`` after ``LOCK_TIMEOUT_S``."""

    def __init__(self, lock: threading.RLock):
        self.lock = lock

    def __enter__(self) -> None:
        if not self.lock.acquire(timeout=LOCK_TIMEOUT_S):
            raise StoreError("busy", f"the job store is busy: a call has held it for over {LOCK_TIMEOUT_S:.0f} s; retry")

    def __exit__(self, *exc: Any) -> None:
        self.lock.release()


class Shared:
    """``with``: the writer's connection under its lock (an in-memory store has no other)."""

    def __init__(self, db: sqlite3.Connection, lock: threading.RLock):
        self.db, self.lock = db, lock

    def __enter__(self) -> sqlite3.Connection:
        WriterLock(self.lock).__enter__()
        return self.db

    def __exit__(self, *exc: Any) -> None:
        self.lock.release()


class Transaction:
    """``with store._tx() as db:`` holds the writer lock and commits (or rolls back) one transaction."""

    def __init__(self, db: sqlite3.Connection, lock: threading.RLock):
        self.db, self.lock = db, lock

    def __enter__(self) -> sqlite3.Connection:
        WriterLock(self.lock).__enter__()
        try:
            self.db.execute("BEGIN IMMEDIATE")
        except BaseException:
            self.lock.release()
            raise
        return self.db

    def __exit__(self, exc_type: Any, *rest: Any) -> None:
        try:
            if not exc_type:
                self.db.execute("COMMIT")
        finally:
            try:
                if self.db.in_transaction:  # an error, or a COMMIT that failed; SQLite rolls some back itself
                    self.db.execute("ROLLBACK")
            finally:
                self.lock.release()


def _faults(method):  # noqa: ANN001, ANN202 - a decorator: SQLite's exceptions become StoreError
    @functools.wraps(method)
    def wrapper(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        try:
            return method(*args, **kwargs)
        except sqlite3.DatabaseError as exc:
            name = getattr(exc, "sqlite_errorname", "")  # SQLITE_BUSY, SQLITE_FULL, ... (extended codes too)
            if name.startswith(("SQLITE_BUSY", "SQLITE_LOCKED")):
                message = f"the job store is locked by another writer for over {LOCK_TIMEOUT_S:.0f} s; retry"
                raise StoreError("busy", message) from exc
            if name.startswith("SQLITE_FULL"):
                raise StoreError("full", "the service's disk is full: nothing was stored; retry once space is freed") from exc
            raise StoreError("broken", f"the job store cannot be written or read ({exc})") from exc

    return wrapper


def with_faults(cls):  # noqa: ANN001, ANN202 - every public method of cls: SQLite errors leave as StoreError
    for name, value in list(vars(cls).items()):
        if callable(value) and not name.startswith("_"):
            setattr(cls, name, _faults(value))
    return cls
