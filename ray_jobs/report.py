"""The running job's one way back to the rayft service: its events, over gRPC, in order.

The only module in ``ray_jobs`` that imports grpc. Events queue in memory and a background thread
sends them one by one (``JobReporting.Report``), numbered so that a report retried after a lost reply
is stored once. While the service is unreachable (restarting, say) it retries with backoff, so training
never waits on the service.
"""

from __future__ import annotations

import logging
import queue
import threading
import time

import grpc

from rayft_contract.convert import event_to_proto, progress_from_metrics
from rayft_contract.events import Event
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


class Reporter:
    """Callable event sink for ``ray_jobs.run.run`` that forwards to the service."""

    def __init__(self, address: str, job_id: str, token: str, give_up_after_s: float = 900.0):
        self.address, self.job_id, self.give_up_after_s = address, job_id, give_up_after_s
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
        with grpc.insecure_channel(self.address) as channel:
            stub = pb_grpc.JobReportingStub(channel)
            seq = 0
            while (event := self._queue.get()) is not _DONE:
                seq += 1
                self._send(stub, pb.ReportRequest(job_id=self.job_id, report_seq=seq, event=to_proto(event)))

    def _send(self, stub: pb_grpc.JobReportingStub, request: pb.ReportRequest) -> None:
        start, delay = time.monotonic(), 0.2
        while True:
            try:
                response = stub.Report(request, metadata=self._metadata, timeout=10)
                if response.job_ended:
                    self._on_job_ended()
                return
            except grpc.RpcError as exc:
                if exc.code() not in RETRYABLE or time.monotonic() - start > self.give_up_after_s:
                    log.error("dropping report %d: %s", request.report_seq, exc.details())
                    return
                time.sleep(delay)
                delay = min(delay * 2, 5.0)
