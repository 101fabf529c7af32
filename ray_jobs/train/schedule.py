"""The learning-rate schedule: ``train.lr_schedule`` through transformers' ``get_scheduler``."""

from __future__ import annotations

from typing import Any

from rayft_contract.spec import TrainSpec

SCHEDULES = {"cosine": "cosine", "linear": "linear", "constant": "constant_with_warmup"}
"""``train.lr_schedule`` -> the transformers schedule of that name, so a curve ported from an HF recipe
(warmup from 0, then the decay) trains the same here."""


def lr_scheduler(optimizer: Any, train: TrainSpec, total_steps: int) -> Any:
    """Linear warmup from 0 over ``warmup_steps``, then cosine (to ``min_lr_ratio`` x peak) or linear decay to 0
    at ``total_steps``, or constant: transformers' ``get_scheduler``."""
    from transformers import get_scheduler

    name, extra = SCHEDULES[train.lr_schedule], None
    if train.min_lr_ratio:  # validated: cosine only
        name, extra = "cosine_with_min_lr", {"min_lr_rate": train.min_lr_ratio}
    return get_scheduler(
        name, optimizer, num_warmup_steps=train.warmup_steps, num_training_steps=total_steps, scheduler_specific_kwargs=extra
    )
