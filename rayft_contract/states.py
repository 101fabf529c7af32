"""Job states and the one table of allowed transitions.

    QUEUED -> STARTING -> RUNNING -> SUCCEEDED
       |         |           |-----> FAILED
       |         |-----------+-----> CANCELLED
       +-----------------------------> (FAILED, CANCELLED)

A job whose launch failed because Ray was unreachable stays QUEUED and is retried; STARTING can go
straight to SUCCEEDED or FAILED when the service learns of the end from Ray before any report.
"""

from __future__ import annotations

from enum import StrEnum


class JobState(StrEnum):
    QUEUED = "QUEUED"
    """Stored; waiting to be launched on Ray (also while Ray is unreachable)."""
    STARTING = "STARTING"
    """Submitted to Ray; no report from the job yet."""
    RUNNING = "RUNNING"
    """The job is reporting progress."""
    SUCCEEDED = "SUCCEEDED"
    """The adapter and summary are written."""
    FAILED = "FAILED"
    """The job ended with an error (its message and events say which)."""
    CANCELLED = "CANCELLED"
    """Stopped on request."""

    @property
    def is_terminal(self) -> bool:
        return self in TERMINAL

    def can_become(self, other: JobState) -> bool:
        return other in TRANSITIONS[self]


TERMINAL = frozenset({JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED})

TRANSITIONS: dict[JobState, frozenset[JobState]] = {
    JobState.QUEUED: frozenset({JobState.STARTING, JobState.FAILED, JobState.CANCELLED}),
    JobState.STARTING: frozenset({JobState.RUNNING, JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED}),
    JobState.RUNNING: frozenset({JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED}),
    JobState.SUCCEEDED: frozenset(),
    JobState.FAILED: frozenset(),
    JobState.CANCELLED: frozenset(),
}


class TransitionError(ValueError):
    """A state change the table does not allow (e.g. cancelling a finished job)."""
