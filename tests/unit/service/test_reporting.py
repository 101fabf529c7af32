"""The jobs' reporting path (service/reporting.py), served by a real gRPC server in this process."""

from __future__ import annotations

import asyncio
import time
import uuid

import grpc

from rayft_contract.states import JobState
from rayft_contract.v1 import finetune_pb2 as pb
from rayft_contract.v1 import finetune_pb2_grpc as pb_grpc
from service import auth
from service.metrics import ServiceMetrics
from service.progress import JobEvents
from service.reporting import JobReportingServicer
from service.store import AsyncJobStore, JobRecord
from service.store_sqlite import SqliteJobStore


def test_the_reconciler_hears_of_a_jobs_last_event_once_and_of_no_other(tmp_path):
    """The reconciler follows a job to its end once it reported its last event (its summary, or the failure that
    ended it); a rank's failure, which Ray Train restarts from, and progress are not last; nor is a retry."""
    sync = SqliteJobStore(tmp_path / "jobs.db")
    token = auth.new_token()
    now = time.time()
    ids = []
    for name in ("succeeds", "fails"):
        job, _ = sync.create(JobRecord(f"ft-{uuid.uuid4().hex[:12]}", "t", JobState.QUEUED, {"name": name}, now, now))
        sync.transition(job.id, JobState.STARTING, "submitted")
        sync.bind_report_token(job.id, auth.hash_token(token))
        ids.append(job.id)
    told: list[str] = []

    async def report_all() -> list[bool]:
        store = AsyncJobStore(sync)
        server = grpc.aio.server()
        servicer = JobReportingServicer(store, JobEvents(store), b"k" * 32, ServiceMetrics(), on_last_event=told.append)
        pb_grpc.add_JobReportingServicer_to_server(servicer, server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        stored = []
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                stub = pb_grpc.JobReportingStub(channel)
                reports = [
                    (ids[0], 1, pb.JobEvent(progress=pb.Progress(step=1, total_steps=2))),
                    (ids[0], 2, pb.JobEvent(failure=pb.Failure(errors={"0": "rank 0 failed; restarted"}))),
                    (ids[0], 3, pb.JobEvent(summary=pb.Summary(json='{"name": "succeeds"}'))),
                    (ids[0], 3, pb.JobEvent(summary=pb.Summary(json='{"name": "succeeds"}'))),  # a retry
                    (ids[1], 1, pb.JobEvent(failure=pb.Failure(errors={"job": "no rows left"}))),
                ]
                for job_id, seq, event in reports:
                    request = pb.ReportRequest(job_id=job_id, report_seq=seq, event=event)
                    reply = await stub.Report(request, metadata=[("authorization", f"Bearer {token}")])
                    stored.append(reply.stored)
        finally:
            await server.stop(None)
        return stored

    stored = asyncio.run(report_all())
    sync.close()
    assert stored == [True, True, True, False, True]
    assert told == ids, "each job once, at its last event"
