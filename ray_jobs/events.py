"""How progress leaves the Ray Train controller and reaches the driver.

Ray Train calls :class:`ForwardReports` on its controller after every ``ray.train.report`` (with
all ranks' metrics) and after a worker failure. It puts one :class:`Event` on a Ray queue; the
driver (``ray_jobs.run``) takes them off and hands them to whoever watches: the CLI's progress
bar, the metrics log, and later the service's event stream.
"""

from __future__ import annotations

from typing import Any

from ray.train import UserCallback

from rayft_contract.events import Event


class ForwardReports(UserCallback):
    """Runs on the Ray Train controller: forwards rank 0's metrics and worker failures."""

    def __init__(self, queue: Any):
        self.queue = queue

    def after_report(self, run_context: Any, metrics: list[dict[str, Any]], checkpoint: Any) -> None:
        self.queue.put(Event("timing" if metrics[0].get("final") else "progress", dict(metrics[0])))

    def after_exception(self, run_context: Any, worker_exceptions: dict[int, Exception]) -> None:
        errors = {str(rank): f"{type(exc).__name__}: {exc}".splitlines()[0][:500] for rank, exc in worker_exceptions.items()}
        self.queue.put(Event("failure", {"errors": errors}))
