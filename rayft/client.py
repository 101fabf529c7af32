"""A small Python client for the rayft service, with the CLI's verbs.

from rayft.client import Client
client = Client("127.0.0.1:50051", token="rft_...")          # or RAYFT_ADDRESS / RAYFT_TOKEN
job = client.submit(FineTuneSpec.load("job.yaml"), idempotency_key="nightly-2026-11-30")
for event in client.watch(job.id):
    print(event)
"""

from __future__ import annotations

import json
import os
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import grpc

from rayft_contract.channel import WATCH_ADDRESS_KEY, TlsConfig, channel, watch_target
from rayft_contract.convert import spec_to_proto, state_from_proto
from rayft_contract.spec import FineTuneSpec
from rayft_contract.states import TERMINAL
from rayft_contract.v1 import finetune_pb2 as pb
from rayft_contract.v1 import finetune_pb2_grpc as pb_grpc

DEFAULT_ADDRESS = "127.0.0.1:50051"
RETRY_CONFIG = json.dumps(
    {
        "methodConfig": [
            {
                "name": [{"service": "rayft.v1.FineTuning"}],
                # gRPC's own retries: a call the service never got (restarting, a dropped connection) is
                # sent again. Safe for every verb: reads and cancels are idempotent, and every CreateJob
                # carries an idempotency key (made here when the caller gives none).
                "retryPolicy": {
                    "maxAttempts": 5,
                    "initialBackoff": "0.5s",
                    "maxBackoff": "5s",
                    "backoffMultiplier": 2,
                    "retryableStatusCodes": ["UNAVAILABLE"],
                },
            }
        ]
    }
)


