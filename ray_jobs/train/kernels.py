"""Fused Triton kernels for the model's hot ops (Liger): chosen per worker, applied before LoRA.

Liger replaces RMSNorm, the SwiGLU MLP and RoPE with fused Triton kernels, and the loss with a fused
linear cross-entropy that computes the lm_head matmul and the loss chunk by chunk, so the
``tokens x vocab`` logits (2 GiB in fp32 for 8 x 2048 tokens of a 32k vocabulary, plus their
gradient) never exist. In a bare loop of the 7B QLoRA recipe on one H200 it took 12,295 tokens/s to
15,625 at a larger micro-batch (``../shared/NOTES.md``); rayft's own figures are in ``bench/RESULTS.md``.

Why a library and not our own kernels: Liger is kept up by its authors for each transformers release
and each model family. What rayft adds is the choice: where the kernels cannot run (no CUDA GPU, the
package missing, a family Liger does not know) ``model.kernels: auto`` trains without them and says
why in the summary, and ``liger`` fails up front with that reason instead of an hour later.

The loop's loss (summed, over a frozen head) goes through the same Liger kernels without Liger's waits for the GPU
(:mod:`ray_jobs.train.fused_loss`).

The fused loss reads ``lm_head.weight`` directly, not through the module. When the head itself is
trained (``lora.modules_to_save: [lm_head]``) PEFT keeps the trained copy in a wrapper the fused loss
would bypass, so then the loss stays transformers' own and the other kernels still apply.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import logging
from typing import TYPE_CHECKING, Any

from rayft_contract.spec import FineTuneSpec, SpecError

if TYPE_CHECKING:
    import torch

log = logging.getLogger(__name__)

OPS = ("rope", "rms_norm", "swiglu", "fused_linear_cross_entropy")


@dataclasses.dataclass(frozen=True)
class KernelChoice:
    """Which fused kernels a worker trains with, and why."""

    ops: tuple[str, ...]
    """The Liger ops applied (a subset of :data:`OPS`); empty when the kernels are off."""
    reason: str
    """Why: the spec's setting, or what kept ``auto`` from turning them on."""

    @property
    def enabled(self) -> bool:
        return bool(self.ops)

    def describe(self) -> str:
        """One line for the summary: ``liger (rope, rms_norm, ...)`` or ``none (why)``."""
        return f"liger ({', '.join(self.ops)})" if self.ops else f"none ({self.reason})"


def choose(spec: FineTuneSpec, device_type: str, model_type: str) -> KernelChoice:
    """The kernels for ``spec`` on a ``device_type`` device and a ``model_type`` model (``config.model_type``).

    Raises :class:`SpecError` on ``model.kernels: liger`` where they cannot run.
    """
    setting = spec.model.kernels
    if setting == "none":
        return KernelChoice((), "model.kernels is none")
    missing = _unavailable(device_type, model_type)
    if missing:
        if setting == "liger":
            raise SpecError("model.kernels", f"liger cannot run here: {missing}; use auto or none")
        return KernelChoice((), missing)
    ops = [op for op in OPS if op in _flags_of(model_type)]  # families differ (Gemma has GeGLU, not SwiGLU)
    if "lm_head" in spec.lora.modules_to_save and "fused_linear_cross_entropy" in ops:
        ops.remove("fused_linear_cross_entropy")
    return KernelChoice(tuple(ops), f"model.kernels is {setting}")


def _unavailable(device_type: str, model_type: str) -> str:
    """Why Liger cannot run here, or '' when it can."""
    if device_type != "cuda":
        return f"Liger's Triton kernels need a CUDA GPU, this worker has {device_type}"
    if importlib.util.find_spec("liger_kernel") is None:
        return "liger-kernel is not installed (pip install 'rayft[gpu]')"
    if model_type not in _liger_patches():
        return f"Liger has no kernels for model type {model_type!r}"
    return ""


def _liger_patches() -> dict[str, Any]:
    from liger_kernel.transformers.monkey_patch import MODEL_TYPE_TO_APPLY_LIGER_FN

    return MODEL_TYPE_TO_APPLY_LIGER_FN


def _flags_of(model_type: str) -> set[str]:
    import inspect

    return set(inspect.signature(_liger_patches()[model_type]).parameters)


def describe(choice: KernelChoice, spec: FineTuneSpec, compiled_layers: int, fp8: str = "") -> str:
    """The summary's kernels line: Liger's choice, then what ``lora.fused``, ``quantization.fp8`` (``fp8``: what
    ``ray_jobs.train.fp8.usable`` said) and ``model.compile`` add when on."""
    line = choice.describe()
    if spec.lora.fused:
        line += "; LoRA update inside its matmul (lora.fused)"
    if fp8:
        line += f"; {fp8}"
    if compiled_layers:
        line += f"; torch.compile ({compiled_layers} decoder layers)"
    return line


def apply(model: torch.nn.Module, choice: KernelChoice) -> None:
    """Patch ``model`` (the loaded base, before PEFT wraps it) with the chosen kernels, in place."""
    if not choice.enabled:
        return
    patch = _liger_patches()[model.config.model_type]
    # Liger's per-family patch takes one flag per op; those not chosen (the unfused cross_entropy too) stay off.
    flags = _flags_of(model.config.model_type)
    patch(model=model, **{op: op in choice.ops for op in (*OPS, "cross_entropy") if op in flags})
    if "fused_linear_cross_entropy" in choice.ops:
        from ray_jobs.train import fused_loss

        fused_loss.install()  # the loop's summed loss without Liger's three waits for the GPU a micro-batch
    log.info("Liger kernels applied: %s", ", ".join(choice.ops))
