"""Team API tokens in the SQLite job store: only their hashes are kept, and a token is named by its hash's
first ``TOKEN_ID_LEN`` hex digits (``rayft token list|revoke``). A part of :class:`~service.store_sqlite.SqliteJobStore`,
in the same file and transactions."""

from __future__ import annotations

import contextlib
import sqlite3
import time
from collections.abc import Callable

from service.sqlite_locks import Transaction, with_faults
from service.store import TokenRecord

TOKEN_ID_LEN = 12
"""Hex digits of a token's hash that name it (48 bits: unique among any operator's tokens)."""


@with_faults
class SqliteTokens:
    """The tokens table; the store it is part of gives the connections."""

    _tx: Callable[[], Transaction]
    _read: Callable[[], contextlib.AbstractContextManager[sqlite3.Connection]]

    def add_token(self, team: str, token_hash: str, expires_at: float | None = None) -> TokenRecord:
        now = time.time()
        with self._tx() as db:
            db.execute(
                "INSERT INTO tokens (token_hash, team, created_at, expires_at) VALUES (?,?,?,?)",
                (token_hash, team, now, expires_at),
            )
        return TokenRecord(token_hash[:TOKEN_ID_LEN], team, now, expires_at, None)

    def team_for_token(self, token_hash: str) -> str | None:
        with self._read() as db:
            row = db.execute(
                "SELECT team FROM tokens WHERE token_hash = ? AND revoked_at IS NULL AND (expires_at IS NULL OR expires_at > ?)",
                (token_hash, time.time()),
            ).fetchone()
        return row["team"] if row else None

    def tokens(self, team: str | None = None) -> list[TokenRecord]:
        sql, args = "SELECT * FROM tokens", []
        if team is not None:
            sql, args = sql + " WHERE team = ?", [team]
        with self._read() as db:
            rows = db.execute(sql + " ORDER BY created_at", args).fetchall()
        return [_token(r) for r in rows]

    def revoke_token(self, token_id: str) -> TokenRecord | None:
        if len(token_id) != TOKEN_ID_LEN:  # a shorter prefix could name several tokens
            return None
        with self._tx() as db:
            db.execute(
                "UPDATE tokens SET revoked_at = ? WHERE substr(token_hash, 1, ?) = ? AND revoked_at IS NULL",
                (time.time(), TOKEN_ID_LEN, token_id),
            )
            row = db.execute("SELECT * FROM tokens WHERE substr(token_hash, 1, ?) = ?", (TOKEN_ID_LEN, token_id)).fetchone()
        return _token(row) if row else None


def _token(row: sqlite3.Row) -> TokenRecord:
    return TokenRecord(row["token_hash"][:TOKEN_ID_LEN], row["team"], row["created_at"], row["expires_at"], row["revoked_at"])
