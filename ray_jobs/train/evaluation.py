"""Evaluation on the held-out split: the mean loss per answer token, and the share of answer tokens the
model predicts exactly (greedy next-token accuracy), over all workers.

Each pass over a Ray Data shard starts a new streaming execution, seconds of fixed cost. The eval
split is small by design (``data.val_fraction``), so each worker keeps its eval micro-batches in
memory after the first pass when they hold at most ``MAX_KEPT_ROWS`` packed rows, and streams them
every time otherwise.

A cached eval split that small is not even streamed once: each worker reads its share (every
``world``-th row) straight from the entry's Parquet files, where it can open them (an ``s3://`` cache,
or the local cache's node). The first pass was the cost: in ``make demo`` on 2 cores, evaluation took
17% of the job's wall time (3 passes, 2.2 s each on average), and the summary named it ``slow_eval``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

from ray_jobs.data.order import CachedOrder
from ray_jobs.data.packing import SHAPE_MULTIPLE, trim_padding
from ray_jobs.data.pipeline import TOKEN_COLUMNS
from ray_jobs.train.attention_mask import model_inputs
from ray_jobs.train.model import attention_for, autocast
from ray_jobs.train.strategy import all_reduce
from rayft_contract.spec import FineTuneSpec

MAX_KEPT_ROWS = 1024


class EvalBatches:
    """This worker's eval micro-batches (on the CPU, padding trimmed to a multiple of ``multiple`` columns,
    :func:`ray_jobs.data.packing.shape_multiple`)."""

    def __init__(
        self,
        shard: Any,
        micro_batch_size: int,
        split: CachedOrder | None = None,
        rank: int = 0,
        world: int = 1,
        multiple: int = SHAPE_MULTIPLE,
    ):
        """``split``: the cached eval split, read directly when this worker can open it (else ``shard``)."""
        self.shard, self.micro_batch_size, self.multiple = shard, micro_batch_size, multiple
        self.kept: list[dict[str, Any]] | None = None
        if split is not None and split.rows <= MAX_KEPT_ROWS and split.readable_here():
            self.kept = _direct(split, micro_batch_size, rank, world, multiple)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        if self.kept is not None:
            yield from self.kept
            return
        import torch

        kept: list[dict[str, Any]] | None = []
        rows = 0
        for batch in self.shard.iter_torch_batches(batch_size=self.micro_batch_size, dtypes=torch.long, device="cpu"):
            batch = trim_padding(batch, self.multiple)
            rows += len(batch["num_tokens"])
            if kept is not None:
                kept = kept + [batch] if rows <= MAX_KEPT_ROWS else None
            yield batch
        self.kept = kept  # only a pass that ran to the end is kept


def _direct(split: CachedOrder, micro_batch_size: int, rank: int, world: int, multiple: int) -> list[dict[str, Any]]:
    """This worker's rows of the split (every ``world``-th, from ``rank``) in micro-batches; together the
    workers hold every row once, as Ray Train's shards do."""
    import numpy as np
    import torch

    table = split.read_all().select(TOKEN_COLUMNS)
    mine = table.take(np.arange(rank, table.num_rows, world))
    columns = {name: np.stack(mine.column(name).to_numpy(zero_copy_only=False)) for name in TOKEN_COLUMNS}
    batches = []
    for start in range(0, mine.num_rows, micro_batch_size):
        batch = {k: torch.as_tensor(v[start : start + micro_batch_size], dtype=torch.long) for k, v in columns.items()}
        batches.append(trim_padding(batch, multiple))
    return batches


@dataclasses.dataclass(frozen=True)
class Evaluation:
    loss: float
    """Mean loss per label token."""
    token_accuracy: float | None
    """Share of label tokens whose greedy prediction is right; ``None`` when the model gave no logits."""


def evaluate(model: Any, batches: EvalBatches, spec: FineTuneSpec, device: Any) -> Evaluation:
    """The loss and token accuracy over the whole eval split (all workers).

    The accuracy reads the logits the eval forward already returns (in eval mode the fused linear
    cross-entropy of ``model.kernels=liger`` computes them too), so it costs one argmax."""
    import torch

    attention = attention_for(spec, device.type)
    model.eval()
    total = torch.zeros(4, device=device, dtype=torch.float64)  # loss sum, label tokens, right tokens, counted tokens
    with torch.no_grad():
        for batch in batches:
            batch = {k: v.to(device, non_blocking=True) for k, v in batch.items()}
            with autocast(spec, device):
                out = model(**model_inputs(batch, attention), num_items_in_batch=1, use_cache=False)
            targets = batch["labels"][:, 1:]
            answer = targets != -100
            right, counted = torch.zeros((), device=device), torch.zeros((), device=device)
            if getattr(out, "logits", None) is not None:
                right = ((out.logits[:, :-1].argmax(-1) == targets) & answer).sum()
                counted = answer.sum()
            total += torch.stack([out.loss.double(), answer.sum().double(), right.double(), counted.double()])
    model.train()
    total = all_reduce(total)
    accuracy = float(total[2] / total[3]) if total[3] > 0 else None
    return Evaluation(float(total[0] / total[1].clamp(min=1)), accuracy)