class Client:
    def __init__(self, address: str | None = None, token: str | None = None, tls: TlsConfig | None = None):
        """``tls``: default ``TlsConfig.from_env()`` (``RAYFT_TLS_CA``, ...); plaintext reaches loopback only."""
        self.address = address or os.environ.get("RAYFT_ADDRESS", DEFAULT_ADDRESS)
        token = token or os.environ.get("RAYFT_TOKEN")
        self._metadata = [("authorization", f"Bearer {token}")] if token else []
        self._tls = tls if tls is not None else TlsConfig.from_env()
        self._channel = channel(self.address, self._tls, options=[("grpc.service_config", RETRY_CONFIG)])
        self._stub = pb_grpc.FineTuningStub(self._channel)
        self._watch: tuple[grpc.Channel, pb_grpc.FineTuningStub, str] | None = None
        """The channel to the service's watch process, once the API port named it."""

    def submit(self, spec: FineTuneSpec, idempotency_key: str = "") -> pb.Job:
        """Create the job. Without a key one is made for this call, so a retried send creates one job."""
        request = pb.CreateJobRequest(spec=spec_to_proto(spec), idempotency_key=idempotency_key or f"auto-{uuid.uuid4()}")
        return self._stub.CreateJob(request, metadata=self._metadata, timeout=30)

    def validate(self, spec: FineTuneSpec) -> pb.Job:
        """Check the spec as the service would create it (its fields, the team's policy, the cluster's capacity):
        the job as it would be stored, its id empty and its output under ``{job_id}``. Creates nothing."""
        request = pb.CreateJobRequest(spec=spec_to_proto(spec), validate_only=True)
        return self._stub.CreateJob(request, metadata=self._metadata, timeout=30)

    def get(self, job_id: str) -> pb.Job:
        return self._stub.GetJob(pb.GetJobRequest(job_id=job_id), metadata=self._metadata, timeout=30)

    def list(self, states: Sequence[str] = (), page_size: int = 50, full: bool = False, team: str = "") -> Iterator[pb.Job]:
        """Every job of the team, newest first, following pages; specs name only, unless ``full``. With an
        operator's token, every team's jobs, or only ``team``'s."""
        token = ""
        view = pb.JOB_VIEW_FULL if full else pb.JOB_VIEW_BASIC
        while True:
            request = pb.ListJobsRequest(
                states=[pb.JobState.Value(s) for s in states], page_size=page_size, page_token=token, view=view, team=team
            )
            response = self._stub.ListJobs(request, metadata=self._metadata, timeout=30)
            yield from response.jobs
            if not (token := response.next_page_token):
                return

    def cancel(self, job_id: str) -> pb.Job:
        return self._stub.CancelJob(pb.CancelJobRequest(job_id=job_id), metadata=self._metadata, timeout=30)

    def logs(self, job_id: str, tail_lines: int = 0, from_line: int | None = None) -> pb.JobLogs:
        """The last ``tail_lines`` lines of the job's log (0: the service's default, 200), and how many came before;
        or, with ``from_line``, the lines from that one on (0 is the first) and how many the limits left after."""
        request = pb.GetJobLogsRequest(job_id=job_id, tail_lines=tail_lines, from_line=from_line)
        return self._stub.GetJobLogs(request, metadata=self._metadata, timeout=60)

    def follow_logs(
        self, job_id: str, tail_lines: int = 0, poll_s: float = 2.0, on_wait: Callable[[str], None] | None = None
    ) -> Iterator[str]:
        """The job's log as it grows, a line at a time, until the job has ended: its last ``tail_lines`` lines
        first (0: the service's 200), then every later line once, in order. It waits while the job is not on Ray
        yet, and through a busy or restarting service (RESOURCE_EXHAUSTED, UNAVAILABLE); other errors raise.

        It asks for the lines after the last it got every ``poll_s`` (``GetJobLogs`` with ``from_line``), as a
        unary call: the service reads the log from Ray's dashboard, which gives a log whole, not a stream, and
        a call is what the team's quota of log reads counts. The job's state is read before each read, so the
        read after the job ended is its last and has every line of a job that succeeded or failed (Ray ends
        a job once its driver has exited). A cancelled job may write a few lines more while Ray stops it.
        ``on_wait`` hears why it waits (the service's message), each time it does."""
        position: int | None = None
        while True:
            ended = state_from_proto(self.get(job_id).state) in TERMINAL
            try:
                logs = self.logs(job_id, tail_lines) if position is None else self.logs(job_id, from_line=position)
            except grpc.RpcError as exc:
                not_on_ray = exc.code() == grpc.StatusCode.FAILED_PRECONDITION and not ended
                if not (not_on_ray or exc.code() in (grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.UNAVAILABLE)):
                    raise
                if not_on_ray and state_from_proto(self.get(job_id).state) in TERMINAL:
                    continue  # it ended (cancelled) since its state was read: the next read is the last, and says so
                if on_wait is not None:
                    on_wait(exc.details() or exc.code().name)
                time.sleep(poll_s)
                continue
            yield from logs.lines
            position = logs.lines_before + len(logs.lines)
            if logs.lines_after:  # more than one call's limits: the rest at once
                continue
            if ended:
                return
            time.sleep(poll_s)

    @property
    def watch_address(self) -> str:
        """Where this client's WatchJob streams go: the API's address, or the watch process's once the
        service named it (after the first ``open_watch``/``watch``)."""
        return self._watch[2] if self._watch is not None else self.address

    def open_watch(self, job_id: str, after_seq: int = 0, timeout: float | None = None) -> Iterator[pb.JobEvent]:
        """One ``WatchJob`` stream (a gRPC call: iterate it, ``cancel()`` it), where the service serves streams.

        The service runs its streams in a process of its own: its API port refuses WatchJob with
        FAILED_PRECONDITION and names the watch address in trailing metadata. The first event (or
        the refusal) is awaited here, so the stream returned is open on the right port. ``timeout``: the
        whole stream's deadline (none: until the job ends)."""
        request = pb.WatchJobRequest(job_id=job_id, after_seq=after_seq)
        stub = self._watch[1] if self._watch is not None else self._stub
        call = stub.WatchJob(request, metadata=self._metadata, timeout=timeout)
        try:
            first = next(call)
        except StopIteration:
            return iter(())
        except grpc.RpcError as exc:
            advertised = dict(exc.trailing_metadata() or ()).get(WATCH_ADDRESS_KEY)
            if exc.code() != grpc.StatusCode.FAILED_PRECONDITION or not advertised or self._watch is not None:
                raise
            target = watch_target(self.address, advertised)
            watch_channel = channel(target, self._tls)
            self._watch = (watch_channel, pb_grpc.FineTuningStub(watch_channel), target)
            return self.open_watch(job_id, after_seq, timeout)
        return _Stream(first, call)

    def watch(self, job_id: str, after_seq: int = 0) -> Iterator[pb.JobEvent]:
        """The job's events from ``after_seq`` on, until it ends; resumes after a dropped connection."""
        while True:
            try:
                for event in self.open_watch(job_id, after_seq):
                    after_seq = event.seq
                    yield event
                return
            except grpc.RpcError as exc:
                if exc.code() != grpc.StatusCode.UNAVAILABLE:
                    raise
                self._forget_watch()  # ask the API port again: the service may have moved its streams
                time.sleep(1.0)  # the service is restarting: reconnect from the last seq seen

    def _forget_watch(self) -> None:
        if self._watch is not None:
            self._watch[0].close()
            self._watch = None

    def close(self) -> None:
        self._forget_watch()
        self._channel.close()


class _Stream:
    """A WatchJob call whose first event was read already: iterates from that event on, and cancels."""

    def __init__(self, first: pb.JobEvent, call: Any):
        self._first, self._call = first, call

    def __iter__(self) -> Iterator[pb.JobEvent]:
        return self

    def __next__(self) -> pb.JobEvent:
        if self._first is not None:
            first, self._first = self._first, None
            return first
        return next(self._call)

    def cancel(self) -> bool:
        return self._call.cancel()
