"""``rayft.v1.JobReporting``: the narrow path from a running job back into its event log, authenticated per job.

A job claims its spec once with the launch ticket from its runtime environment, binding a report token it
made itself (``service/auth.py``); every report after carries that token and a number, so a retry is stored once.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import grpc

from rayft_contract import convert
from rayft_contract.events import REPORTABLE
from rayft_contract.states import JobState
from rayft_contract.v1 import finetune_pb2 as pb
from rayft_contract.v1 import finetune_pb2_grpc as pb_grpc
from service import auth
from service.metrics import ServiceMetrics
from service.progress import JobEvents
from service.store import AsyncJobStore, ReportOutOfOrder

log = logging.getLogger(__name__)


class JobReportingServicer(pb_grpc.JobReportingServicer):
    """The narrow path from a running job back into its event log, authenticated per job."""

    def __init__(
        self,
        store: AsyncJobStore,
        events: JobEvents,
        launch_key: bytes,
        metrics: ServiceMetrics,
        on_last_event: Callable[[str], None] = lambda job_id: None,
    ):
        self.store, self.events, self.launch_key, self.metrics = store, events, launch_key, metrics
        self.on_last_event = on_last_event
        """Told a job's id when the job reports its last event (the reconciler's ``ending``: its driver ends soon)."""

    async def ClaimJob(self, request: pb.ClaimJobRequest, context: grpc.aio.ServicerContext) -> pb.ClaimJobResponse:
        job = await self.store.get(request.job_id) if request.job_id else None
        if job is None or not auth.ticket_matches(self.launch_key, job.id, auth.bearer(context.invocation_metadata())):
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, "this launch ticket is not this job's")
        if job.state.is_terminal:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"job {job.id} already ended ({job.state.value})")
        token_hash = request.report_token_sha256.lower()
        if len(token_hash) != 64 or any(c not in "0123456789abcdef" for c in token_hash):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "report_token_sha256: must be 64 hex digits")
        if not await self.store.bind_report_token(job.id, token_hash):
            log.warning("job %s was claimed again with another report token: refused", job.id)
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, f"job {job.id} was already claimed by its driver")
        return pb.ClaimJobResponse(spec=convert.spec_to_proto(job.spec), team=job.team)

    async def Report(self, request: pb.ReportRequest, context: grpc.aio.ServicerContext) -> pb.ReportResponse:
        token = auth.bearer(context.invocation_metadata())
        job = await self.store.get(request.job_id)
        if job is None or not token or not job.report_token_hash or auth.hash_token(token) != job.report_token_hash:
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, "this token may not report for this job")
        if job.state.is_terminal:  # e.g. cancelled while Ray's stop missed the driver: tell it to exit
            return pb.ReportResponse(stored=False, job_ended=True)
        try:
            event = convert.event_from_proto(request.event)
        except ValueError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"event: {exc}")
        if event.kind not in REPORTABLE:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"event: a job cannot report {event.kind!r} events")
        if job.state is JobState.STARTING:
            await self.events.transition(job.id, JobState.RUNNING, "the job is reporting")
        try:
            stored = await self.events.append_report(job.id, request.report_seq, event.kind, event.data)
        except ReportOutOfOrder as exc:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(exc))
        if stored is not None:
            self.metrics.report_lag.observe(max(time.time() - event.time, 0.0))
            if event.is_last:
                self.on_last_event(job.id)
        return pb.ReportResponse(stored=stored is not None)
