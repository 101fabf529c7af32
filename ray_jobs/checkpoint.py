"""Resumable checkpoints: the adapter (PEFT format), optimizer, scheduler and data position.

Only trainable weights are gathered (``ignore_frozen_params``): a 7B QLoRA checkpoint is the
adapter's megabytes, not the base's gigabytes. The strategy (``ray_jobs.strategy``) gathers them,
and scatters them again on resume, whatever it spreads the model with. Rank 0 writes the directory and Ray Train copies it into the
run's storage.

Layout::

    adapter/adapter_config.json, adapter/adapter_model.safetensors   # loads with PeftModel.from_pretrained
    train_state.pt   # {"model": trainable weights by name, "optimizer", "scheduler", "state": TrainState}
"""

from __future__ import annotations

import dataclasses
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import ray.train
    import torch

    from ray_jobs.strategy import Strategy


@dataclasses.dataclass
class TrainState:
    """Where training stands; restored on resume."""

    step: int = 0
    """Optimizer steps done."""
    epoch: int = 0
    """Epoch of the next micro-batch."""
    batches_in_epoch: int = 0
    """Micro-batches of ``epoch`` already consumed by this worker."""
    tokens: int = 0
    """Real (non-padding) tokens trained on, over all workers: what tokens/s counts."""
    samples: int = 0
    """Examples seen, over all workers."""


def save(
    strategy: Strategy, model: torch.nn.Module, optimizer: Any, scheduler: Any, state: TrainState
) -> ray.train.Checkpoint | None:
    """Collective: every rank calls it; rank 0 gets the checkpoint, the others ``None``."""
    import ray.train
    import torch

    weights, optim = strategy.state_dict(model, optimizer)
    if ray.train.get_context().get_world_rank() != 0:
        return None
    directory = Path(tempfile.mkdtemp(prefix="rayft-ckpt-"))
    strategy.unwrap(model).save_pretrained(directory / "adapter", state_dict=weights)
    torch.save(
        {"model": weights, "optimizer": optim, "scheduler": scheduler.state_dict(), "state": dataclasses.asdict(state)},
        directory / "train_state.pt",
    )
    return ray.train.Checkpoint.from_directory(str(directory))


def release(checkpoint: ray.train.Checkpoint | None) -> None:
    """Remove the local copy :func:`save` made, once ``ray.train.report`` has persisted it to the run's storage."""
    import shutil

    if checkpoint is not None:
        shutil.rmtree(checkpoint.path)


def load(
    checkpoint: ray.train.Checkpoint, strategy: Strategy, model: torch.nn.Module, optimizer: Any, scheduler: Any
) -> TrainState:
    """Restore the trainable weights, optimizer and scheduler into place; return the train state."""
    import torch

    with checkpoint.as_directory() as directory:
        # weights_only: tensors, numbers, strings and containers, never arbitrary pickled objects. The run
        # directory is the team's own storage, so a file planted there must not run code in our workers.
        saved = torch.load(Path(directory) / "train_state.pt", map_location="cpu", weights_only=True)
    strategy.load_state_dict(model, optimizer, saved["model"], saved["optimizer"])
    scheduler.load_state_dict(saved["scheduler"])
    return TrainState(**saved["state"])
