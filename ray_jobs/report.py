"""The running job's one way back to the rayft service: its events, over gRPC, in order.

The only module in ``ray_jobs`` that imports grpc. Events are spooled to the driver's disk and a
background thread sends them one by one (``JobReporting.Report``), numbered so that a report retried
after a lost reply is stored once. While the service is away (restarting, its disk full) it retries with
backoff, so training never waits on the service, and the job ends only once its last event is taken.
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import logging
import os
import secrets
import tempfile
import threading
import time
from collections.abc import Iterator

import grpc

from rayft_contract.channel import TlsConfig, channel
from rayft_contract.convert import event_to_proto, spec_from_proto
from rayft_contract.events import Event
from rayft_contract.spec import FineTuneSpec
from rayft_contract.v1 import finetune_pb2 as pb
from rayft_contract.v1 import finetune_pb2_grpc as pb_grpc

log = logging.getLogger(__name__)
RETRYABLE = {
    grpc.StatusCode.UNAVAILABLE,  # restarting, unreachable, its store busy
    grpc.StatusCode.DEADLINE_EXCEEDED,
    grpc.StatusCode.RESOURCE_EXHAUSTED,  # its disk full
    grpc.StatusCode.ABORTED,
    grpc.StatusCode.UNKNOWN,  # what services before the store's fault mapping answered for a full disk
}
"""Failures that say nothing about the report itself: sent again until the service takes it."""


def _backoff(first_s: float, cap_s: float = 10.0) -> Iterator[float]:
    """Waits between retries: ``first_s``, doubling, then every ``cap_s``."""
    delay = first_s
    while True:
        yield delay
        delay = min(delay * 2, cap_s)


class ClaimRefused(RuntimeError):
    """The service would not hand this job its spec (a wrong ticket, or the job claimed by another)."""


def report_tls(env: dict[str, str]) -> TlsConfig:
    """How this job reaches the service, as the service said in its runtime environment."""
    ca = env.get("RAYFT_REPORT_CA")
    return TlsConfig(enabled=env.get("RAYFT_REPORT_TLS") == "1", ca=ca.encode() if ca else None)


@dataclasses.dataclass(frozen=True)
class Claimed:
    spec: FineTuneSpec
    token: str
    """The report token: made here, only its hash ever sent."""
    team: str


def claim(address: str, job_id: str, ticket: str, tls: TlsConfig, wait_s: float = 600.0) -> Claimed:
    """Trade the launch ticket for the job's spec and team, and bind a report token made here.

    The token is made in this process and only its hash is sent, so it exists nowhere else: not in Ray's
    runtime environment, not in its logs, not in the service's store. Retries while the service is
    unreachable (restarting), for up to ``wait_s``."""
    token = "rftr_" + secrets.token_urlsafe(32)
    request = pb.ClaimJobRequest(job_id=job_id, report_token_sha256=hashlib.sha256(token.encode()).hexdigest())
    start, delays = time.monotonic(), _backoff(0.5)
    with channel(address, tls) as reporting:
        stub = pb_grpc.JobReportingStub(reporting)
        while True:
            try:
                response = stub.ClaimJob(request, metadata=[("authorization", f"Bearer {ticket}")], timeout=10)
                return Claimed(spec_from_proto(response.spec), token, response.team)
            except grpc.RpcError as exc:
                if exc.code() not in RETRYABLE:
                    raise ClaimRefused(
                        f"the rayft service refused this job's claim: {exc.code().name}: {exc.details()}"
                    ) from None
                if time.monotonic() - start > wait_s:
                    raise ClaimRefused(f"the rayft service at {address} was unreachable for {wait_s:.0f} s") from None
                time.sleep(next(delays))


class Spool:
    """The job's unsent events, in order, in a file on the driver's disk: the training side appends, the
    sender reads at its own pace. However long the service is away, memory stays flat and nothing is
    dropped. Hand-written: the standard library's queues hold everything in memory, and a queue library with
    a disk backend would be a dependency for forty lines.

    The file has no name: it is opened twice (an append side and a read side) and its name removed at once,
    so it goes with the driver however the driver ends. A cancelled job's driver is killed or exits at once
    (``Reporter._on_job_ended``), and before this each such end left a ``rayft-spool-*`` folder in the
    node's temp dir (ten in one day of this project's test runs). No other process can open it by name.
    """

    def __init__(self, job_id: str):
        fd, name = tempfile.mkstemp(prefix=f"rayft-spool-{job_id}-", suffix=".b64")  # 0600: the team's events
        try:
            self._append = os.fdopen(fd, "ab")
            self._read = open(name, "rb")  # noqa: SIM115 - held for the spool's life, closed in remove()
        finally:
            os.unlink(name)
        self._written = 0
        self._closed = False
        self._changed = threading.Condition()

    @property
    def size(self) -> int:
        """Bytes on disk (what is spooled stays there until the driver ends)."""
        return os.fstat(self._append.fileno()).st_size

    def put(self, message: bytes) -> None:
        with self._changed:
            self._append.write(base64.b64encode(message) + b"\n")
            self._append.flush()
            self._written += 1
            self._changed.notify_all()

    def close(self) -> None:
        """No more events will come; the reader ends after the last one."""
        with self._changed:
            self._closed = True
            self._changed.notify_all()

    def __iter__(self) -> Iterator[bytes]:
        """Every event once, in order, to one reader (the sender thread)."""
        read = 0
        while True:
            with self._changed:
                self._changed.wait_for(lambda read=read: self._written > read or self._closed)
                if self._written == read:
                    return
            line = self._read.readline()
            read += 1
            yield base64.b64decode(line)

    def remove(self) -> None:
        """Free the disk now, not at the driver's end."""
        self._append.close()
        self._read.close()


