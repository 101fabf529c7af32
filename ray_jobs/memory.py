"""Out of GPU memory at the spec's micro-batch: back off once, to half, and say so.

Measured on one H200 (``bench/RESULTS.md``): the 7B preset at micro-batch 16 ran out of memory at
137.7 GiB, and Ray Train then restarted it from its checkpoint twice before it failed, minutes lost
for a failure that was certain. A worker that trains alone now catches the first out-of-memory error,
frees what the failed step held, and trains on with each micro-batch cut in half. The global batch
stays the same (each step takes the same rows, in twice as many micro-batches), so the loss curve does
not change, only the speed. The choice and its reason go into the job's summary.

Only once: a second out-of-memory error at half the micro-batch is a real failure, raised with the
fix named. Only alone: under DDP/FSDP the other ranks may already wait in a collective for the rank
that failed, so a retry there could hang. Those jobs fail with the same message.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

log = logging.getLogger(__name__)


class OutOfMemory(RuntimeError):
    """Out of GPU memory, and backing off did not help or could not run: the fix is in the message."""


@dataclasses.dataclass
class MicroBatches:
    """The micro-batch the loop runs: the spec's, or half of it after one out-of-memory back-off."""

    size: int
    """The spec's ``train.micro_batch_size``."""
    world: int
    split: int = 1
    """Each fetched micro-batch runs as this many pieces."""
    reason: str = ""

    def pieces(self, group: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """``group``'s micro-batches, each cut into ``split`` pieces of consecutive rows."""
        if self.split == 1:
            return group
        return [_rows(b, i, self.split) for b in group for i in range(self.split)]

    def back_off(self, error: BaseException, step: int, free: Any) -> None:
        """Halve the micro-batch after ``error`` (out of memory at ``step``), or raise :class:`OutOfMemory`.

        ``free``: releases what the failed attempt held (its gradients, the allocator's cache)."""
        fix = "lower train.micro_batch_size (global_batch_size stays), or set train.gradient_checkpointing: true"
        if self.world > 1:
            raise OutOfMemory(f"out of GPU memory at step {step}, micro-batch {self.size} ({error}); {fix}") from error
        if self.split > 1 or self.size < 2:
            raise OutOfMemory(
                f"out of GPU memory at step {step}, even at micro-batch {self.running} after backing off ({error}); {fix}"
            ) from error
        free()
        self.split = 2
        self.reason = f"step {step} ran out of GPU memory at micro-batch {self.size}: halved, global batch unchanged"
        log.warning("%s", self.reason)

    @property
    def running(self) -> int:
        return -(-self.size // self.split)

    def describe(self) -> str:
        """One line for the summary."""
        return f"{self.running} ({self.reason})" if self.reason else f"{self.size} (train.micro_batch_size)"


def _rows(batch: dict[str, Any], index: int, parts: int) -> dict[str, Any]:
    rows = len(batch["num_tokens"])
    start, stop = index * rows // parts, (index + 1) * rows // parts
    return {k: v[start:stop] for k, v in batch.items()}


def free_step(error: BaseException, optimizer: Any, device: Any) -> None:
    """Release what a step that ran out of memory still holds: the activations its traceback keeps alive, the
    partial gradients, the allocator's cached blocks."""
    import gc
    import traceback

    import torch

    traceback.clear_frames(error.__traceback__)
    optimizer.zero_grad(set_to_none=True)
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
