"""How progress leaves the Ray Train controller and reaches the driver, while `fit()` runs beside it.

Ray Train calls :class:`ForwardReports` on its controller after every ``ray.train.report`` (with
all ranks' metrics) and after a worker failure. It puts one :class:`Event` on a Ray queue; the
driver (``ray_jobs.run``) takes them off and hands them to whoever watches: the CLI's progress
bar, the metrics log, and later the service's event stream.
"""

from __future__ import annotations

import dataclasses
import threading
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
    closing one. Ray Train's controller and a warm worker (``ray_jobs.train.session``) both send these."""
    report = Progress.from_dict(metrics)
    return Event("timing" if report.final else "progress", report.to_dict())


def failure_event(errors: dict[Any, BaseException]) -> Event:
    """Failed workers by rank, each as the first line of its error."""
    lines = {str(rank): Failure.reason_of(exc, limit=500) for rank, exc in errors.items()}
    return Event("failure", Failure(lines).to_dict())


def fit_while_forwarding(fit: Callable[[], Fitted], queue: Any, sink: Callable[[Event], None]) -> Fitted:
    """``fit()`` (:func:`fit_trainer`, or a warm worker's, ``ray_jobs.warm.pool``) in a thread while this one
    forwards the events it puts on ``queue``, returning once the last is passed on.

    The thread puts an end mark on the queue when ``fit()`` returns. Every event the fit caused is ahead of
    it: ``queue.put`` returns only once the queue holds the event. Polling instead (``get`` with a 0.5 s
    timeout, then asking whether the thread lives) noticed the end up to a timeout late, and later on a
    busy machine: 0.53 s in one CI run, which no phase of the table covered."""
    box: dict[str, Fitted] = {}

    def fit_then_mark() -> None:
        try:
            box["result"] = fit()
        finally:
            queue.put(_FitEnded())

    thread = threading.Thread(target=fit_then_mark, daemon=True)
    thread.start()
    from ray.util.queue import Empty

    while True:
        try:
            event = queue.get(timeout=END_CHECK_S)
        except Empty:  # nothing new for a while: only a thread that died before its mark ends the wait here
            if thread.is_alive() or not queue.empty():
                continue
            break
        if isinstance(event, _FitEnded):
            break
        sink(event)
    thread.join()
    return box["result"]


END_CHECK_S = 5.0
"""How long :func:`fit_while_forwarding` waits on an empty queue before it checks that the fit's thread still
lives: a safety net only, for a thread that ended without its end mark (the mark ends the wait at once)."""


class _FitEnded:
    """The end mark :func:`fit_while_forwarding`'s thread puts on the queue after ``fit()`` returns."""


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
