"""The gRPC front end for teams: ``rayft.v1.FineTuning`` (running jobs report on ``service/reporting.py``).

Thin servicers: authenticate, validate (``INVALID_ARGUMENT`` naming the field), then the store, the
event stream and the reconciler do the work. ``service/app.py`` wires them into running servers.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections import Counter, OrderedDict
from collections.abc import AsyncIterator

import grpc

from rayft_contract import convert
from rayft_contract.channel import WATCH_ADDRESS_KEY
from rayft_contract.events import Event
from rayft_contract.records import JobPhase
from rayft_contract.spec import MAX_SPEC_BYTES, SpecError
from rayft_contract.states import JobState, TransitionError
from rayft_contract.v1 import finetune_pb2 as pb
from rayft_contract.v1 import finetune_pb2_grpc as pb_grpc
from service import auth, job_logs
from service.metrics import ServiceMetrics
from service.policy import PathPolicy, PolicyDenied
from service.progress import JobEvents
from service.reconciler import Reconciler
from service.settings import ServiceSettings
from service.store import AsyncJobStore, EventRecord, JobRecord

log = logging.getLogger(__name__)
DEFAULT_TEAM = "default"
"""The team of every call when auth is off (loopback only)."""
MAX_PAGE_BYTES = 1024 * 1024
"""A ListJobs page stops at this size, whatever page_size asks: under a client's 4 MiB default
receive limit, and a bound on the server's memory per call."""
FULL_VIEW_CHUNK = 32
"""Whole specs a full-view ListJobs reads from the store at a time (at most 2 MB of JSON): a page that stops
at MAX_PAGE_BYTES after 17 jobs no longer reads and parses 500 specs to send 17."""
SPEC_CACHE_BYTES = 32 * 1024 * 1024
"""Spec messages kept built, by their size: 4,096 of them at the 64 KB limit were 256 MB."""


class TeamServicer(pb_grpc.FineTuningServicer):
    """What the team API's two servicers share: the caller's team from its token, a job that only its own
    team sees, and ``WatchJob``'s streams, with their quotas. ``FineTuningServicer`` serves the API; with
    the watch process (the default, ``service/watch.py``), ``WatchServicer`` serves the streams there."""

    def __init__(self, store: AsyncJobStore, events: JobEvents, settings: ServiceSettings, metrics: ServiceMetrics):
        self.store, self.events, self.settings, self.metrics = store, events, settings, metrics
        self.streams: Counter[str] = Counter()
        """Open WatchJob streams by team."""
        self._protos: OrderedDict[tuple[str, int], pb.JobEvent] = OrderedDict()
        """Recent events as messages: one event goes out to every stream on its job, built once."""

    def _event_proto(self, event: EventRecord) -> pb.JobEvent:
        key = (event.job_id, event.seq)
        message = self._protos.get(key)
        if message is None:
            message = self._protos[key] = stored_event_to_proto(event)
            if len(self._protos) > 4096:
                self._protos.popitem(last=False)
        return message

    async def _caller(self, context: grpc.aio.ServicerContext) -> auth.Caller:
        token = auth.bearer(context.invocation_metadata())
        if not self.settings.auth:
            return auth.Caller(DEFAULT_TEAM)
        team = await self.store.team_for_token(auth.hash_token(token)) if token else None
        if team is None:
            await context.abort(
                grpc.StatusCode.UNAUTHENTICATED,
                "missing or unknown API token: send `authorization: Bearer <token>` (rayft token create --team NAME)",
            )
        return auth.Caller(team)

    async def _job_of(self, job_id: str, caller: auth.Caller) -> JobRecord | None:
        job = await self.store.get(job_id) if job_id else None
        return job if job is not None and caller.sees(job.team) else None  # another team's job does not exist, to you

    async def _job(self, job_id: str, caller: auth.Caller, context: grpc.aio.ServicerContext) -> JobRecord:
        job = await self._job_of(job_id, caller)
        if job is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"job_id: no job {job_id!r}")
        return job

    async def _stream(self, request: pb.WatchJobRequest, context: grpc.aio.ServicerContext) -> AsyncIterator[pb.JobEvent]:
        caller = await self._caller(context)
        team = caller.team
        if sum(self.streams.values()) >= self.settings.max_streams:
            await context.abort(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"the service has {self.settings.max_streams} open watch streams, its limit: retry later",
            )
        if self.streams[team] >= self.settings.max_streams_per_team:
            await context.abort(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"team {team!r} has {self.settings.max_streams_per_team} open watch streams, its limit: close one",
            )
        job = await self._job(request.job_id, caller, context)  # after the quotas: a refusal costs no store read
        self.streams[team] += 1
        self.metrics.streams.labels(team).inc()
        released = False

        def release(_: object = None) -> None:
            nonlocal released
            if not released:
                released = True
                self.streams[team] -= 1
                self.metrics.streams.labels(team).dec()

        # When the RPC ends, not when this generator is closed: a stream cancelled while an event was being sent
        # leaves the generator suspended at its yield, closed only once the garbage collector frees the cancelled
        # task's traceback; until then the stream held its team's place (a CI run waited 30 s for it in vain).
        context.add_done_callback(release)
        opened = time.time()
        try:
            async for event in self.events.follow(job.id, request.after_seq):
                if event.time >= opened:  # live, not the history replayed to a new watcher
                    self.metrics.stream_lag.observe(max(time.time() - event.time, 0.0))
                yield self._event_proto(event)
        finally:  # ended, cancelled by the client, or cut off by shutdown
            release()


