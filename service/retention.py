"""How long the job store keeps every progress event of an ended job: ``events_keep_days``, then a few.

A job reports progress every ``train.log_every`` steps, and each report is a row of the store (about 230 bytes
in the demo): 1,000 rows for a 10,000-step job, 10,000 at ``log_every: 1``, kept for ever, so the store of a
busy service only grows. Long after a job ended, its progress events are thinned to :data:`KEEP_PROGRESS`
(the first, the last, evenly spaced between), enough for a client that replays it (``WatchJob``) to see
how its loss went. Its states, phases, diagnoses, failure and summary are never removed, nor is its
``metrics.jsonl`` in its output root, which holds every report with each step's timing.

A job is thinned in transactions of about 1,000 deletes, the writer lock handed on between two
(``SqliteJobStore.thin_events``): during a pass over 20 jobs of 10,000 reports, another team's report waited at
most 8.4 ms (p99 7.5 ms, 0.4 ms idle), against 80 ms with one transaction a job (``bench/store_retention.py``,
2-core machine; ``bench/RESULTS.md``).

SQLite reuses the freed pages for new rows; the file does not shrink (``VACUUM`` would rewrite it whole
under the writer lock, which a service in use cannot give it).
"""

from __future__ import annotations

import asyncio
import logging
import time

from service.metrics import ServiceMetrics
from service.store import AsyncJobStore, StoreError

log = logging.getLogger(__name__)

KEEP_PROGRESS = 100
"""Progress events an ended job keeps after ``events_keep_days``."""
DAY_S = 86_400.0


class EventRetention:
    """Thins the events of jobs that ended over ``keep_days`` ago, every ``interval_s``; ``keep_days=0``: never."""

    INTERVAL_S = 600.0
    """How often it looks for jobs to thin."""
    JOBS_PER_PASS = 200
    """Jobs thinned at most in one pass: 1,200 an hour, for a store that kept every event before this setting."""

    def __init__(
        self, store: AsyncJobStore, keep_days: float, interval_s: float = INTERVAL_S, metrics: ServiceMetrics | None = None
    ):
        self.store, self.keep_days, self.interval_s, self.metrics = store, keep_days, interval_s, metrics

    async def once(self, now: float | None = None) -> tuple[int, int]:
        """One pass: (jobs thinned, events deleted)."""
        if not self.keep_days:
            return 0, 0
        ended_before = (time.time() if now is None else now) - self.keep_days * DAY_S
        jobs = deleted = 0
        while jobs < self.JOBS_PER_PASS:  # a job a call: the service's shutdown cancels a pass between two jobs
            thinned, gone = await self.store.thin_events(ended_before, KEEP_PROGRESS, jobs=1)
            if not thinned:
                break
            jobs, deleted = jobs + thinned, deleted + gone
            if self.metrics is not None:
                self.metrics.events_thinned.inc(gone)
        if jobs:
            log.info(
                "thinned the progress events of %d jobs that ended over %g days ago: %d deleted", jobs, self.keep_days, deleted
            )
        return jobs, deleted

    async def run_forever(self) -> None:
        while self.keep_days:
            try:
                await self.once()
            except StoreError as exc:  # locked, full or damaged for now: the store's health watch logs it
                log.debug("event retention pass skipped: %s", exc)
            await asyncio.sleep(self.interval_s)
