"""API tokens: teams authenticate with ``authorization: Bearer <token>``; only hashes are stored.

An **operator's token** (``rayft token create --operator``) is stored under the name ``OPERATOR``, which no team
can have. It reads, watches and cancels every team's jobs, for the platform team that answers for the service,
and creates none: a job runs as a team, under that team's policy.

A running job holds two secrets of its own. Its **launch ticket** travels in its Ray runtime
environment (where the Ray dashboard shows it): an HMAC of the job id under the service's key, so every
launch attempt of a job, before or after a service restart, carries the same ticket and nothing about it
is stored. The job trades the ticket once (``JobReporting.ClaimJob``) for its spec, binding the hash of a
**report token** it made itself; only that token reports the job's events, and it never leaves the job.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

PREFIX = "rft_"
OPERATOR = "(operator)"
"""The team an operator's token is stored under: not a team name (those are one safe path component:
letters, digits, ``-``, ``_``, ``.``), so no team's token, policy or output root can ever be the operator's."""


@dataclass(frozen=True)
class Caller:
    """Who made a call: a team, or the operator. ``team`` keys the per-caller quotas either way."""

    team: str

    @property
    def operator(self) -> bool:
        return self.team == OPERATOR

    def sees(self, team: str) -> bool:
        """Whether a job of ``team`` exists to this caller: its own team's, or every job for the operator."""
        return self.operator or team == self.team


def new_token() -> str:
    return PREFIX + secrets.token_urlsafe(32)


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def bearer(metadata: Sequence[tuple[str, str | bytes]] | None) -> str | None:
    """The token of an ``authorization: Bearer ...`` header, if any."""
    for key, value in metadata or ():
        if key.lower() == "authorization":
            text = value.decode() if isinstance(value, bytes) else value
            scheme, _, token = text.partition(" ")
            if scheme.lower() == "bearer" and token.strip():
                return token.strip()
    return None


def launch_ticket(key: bytes, job_id: str) -> str:
    """The job's launch ticket: the same for every launch of one job, different for every job and key."""
    return "rftl_" + hmac.new(key, job_id.encode(), hashlib.sha256).hexdigest()


def ticket_matches(key: bytes, job_id: str, ticket: str | None) -> bool:
    return ticket is not None and hmac.compare_digest(ticket, launch_ticket(key, job_id))


def service_key(data_dir: Path) -> bytes:
    """The key launch tickets are made with: ``data_dir/launch.key``, created once, readable by the
    service's user alone. Replacing it invalidates the tickets of jobs not yet started."""
    path = data_dir / "launch.key"
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return path.read_bytes()
    with os.fdopen(fd, "wb") as out:
        out.write(secrets.token_bytes(32))
    return path.read_bytes()
