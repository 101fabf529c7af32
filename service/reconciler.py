"""Keeps the store in step with Ray: launches queued jobs, and follows launched ones to their end.

Which queued jobs launch, and why the others wait, is ``service.admission``: each team's quota of
launched jobs (``max_running_per_team``) and its fair share of the cluster's GPUs. A waiting job's reason
joins its events whenever it changes (``waiting for 2 GPUs; 1 free``). Ray places what is launched.

It runs every ``reconcile_interval_s`` and after every CreateJob, also right after the service
starts, so jobs that ran (or ended) while the service was down are picked up where they are.
"""

from __future__ import annotations

import asyncio
import logging
import time

from rayft_contract.records import Failure, JobPhase
from rayft_contract.spec import FineTuneSpec
from rayft_contract.states import JobState, TransitionError
from service import auth
from service.admission import admit
from service.launcher import Capacity, Launcher, LaunchRejected, RayUnavailable
from service.metrics import ServiceMetrics
from service.progress import JobEvents
from service.store import JobRecord, StoreError

log = logging.getLogger(__name__)


class Reconciler:
    SWEEP_ENDED_S = 600.0
    """Jobs that ended this recently are checked for Ray jobs left running (see ``_ensure_stopped``)."""
    SWEEP_PAGE = 200
    """Cancelled jobs a pass looks for in Ray, at most; the next pass goes on from the last."""
    CAPACITY_TTL_S = 30.0
    """How long a look at the cluster's nodes is reused by CreateJob's capacity check."""
    ENDING_POLL_S = 0.25
    ENDING_FOR_S = 60.0
    """A job that reported its last event is asked about every ``ENDING_POLL_S`` for up to ``ENDING_FOR_S``
    (:meth:`ending`); after that, at the passes as before."""

    def __init__(
        self,
        events: JobEvents,
        launcher: Launcher,
        report_address: str,
        interval_s: float,
        launch_paused: bool = False,
        *,
        launch_key: bytes,
        max_running_per_team: int = 2,
        cluster_autoscales: bool = False,
        cluster_gpus: float | None = None,
        metrics: ServiceMetrics | None = None,
    ):
        self.events, self.store, self.launch_key = events, events.store, launch_key
        self.max_running_per_team = max_running_per_team
        self.cluster_autoscales = cluster_autoscales
        self.cluster_gpus = cluster_gpus
        """The GPUs launched jobs may hold at once; ``None``: the alive nodes' on a fixed cluster, no limit on
        one that autoscales (whose autoscaler adds nodes only for jobs Ray already has)."""
        self._waiting: dict[str, str] = {}
        """Queued job id -> the reason last added to its events (a new event only when it changes)."""
        self._gpus: dict[str, int] = {}
        """Active job id -> the GPUs it asks for (its spec is parsed once, not at every pass)."""
        self.metrics = metrics
        self._swept_until: float | None = None
        """Jobs cancelled before this were checked in Ray by a pass that reached them all: each is checked
        once (after a restart, those of the last ``SWEEP_ENDED_S``). Before, every pass asked Ray about every
        job cancelled in the last ``SWEEP_ENDED_S``: a team that cancelled 1,500 jobs made each pass load and
        parse 1,500 specs in the service's threads, which held the interpreter lock long enough to stall
        other teams' calls by 25-50 ms (bench/tenant_bench.py)."""
        self._swept: dict[str, float] = {}
        """Jobs checked in the last second before ``_swept_until`` (job id -> when it ended), which the next
        pass reads again: not asked about twice."""
        self._capacity: tuple[float, Capacity | None] | None = None
        """(when it was looked at, what the nodes held: ``None`` if Ray could not say)."""
        self.launch_paused = launch_paused
        self.launcher, self.report_address, self.interval_s = launcher, report_address, interval_s
        self.ray_reachable = True
        self._wake = asyncio.Event()
        self._lock = asyncio.Lock()
        self._stopping = False
        self._ending: dict[str, asyncio.Task[None]] = {}
        """Jobs followed to their end between passes (:meth:`ending`)."""

    def wake(self) -> None:
        """Run a pass now (a job was queued); pointless while launches are paused."""
        if not self.launch_paused:
            self._wake.set()

    def ending(self, job_id: str) -> None:
        """The job reported its last event (its summary, or the failure that ends it): its driver ends within
        seconds. Ask Ray about it every ``ENDING_POLL_S`` instead of at the next pass, so its team hears it ended
        when Ray does, not up to ``interval_s`` later: that wait was 0.3-2.0 s of every job's end on a 2 s pass
        (``bench/service_submit.py``). One job's questions, not a whole pass's."""
        if job_id not in self._ending and not self._stopping:
            self._ending[job_id] = asyncio.create_task(self._follow_end(job_id), name=f"ending {job_id}")

    async def _follow_end(self, job_id: str) -> None:
        deadline = time.monotonic() + self.ENDING_FOR_S
        try:
            while time.monotonic() < deadline and not self._stopping:
                await asyncio.sleep(self.ENDING_POLL_S)
                async with self._lock:  # not beside a pass, which may end it too
                    job = await self.store.get(job_id)
                    if job is None or job.state.is_terminal:
                        return
                    ended = await self._sync(job)
                if ended:
                    self.wake()  # what it held may launch a queued job now
                    return
        except (RayUnavailable, StoreError) as exc:  # the passes follow it as they follow every job
            log.info("job %s is left to the passes: %s", job_id, exc)
        except Exception:  # a bug here must not go unseen; the passes still follow the job
            log.exception("following job %s to its end failed; it is left to the passes", job_id)
        finally:
            self._ending.pop(job_id, None)

    async def run_forever(self) -> None:
        while not self._stopping:
            try:
                await self.once()
            except StoreError as exc:  # logged by the store's health watch; the next pass tries again
                log.debug("reconcile pass skipped: %s", exc)
            except Exception:  # a bug here must not stop the loop that launches every job
                log.exception("reconcile pass failed")
            try:
                await asyncio.wait_for(self._wake.wait(), timeout=self.interval_s)
            except TimeoutError:
                pass
            self._wake.clear()

    def _count_failure(self, reason: str) -> None:
        if self.metrics is not None:
            self.metrics.launch_failures.labels(reason).inc()

    async def refusal(self, spec: FineTuneSpec) -> str | None:
        """Why ``spec`` can never run on the cluster as it is (``Capacity.refusal``); ``None`` when it can, when
        the cluster autoscales, while launches are paused (the cluster is being changed), or when Ray cannot say
        (the job then queues, and launches once Ray is back)."""
        if self.cluster_autoscales or self.launch_paused:
            return None
        nodes = await self._nodes()
        return nodes.refusal(spec) if nodes is not None else None

    async def _nodes(self) -> Capacity | None:
        """The cluster's alive nodes, looked at most every ``CAPACITY_TTL_S``; ``None`` when Ray cannot say."""
        if self._capacity is None or time.monotonic() - self._capacity[0] > self.CAPACITY_TTL_S:
            try:
                nodes: Capacity | None = await asyncio.to_thread(self.launcher.capacity)
            except RayUnavailable as exc:
                log.info("no capacity check for %s s: %s", self.CAPACITY_TTL_S, exc)
                nodes = None
            self._capacity = (time.monotonic(), nodes)
        return self._capacity[1]

    async def _gpu_limit(self) -> float | None:
        if self.cluster_gpus is not None:
            return self.cluster_gpus
        if self.cluster_autoscales:
            return None
        nodes = await self._nodes()
        return nodes.gpus if nodes is not None else None

    def _gpus_of(self, job: JobRecord) -> int:
        if job.id not in self._gpus:
            scaling = FineTuneSpec.from_dict(job.spec).scaling
            self._gpus[job.id] = scaling.num_workers if scaling.use_gpu else 0
        return self._gpus[job.id]

    async def shutdown(self) -> None:
        """Let the pass in flight finish (a launch must not be cut between submit and record), then one
        last pass so jobs cancelled meanwhile are stopped in Ray."""
        self._stopping = True
        self.wake()
        await self.once()
        await asyncio.gather(*self._ending.values(), return_exceptions=True)  # each ends at its next look

    async def once(self) -> None:
        async with self._lock:
            try:
                if not self.launch_paused:  # paused (Ray maintenance): accept and queue without complaint
                    await asyncio.to_thread(self.launcher.ping)
            except RayUnavailable as exc:
                if self.ray_reachable:
                    log.warning("Ray unreachable: %s", exc)
                self.ray_reachable = False
                return
            reachable, started = True, time.time()
            since = self._swept_until if self._swept_until is not None else started - self.SWEEP_ENDED_S
            # A page at a time, without specs: while Ray cannot answer, the sweep stops at its first job and
            # the next pass starts from the same place. Read whole and all at once, a team's 3,000 cancels
            # of the last 10 minutes were 3,000 specs parsed every 2 s in the service's threads, 65 ms of
            # the interpreter lock a pass that every other team's calls waited for (py-spy beside
            # bench/tenant_bench.py's noisy team, with Ray down).
            page = await self.store.ended_since(since, JobState.CANCELLED, specs=False, limit=self.SWEEP_PAGE)
            for job in page:
                if job.id in self._swept:
                    continue
                try:
                    await self._ensure_stopped(job)
                except RayUnavailable:
                    reachable = False
                    break
                self._swept[job.id] = job.updated_at
            if reachable:
                if len(page) == self.SWEEP_PAGE and page[-1].updated_at > since:  # more after it: the next pass
                    self._swept_until = page[-1].updated_at
                else:  # a second's overlap: a cancel committed while this pass began is read again (never
                    # before where the last page ended: those before it were looked for and are forgotten)
                    self._swept_until = max(since, started - 1.0)
                self._swept = {job_id: ended for job_id, ended in self._swept.items() if ended >= self._swept_until}
            jobs = await self.store.active()  # oldest first
            active = {job.id for job in jobs}
            self._gpus = {i: n for i, n in self._gpus.items() if i in active}
            self._waiting = {i: reason for i, reason in self._waiting.items() if i in active}
            ended: set[str] = set()
            try:
                for job in jobs:  # follow the launched ones first: a job that ended frees its share for this pass
                    if job.state is not JobState.QUEUED and await self._sync(job):
                        ended.add(job.id)
                if not self.launch_paused:
                    active_jobs = [job for job in jobs if job.id not in ended]
                    # The cluster's GPUs are looked up only while a GPU job waits: a CPU-only queue needs no limit.
                    gpus_wanted = any(self._gpus_of(j) for j in active_jobs if j.state is JobState.QUEUED)
                    admission = admit(
                        active_jobs,
                        self._gpus_of,
                        max_running_per_team=self.max_running_per_team,
                        cluster_gpus=await self._gpu_limit() if gpus_wanted else None,
                    )
                    for job in admission.launch:
                        try:
                            await self._launch(job)
                        except LaunchRejected as exc:  # this job's own fault: it fails alone, the others go on
                            self._count_failure("rejected")
                            await self._end(job, JobState.FAILED, f"Ray rejected the submission: {exc}")
                    for job_id, reason in admission.waiting.items():
                        if self._waiting.get(job_id) != reason:
                            self._waiting[job_id] = reason
                            await self.events.append(job_id, "phase", JobPhase("queued", reason).to_dict())
            except RayUnavailable as exc:
                self._count_failure("unavailable")
                reachable = False
                log.warning("Ray unreachable; launches and syncs wait for the next pass: %s", exc)
            self.ray_reachable = reachable

    async def _ensure_stopped(self, job: JobRecord) -> None:
        """A job cancelled while its launch was in flight (or while the service was down) may still run
        in Ray: stop it. The submission id is the job id, so this needs no stored state."""
        if job.state is not JobState.CANCELLED:
            return
        found = await asyncio.to_thread(self.launcher.status, job.id)
        if found is not None and found[0] in ("PENDING", "RUNNING"):
            log.info("stopping Ray job %s of cancelled job", job.id)
            await asyncio.to_thread(self.launcher.stop, job.id)

    async def _launch(self, job: JobRecord) -> None:
        # The same ticket on every attempt: a launch retried after a restart or a timeout, when Ray may
        # already run the first, leaves that driver's ticket (and the report token it binds) valid.
        ticket = auth.launch_ticket(self.launch_key, job.id)
        submission_id = await asyncio.to_thread(self.launcher.submit, job, self.report_address, ticket)
        await self.store.update(job.id, ray_submission_id=submission_id)
        try:
            await self.events.transition(job.id, JobState.STARTING, f"submitted to Ray as {submission_id}")
        except TransitionError:  # cancelled while the submission was in flight
            await asyncio.to_thread(self.launcher.stop, submission_id)

    async def _sync(self, job: JobRecord) -> bool:
        """Follow a launched job in Ray; ``True`` when it has ended."""
        found = await asyncio.to_thread(self.launcher.status, job.ray_submission_id)
        if found is None:
            await self._end(job, JobState.FAILED, "Ray has no record of this job (was the cluster replaced?)")
            return True
        status, message = found
        if status == "SUCCEEDED":
            await self._end(job, JobState.SUCCEEDED, "")
        elif status == "FAILED":
            await self._end(job, JobState.FAILED, await self._failure_reason(job) or message or "the Ray job failed")
        elif status == "STOPPED":
            await self._end(job, JobState.CANCELLED, "stopped in Ray")
        else:
            return False
        return True

    async def _end(self, job: JobRecord, state: JobState, message: str) -> None:
        try:
            await self.events.transition(job.id, state, message)
        except TransitionError:
            pass  # it ended another way meanwhile (e.g. cancelled)

    async def _failure_reason(self, job: JobRecord) -> str:
        failures = [e for e in await self.store.events(job.id, max(0, job.last_seq - 50)) if e.kind == "failure"]
        return "; ".join(Failure.from_dict(failures[-1].data).errors.values()) if failures else ""
