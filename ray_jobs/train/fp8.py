"""``quantization.fp8``: the frozen base's matmuls on the GPU's FP8 tensor cores (Hopper, Ada), the adapter's in bf16.

In the 7B preset's profile on an H200, matmuls were 59% of the GPU's time, most of them the frozen base's: its
forward and, in backward, the gradient through it to the layer below (its own weights take no gradient).
An H200 does about twice the FP8 FLOP/s of bf16. Here each of those two matmuls per adapted layer runs as
``torch._scaled_mm`` in ``float8_e4m3fn``, with one scale per row: per token of the input (or of the incoming gradient)
and per output channel of the weight, torchao's "rowwise" recipe, the finer of its two. The dequantized NF4 weight is
cast the same way, and its NF4 storage stays as it is. LoRA's A and B, the norms, attention and the loss are untouched.

What it costs is precision: e4m3 keeps 3 mantissa bits. Over 90 steps of the 7B preset on an H200 the loss was 0.5%
above bf16's at equal steps and +26% tokens/s (``bench/RESULTS.md``): off in the spec's default, on in the 7B GPU
presets. Only training runs in FP8: evaluation and generation (no gradient) see the bf16 base, as a server would. On
CPU the same ``_scaled_mm`` runs (slowly), which is what the tests use; a GPU without FP8 tensor cores trains in bf16,
and so does one where the FP8 weights would cut the micro-batch (``ray_jobs.train.memory.fp8_cost``: a 24 GB GPU on the
7B preset); the summary's kernels line says why.

Written here and not taken from torchao: torchao's float8 training converts ``nn.Linear`` modules whose weights
are trained in high precision; a frozen NF4 weight that is dequantized per call, with no weight gradient, is not a
case it covers.
"""

from __future__ import annotations

from typing import Any

import torch

FP8 = torch.float8_e4m3fn
_MAX = torch.finfo(FP8).max


def usable(device: torch.device) -> tuple[bool, str]:
    """Whether this worker's device runs FP8 matmuls, and if not, why (for the summary)."""
    if device.type != "cuda":
        return True, "fp8 base matmuls (rowwise, emulated on CPU)"
    if torch.cuda.get_device_capability(device) < (8, 9):
        return False, f"fp8 off: {torch.cuda.get_device_name(device)} has no FP8 tensor cores (Ada or Hopper needed)"
    return True, "fp8 base matmuls (rowwise)"


def enable(model: Any, spec: Any, shape: Any, trainable: int, device: torch.device, world: int, forecast: Any = None) -> str:
    """``quantization.fp8`` on a LoRA model whose layers are fused: their base matmuls in FP8 where the device has FP8
    tensor cores and the FP8 weights cost the micro-batch nothing (``ray_jobs.train.memory.fp8_cost``). Returns the
    summary's kernels words, on or off and why. Collective on GPU. ``forecast``: the job's memory as its one-layer copy
    forecasts it (``ray_jobs.train.one_layer.JobForecast``), so the copy decides as the job will."""
    from ray_jobs.train.lora_fused import enable_fp8
    from ray_jobs.train.memory import fp8_cost_here

    ok, line = usable(device)
    if not ok:
        return line
    if cost := fp8_cost_here(spec, shape, trainable, weight_bytes(model), device, world, forecast):
        return cost
    enable_fp8(model)
    return line


def warm_up(device: torch.device, widths: tuple[int, ...]) -> bool:
    """Compile :data:`_rowwise_compiled` and make cuBLASLt's first FP8 call in this process, on a warm worker before its
    job comes (``ray_jobs.train.held.hold_base``), so that the job's first step does neither. Rows of ``widths`` (the
    layers' input widths), 16 of them: the GPU's smallest FP8 GEMM. Returns whether it ran (only where FP8 runs on
    tensor cores; on CPU there is nothing to compile)."""
    if not usable(device)[0] or device.type != "cuda":
        return False
    for width in widths:
        a = torch.randn(16, width, device=device, dtype=torch.bfloat16)
        b8, b_scale = _rowwise(torch.randn(16, width, device=device, dtype=torch.bfloat16))
        _matmul(a, b8, b_scale)
    return True


