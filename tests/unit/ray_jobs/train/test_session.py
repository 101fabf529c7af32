"""ray_jobs.train.session: a warm worker's checkpoints in the run's storage, and how a resume finds the newest whole one."""

from __future__ import annotations

import queue as queues
from pathlib import Path

import pytest

from ray_jobs.storage import location
from ray_jobs.train import session
from ray_jobs.train.checkpoint import MANIFEST, RunIdentity, TrainState, write


def _checkpoint_dir(root: Path, step: int) -> Path:
    """A checkpoint as the loop writes one (``checkpoint.write``), with an adapter file beside it."""
    import torch

    directory = root / f"taken-{step}"
    (directory / "adapter").mkdir(parents=True)
    (directory / "adapter" / "adapter_model.safetensors").write_bytes(b"weights of step %d" % step)
    write(directory, {"model": {"w": torch.full((2,), float(step))}}, TrainState(step=step), RunIdentity("team-a", "h"))
    return directory


class _Queue:
    """Stands in for the driver's ``ray.util.queue.Queue`` (its ``put``), so these tests need no cluster."""

    def __init__(self) -> None:
        self.events = queues.Queue()

    def put(self, event) -> None:
        self.events.put(event)


def test_a_warm_workers_checkpoints_are_persisted_reported_after_and_the_newest_two_kept(tmp_path):
    import ray.train

    warm = session.WarmSession(_Queue(), location(str(tmp_path / "run" / "warm")), datasets={})
    uploaded = []

    def upload(checkpoint, dir_name):
        uploaded.append(dir_name)
        return warm.persist(checkpoint, dir_name)

    for step in (4, 8, 12):
        taken = _checkpoint_dir(tmp_path, step)
        report = {"step": step, "total_steps": 13, "checkpoint": True}
        warm.report_checkpoint(report, ray.train.Checkpoint.from_directory(str(taken)), upload)
    warm.report({"step": 13, "total_steps": 13})
    warm.report({"step": 13, "total_steps": 13, "final": True})

    assert uploaded == ["checkpoint_00000004", "checkpoint_00000008", "checkpoint_00000012"]
    events = [warm.queue.events.get_nowait() for _ in range(5)]
    assert [(e.kind, e.data["step"]) for e in events] == [
        ("progress", 4),
        ("progress", 8),
        ("progress", 12),
        ("progress", 13),
        ("timing", 13),
    ]
    kept = sorted(p.name for p in (tmp_path / "run" / "warm").iterdir())
    assert kept == ["checkpoint_00000008", "checkpoint_00000012"], "the newest two, as Ray Train keeps its own"
    assert Path(warm.latest.path).name == "checkpoint_00000012"
    assert (Path(warm.latest.path) / "adapter" / "adapter_model.safetensors").read_bytes() == b"weights of step 12"


def test_a_failed_upload_fails_the_loop_at_its_next_report_and_nothing_is_reported_for_it(tmp_path):
    import ray.train

    warm = session.WarmSession(_Queue(), location(str(tmp_path / "warm")), datasets={})

    def upload(checkpoint, dir_name):
        raise OSError("No space left on device")

    taken = ray.train.Checkpoint.from_directory(str(_checkpoint_dir(tmp_path, 4)))
    warm.report_checkpoint({"step": 4, "total_steps": 8, "checkpoint": True}, taken, upload)
    with pytest.raises(OSError, match="No space left"):
        warm.report({"step": 5, "total_steps": 8})
    assert warm.queue.events.empty() and warm.latest is None


def test_a_resume_takes_the_newest_whole_checkpoint_and_passes_over_one_whose_copy_did_not_finish(tmp_path):
    folder = location(str(tmp_path / "warm"))
    assert session.latest_in(folder) is None, "no folder yet: nothing to resume"
    for step in (4, 8):
        folder.child(f"checkpoint_{step:08d}").upload_tree(_checkpoint_dir(tmp_path, step), last=MANIFEST)
    torn = tmp_path / "warm" / "checkpoint_00000012"
    (torn / "adapter").mkdir(parents=True)  # the copy stopped before its manifest

    found = session.latest_in(folder)
    assert Path(found.path).name == "checkpoint_00000008"
    assert session.WarmSession(_Queue(), folder, {}, resume_from=found).resumed(None) is found


def test_of_two_checkpoints_the_one_at_the_later_step_is_resumed(tmp_path):
    import ray.train

    early, late = (ray.train.Checkpoint.from_directory(str(_checkpoint_dir(tmp_path, s))) for s in (4, 8))
    warm = session.WarmSession(_Queue(), location(str(tmp_path / "warm")), {}, resume_from=early)
    assert warm.resumed(late) is late and warm.resumed(None) is early
