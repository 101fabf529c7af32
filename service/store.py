"""The job store interface: jobs, their ordered event logs, and team API tokens.

Any implementation passes the contract suite in ``tests/unit/service/test_store_contract.py``. The default is
SQLite (``service.store_sqlite``); a server database can follow behind the same Protocol.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Protocol

from rayft_contract.states import JobState


class StoreError(RuntimeError):
    """The store cannot answer now; ``kind`` says why, and the API maps it to a status the caller can act on:
    ``busy`` (a lock held past its timeout, by another process or a long call) and ``broken`` (damaged,
    read-only, unreadable) are UNAVAILABLE; ``full`` (no disk space) is RESOURCE_EXHAUSTED."""

    def __init__(self, kind: str, message: str):
        self.kind = kind
        super().__init__(message)


class ReportOutOfOrder(ValueError):
    """A report numbered other than the next one expected; ``expected`` is that number."""

    def __init__(self, expected: int, got: int):
        self.expected = expected
        super().__init__(f"report_seq: expected {expected}, got {got}; not stored")


@dataclasses.dataclass(frozen=True)
class JobRecord:
    id: str
    team: str
    state: JobState
    spec: dict[str, Any]
    """The validated FineTuneSpec as a plain dict (``FineTuneSpec.to_dict``)."""
    created_at: float
    updated_at: float
    idempotency_key: str = ""
    request_hash: str = ""
    """Hash of the creating request's spec: tells an idempotent retry from a conflicting reuse."""
    message: str = ""
    ray_submission_id: str = ""
    last_seq: int = 0
    summary: dict[str, Any] | None = None
    report_token_hash: str = ""
    """SHA-256 of the token the running job reports with (bound by its ``ClaimJob``; empty before)."""


@dataclasses.dataclass(frozen=True)
class EventRecord:
    job_id: str
    seq: int
    """1, 2, 3, ... per job, without gaps as stored; gaps only where an ended job's progress was thinned
    (``service/retention.py``)."""
    time: float
    kind: str
    """``state`` (the service's own) or one of the kinds a job reports (``rayft_contract.events.REPORTABLE``)."""
    data: dict[str, Any]


@dataclasses.dataclass(frozen=True)
class TokenRecord:
    id: str
    """The first 12 hex digits of the token's hash: names it in lists and revocations, opens nothing."""
    team: str
    created_at: float
    expires_at: float | None
    """Unix seconds after which the token no longer authenticates; ``None``: no expiry."""
    revoked_at: float | None


