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

Before the first step, :func:`plan` checks the spec's micro-batch against the GPU memory left once the
model is loaded, from the model's shape (:data:`ACTIVATION_BYTES`), and runs each micro-batch in as
many pieces as it takes to fit; a worker alone turns gradient checkpointing on when even one row a
piece would not fit. So a GPU smaller than the preset's (or one shared with another process) runs the
job at a lower speed instead of failing, and the summary says what was chosen and why. The back-off
above still checks the choice against the first steps' real peak. The one-layer copy that compiles a job's kernels
ahead plans the same way from its forecast of the job's model and memory (``ray_jobs.train.one_layer``), so it compiles
the pieces the job will run.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Callable

    from rayft_contract.records import ModelShape
    from rayft_contract.spec import FineTuneSpec

    Forecast = Callable[[ModelShape, int], tuple[ModelShape, int, float]]
    """``(shape, trainable)`` -> the job's ``(shape, trainable, free bytes)``: :class:`ray_jobs.train.one_layer.JobForecast`."""

log = logging.getLogger(__name__)

ACTIVATION_BYTES = 34
"""Bytes of activations a bf16 decoder layer keeps for backward, per token and per unit of its width,
when attention never stores its scores (SDPA's flash kernels): Korthikanti et al. 2022, "Reducing
Activation Recomputation in Large Transformer Models", without the ``5as/h`` term of the scores. For the
7B preset that is 34 x 4,096 x 32 = 4.5 MB a token; on an H200 it peaked at 71.4 GiB at micro-batch 8 x
2,048 tokens with Liger's kernels (about 4.1 MB a token after the 4-bit base) and at 96.4 GiB without
them (5.6 MB: the logits), hence :data:`HEADROOM`."""
HEADROOM = 0.75
"""The share of the free memory a plan may fill: the formula is 20% under the measured peak without
the fused kernels, and the allocator fragments."""


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
    backed_off: bool = False

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
        if self.backed_off or self.running < 2:
            raise OutOfMemory(
                f"out of GPU memory at step {step}, even at micro-batch {self.running} after backing off ({error}); {fix}"
            ) from error
        free()
        ran = self.running
        self.split, self.backed_off = self.split * 2, True
        self.reason = f"step {step} ran out of GPU memory at micro-batch {ran}: halved, global batch unchanged"
        log.warning("%s", self.reason)

    def follow(self, chosen: Plan) -> None:
        """Run the micro-batches as :func:`plan` chose."""
        self.split, self.reason = chosen.split, chosen.reason

    @property
    def running(self) -> int:
        return -(-self.size // self.split)

    def describe(self) -> str:
        """One line for the summary."""
        return f"{self.running} ({self.reason})" if self.reason else f"{self.size} (train.micro_batch_size)"


@dataclasses.dataclass(frozen=True)
class Plan:
    """How the micro-batches run on this GPU: :func:`plan`'s answer."""

    split: int = 1
    gradient_checkpointing: bool = False
    """Turn gradient checkpointing on (the spec had it off)."""
    reason: str = ""
    """Empty: the spec's choice fits."""


def activation_bytes(shape: ModelShape, tokens: int, gradient_checkpointing: bool) -> float:
    """Activations kept for backward over ``tokens`` tokens: every layer's (:data:`ACTIVATION_BYTES`), or
    with checkpointing each layer's bf16 input and one layer's whole set at a time."""
    per_layer = ACTIVATION_BYTES * shape.attn_dim
    if gradient_checkpointing:
        return tokens * (2 * shape.attn_dim * shape.layers + per_layer)
    return tokens * per_layer * shape.layers


def plan(size: int, seq_len: int, shape: ModelShape, trainable: int, free_bytes: float, alone: bool) -> Plan:
    """The fewest pieces per micro-batch (a power of 2, at most ``size``) whose activations, with the
    trainable weights' gradients and Adam's moments (16 bytes a parameter), fit in :data:`HEADROOM` of
    ``free_bytes``; failing that, a worker ``alone`` also turns on gradient checkpointing. ``Plan()`` when
    the spec's choice fits, or when nothing does (the back-off then has the last word)."""
    fit = _first_fit(size, seq_len, shape, trainable, free_bytes, alone)
    if fit is None or fit == (1, shape.gradient_checkpointing):
        return Plan()
    split, gc = fit
    estimate = activation_bytes(shape, size * seq_len, shape.gradient_checkpointing) / 2**30
    return Plan(
        split,
        gc != shape.gradient_checkpointing,
        f"{_describe(size, fit, shape)}: about {estimate:.0f} GiB of activations at micro-batch {size} against "
        f"{free_bytes / 2**30:.0f} GiB free after the model; global batch unchanged",
    )


def fp8_cost(size: int, seq_len: int, shape: ModelShape, trainable: int, free_bytes: float, fp8_bytes: float, alone: bool) -> str:
    """Why ``quantization.fp8`` stays off on this GPU, or ``""`` when its FP8 weights (``fp8_bytes``, made after
    ``free_bytes`` was read) leave the micro-batch as :func:`plan` would run it without them. FP8 trades memory for
    speed: 13 GB more for the 7B base, +26% tokens/s on an H200, where it costs nothing in the micro-batch. On a
    GPU where the same 13 GB would cut the micro-batch or turn gradient checkpointing on (a 24 GB one), bf16 at the
    spec's micro-batch is the faster and safer default, and the summary's kernels line says why."""
    without = _first_fit(size, seq_len, shape, trainable, free_bytes, alone)
    with_fp8 = _first_fit(size, seq_len, shape, trainable, free_bytes - fp8_bytes, alone)
    if without is not None and with_fp8 == without:
        return ""
    return (
        f"fp8 off: its {fp8_bytes / 2**30:.0f} GiB of FP8 weights would leave {max(free_bytes - fp8_bytes, 0) / 2**30:.0f} "
        f"of {free_bytes / 2**30:.0f} GiB free, {_describe(size, with_fp8, shape)} instead of {_describe(size, without, shape)}"
    )


def _first_fit(
    size: int, seq_len: int, shape: ModelShape, trainable: int, free_bytes: float, alone: bool
) -> tuple[int, bool] | None:
    """``(pieces per micro-batch, gradient checkpointing)`` of :func:`plan`'s first choice that fits, or ``None``."""
    budget = HEADROOM * free_bytes - 16 * trainable
    checkpointing = [shape.gradient_checkpointing] + ([True] if alone and not shape.gradient_checkpointing else [])
    for gc in checkpointing:
        split = 1
        while split <= size:
            if activation_bytes(shape, -(-size // split) * seq_len, gc) <= budget:
                return split, gc
            split *= 2
    return None


def _describe(size: int, fit: tuple[int, bool] | None, shape: ModelShape) -> str:
    if fit is None:
        return "too little for one row"
    split, gc = fit
    return f"micro-batch {-(-size // split)}" + (", gradient checkpointing on" if gc != shape.gradient_checkpointing else "")


def free_gpu_bytes(device: Any) -> float:
    """What this process may still allocate on ``device``: the device's free memory, or less where the
    process is capped (``torch.cuda.set_per_process_memory_fraction``: a MIG slice, a test). A device without an index
    (``cuda``) is the current one: the cap's query needs the index."""
    import torch

    if device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    free, total = torch.cuda.mem_get_info(device)
    cap = torch.cuda.get_per_process_memory_fraction(device) * total - torch.cuda.memory_reserved(device)
    return float(min(free, cap))


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


def fit_plan(
    spec: FineTuneSpec, shape: ModelShape, trainable: int, device: Any, world: int, forecast: Forecast | None = None
) -> Plan:
    """How the micro-batches fit this GPU (:func:`plan`), from the least free memory of any rank, so every rank
    runs as many pieces (FSDP's collectives need that). On CPU, or with ``train.fit_memory`` off: the spec's
    choice. Collective on GPU. ``forecast``: the job's model and memory as its one-layer copy forecasts them
    (:class:`ray_jobs.train.one_layer.JobForecast`), planned in their place, on any device."""
    if (seen := _seen(spec, shape, trainable, device, forecast)) is None:
        return Plan()
    shape, trainable, free = seen
    return plan(spec.train.micro_batch_size, spec.data.max_seq_len, shape, trainable, free, alone=world == 1)


def fp8_cost_here(
    spec: FineTuneSpec,
    shape: ModelShape,
    trainable: int,
    fp8_bytes: float,
    device: Any,
    world: int,
    forecast: Forecast | None = None,
) -> str:
    """:func:`fp8_cost` on this GPU, from the least free memory of any rank (every rank decides alike). On CPU, or with
    ``train.fit_memory`` off: ``""``, the spec decides. Collective on GPU. ``forecast``: as :func:`fit_plan`'s; the
    FP8 weights are the copy's one layer's, so they grow as its layers do."""
    if (seen := _seen(spec, shape, trainable, device, forecast)) is None:
        return ""
    job, trainable, free = seen
    fp8_bytes *= job.layers / shape.layers
    return fp8_cost(spec.train.micro_batch_size, spec.data.max_seq_len, job, trainable, free, fp8_bytes, alone=world == 1)


def _seen(
    spec: FineTuneSpec, shape: ModelShape, trainable: int, device: Any, forecast: Forecast | None
) -> tuple[ModelShape, int, float] | None:
    """``(shape, trainable, free bytes)`` to plan from, or ``None``: nothing to plan (off, or a CPU without a forecast)."""
    if (device.type != "cuda" and forecast is None) or not spec.train.fit_memory:
        return None
    return forecast(shape, trainable) if forecast is not None else (shape, trainable, _least_free(device))


def _least_free(device: Any) -> float:
    import torch

    from ray_jobs.train import strategy

    free = strategy.all_reduce(torch.tensor([free_gpu_bytes(device)], device=device, dtype=torch.float64), op="MIN")
    return float(free.item())