class Reporter:
    """Callable event sink for ``ray_jobs.run.run`` that forwards to the service.

    Events go to a ``Spool`` on the driver's disk; a background thread sends them one by one, retrying
    every transient failure (the service restarting, its disk full, a timeout) with backoff for up to
    ``patience_s`` of continuous failure (``RAYFT_REPORT_PATIENCE_S``, a day by default). ``close()`` waits
    for the last event: a summary queued while the service is down is sent when it is back."""

    def __init__(self, address: str, job_id: str, token: str, tls: TlsConfig, patience_s: float | None = None):
        self.address, self.job_id, self.tls = address, job_id, tls
        self.patience_s = patience_s if patience_s is not None else float(os.environ.get("RAYFT_REPORT_PATIENCE_S", 86400))
        self._metadata = [("authorization", f"Bearer {token}")]
        self._spool = Spool(job_id)
        self.sent = 0
        """Events the service has acknowledged."""
        self._thread = threading.Thread(target=self._send_all, name="rayft-reporter", daemon=True)
        self._thread.start()

    def __call__(self, event: Event) -> None:
        self._spool.put(event_to_proto(event).SerializeToString())

    def _on_job_ended(self) -> None:
        """The service has ended this job (cancelled): stop the whole driver, and with it its Ray actors.
        Ray's own stop normally gets here first; this covers a stop that missed the driver."""
        log.error("the rayft service reports job %s as ended; exiting", self.job_id)
        logging.shutdown()
        os._exit(143)

    def close(self) -> None:
        """Send everything still spooled (however long the service takes to come back, up to the patience),
        then stop."""
        self._spool.close()
        self._thread.join()
        self._spool.remove()

    def _send_all(self) -> None:
        with channel(self.address, self.tls) as reporting:
            stub = pb_grpc.JobReportingStub(reporting)
            seq = 1  # the service stores only the next number, so a number is used up only once acknowledged
            for message in self._spool:
                event = pb.JobEvent.FromString(message)
                if self._send(stub, pb.ReportRequest(job_id=self.job_id, report_seq=seq, event=event)):
                    seq += 1
                    self.sent += 1

    def _send(self, stub: pb_grpc.JobReportingStub, request: pb.ReportRequest) -> bool:
        """True once the service has the report (stored now, or before: a repeat); False when it was dropped.
        A dropped report's number goes to the next event: after a refusal the service holds nothing under
        it, and after running out of patience it most likely holds nothing either (if it does, the next
        event reads as a repeat: one event lost, where a gap would have lost all the rest)."""
        start, delays, outage_logged = time.monotonic(), _backoff(0.2), False
        while True:
            try:
                response = stub.Report(request, metadata=self._metadata, timeout=10)
                if outage_logged:
                    log.info("the rayft service is back after %.0f s; reporting again", time.monotonic() - start)
                if response.job_ended:
                    self._on_job_ended()
                return True
            except grpc.RpcError as exc:
                if exc.code() not in RETRYABLE or time.monotonic() - start > self.patience_s:
                    log.error("dropping report %d: %s: %s", request.report_seq, exc.code().name, exc.details())
                    return False
                if not outage_logged and time.monotonic() - start > 30:
                    log.warning("the rayft service is not taking reports (%s); keeping them until it does", exc.code().name)
                    outage_logged = True
                time.sleep(next(delays))
