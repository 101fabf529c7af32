"""LoRA's update added inside its own matmul: ``base(x) + scale * B(A(x))`` as one ``addmm`` (``lora.fused``).

PEFT computes an adapted layer's output as ``base(x)``, then (on a 4-bit base) a defensive ``result.clone()``, then
``lora_B(lora_A(x))``, ``* scaling`` and ``+ result``: a copy, a multiply and an add over the full output of every
adapted layer, and the multiply again in backward. In the 7B preset's profile on an H200 those copies, scalar
multiplies and adds were 13% of the GPU's kernel time (``bench/RESULTS.md``, 2026-12-03). A BLAS ``addmm`` computes
``C + alpha * (A @ B)`` in the matmul itself, so here the update is one kernel: no copy (``addmm`` writes a new
tensor, so nothing is changed in place, which is what PEFT's clone guards against), no separate scale, no separate add;
its backward passes the gradient straight through to the base and scales only the small LoRA gradients.

Why our own forward and not PEFT's: PEFT has no fused path for this. Only ``forward`` changes, and only in the plain
training case: adapters on and not merged, one active adapter, plain LoRA (no DoRA or other variant), no LoRA bias,
the layer called with its input alone, and the output's dtype the update's (bf16 autocast, or an fp32 CPU model).
Anything else goes to PEFT's own forward. Parameters, state dict and the saved adapter stay PEFT's, byte for byte.
"""

from __future__ import annotations

from typing import Any

# torch and PEFT at import: the fused classes are defined at module level, so a module that has one pickles by
# reference, and the forward imports nothing per call. This module is imported by ray_jobs.train.model when lora.fused
# is on (the default), after PEFT itself, so it adds no import time of its own.
import torch
from peft.tuners.lora.layer import Linear


class _FusedForward:
    """Mixed in before a PEFT LoRA layer class: its forward, fused where it is the plain case."""

    rayft_fp8 = False
    """The base layer's matmuls in FP8 (``quantization.fp8``, ``ray_jobs.train.fp8``); set by :func:`enable_fp8`."""

    def forward(self, x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        adapter = _plain_adapter(self) if not args and not kwargs else None
        if adapter is None:
            return super().forward(x, *args, **kwargs)  # type: ignore[misc]
        lora_a, lora_b = self.lora_A[adapter], self.lora_B[adapter]
        if not torch.is_autocast_enabled(x.device.type) and x.dtype != lora_a.weight.dtype:
            return super().forward(x)  # type: ignore[misc]  # mixed dtypes without autocast: PEFT casts them
        # Under autocast the input goes in as it is: autocast runs the matmuls in its dtype (PEFT's plain Linear would
        # first copy the whole input to the fp32 of the LoRA weights, and autocast would copy it back).
        if self.rayft_fp8 and torch.is_grad_enabled():  # training; evaluation and generation see the bf16 base
            from ray_jobs.train.fp8 import base_forward

            result = base_forward(self.base_layer, x)
        else:
            result = self.base_layer(x)
        update_in = lora_a(self.lora_dropout[adapter](x))
        out = torch.addmm(
            result.reshape(-1, result.shape[-1]),
            update_in.reshape(-1, update_in.shape[-1]),
            lora_b.weight.t(),
            alpha=self.scaling[adapter],
        )
        return out.view(result.shape)


def _plain_adapter(layer: Any) -> str | None:
    """The one active adapter when ``layer`` trains plain LoRA on it, else ``None`` (PEFT's forward handles it)."""
    if layer.disable_adapters or layer.merged or len(layer.active_adapters) != 1:
        return None
    (adapter,) = layer.active_adapters
    if adapter not in layer.lora_A or adapter in layer.lora_variant or layer.lora_B[adapter].bias is not None:
        return None
    return adapter


class FusedLinear(_FusedForward, Linear):
    """PEFT's LoRA ``Linear`` (a bf16 or fp32 base) with the fused forward."""


_FUSED: dict[type, type] = {Linear: FusedLinear}

try:
    from peft.tuners.lora.bnb import Linear4bit
except ImportError:  # PEFT defines it only where bitsandbytes imports
    pass
else:

    class FusedLinear4bit(_FusedForward, Linear4bit):
        """PEFT's LoRA ``Linear4bit`` (an NF4 base, QLoRA) with the fused forward."""

    _FUSED[Linear4bit] = FusedLinear4bit


def fuse(model: torch.nn.Module, fp8: bool = False) -> int:
    """Give every LoRA linear layer of ``model`` (a PEFT model) the fused forward, in place; returns how many.
    ``fp8``: their base layers' matmuls in FP8 (``ray_jobs.train.fp8``).

    The layer's class becomes a subclass of its own that only overrides ``forward`` (the module, its parameters
    and hooks are untouched), so ``isinstance`` checks against PEFT's classes still hold."""
    fused = 0
    for module in model.modules():
        target = _FUSED.get(type(module))
        if target is not None:
            module.__class__ = target
            fused += 1
    if fp8:
        enable_fp8(model)
    return fused


def fused_layers(model: torch.nn.Module) -> list[Any]:
    """The layers :func:`fuse` gave the fused forward."""
    return [module for module in model.modules() if isinstance(module, _FusedForward)]


def enable_fp8(model: torch.nn.Module) -> None:
    """The fused layers' base matmuls in FP8 from now on (``ray_jobs.train.fp8``): their FP8 weights are made here."""
    from ray_jobs.train.fp8 import prepare

    for module in fused_layers(model):
        prepare(module.base_layer)
        module.rayft_fp8 = True
