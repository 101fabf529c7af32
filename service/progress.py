"""Job events as a stream: append to the durable log, wake watchers, replay then follow.

Every append goes through :class:`JobEvents` on the server's event loop, which bumps a version and
wakes all waiting ``WatchJob`` streams; each re-reads its job's log after the last seq it sent, so a
watcher sees every event once, in order, whether it was stored before or after it connected.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from rayft_contract.states import JobState
from service.store import AsyncJobStore, EventRecord, JobRecord


class JobEvents:
    def __init__(self, store: AsyncJobStore):
        self.store = store
        self._changed = asyncio.Condition()
        self._version = 0

    async def _bump(self) -> None:
        async with self._changed:
            self._version += 1
            self._changed.notify_all()

    async def append(self, job_id: str, kind: str, data: dict[str, Any]) -> EventRecord:
        event = await self.store.append_event(job_id, kind, data)
        await self._bump()
        return event

    async def append_report(self, job_id: str, report_seq: int, kind: str, data: dict[str, Any]) -> EventRecord | None:
        event = await self.store.append_report(job_id, report_seq, kind, data)
        await self._bump()
        return event

    async def transition(self, job_id: str, state: JobState, message: str = "") -> JobRecord:
        job = await self.store.transition(job_id, state, message)
        await self._bump()
        return job

    async def follow(self, job_id: str, after_seq: int, poll_s: float = 5.0) -> AsyncIterator[EventRecord]:
        """Events with seq > ``after_seq``, then new ones as they come; ends after a terminal job's last event."""
        while True:
            version = self._version
            events = await self.store.events(job_id, after_seq)
            for event in events:
                yield event
                after_seq = event.seq
            if events:
                continue
            job = await self.store.get(job_id)
            if job is None or (job.state.is_terminal and after_seq >= job.last_seq):
                return
            async with self._changed:
                try:
                    await asyncio.wait_for(self._changed.wait_for(lambda seen=version: self._version != seen), timeout=poll_s)
                except TimeoutError:
                    pass  # another process may share the store: look again now and then
