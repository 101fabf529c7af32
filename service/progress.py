"""Job events as a stream: append to the durable log, wake watchers, replay then follow.

Every append goes through :class:`JobEvents` on the server's event loop, which keeps the event in a
small per-job window in memory and wakes that job's waiting ``WatchJob`` streams;
each reads what follows the last seq it sent (from memory when the window holds all of it, else from
the store), so a watcher sees every event once, in order, whether it was stored before or after it
connected.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import AsyncIterator
from typing import Any

from rayft_contract.states import JobState
from service.store import AsyncJobStore, EventRecord, JobRecord, StoreError

log = logging.getLogger(__name__)


class JobEvents:
    RECENT_EVENTS = 256
    """Events kept in memory per job, for followers to read without the store."""
    RECENT_JOBS = 1024
    """Jobs whose recent events are kept (the most recently active)."""

    def __init__(self, store: AsyncJobStore):
        self.store = store
        self._next: dict[str, asyncio.Future[None]] = {}
        """job id -> a future that resolves at its next event: every follower awaits the same one, so an
        event wakes its job's followers and no others, without a lock to hand from one to the next."""
        self._recent: OrderedDict[str, dict[int, EventRecord]] = OrderedDict()
        """job id -> its latest events by seq. Measured (bench/tenant_bench.py): with 100 streams on one job,
        each event made 100 store reads, which queued every other team's calls behind them in the
        store's threads; now an event costs one write, and its followers read it here."""

    async def _bump(self, event: EventRecord | None) -> None:
        if event is not None:
            recent = self._recent.setdefault(event.job_id, {})
            self._recent.move_to_end(event.job_id)
            recent[event.seq] = event
            for seq in sorted(recent)[: -self.RECENT_EVENTS]:
                del recent[seq]
            while len(self._recent) > self.RECENT_JOBS:
                self._recent.popitem(last=False)
            waiting = self._next.pop(event.job_id, None)
            if waiting is not None and not waiting.done():
                waiting.set_result(None)

    async def follow_store(self, poll_s: float = 0.05) -> None:
        """Hear the events another process stores, and wake this process's followers with each, until
        cancelled. The watch process runs this (``service/watch.py``): the API process writes the events.

        It polls the store's log position, every ``poll_s`` while nothing is new: one indexed read of a
        few microseconds, 20 a second, and an event waits at most ``poll_s`` longer than in one process.
        A notice over a pipe from the writer would be quicker, but would cost the API process a send per
        event and be lost when either process restarts; the store knows every event, in order."""
        position = await self.store.log_position()
        while True:
            try:
                events, position = await self.store.events_since(position)
            except StoreError as exc:  # locked or damaged for now: the streams wait, and this looks again
                log.warning("watch streams cannot read new events: %s", exc)
                events = []
                await asyncio.sleep(1.0)
            for event in events:
                await self._bump(event)
            if not events:
                await asyncio.sleep(poll_s)

    async def append(self, job_id: str, kind: str, data: dict[str, Any]) -> EventRecord:
        event = await self.store.append_event(job_id, kind, data)
        await self._bump(event)
        return event

    async def append_report(self, job_id: str, report_seq: int, kind: str, data: dict[str, Any]) -> EventRecord | None:
        event = await self.store.append_report(job_id, report_seq, kind, data)
        await self._bump(event)
        return event

    async def transition(self, job_id: str, state: JobState, message: str = "") -> JobRecord:
        job = await self.store.transition(job_id, state, message)
        (event,) = await self.store.events(job_id, job.last_seq - 1, limit=1)  # the state event it logged
        await self._bump(event)
        return job

    def _cached(self, job_id: str, after_seq: int) -> list[EventRecord] | None:
        """The job's events after ``after_seq`` from memory, when memory has all of them, in order (``[]``:
        none yet). Measured (bench/tenant_bench.py): a woken follower used to read the store twice more after
        each event it sent, to find nothing new and the job still running; with 32 streams on a job that
        reports 5 times a second, that was 320 store calls a second and 190 us of the server's CPU per
        stream message. Now a follower reads the store when memory cannot tell, once per state event,
        and on its poll."""
        recent = self._recent.get(job_id)
        if not recent or after_seq + 1 < min(recent):
            return None
        newest = max(recent)
        events = [recent.get(seq) for seq in range(after_seq + 1, newest + 1)]
        return None if None in events else events  # type: ignore[return-value]

    async def follow(self, job_id: str, after_seq: int, poll_s: float = 5.0) -> AsyncIterator[EventRecord]:
        """Events with seq > ``after_seq``, then new ones as they come; ends after a terminal job's last event."""
        look_in_store, state_changed = True, True
        while True:
            # Taken before reading, so an event stored after the read resolves the future waited on below.
            next_event = self._next.setdefault(job_id, asyncio.get_running_loop().create_future())
            events = None if look_in_store else self._cached(job_id, after_seq)
            if events is None:  # memory cannot tell: the store can
                events = await self.store.events(job_id, after_seq)
            look_in_store = False
            for event in events:
                yield event
                after_seq = event.seq
                state_changed |= event.kind == "state"
            if events:
                continue
            if state_changed:  # only a state event can end the job: the store is read once per state
                job = await self.store.get(job_id)
                if job is None or (job.state.is_terminal and after_seq >= job.last_seq):
                    if self._next.get(job_id) is next_event:  # nothing more will come for it: no entry left behind
                        del self._next[job_id]
                    return
                state_changed = False
            try:
                await asyncio.wait_for(asyncio.shield(next_event), timeout=poll_s)
            except TimeoutError:  # another process may share the store: look again now and then
                look_in_store = state_changed = True
