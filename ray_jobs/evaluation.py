"""Evaluation on the held-out split: the mean loss per answer token, over all workers.

Each pass over a Ray Data shard starts a new streaming execution, seconds of fixed cost. The eval
split is small by design (``data.val_fraction``), so each worker keeps its eval micro-batches in
memory after the first pass when they hold at most ``MAX_KEPT_ROWS`` packed rows, and streams them
every time otherwise.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from ray_jobs.model import autocast
from ray_jobs.packing import trim_padding
from ray_jobs.strategy import all_reduce
from rayft_contract.spec import FineTuneSpec

MAX_KEPT_ROWS = 1024


class EvalBatches:
    """This worker's eval micro-batches (on the CPU, padding trimmed)."""

    def __init__(self, shard: Any, micro_batch_size: int):
        self.shard, self.micro_batch_size = shard, micro_batch_size
        self.kept: list[dict[str, Any]] | None = None

    def __iter__(self) -> Iterator[dict[str, Any]]:
        if self.kept is not None:
            yield from self.kept
            return
        import torch

        kept: list[dict[str, Any]] | None = []
        rows = 0
        for batch in self.shard.iter_torch_batches(batch_size=self.micro_batch_size, dtypes=torch.long, device="cpu"):
            batch = trim_padding(batch)
            rows += len(batch["num_tokens"])
            if kept is not None:
                kept = kept + [batch] if rows <= MAX_KEPT_ROWS else None
            yield batch
        self.kept = kept  # only a pass that ran to the end is kept


def evaluate(model: Any, batches: EvalBatches, spec: FineTuneSpec, device: Any) -> float:
    """Mean loss per label token over the whole eval split (all workers)."""
    import torch

    model.eval()
    total = torch.zeros(2, device=device, dtype=torch.float64)
    with torch.no_grad():
        for batch in batches:
            batch = {k: v.to(device, non_blocking=True) for k, v in batch.items()}
            with autocast(spec, device):
                out = model(
                    input_ids=batch["input_ids"],
                    position_ids=batch["position_ids"],
                    labels=batch["labels"],
                    num_items_in_batch=1,
                    use_cache=False,
                )
            total += torch.stack([out.loss.double(), (batch["labels"][:, 1:] != -100).sum().double()])
    model.train()
    total = all_reduce(total)
    return float(total[0] / total[1].clamp(min=1))
