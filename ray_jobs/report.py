"""The running job's one way back to the rayft service: its events, over gRPC, in order.

The only module in ``ray_jobs`` that imports grpc. Events queue in memory and a background thread
sends them one by one (``JobReporting.Report``), numbered so that a report retried after a lost reply
is stored once. While the service is unreachable (restarting, say) it retries with backoff, so training
never waits on the service.
"""

from __future__ import annotations

import hashlib
import logging
import queue
import secrets
import threading
import time

import grpc

from rayft_contract.channel import TlsConfig, channel
from rayft_contract.convert import event_to_proto, progress_from_metrics, spec_from_proto
from rayft_contract.events import Event
from rayft_contract.spec import FineTuneSpec
from rayft_contract.v1 import finetune_pb2 as pb
from rayft_contract.v1 import finetune_pb2_grpc as pb_grpc

log = logging.getLogger(__name__)
_DONE = object()
RETRYABLE = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED}


def to_proto(event: Event) -> pb.JobEvent:
    """A progress report's metrics become Progress fields (with the ETA); every other kind maps as is."""
    if event.kind == "progress":
        event = Event("progress", progress_from_metrics(event.data), event.time)
    return event_to_proto(event)


class ClaimRefused(RuntimeError):
    """The service would not hand this job its spec (a wrong ticket, or the job claimed by another)."""


def report_tls(env: dict[str, str]) -> TlsConfig:
    """How this job reaches the service, as the service said in its runtime environment."""
    ca = env.get("RAYFT_REPORT_CA")
    return TlsConfig(enabled=env.get("RAYFT_REPORT_TLS") == "1", ca=ca.encode() if ca else None)


def claim(address: str, job_id: str, ticket: str, tls: TlsConfig, wait_s: float = 600.0) -> tuple[FineTuneSpec, str]:
    """Trade the launch ticket for the job's spec and bind a report token made here; return both.

    The token is made in this process and only its hash is sent, so it exists nowhere else: not in Ray's
    runtime environment, not in its logs, not in the service's store. Retries while the service is
    unreachable (restarting), for up to ``wait_s``."""
    token = "rftr_" + secrets.token_urlsafe(32)
    request = pb.ClaimJobRequest(job_id=job_id, report_token_sha256=hashlib.sha256(token.encode()).hexdigest())
    start, delay = time.monotonic(), 0.5
    with channel(address, tls) as reporting:
        stub = pb_grpc.JobReportingStub(reporting)
        while True:
            try:
                response = stub.ClaimJob(request, metadata=[("authorization", f"Bearer {ticket}")], timeout=10)
                return spec_from_proto(response.spec), token
            except grpc.RpcError as exc:
                if exc.code() not in RETRYABLE:
                    raise ClaimRefused(
                        f"the rayft service refused this job's claim: {exc.code().name}: {exc.details()}"
                    ) from None
                if time.monotonic() - start > wait_s:
                    raise ClaimRefused(f"the rayft service at {address} was unreachable for {wait_s:.0f} s") from None
                time.sleep(delay)
                delay = min(delay * 2, 10.0)


class Reporter:
    """Callable event sink for ``ray_jobs.run.run`` that forwards to the service."""

    def __init__(self, address: str, job_id: str, token: str, tls: TlsConfig, give_up_after_s: float = 900.0):
        self.address, self.job_id, self.tls, self.give_up_after_s = address, job_id, tls, give_up_after_s
        self._metadata = [("authorization", f"Bearer {token}")]
        self._queue: queue.Queue = queue.Queue()
        self._thread = threading.Thread(target=self._send_all, name="rayft-reporter", daemon=True)
        self._thread.start()

    def __call__(self, event: Event) -> None:
        self._queue.put(event)

    def _on_job_ended(self) -> None:
        """The service has ended this job (cancelled): stop the whole driver, and with it its Ray actors.
        Ray's own stop normally gets here first; this covers a stop that missed the driver."""
        import os

        log.error("the rayft service reports job %s as ended; exiting", self.job_id)
        logging.shutdown()
        os._exit(143)

    def close(self, timeout_s: float = 120.0) -> None:
        """Send what is queued (up to ``timeout_s``), then stop."""
        self._queue.put(_DONE)
        self._thread.join(timeout_s)

    def _send_all(self) -> None:
        with channel(self.address, self.tls) as reporting:
            stub = pb_grpc.JobReportingStub(reporting)
            seq = 1  # the service stores only the next number, so a number is used up only once acknowledged
            while (event := self._queue.get()) is not _DONE:
                if self._send(stub, pb.ReportRequest(job_id=self.job_id, report_seq=seq, event=to_proto(event))):
                    seq += 1

    def _send(self, stub: pb_grpc.JobReportingStub, request: pb.ReportRequest) -> bool:
        """True once the service has the report (stored now, or before: a repeat); False when it was dropped.
        A dropped report's number goes to the next event: after a refusal the service holds nothing under
        it, and after giving up on an outage it most likely holds nothing either (if it does, the next event
        reads as a repeat: one event lost, where a gap would have lost all the rest)."""
        start, delay = time.monotonic(), 0.2
        while True:
            try:
                response = stub.Report(request, metadata=self._metadata, timeout=10)
                if response.job_ended:
                    self._on_job_ended()
                return True
            except grpc.RpcError as exc:
                if exc.code() not in RETRYABLE or time.monotonic() - start > self.give_up_after_s:
                    log.error("dropping report %d: %s", request.report_seq, exc.details())
                    return False
                time.sleep(delay)
                delay = min(delay * 2, 5.0)