class FineTuningServicer(TeamServicer):
    def __init__(
        self,
        store: AsyncJobStore,
        events: JobEvents,
        reconciler: Reconciler,
        settings: ServiceSettings,
        policy: PathPolicy,
        metrics: ServiceMetrics,
        watch_address: str = "",
    ):
        super().__init__(store, events, settings, metrics)
        self.reconciler, self.policy = reconciler, policy
        self.watch_address = watch_address
        """Where the watch process serves WatchJob (``:PORT``: this host), told to every WatchJob here;
        empty: the streams are served in this process."""
        self._specs: OrderedDict[str, pb.FineTuneSpec] = OrderedDict()
        """Recent jobs' specs as messages, by job id, up to SPEC_CACHE_BYTES in all."""
        self._spec_bytes = 0
        self.log_reads: Counter[str] = Counter()
        """GetJobLogs calls in flight by team."""

    def _job_proto(self, job: JobRecord) -> pb.Job:
        """The whole job as the API shows it, its spec message built once per job (a job's spec never
        changes once stored; building it was a third of a GetJob's time in the server)."""
        spec = self._specs.get(job.id)
        if spec is None:
            spec = self._specs[job.id] = convert.spec_to_proto(job.spec)
            self._spec_bytes += spec.ByteSize()
            while self._spec_bytes > SPEC_CACHE_BYTES and len(self._specs) > 1:
                self._spec_bytes -= self._specs.popitem(last=False)[1].ByteSize()
        return job_to_proto(job, spec=spec)

    async def CreateJob(self, request: pb.CreateJobRequest, context: grpc.aio.ServicerContext) -> pb.Job:
        caller = await self._caller(context)
        if caller.operator:  # a job runs as a team, under its policy, quotas and output root
            await context.abort(
                grpc.StatusCode.PERMISSION_DENIED,
                "an operator's token creates no jobs: submit with the team's token (rayft token create --team NAME)",
            )
        team, checking = caller.team, request.validate_only  # checking: nothing is stored, so no quota applies
        # The quota first: a team at its limit is refused before its spec is parsed and checked, which is
        # most of a CreateJob's cost (measured in bench/tenant_bench.py: 3.1 ms of the server's CPU a
        # refusal when it came last, beside 1.2 ms for a GetJob), so that retrying at the limit stays cheap.
        existing = await self.store.by_key(team, request.idempotency_key) if request.idempotency_key and not checking else None
        if existing is None and not checking and await self.store.count_active(team) >= self.settings.max_active_jobs_per_team:
            await context.abort(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"team {team!r} has {self.settings.max_active_jobs_per_team} active jobs, its limit: wait for one to end or cancel one",
            )
        size = request.spec.ByteSize()
        if size > MAX_SPEC_BYTES:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"spec: {size} bytes, over the limit of {MAX_SPEC_BYTES}; data goes in data.path, not in the spec",
            )
        try:
            spec = convert.spec_from_proto(request.spec)
        except SpecError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"spec.{exc}")
        request_hash = spec.digest()
        job_id = "{job_id}" if checking else f"ft-{uuid.uuid4().hex[:16]}"  # checking: where its id would go
        try:
            spec = self.policy.apply(team, spec, job_id)
        except PolicyDenied as exc:
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, f"spec.{exc}")
        if why := await self.reconciler.refusal(spec):  # it would wait in Ray's queue for ever
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"spec.{why}")
        if checking:
            return job_to_proto(JobRecord("", team, JobState.QUEUED, spec.to_dict(), 0.0, 0.0))
        now = time.time()
        record = JobRecord(
            id=job_id,
            team=team,
            state=JobState.QUEUED,
            spec=spec.to_dict(),
            created_at=now,
            updated_at=now,
            idempotency_key=request.idempotency_key,
            request_hash=request_hash,
        )
        job, created = await self.store.create(record)
        if not created and job.request_hash != request_hash:
            await context.abort(
                grpc.StatusCode.ALREADY_EXISTS,
                f"idempotency_key {request.idempotency_key!r} was used for job {job.id} with another spec",
            )
        if created:
            await self.events.append(job.id, "phase", JobPhase("queued").to_dict())
            self.reconciler.wake()
        if not self.reconciler.ray_reachable:  # stored and QUEUED: it launches when Ray is back
            log.info("job %s queued while Ray at %s is unreachable", job.id, self.reconciler.launcher.address)
        return self._job_proto(await self.store.get(job.id))

    async def GetJob(self, request: pb.GetJobRequest, context: grpc.aio.ServicerContext) -> pb.Job:
        return self._job_proto(await self._job(request.job_id, await self._caller(context), context))

    async def ListJobs(self, request: pb.ListJobsRequest, context: grpc.aio.ServicerContext) -> pb.ListJobsResponse:
        caller = await self._caller(context)
        if request.team and not caller.sees(request.team):
            await context.abort(
                grpc.StatusCode.PERMISSION_DENIED,
                f"team: a team's token lists its own team's jobs ({caller.team!r}); leave team empty",
            )
        team = request.team or (None if caller.operator else caller.team)  # None: every team's (the operator)
        size = request.page_size or 50
        if not 0 < size <= 500:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "page_size: must be between 1 and 500")
        try:
            states = [convert.state_from_proto(s) for s in request.states if s != pb.JOB_STATE_UNSPECIFIED]
        except ValueError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"states: {exc}")
        if request.page_token and await self._job_of(request.page_token, caller) is None:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "page_token: not one this service gave; start without one")
        full = request.view == pb.JOB_VIEW_FULL
        page: list[pb.Job] = []
        total, after = 0, request.page_token
        while True:  # the basic view in one read; the full one a few whole specs at a time
            chunk = min(size - len(page), FULL_VIEW_CHUNK) if full else size - len(page)
            jobs = await self.store.list(team, states, limit=chunk + 1, after=after, specs=full)
            for job in jobs[:chunk]:
                message = self._job_proto(job) if full else job_to_proto(job, full=False)
                total += message.ByteSize()
                if page and total > MAX_PAGE_BYTES:
                    return pb.ListJobsResponse(jobs=page, next_page_token=page[-1].id)
                page.append(message)
            if len(jobs) <= chunk:  # the team has no more
                return pb.ListJobsResponse(jobs=page)
            if len(page) == size:
                return pb.ListJobsResponse(jobs=page, next_page_token=page[-1].id)
            after = page[-1].id

    async def CancelJob(self, request: pb.CancelJobRequest, context: grpc.aio.ServicerContext) -> pb.Job:
        caller = await self._caller(context)
        job = await self._job(request.job_id, caller, context)
        why = "cancelled by the operator" if caller.operator else "cancelled on request"
        if caller.operator:  # the platform team's hand in a team's work is on record in the service's log
            log.warning("the operator cancels job %s of team %s", job.id, job.team)
        try:
            job = await self.events.transition(job.id, JobState.CANCELLED, why)
        except TransitionError:
            await context.abort(
                grpc.StatusCode.FAILED_PRECONDITION, f"job {job.id} already ended ({job.state.value}); nothing to cancel"
            )
        try:  # the submission id is the job id, also while the launch is still in flight
            await asyncio.to_thread(self.reconciler.launcher.stop, job.ray_submission_id or job.id)
        except ConnectionError as exc:  # not submitted yet, or Ray unreachable: the reconciler's sweep stops it
            log.info("Ray job %s not stopped now: %s", job.id, exc)
        return self._job_proto(job)

    async def GetJobLogs(self, request: pb.GetJobLogsRequest, context: grpc.aio.ServicerContext) -> pb.JobLogs:
        caller = await self._caller(context)
        team = caller.team
        if not 0 <= request.tail_lines <= job_logs.MAX_LINES:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"tail_lines: between 1 and {job_logs.MAX_LINES:,} (0: {job_logs.DEFAULT_LINES})",
            )
        following = request.HasField("from_line")
        if following and (request.tail_lines or request.from_line < 0):
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                "from_line: a line number, 0 or more, and no tail_lines with it (the lines from it on are given)",
            )
        if self.log_reads[team] >= self.settings.max_log_reads_per_team:  # before the store: a refusal costs no read
            await context.abort(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"team {team!r} has {self.log_reads[team]} log reads in flight, its limit: wait for one to end",
            )
        self.log_reads[team] += 1  # taken before the next await, so that two calls at once cannot both pass
        try:
            job = await self._job(request.job_id, caller, context)
            if not job.ray_submission_id:
                await context.abort(
                    grpc.StatusCode.FAILED_PRECONDITION,
                    f"job {job.id} is {job.state.value} and has not started on Ray: it has no log (yet)",
                )
            try:
                text = await asyncio.to_thread(self.reconciler.launcher.logs, job.ray_submission_id)
            except ConnectionError:
                await context.abort(
                    grpc.StatusCode.UNAVAILABLE, f"Ray is unreachable: the log of job {job.id} cannot be read now; try again"
                )
        finally:
            self.log_reads[team] -= 1
        if text is None:
            await context.abort(
                grpc.StatusCode.NOT_FOUND,
                f"job_id: Ray no longer holds the log of job {job.id} (the cluster it ran on was replaced); its events remain",
            )
        if not following:
            lines, before = job_logs.tail(text, request.tail_lines or job_logs.DEFAULT_LINES)
            return pb.JobLogs(job_id=job.id, lines=lines, lines_before=before)
        try:
            lines, after = job_logs.since(text, request.from_line)
        except IndexError as exc:
            await context.abort(grpc.StatusCode.OUT_OF_RANGE, str(exc))
        return pb.JobLogs(job_id=job.id, lines=lines, lines_before=request.from_line, lines_after=after)

    async def WatchJob(self, request: pb.WatchJobRequest, context: grpc.aio.ServicerContext) -> AsyncIterator[pb.JobEvent]:
        if self.watch_address:  # before the token is read: sending a caller on costs this process nothing
            await context.abort(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"WatchJob is served at {self.watch_address} (the service's watch process), not on this port: "
                f"watch there (rayft's client follows the `{WATCH_ADDRESS_KEY}` metadata by itself)",
                trailing_metadata=((WATCH_ADDRESS_KEY, self.watch_address),),
            )
        async for message in self._stream(request, context):
            yield message


