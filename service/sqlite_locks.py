"""This process's side of the SQLite store's locking: its writer lock, with a timeout that answers "busy",
and the transaction that holds it (``service.store_sqlite``)."""

from __future__ import annotations

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
