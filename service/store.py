"""The job store interface: jobs, their ordered event logs, and team API tokens.

Any implementation passes the contract suite in ``tests/unit/test_store_contract.py``. The default is
SQLite (``service.store_sqlite``); a server database can follow behind the same Protocol.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any, Protocol

from rayft_contract.states import JobState


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
    """SHA-256 of the token the running job reports with (minted at launch)."""


@dataclasses.dataclass(frozen=True)
class EventRecord:
    job_id: str
    seq: int
    """1, 2, 3, ... per job, without gaps."""
    time: float
    kind: str
    """``state`` (the service's own) or one of the kinds a job reports (``rayft_contract.events.REPORTABLE``)."""
    data: dict[str, Any]


class JobStore(Protocol):
    def create(self, record: JobRecord) -> tuple[JobRecord, bool]:
        """Insert a QUEUED job with its first state event; with an idempotency key already used by the
        team, insert nothing and return ``(existing, False)``."""

    def get(self, job_id: str) -> JobRecord | None: ...

    def by_key(self, team: str, idempotency_key: str) -> JobRecord | None: ...

    def list(self, team: str, states: Sequence[JobState] = (), limit: int = 50, after: str = "") -> list[JobRecord]:
        """The team's jobs, newest first; ``after`` is the id of the last job of the previous page."""

    def transition(self, job_id: str, state: JobState, message: str = "") -> JobRecord:
        """Move a job to ``state`` and log a state event, atomically; raises ``TransitionError``."""

    def append_event(self, job_id: str, kind: str, data: dict[str, Any], time: float | None = None) -> EventRecord: ...

    def append_report(self, job_id: str, report_seq: int, kind: str, data: dict[str, Any]) -> EventRecord | None:
        """Append an event the running job reported as its ``report_seq``-th; ``None`` for a repeat."""

    def events(self, job_id: str, after_seq: int = 0, limit: int = 1000) -> list[EventRecord]: ...

    def update(self, job_id: str, **fields: Any) -> JobRecord:
        """Set ``ray_submission_id``, ``summary`` or ``report_token_hash``."""

    def active(self) -> list[JobRecord]:
        """Jobs not yet in a terminal state, oldest first."""

    def ended_since(self, since: float) -> list[JobRecord]:
        """Jobs in a terminal state whose last change was at or after ``since``."""

    def count_active(self, team: str) -> int: ...

    def add_token(self, team: str, token_hash: str) -> None: ...

    def team_for_token(self, token_hash: str) -> str | None: ...

    def close(self) -> None: ...