class WatchServicer(TeamServicer):
    """The watch process's servicer: ``WatchJob`` alone. The API's other calls are refused by name, so a
    client pointed at the wrong port hears where to go."""

    async def WatchJob(self, request: pb.WatchJobRequest, context: grpc.aio.ServicerContext) -> AsyncIterator[pb.JobEvent]:
        async for message in self._stream(request, context):
            yield message

    async def _elsewhere(self, context: grpc.aio.ServicerContext) -> None:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, "this port serves WatchJob only: call the service's API port")

    async def CreateJob(self, request: pb.CreateJobRequest, context: grpc.aio.ServicerContext) -> pb.Job:
        await self._elsewhere(context)

    async def GetJob(self, request: pb.GetJobRequest, context: grpc.aio.ServicerContext) -> pb.Job:
        await self._elsewhere(context)

    async def ListJobs(self, request: pb.ListJobsRequest, context: grpc.aio.ServicerContext) -> pb.ListJobsResponse:
        await self._elsewhere(context)

    async def CancelJob(self, request: pb.CancelJobRequest, context: grpc.aio.ServicerContext) -> pb.Job:
        await self._elsewhere(context)

    async def GetJobLogs(self, request: pb.GetJobLogsRequest, context: grpc.aio.ServicerContext) -> pb.JobLogs:
        await self._elsewhere(context)


def job_to_proto(job: JobRecord, full: bool = True, spec: pb.FineTuneSpec | None = None) -> pb.Job:
    """The stored job as the API shows it; ``full=False``: the spec holds only its name (ListJobs' BASIC
    view: building a whole spec message was most of a list's cost, measured in bench/tenant_bench.py).
    ``spec``: the spec's message, when the caller has it built."""
    if spec is None:
        spec = convert.spec_to_proto(job.spec) if full else pb.FineTuneSpec(name=job.spec.get("name", ""))
    return pb.Job(
        id=job.id,
        team=job.team,
        state=convert.state_to_proto(job.state),
        spec=spec,
        idempotency_key=job.idempotency_key,
        created_at=job.created_at,
        updated_at=job.updated_at,
        ray_submission_id=job.ray_submission_id,
        message=job.message,
        last_seq=job.last_seq,
        summary_json=json.dumps(job.summary) if job.summary else "",
    )


def stored_event_to_proto(event: EventRecord) -> pb.JobEvent:
    return convert.event_to_proto(Event(event.kind, event.data, event.time), job_id=event.job_id, seq=event.seq)
