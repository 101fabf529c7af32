"""A warm or early worker's run in the Ray dashboard's Train view, recorded as Ray Train's controller records its own.

Why: a one-GPU job runs on its own early worker by default (``ray_jobs.warm.early``), and a pool's job on a warm
worker; neither is a Ray Train run, so the Train view (runs, their status, their workers and the Ray job each belongs
to) listed none of them, only the jobs of several workers. The records are Ray Train V2's own
(``ray.train.v2._internal.state``: a developer API of Ray 2.60, the version constraints.txt pins), written to its
state actor through its ``TrainStateManager``, with the worker's place as its ``Worker`` record gives it. A record that
cannot be written costs the view and a warning, never the job. A job whose warm worker fails shows twice: this run,
ERRORED, and the Ray Train run that resumed it.
"""

from __future__ import annotations

import logging
import os
import uuid
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ray_jobs.storage import Location
    from rayft_contract.spec import FineTuneSpec

log = logging.getLogger(__name__)

TRACKING_ENV = "RAY_TRAIN_ENABLE_STATE_TRACKING"


def tracking_on() -> bool:
    """Ray Train's state tracking, which the Train view reads: on unless the operator turned it off (``=0``). Ray 2.60
    leaves it off by default, and the view is then empty; one detached actor, no CPU."""
    os.environ.setdefault(TRACKING_ENV, "1")
    return os.environ[TRACKING_ENV] == "1"


def here() -> Any:
    """This process's place (node, address, pid, accelerators), as Ray Train's worker reports its own
    (``RayTrainWorker.get_metadata``, a method of Ray Train's worker actor, which a warm worker is not); called in the
    warm worker."""
    import socket

    import ray
    from ray.train.v2._internal.execution.worker_group.worker import ActorMetadata

    context = ray.get_runtime_context()
    return ActorMetadata(
        hostname=socket.gethostname(),
        node_id=context.get_node_id(),
        node_ip=ray.util.get_node_ip_address(),
        pid=os.getpid(),
        accelerator_ids=context.get_accelerator_ids(),
    )


class TrainViewRun:
    """One warm worker's run of one job, from its start to :meth:`end`."""

    def __init__(
        self, spec: FineTuneSpec, owner: str, worker: Any, place: Any, datasets: dict[str, Any], checkpoints: Location
    ) -> None:
        """``place``: the ref of the worker's ``where()`` (:func:`here`)."""
        import ray
        from ray.train import DataConfig, RunConfig, ScalingConfig
        from ray.train.torch import TorchConfig
        from ray.train.v2._internal.execution.context import DistributedContext
        from ray.train.v2._internal.execution.worker_group.worker import Worker
        from ray.train.v2._internal.state.state_manager import TrainStateManager

        from ray_jobs.train.session import train_run_name

        self.manager, self.run_id, self.attempt_id = TrainStateManager(), uuid.uuid4().hex, uuid.uuid4().hex
        name = train_run_name(spec, owner)  # the name Ray Train's run of this job has, and its storage
        resources = {"CPU": float(spec.scaling.cpus_per_worker), **({"GPU": 1.0} if spec.scaling.use_gpu else {})}
        self.manager.create_train_run(
            id=self.run_id,
            name=name,
            job_id=ray.get_runtime_context().get_job_id(),
            controller_actor_id=worker._actor_id.hex(),  # the worker is its own controller: the view follows its life
            controller_log_file_path=None,
            run_config=RunConfig(name=name, storage_path=checkpoints.uri),
            train_loop_config=None,
            scaling_config=ScalingConfig(num_workers=1, use_gpu=spec.scaling.use_gpu, resources_per_worker=resources),
            backend_config=TorchConfig(),
            datasets=datasets,
            dataset_config=DataConfig(),
        )
        self.manager.create_train_run_attempt(self.run_id, self.attempt_id, 1, resources)
        record = Worker(
            actor=worker,
            metadata=ray.get(place),
            resources=resources,
            distributed_context=DistributedContext(world_rank=0, world_size=1, local_rank=0, local_world_size=1, node_rank=0),
        )
        self.manager.update_train_run_attempt_running(self.run_id, self.attempt_id, [record])
        self.manager.update_train_run_running(self.run_id)

    def end(self, error: BaseException | None) -> None:
        if error is None:
            self.manager.update_train_run_attempt_finished(self.run_id, self.attempt_id)
            self.manager.update_train_run_finished(self.run_id)
        else:
            detail = f"{type(error).__name__}: {error}"[:1000]
            self.manager.update_train_run_attempt_errored(self.run_id, self.attempt_id, detail)
            self.manager.update_train_run_errored(self.run_id, detail)


def open_run(
    spec: FineTuneSpec, owner: str, worker: Any, place: Any, datasets: dict[str, Any], checkpoints: Location
) -> TrainViewRun | None:
    """The job's run in the Train view, running; ``None`` where tracking is off or the records failed (logged)."""
    if not tracking_on():
        return None
    try:
        return TrainViewRun(spec, owner, worker, place, datasets, checkpoints)
    except Exception:  # Ray's developer API moved, or its state actor is gone: the view is lost, not the job
        log.warning("the Train view will not list this job's run", exc_info=True)
        return None


def end_run(run: TrainViewRun | None, error: BaseException | None) -> None:
    """Mark ``run`` FINISHED, or ERRORED with ``error``; a failure to write is logged, as at :func:`open_run`."""
    if run is None:
        return
    try:
        run.end(error)
    except Exception:  # as at open_run: the view's loss only
        log.warning("the Train view could not mark this job's run ended", exc_info=True)
