"""Spreading the model over the Ray Train workers: DDP or FSDP.

- ``ddp`` replicates the (quantized) base on every worker and all-reduces only the LoRA gradients.
  The right choice whenever the base fits one GPU, which a 4-bit 70B nearly does on an H200.
- ``fsdp`` shards parameters with FSDP2 (``fully_shard``): one unit per decoder layer, then the root.
  For QLoRA the 4-bit weights are stored in the compute dtype (``bnb_4bit_quant_storage``, set in
  ``ray_jobs.model``) so each unit's flat shard has one dtype.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch


def wrap(model: torch.nn.Module, strategy: str) -> torch.nn.Module:
    """The model ready for distributed training (unchanged on a single worker)."""
    import ray.train
    import ray.train.torch

    if ray.train.get_context().get_world_size() == 1:
        return model
    if strategy == "ddp":
        return ray.train.torch.prepare_model(model, move_to_device=False, parallel_strategy="ddp")
    return _fully_shard(model)


def _fully_shard(model: torch.nn.Module) -> torch.nn.Module:
    from torch.distributed.fsdp import fully_shard

    for layer in decoder_layers(model):
        fully_shard(layer)
    fully_shard(model)
    return model


def decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The repeated transformer blocks (``...model.layers`` in Llama-like models)."""
    import torch

    for module in model.modules():
        layers = getattr(module, "layers", None)
        if isinstance(layers, torch.nn.ModuleList) and len(layers) > 0:
            return list(layers)
    raise ValueError("scaling.strategy: fsdp needs a model with a `layers` ModuleList of decoder blocks")


def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """The PEFT model inside a DDP wrapper (FSDP2 modifies the model in place)."""
    return getattr(model, "module", model)


@contextlib.contextmanager
def grad_sync(model: torch.nn.Module, enabled: bool) -> Iterator[None]:
    """Skip the gradient all-reduce on all but the last micro-batch of an accumulated step."""
    if enabled:
        yield
    elif hasattr(model, "no_sync"):  # DDP
        with model.no_sync():
            yield
    elif hasattr(model, "set_requires_gradient_sync"):  # FSDP2
        model.set_requires_gradient_sync(False)
        try:
            yield
        finally:
            model.set_requires_gradient_sync(True)
    else:  # a single worker: nothing to sync
        yield


def describe(model: torch.nn.Module) -> dict[str, int | str]:
    """What the loop is really training: how the model is spread and how many layers are quantized."""
    from torch.distributed.tensor import DTensor

    params = list(model.parameters())
    layout = "fsdp" if any(isinstance(p, DTensor) for p in params) else "ddp" if hasattr(model, "no_sync") else "single"
    quantized = sum(type(m).__name__ in ("Linear4bit", "Linear8bitLt") for m in model.modules())
    return {"layout": layout, "quantized_layers": quantized}


def all_reduce(tensor: Any) -> Any:
    """Sum ``tensor`` over all workers in place (a no-op in a single process)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.all_reduce(tensor)
    return tensor
