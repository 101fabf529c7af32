"""What the training loop asks of whoever runs it: its rank, its device, where to resume, its data shards, where
its reports and checkpoints go.

Two runners answer. :class:`RayTrainSession` is Ray Train's worker (``ray.train``'s functions, as before).
:class:`WarmSession` is a worker of the warm pool (``ray_jobs.warm.pool``), a process that imported the
training stack before the job came: it runs the same loop alone (world size 1), sends the reports to the
driver's queue and writes checkpoints to the run's storage itself. The loop and ``ray_jobs.train.checkpoint`` call
:func:`current` and never ask which one it is.
"""

from __future__ import annotations

import dataclasses
import os
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import ray.train
    import torch

    from ray_jobs import storage
    from rayft_contract.spec import FineTuneSpec

UploadFn = Callable[["ray.train.Checkpoint", str], "ray.train.Checkpoint"]


class Session(Protocol):
    rank: int
    world: int
    local_rank: int
    """This worker's rank among the job's workers on its node: rank 0 there writes what the node's cache keeps."""

    def device(self) -> torch.device: ...

    def resumed(self, fallback: ray.train.Checkpoint | None) -> ray.train.Checkpoint | None:
        """The checkpoint to resume from: the runner's own, or ``fallback`` (``LoopConfig.resume_from``) when
        that one is further along."""

    def shard(self, name: str) -> Any:
        """This worker's iterator over the dataset ``name`` (a Ray Data ``DataIterator``)."""

    def report(self, metrics: dict[str, Any]) -> None:
        """Send ``metrics`` (a ``Progress`` as a dict) on; returns once the runner has taken it."""

    def report_checkpoint(self, metrics: dict[str, Any], checkpoint: ray.train.Checkpoint, upload: UploadFn) -> None:
        """Send ``metrics`` once ``upload(checkpoint, dir_name)`` has persisted the checkpoint, which runs on a
        thread while training goes on; later reports wait behind it."""

    def persist(self, checkpoint: ray.train.Checkpoint, dir_name: str) -> ray.train.Checkpoint:
        """Copy a checkpoint's directory to the run's storage (called by ``upload``)."""

    def describe(self) -> str:
        """Which worker this is, for the summary."""


_current: Session | None = None


def current() -> Session:
    """The session of this process: the warm pool's when it set one, Ray Train's otherwise."""
    return _current if _current is not None else RayTrainSession.of_context()


def use(session: Session | None) -> None:
    """Make ``session`` this process's (``None``: back to Ray Train's)."""
    global _current
    _current = session


def _further(a: ray.train.Checkpoint | None, b: ray.train.Checkpoint | None) -> ray.train.Checkpoint | None:
    """Of two checkpoints, the one taken at the later step."""
    from ray_jobs.train.checkpoint import step_of

    if a is None or b is None:
        return a or b
    return a if (step_of(a) or 0) >= (step_of(b) or 0) else b


@dataclasses.dataclass
class RayTrainSession:
    rank: int
    world: int
    local_rank: int

    @classmethod
    def of_context(cls) -> RayTrainSession:
        import ray.train

        context = ray.train.get_context()
        return cls(context.get_world_rank(), context.get_world_size(), context.get_local_rank())

    def device(self) -> torch.device:
        import ray.train.torch

        return ray.train.torch.get_device()

    def resumed(self, fallback: ray.train.Checkpoint | None) -> ray.train.Checkpoint | None:
        import ray.train

        return _further(ray.train.get_checkpoint(), fallback)

    def shard(self, name: str) -> Any:
        import ray.train

        return ray.train.get_dataset_shard(name)

    def report(self, metrics: dict[str, Any]) -> None:
        import ray.train

        ray.train.report(metrics)

    def report_checkpoint(self, metrics: dict[str, Any], checkpoint: ray.train.Checkpoint, upload: UploadFn) -> None:
        import ray.train

        mode = ray.train.CheckpointUploadMode.ASYNC
        ray.train.report(metrics, checkpoint, checkpoint_upload_mode=mode, checkpoint_upload_fn=upload)

    def persist(self, checkpoint: ray.train.Checkpoint, dir_name: str) -> ray.train.Checkpoint:
        import ray.train

        return ray.train.get_context().get_storage().persist_current_checkpoint(checkpoint, dir_name)

    def describe(self) -> str:
        return "Ray Train's, started for this job"


