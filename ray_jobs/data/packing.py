"""Packing tokenized examples into fixed-length training rows.

Each row holds whole examples placed by first-fit-decreasing (longest first, into the first row
with room), then right padding. ``position_ids`` restart at 0 for every example: transformers
reads that as sequence boundaries and builds a block-diagonal causal mask (SDPA/eager) or
variable-length kernels (flash attention), so no token attends across examples. The first label
of every example is masked: it would otherwise be predicted from the previous example's last token.
Padding sits at the end of a row, after every real token, so causal attention never reads it and
its labels are masked.

Row columns (all ``int32``, length ``seq_len`` unless noted):
``input_ids``, ``labels``, ``position_ids``; scalars ``num_tokens`` (real tokens),
``num_examples`` and ``num_truncated`` (examples cut to ``seq_len``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from ray_jobs.data.template import IGNORE_INDEX

if TYPE_CHECKING:
    import torch

    from rayft_contract.spec import FineTuneSpec

Example = tuple[Sequence[int], Sequence[int]]
"""``(input_ids, labels)`` of one tokenized example."""


def pack(examples: Sequence[Example], seq_len: int, pad_id: int, packing: bool = True) -> dict[str, np.ndarray]:
    """Rows of ``seq_len`` tokens holding ``examples`` (truncated to ``seq_len`` where longer)."""
    truncated = [len(ids) > seq_len for ids, _ in examples]
    items = [(list(ids[:seq_len]), list(labels[:seq_len])) for ids, labels in examples]
    items = [(ids, labels, cut) for (ids, labels), cut in zip(items, truncated) if ids]
    rows = _first_fit_decreasing([len(ids) for ids, _, _ in items], seq_len) if packing else [[i] for i in range(len(items))]

    n = len(rows)
    out = {
        "input_ids": np.full((n, seq_len), pad_id, dtype=np.int32),
        "labels": np.full((n, seq_len), IGNORE_INDEX, dtype=np.int32),
        "position_ids": np.zeros((n, seq_len), dtype=np.int32),
        "num_tokens": np.zeros(n, dtype=np.int32),
        "num_examples": np.zeros(n, dtype=np.int32),
        "num_truncated": np.zeros(n, dtype=np.int32),
    }
    for r, members in enumerate(rows):
        at = 0
        for i in members:
            ids, labels, cut = items[i]
            k = len(ids)
            out["input_ids"][r, at : at + k] = ids
            out["labels"][r, at : at + k] = labels
            out["labels"][r, at] = IGNORE_INDEX
            out["position_ids"][r, at : at + k] = np.arange(k)
            out["num_truncated"][r] += cut
            at += k
        out["num_tokens"][r] = at
        out["num_examples"][r] = len(members)
        out["position_ids"][r, at:] = np.arange(seq_len - at)
    return out


def _first_fit_decreasing(lengths: Sequence[int], capacity: int) -> list[list[int]]:
    """Bins of example indices, each summing to at most ``capacity``; order inside a bin kept ascending."""
    bins: list[list[int]] = []
    free: list[int] = []
    for i in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        for b, room in enumerate(free):
            if lengths[i] <= room:
                bins[b].append(i)
                free[b] -= lengths[i]
                break
        else:
            bins.append([i])
            free.append(capacity - lengths[i])
    return [sorted(b) for b in bins]


SHAPE_MULTIPLE = 128
"""Trimmed batches are cut to a multiple of this many columns. Every sequence length the GPU has not seen
costs one slow step: on the 7B preset on an H200 the first micro-batch of 2,047 tokens instead of 2,048
made step 5 take 7.7 s instead of 5.5, with and without Liger's kernels (``bench/RESULTS.md``); on two
GPUs, one rank's new shape stalls both. Rounding up bounds the shapes at ``max_seq_len / 128`` (16 at
2,048, and packed rows are nearly always full) for under 128 padding columns per batch."""


def shape_multiple(attention: str, seq_len: int) -> int:
    """The column multiple :func:`trim_padding` keeps under ``attention``: whole rows (``seq_len``) under flex
    attention, else :data:`SHAPE_MULTIPLE`. transformers compiles flex attention, and each width it has not seen
    recompiles it (the first new one as a dynamic-shape kernel); a padding column costs flex attention little, as
    padding is its own block of the mask, which the examples' blocks skip."""
    return seq_len if attention == "flex_attention" else SHAPE_MULTIPLE


def trim_padding(batch: dict[str, np.ndarray], multiple: int = SHAPE_MULTIPLE) -> dict[str, np.ndarray]:
    """Cut the columns every row of a batch pads (real tokens are at the front of each row), keeping a
    multiple of ``multiple`` columns (or the whole row, if that is shorter)."""
    longest = int(batch["num_tokens"].max())
    width = next(v.shape[1] for v in batch.values() if getattr(v, "ndim", 1) == 2)
    keep = min(width, -(-longest // multiple) * multiple)
    return {k: (v[:, :keep] if getattr(v, "ndim", 1) == 2 else v) for k, v in batch.items()}


def rows_of_job_shape(
    spec: FineTuneSpec, vocab: int, attention: str, device: torch.device, rows: int | None = None
) -> dict[str, torch.Tensor]:
    """One placeholder micro-batch of the job's shape, for compiling its kernels before its data comes (a warm worker,
    ``ray_jobs.train.compile_ahead``): ``rows`` (``micro_batch_size`` unless given: the memory plan's pieces) rows as
    wide as :func:`trim_padding` cuts the job's batches under ``attention``, two examples packed in each (positions
    restart mid-row), random ids below ``vocab``, every token a label. Kernels are keyed by these shapes, not by the
    values."""
    import torch

    rows, width = rows or spec.train.micro_batch_size, shape_multiple(attention, spec.data.max_seq_len)
    ids = torch.randint(min(vocab, 1000), (rows, width), device=device)
    positions = torch.cat([torch.arange(width // 2), torch.arange(width - width // 2)]).to(device).expand(rows, -1)
    return {"input_ids": ids, "position_ids": positions.contiguous(), "labels": ids.clone()}
