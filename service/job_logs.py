"""A job's log as ``GetJobLogs`` gives it: the last lines Ray holds of the job's driver, within the API's limits.

Ray's Jobs API gives a job's whole log and no tail of it, so the tail is cut here. A team reads its own jobs'
logs only; what the driver writes is the team's own (its spec's paths, its errors), and nothing the service
or another team holds reaches a driver's log: the launch ticket and the report token are never logged, and
each team's storage keys are its own.
"""

from __future__ import annotations

from collections.abc import Iterable

DEFAULT_LINES = 200
"""Lines given when the request asks for none."""
MAX_LINES = 10_000
"""The most lines one call gives."""
MAX_BYTES = 1024 * 1024
"""The most bytes of lines one call gives: under a client's 4 MiB receive limit."""
MAX_LINE_CHARS = 16_384
"""A longer line (a tensor printed whole, say) is cut to this, with a mark that says how much was left out."""


def tail(text: str, lines: int) -> tuple[list[str], int]:
    """The last ``lines`` lines of ``text`` that fit in :data:`MAX_BYTES`, oldest first, each cut to
    :data:`MAX_LINE_CHARS`; and how many lines of the log come before them."""
    every = text.splitlines()
    kept = _fit(reversed(every[-lines:] if lines else []))
    kept.reverse()
    return kept, len(every) - len(kept)


def since(text: str, from_line: int) -> tuple[list[str], int]:
    """The lines of ``text`` from ``from_line`` on (0 is the first), oldest first, as many as fit in :data:`MAX_LINES`
    and :data:`MAX_BYTES`, each cut to :data:`MAX_LINE_CHARS`; and how many lines of the log come after them.
    ``IndexError`` past the log's end (at its end: no lines)."""
    every = text.splitlines()
    if not 0 <= from_line <= len(every):
        raise IndexError(f"from_line: {from_line:,} is past the log's end, its line {len(every):,}")
    kept = _fit(every[from_line : from_line + MAX_LINES], at_least_one=True)  # a follower never stalls on a long line
    return kept, len(every) - from_line - len(kept)


def _fit(lines: Iterable[str], at_least_one: bool = False) -> list[str]:
    """``lines`` in the order given, each cut to :data:`MAX_LINE_CHARS`, until the next would pass :data:`MAX_BYTES`."""
    kept: list[str] = []
    size = 0
    for line in lines:
        if len(line) > MAX_LINE_CHARS:
            line = f"{line[:MAX_LINE_CHARS]}... ({len(line) - MAX_LINE_CHARS:,} characters cut)"
        size += len(line.encode()) + 1
        if size > MAX_BYTES and (kept or not at_least_one):
            break
        kept.append(line)
    return kept