@dataclasses.dataclass
class WarmSession:
    """One warm worker running one job: rank 0 of 1. Reports go to the driver's queue as the events Ray Train's
    controller would have put there (``ray_jobs.events.ForwardReports``); checkpoints go to ``checkpoints``,
    the newest :data:`KEEP` kept, as ``CheckpointConfig(num_to_keep=2)`` keeps Ray Train's."""

    queue: Any
    """The driver's ``ray.util.queue.Queue``."""
    checkpoints: storage.Location
    """``{run dir}/{Ray Train's run name}/warm``: where a fallback to Ray Train, or a relaunch, resumes from."""
    datasets: dict[str, Any]
    resume_from: ray.train.Checkpoint | None = None
    ready_for_s: float = 0.0
    """How long before this job the worker started its imports."""
    early: bool = False
    """The job's own worker, started at its connect (``ray_jobs.warm.early``), not the pool's."""
    rank: int = 0
    world: int = 1
    local_rank: int = 0
    latest: ray.train.Checkpoint | None = None
    """The last checkpoint persisted: what the driver exports the adapter from."""
    _uploading: threading.Thread | None = None
    _failed: BaseException | None = None

    KEEP = 2

    def device(self) -> torch.device:
        import torch

        return torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")

    def resumed(self, fallback: ray.train.Checkpoint | None) -> ray.train.Checkpoint | None:
        return _further(self.resume_from, fallback)

    def shard(self, name: str) -> Any:
        return self.datasets[name].iterator()

    def report(self, metrics: dict[str, Any]) -> None:
        self.wait()
        self._put(metrics)

    def report_checkpoint(self, metrics: dict[str, Any], checkpoint: ray.train.Checkpoint, upload: UploadFn) -> None:
        self.wait()

        def run() -> None:
            try:
                self.latest = upload(checkpoint, f"checkpoint_{metrics['step']:08d}")
                self._put(metrics)
                self._prune()
            except BaseException as exc:  # re-raised on the loop's thread by wait(): the job fails, as under Ray Train
                self._failed = exc

        self._uploading = threading.Thread(target=run, name="rayft-warm-upload", daemon=True)
        self._uploading.start()

    def wait(self) -> None:
        """Until the checkpoint being uploaded is persisted and reported; raise its failure, if it failed."""
        if self._uploading is not None:
            self._uploading.join()
            self._uploading = None
        if self._failed is not None:
            failed, self._failed = self._failed, None
            raise failed

    def persist(self, checkpoint: ray.train.Checkpoint, dir_name: str) -> ray.train.Checkpoint:
        """Files first, then ``train_state.json``: a checkpoint directory without it is one whose copy did not
        finish, and :func:`latest_in` passes it over."""
        import ray.train

        from ray_jobs.train.checkpoint import MANIFEST

        target = self.checkpoints.child(dir_name)
        with checkpoint.as_directory() as directory:
            target.upload_tree(directory, last=MANIFEST)
        return ray.train.Checkpoint(target.path, filesystem=target.fs)

    def describe(self) -> str:
        if self.early:
            return f"early: the job's own, started at its connect, {self.ready_for_s:.0f} s before training (RAYFT_EARLY_WORKER)"
        return f"warm: started {self.ready_for_s:.0f} s before the job, imports done (RAYFT_WARM_WORKERS)"

    def _put(self, metrics: dict[str, Any]) -> None:
        from ray_jobs.events import report_event

        self.queue.put(report_event(metrics))

    def _prune(self) -> None:
        for old in sorted(self.checkpoints.list_dirs())[: -self.KEEP]:
            self.checkpoints.child(old).delete()


def latest_in(checkpoints: storage.Location) -> ray.train.Checkpoint | None:
    """The newest complete checkpoint a warm worker wrote under ``checkpoints``, or ``None``."""
    import ray.train

    from ray_jobs.train.checkpoint import MANIFEST

    if not checkpoints.exists():
        return None
    for name in sorted(checkpoints.list_dirs(), reverse=True):
        if checkpoints.child(name).child(MANIFEST).exists():
            found = checkpoints.child(name)
            return ray.train.Checkpoint(found.path, filesystem=found.fs)
    return None


def train_run_name(spec: FineTuneSpec, owner: str) -> str:
    """``team.name.job-id`` for a job of the service (``RAYFT_JOB_ID``; its relaunches keep the id, so a
    resumed run finds its folder), the spec's name otherwise, where a re-run of the name resumes."""
    job_id = os.environ.get("RAYFT_JOB_ID")
    return f"{owner}.{spec.name}.{job_id}" if job_id else spec.name
