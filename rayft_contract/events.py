"""The events a job emits, as the job, the service and the clients all see them.

The driver (``ray_jobs.run``) emits them; ``ray_jobs.report`` sends them to the service, which stores
them in each job's log (``service.progress``) and streams them to watchers; the CLI draws them. On the
wire each is one ``JobEvent`` payload (``rayft_contract.convert``).
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Literal

from rayft_contract.records import Failure

EventKind = Literal["state", "phase", "progress", "timing", "failure", "diagnosis", "summary"]
EVENT_KINDS: tuple[EventKind, ...] = ("state", "phase", "progress", "timing", "failure", "diagnosis", "summary")
REPORTABLE: tuple[EventKind, ...] = ("phase", "progress", "failure", "diagnosis", "summary")
"""What a job may report to the service: ``state`` is the service's own, ``timing`` stays in the driver."""


@dataclasses.dataclass(frozen=True)
class Event:
    kind: EventKind
    """``state`` (the service moved the job: ``state``, ``message``), ``phase`` (the job moved on:
    ``connect``, ``model``, ``data``, ``training``, ``export``, with a ``detail``), ``progress``
    (metrics of a report), ``failure`` (a worker failed; Ray Train restarts from the last checkpoint:
    ``errors`` by rank), ``diagnosis`` (a bottleneck found: ``kind``, ``message``, ``cost_s``; see
    ``ray_jobs.observe.diagnosis``) or ``summary`` (the job's summary.json). ``timing`` (the step records of
    the workers' closing report) stays inside the driver."""
    data: dict[str, Any]
    time: float = dataclasses.field(default_factory=time.time)

    @property
    def is_last(self) -> bool:
        """The job reports nothing after it: its ``summary``, or the ``failure`` under ``job`` that ended it
        (``ray_jobs.submitted``); its driver ends next."""
        return self.kind == "summary" or (self.kind == "failure" and Failure.from_dict(self.data).job_error is not None)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "time": self.time, **self.data}
