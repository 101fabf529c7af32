"""How progress leaves the Ray Train controller and reaches the driver, while `fit()` runs beside it.

Ray Train calls :class:`ForwardReports` on its controller after every ``ray.train.report`` (with
all ranks' metrics) and after a worker failure. It puts one :class:`Event` on a Ray queue; the
driver (``ray_jobs.run``) takes them off and hands them to whoever watches: the CLI's progress
bar, the metrics log, and later the service's event stream.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable
from typing import Any

from ray.train import UserCallback

from rayft_contract.events import Event
from rayft_contract.records import Failure, Progress


class ForwardReports(UserCallback):
    """Runs on the Ray Train controller: forwards rank 0's metrics and worker failures."""

    def __init__(self, queue: Any):
        self.queue = queue

    def after_report(self, run_context: Any, metrics: list[dict[str, Any]], checkpoint: Any) -> None:
        self.queue.put(report_event(metrics[0]))  # rank 0's

    def after_exception(self, run_context: Any, worker_exceptions: dict[int, Exception]) -> None:
        self.queue.put(failure_event(worker_exceptions))


def report_event(metrics: dict[str, Any]) -> Event:
    """A worker's report (a ``Progress`` as a dict) as the driver hears it: ``progress``, or ``timing`` for the
    closing one. Ray Train's controller and a warm worker (``ray_jobs.session``) both send these."""
    report = Progress.from_dict(metrics)
    return Event("timing" if report.final else "progress", report.to_dict())


def failure_event(errors: dict[Any, BaseException]) -> Event:
    """Failed workers by rank, each as the first line of its error."""
    lines = {str(rank): f"{type(exc).__name__}: {exc}".splitlines()[0][:500] for rank, exc in errors.items()}
    return Event("failure", Failure(lines).to_dict())


def fit_while_forwarding(fit: Callable[[], Fitted], queue: Any, sink: Callable[[Event], None]) -> Fitted:
    """``fit()`` (:func:`fit_trainer`, or a warm worker's, ``ray_jobs.warm_pool``) in a thread while this one
    forwards the events it puts on ``queue``."""
    box: dict[str, Any] = {}
    thread = threading.Thread(target=lambda: box.update(result=fit()), daemon=True)
    thread.start()
    from ray.util.queue import Empty

    while thread.is_alive() or not queue.empty():
        try:
            event = queue.get(timeout=0.5)
        except Empty:  # nothing new within the timeout; a sink's own error is not swallowed here
            continue
        sink(event)
    return box["result"]


def fit_trainer(trainer: Any) -> Fitted:
    try:
        result = trainer.fit()
        return Fitted(result.error, result.checkpoint)
    except Exception as exc:  # TrainingFailedError etc.: re-raised on the caller's thread
        return Fitted(exc)


@dataclasses.dataclass
class Fitted:
    error: Exception | None
    checkpoint: Any = None
    end: float = dataclasses.field(default_factory=time.time)
