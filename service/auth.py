"""API tokens: teams authenticate with ``authorization: Bearer <token>``; only hashes are stored.

The running job has its own token, minted at launch, good for reporting that job's events alone.
"""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Sequence

PREFIX = "rft_"


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