def weight_bytes(model: Any) -> int:
    """What :func:`prepare` adds for the fused layers of ``model``: one byte a base weight, in two layouts."""
    from ray_jobs.train.lora_fused import fused_layers

    return sum(2 * m.base_layer.in_features * m.base_layer.out_features for m in fused_layers(model))


def base_forward(layer: Any, x: torch.Tensor) -> torch.Tensor:
    """``layer(x)`` for a frozen linear base layer (bitsandbytes' ``Linear4bit`` or a plain ``nn.Linear``), its matmul
    and the one in its backward in FP8."""
    if (x.numel() // x.shape[-1]) % 16:  # FP8 GEMMs take rows in multiples of 16 (packed training rows always are)
        return layer(x)
    dtype = torch.get_autocast_dtype(x.device.type) if torch.is_autocast_enabled(x.device.type) else x.dtype
    with torch.autocast(x.device.type, enabled=False):
        out = _FrozenFP8Linear.apply(x.to(dtype), layer)
        bias = getattr(layer, "bias", None)
        return out if bias is None else out + bias.to(dtype)


class _FrozenFP8Linear(torch.autograd.Function):
    """``x @ W.T`` and, in backward, ``grad @ W``, from the layer's FP8 weights (:func:`prepare`). No gradient for
    ``W``: it is frozen."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, layer: Any) -> torch.Tensor:
        ctx.layer = layer
        w8, w_scale, _, _ = layer.rayft_fp8_weights
        return _product(*_LAST_INPUT.rows(x), w8, w_scale, x.dtype).view(*x.shape[:-1], w8.shape[0])

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        _LAST_INPUT.forget()  # the forward is over: hold none of its tensors through the backward
        _, _, wt8, wt_scale = ctx.layer.rayft_fp8_weights
        grad_in = _matmul(grad.reshape(-1, grad.shape[-1]), wt8, wt_scale)
        return grad_in.view(*grad.shape[:-1], wt8.shape[0]), None


class _LastInput:
    """The last forward input quantized, kept for the next layer that takes the same tensor: a decoder layer's q, k and
    v projections take one input, and so do its gate and up projections, so a forward quantizes 4 inputs a layer
    instead of 7: 3 fewer calls of the compiled row scaling a layer and micro-batch, 768 a step of the 7B preset at
    micro-batch 4 (each a pass over the input on the GPU, and on the host dynamo's guards and wrappers: all its calls
    were 11% of the sampled host time of an H100's steps, ``bench/host_h100``). The input's row scales do not depend
    on the weight, so the FP8 rows are the same bytes either way.

    The same tensor: the same object (held here, so that no other can take its id) at the same version (an in-place
    change bumps it). Only forwards use it: the step's, on the thread that runs the steps, and under gradient
    checkpointing a layer's forward run again inside the backward, on autograd's thread while the step's waits in
    ``backward()``, so never two at once. Each backward of a matmul (:class:`_FrozenFP8Linear`) lets go of it, so
    nothing of the forward is held through the backward."""

    def __init__(self) -> None:
        self._kept: tuple[torch.Tensor, int, torch.Tensor, torch.Tensor] | None = None

    def rows(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``_scaled_mm``'s first operand and its ``scale_a`` for ``x`` (``[..., K]``) as ``[M, K]`` rows."""
        kept = self._kept
        if kept is not None and kept[0] is x and kept[1] == x._version:
            return kept[2], kept[3]
        a8, a_scale = _rows(x.reshape(-1, x.shape[-1]))
        self._kept = (x, x._version, a8, a_scale)
        return a8, a_scale

    def forget(self) -> None:
        self._kept = None


_LAST_INPUT = _LastInput()


def prepare(layer: Any) -> None:
    """Keep ``layer``'s frozen weight in FP8, twice: ``[out, in]`` scaled per output channel (the forward) and ``[in,
    out]`` scaled per input channel (the backward, whose product runs along the other dimension). Once per job, not per
    call: dequantizing NF4 and casting at every call cost the 7B preset more than FP8 saved (4.18 s a step against
    3.73 in bf16, on an H200). One byte per parameter each: 13 GB for a 7B base, held beside its 3.9 GB in NF4; made
    before the micro-batch is planned from the free memory (``ray_jobs.train.memory``), so the plan counts it."""
    with torch.no_grad():
        weight = _weight(layer, torch.bfloat16 if layer.weight.device.type == "cuda" else torch.float32)
        layer.rayft_fp8_weights = (*_rowwise(weight), *_rowwise(weight.t().contiguous()))


def _weight(layer: Any, dtype: torch.dtype) -> torch.Tensor:
    """The layer's weight in ``dtype``, ``[out, in]``: a 4-bit one dequantized."""
    weight = layer.weight
    state = getattr(weight, "quant_state", None)
    if state is not None:
        import bitsandbytes.functional as bnb

        return bnb.dequantize_4bit(weight.data, state).to(dtype)
    return weight.to(dtype)


def _matmul(a: torch.Tensor, b8: torch.Tensor, b_scale: torch.Tensor) -> torch.Tensor:
    """``a @ b.T`` for ``a [M, K]`` and ``b [N, K]`` (FP8 already, one scale per row), in FP8 with one scale per row of
    ``a``."""
    return _product(*_rows(a), b8, b_scale, a.dtype)


def _rows(a: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``a`` in FP8 rows with their scales: the compiled row scaling on a GPU, eager on CPU."""
    return _quantize_rows(a, _rowwise_compiled if a.is_cuda else _rowwise)


def _product(
    a8: torch.Tensor, a_scale: torch.Tensor, b8: torch.Tensor, b_scale: torch.Tensor, dtype: torch.dtype
) -> torch.Tensor:
    """``a @ b.T`` in ``dtype`` from both operands in FP8 rows (:func:`_rows`; the weights' from :func:`prepare`)."""
    return torch._scaled_mm(a8, b8.t(), scale_a=a_scale, scale_b=b_scale.t(), out_dtype=dtype)


def _quantize_rows(a: torch.Tensor, rowwise: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """``rowwise(a)`` on ``a`` detached and contiguous, so that the compiled one (:data:`_rowwise_compiled`) sees one
    kind of input from every layer and in backward: no ``requires_grad``, no view's base and no row stride to guard.
    ``contiguous`` copies only a strided input (none seen in the 7B preset's guards)."""
    return rowwise(a.detach().contiguous())


def _rowwise(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``t`` in FP8 with one float32 scale per row (``t ~= t8 * scale``); a row of zeros keeps scale 1. The scale is
    rounded to ``t``'s dtype first, so the one ``t`` is divided by is exactly the one ``_scaled_mm`` multiplies by."""
    amax = t.abs().amax(dim=1, keepdim=True)
    scale = torch.where(amax > 0, amax / _MAX, torch.ones_like(amax))
    return (t / scale).clamp(-_MAX, _MAX).to(FP8), scale.float()


_rowwise_compiled = torch.compile(_rowwise, dynamic=True)
"""On the GPU, the row's absolute maximum, the division, the clamp and the cast as one fused kernel (inductor), over
each input and incoming gradient: eager, they were four passes over every activation. Dynamic shapes: one compile for
all the layers' widths and micro-batch sizes. Called on ``a`` detached and contiguous (:func:`_quantize_rows`): dynamo
guards an input's ``requires_grad`` and, for a view, its base's sizes and strides, and the 7B job's first step compiled
it 5 times over (inputs with and without ``requires_grad``, views of three kinds of base), 4 of them past what a
one-layer first step compiles ahead (``ray_jobs.train.compile_ahead``); a detached tensor is neither (H200,
``bench/RESULTS.md``)."""