class JobStore(Protocol):
    def create(self, record: JobRecord) -> tuple[JobRecord, bool]:
        """Insert a QUEUED job with its first state event; with an idempotency key already used by the
        team, insert nothing and return ``(existing, False)``."""

    def get(self, job_id: str) -> JobRecord | None: ...

    def by_key(self, team: str, idempotency_key: str) -> JobRecord | None: ...

    def list(
        self, team: str | None, states: Sequence[JobState] = (), limit: int = 50, after: str = "", specs: bool = True
    ) -> list[JobRecord]:
        """The team's jobs (``None``: every team's), newest first; ``after`` is the id of the last job of the previous page.
        ``specs=False``: each record's spec holds only its ``name`` (a list's basic view), never read whole."""

    def transition(self, job_id: str, state: JobState, message: str = "") -> JobRecord:
        """Move a job to ``state`` and log a state event, atomically; raises ``TransitionError``."""

    def append_event(self, job_id: str, kind: str, data: dict[str, Any], time: float | None = None) -> EventRecord: ...

    def append_report(self, job_id: str, report_seq: int, kind: str, data: dict[str, Any]) -> EventRecord | None:
        """Append an event the running job reported as its ``report_seq``-th; ``None`` for a repeat (a number
        already stored). Only the next number is stored: a gap or a number ahead raises ``ReportOutOfOrder``
        and stores nothing, so a forged ``report_seq=10**12`` cannot make the job's real reports look like
        repeats. A ``summary`` event also becomes the job's summary, in the same transaction."""

    def events(self, job_id: str, after_seq: int = 0, limit: int = 1000) -> list[EventRecord]: ...

    def thin_events(self, ended_before: float, keep_progress: int, jobs: int = 100) -> tuple[int, int]:
        """Thin the progress events of up to ``jobs`` jobs that ended before ``ended_before`` and were not thinned
        yet, each to at most ``keep_progress`` (2 or more): its first, its last and evenly spaced ones between; every
        other event stays. Returns (jobs thinned, events deleted). The store's newest event is never deleted."""

    def log_position(self) -> int:
        """Where the log of every job's events ends now: a cursor for ``events_since``."""

    def events_since(self, position: int, limit: int = 1000) -> tuple[list[EventRecord], int]:
        """Every job's events stored after ``position``, in the order they were stored, and the position
        after the last one returned. What another process follows the store with (the watch process:
        ``service/watch.py``); the writer's own process is told of its events directly."""

    def bind_report_token(self, job_id: str, token_hash: str) -> bool:
        """Make ``token_hash`` the job's report token unless another is bound already, atomically: True when
        it is the job's (now or before: a retried claim), False when the job was claimed with another."""

    def update(self, job_id: str, **fields: Any) -> JobRecord:
        """Set ``ray_submission_id``, ``summary`` or ``report_token_hash``."""

    def active(self) -> list[JobRecord]:
        """Jobs not yet in a terminal state, oldest first."""

    def ended_since(
        self, since: float, state: JobState | None = None, specs: bool = True, limit: int | None = None
    ) -> list[JobRecord]:
        """Jobs in a terminal state (``state``, when given) whose last change was at or after ``since``, in
        the order of that change (the first ``limit``); ``specs=False``: each spec holds only its ``name``."""

    def count_active(self, team: str) -> int: ...

    def count_by_state(self) -> dict[tuple[JobState, str], int]:
        """How many jobs each team has in each state (what the metrics' ``rayft_jobs`` shows)."""

    def add_token(self, team: str, token_hash: str, expires_at: float | None = None) -> TokenRecord: ...

    def team_for_token(self, token_hash: str) -> str | None:
        """The team of a live token; ``None`` for an unknown, expired or revoked one."""

    def tokens(self, team: str | None = None) -> list[TokenRecord]:
        """Tokens, oldest first; one team's, or every team's."""

    def revoke_token(self, token_id: str) -> TokenRecord | None:
        """Revoke the token so named (its record, now revoked); ``None`` when no token has that id."""

    def close(self) -> None: ...


WRITES = frozenset(
    {"create", "transition", "append_event", "append_report", "update", "bind_report_token", "add_token", "revoke_token"}
)
"""The store's calls that write: only their success shows a fault has cleared."""


class AsyncJobStore:
    """A ``JobStore`` for the event loop: ``await store.get(job_id)`` runs the call in a worker thread, so
        the loop never waits on SQLite. With another process holding the database lock, calls that need the
        store wait (up to the store's lock timeout, then ``StoreError("busy")``), while health checks and
        streams that don't go on. ``watch`` hears every fault (the ``StoreError``) and every write that
    succeeds (``None``).

        Written by hand because the store is synchronous (SQLite's module is) and the service async: this is
        the one place the two meet."""

    def __init__(self, store: JobStore, watch: Callable[[StoreError | None], Awaitable[None]] | None = None):
        self.sync, self._watch = store, watch

    def __getattr__(self, name: str) -> Callable[..., Awaitable[Any]]:
        method = getattr(self.sync, name)

        async def call(*args: Any, **kwargs: Any) -> Any:
            try:
                result = await asyncio.to_thread(method, *args, **kwargs)
            except StoreError as exc:
                if self._watch is not None:
                    await self._watch(exc)
                raise
            if self._watch is not None and name in WRITES:  # with WAL, reads go on under another's write lock
                await self._watch(None)
            return result

        return call
