"""How the model is spread over the Ray Train workers, behind one interface the loop never looks past.

A :class:`Strategy` owns everything that differs between running alone, under DDP and under FSDP2:
how the model is wrapped, how gradient sync is skipped on accumulation micro-batches, backward, the
optimizer step, the full state dict a checkpoint saves and loads, and the dtype 4-bit weights are
stored in. The loop, the checkpoint module and the model loader ask the strategy; none of them asks
which one it is (the seam litgpt's Fabric strategies draw). A new one (DeepSpeed, tensor parallel) is
one more class with these methods, found by :func:`for_spec`.

- :class:`Single`: one worker, nothing to synchronise.
- :class:`DDP`: replicates the (quantized) base on every worker and all-reduces only the LoRA
  gradients. The right choice whenever the base fits one GPU, which a 4-bit 70B nearly does on an H200.
- :class:`FSDP2`: shards parameters with ``fully_shard``, one unit per decoder layer, then the root.
  For QLoRA the 4-bit weights are stored in the compute dtype (``bnb_4bit_quant_storage``) so each
  unit's flat shard has one dtype.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import torch

    from rayft_contract.spec import FineTuneSpec


class Strategy(Protocol):
    name: str
    """``single``, ``ddp`` or ``fsdp``: what the summary reports as the layout."""
    one_rank_runs: bool
    """One rank can run the model alone (to generate eval samples); not under FSDP2, where every forward is
    a collective."""

    def quant_storage(self, compute_dtype: torch.dtype) -> torch.dtype:
        """The dtype bitsandbytes stores 4-bit weights in."""

    def wrap(self, model: torch.nn.Module) -> torch.nn.Module:
        """The model ready for this strategy (after LoRA is applied)."""

    def unwrap(self, model: torch.nn.Module) -> torch.nn.Module:
        """The PEFT model inside whatever :meth:`wrap` returned (to save the adapter)."""

    def grad_sync(self, model: torch.nn.Module, enabled: bool) -> contextlib.AbstractContextManager[None]:
        """Run a micro-batch with (``enabled``) or without the gradient all-reduce."""

    def backward(self, loss: torch.Tensor) -> None: ...

    def step(self, optimizer: Any, scheduler: Any, params: list[torch.nn.Parameter], max_grad_norm: float | None) -> None:
        """Clip, step the optimizer and the schedule, zero the gradients."""

    def state_dict(self, model: torch.nn.Module, optimizer: Any) -> tuple[dict[str, Any], dict[str, Any]]:
        """Full (unsharded) trainable weights and optimizer state, on the CPU; collective."""

    def weights(self, model: torch.nn.Module) -> dict[str, Any]:
        """Full trainable weights on the CPU, without the optimizer state (twice the weights in AdamW); collective."""

    def load_state_dict(self, model: torch.nn.Module, optimizer: Any, weights: dict[str, Any], optim: dict[str, Any]) -> None:
        """Put saved weights and optimizer state back in place (sharding them again if needed)."""


def for_spec(spec: FineTuneSpec, world_size: int) -> Strategy:
    """The strategy ``scaling.strategy`` names, or :class:`Single` for one worker."""
    if world_size == 1:
        return Single()
    return {"ddp": DDP, "fsdp": FSDP2}[spec.scaling.strategy]()


class _Torch:
    """What every strategy here does the same way, through PyTorch's own calls: backward, the step, and state dicts
    through ``torch.distributed.checkpoint``, which take whole tensors under :class:`Single` and :class:`DDP` and,
    under :class:`FSDP2`, gather the shards (``clip_grad_norm_`` reduces over them, ``set_state_dict`` shards them
    again). 4-bit weights keep bitsandbytes' own storage unless a strategy says otherwise."""

    def quant_storage(self, compute_dtype: torch.dtype) -> torch.dtype:
        import torch

        return torch.uint8

    def backward(self, loss: torch.Tensor) -> None:
        loss.backward()

    def step(self, optimizer: Any, scheduler: Any, params: list[torch.nn.Parameter], max_grad_norm: float | None) -> None:
        _step(optimizer, scheduler, params, max_grad_norm)

    def state_dict(self, model: torch.nn.Module, optimizer: Any) -> tuple[dict[str, Any], dict[str, Any]]:
        return _full_state_dict(model, optimizer)

    def weights(self, model: torch.nn.Module) -> dict[str, Any]:
        return _full_weights(model)

    def load_state_dict(self, model: torch.nn.Module, optimizer: Any, weights: dict[str, Any], optim: dict[str, Any]) -> None:
        _set_full_state_dict(model, optimizer, weights, optim)


class Single(_Torch):
    name = "single"
    one_rank_runs = True

    def wrap(self, model: torch.nn.Module) -> torch.nn.Module:
        return model

    def unwrap(self, model: torch.nn.Module) -> torch.nn.Module:
        return model

    @contextlib.contextmanager
    def grad_sync(self, model: torch.nn.Module, enabled: bool) -> Iterator[None]:
        yield  # nothing to synchronise


class DDP(_Torch):
    name = "ddp"
    one_rank_runs = True

    def wrap(self, model: torch.nn.Module) -> torch.nn.Module:
        import ray.train.torch

        return ray.train.torch.prepare_model(model, move_to_device=False, parallel_strategy="ddp")

    def unwrap(self, model: torch.nn.Module) -> torch.nn.Module:
        return model.module

    @contextlib.contextmanager
    def grad_sync(self, model: torch.nn.Module, enabled: bool) -> Iterator[None]:
        with contextlib.nullcontext() if enabled else model.no_sync():
            yield


class FSDP2(_Torch):
    name = "fsdp"
    one_rank_runs = False

    def quant_storage(self, compute_dtype: torch.dtype) -> torch.dtype:
        return compute_dtype  # FSDP shards flat parameters of one dtype

    def wrap(self, model: torch.nn.Module) -> torch.nn.Module:
        from torch.distributed.fsdp import fully_shard

        layers = decoder_layers(model)
        if not layers:
            raise ValueError("scaling.strategy: fsdp needs a model with a `layers` ModuleList of decoder blocks")
        for layer in layers:
            fully_shard(layer)
        fully_shard(model)
        return model

    def unwrap(self, model: torch.nn.Module) -> torch.nn.Module:
        return model  # FSDP2 shards the model in place

    @contextlib.contextmanager
    def grad_sync(self, model: torch.nn.Module, enabled: bool) -> Iterator[None]:
        if enabled:
            yield
            return
        model.set_requires_gradient_sync(False)
        try:
            yield
        finally:
            model.set_requires_gradient_sync(True)


def decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The repeated transformer blocks (``...model.layers`` in Llama-like models); empty for a model built otherwise,
    which each caller refuses in its own words."""
    import torch

    for module in model.modules():
        layers = getattr(module, "layers", None)
        if isinstance(layers, torch.nn.ModuleList) and len(layers) > 0:
            return list(layers)
    return []


def describe(model: torch.nn.Module, strategy: Strategy) -> dict[str, int | str]:
    """What the loop is really training: how the model is spread and how many layers are quantized."""
    quantized = sum(type(m).__name__ in ("Linear4bit", "Linear8bitLt") for m in model.modules())
    return {"layout": strategy.name, "quantized_layers": quantized}


def all_reduce(tensor: Any, op: str = "SUM") -> Any:
    """Reduce ``tensor`` over all workers in place (``op``: a ``torch.distributed.ReduceOp`` name; a no-op in a
    single process)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.all_reduce(tensor, op=getattr(dist.ReduceOp, op))
    return tensor


def _step(optimizer: Any, scheduler: Any, params: list[torch.nn.Parameter], max_grad_norm: float | None) -> None:
    import torch

    if max_grad_norm:
        torch.nn.utils.clip_grad_norm_(params, max_grad_norm)
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad(set_to_none=True)


def _options(**kwargs: Any) -> Any:
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(full_state_dict=True, ignore_frozen_params=True, **kwargs)


def _full_state_dict(model: torch.nn.Module, optimizer: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    from torch.distributed.checkpoint.state_dict import get_state_dict

    with _frozen_leaves_say_nothing_more(model):
        return get_state_dict(model, optimizer, options=_options(cpu_offload=True))


def _full_weights(model: torch.nn.Module) -> dict[str, Any]:
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    with _frozen_leaves_say_nothing_more(model):
        return get_model_state_dict(model, options=_options(cpu_offload=True))


@contextlib.contextmanager
def _frozen_leaves_say_nothing_more(model: torch.nn.Module) -> Iterator[None]:
    """While inside, a leaf module whose parameters are all frozen puts only its parameters in a state dict, for
    ``ignore_frozen_params`` to drop.

    Why: that option drops frozen parameters, not what a module adds beside them. Each NF4 ``Linear4bit`` adds five
    entries of its weight's quantization state (absmax, quant_map, their nested pair, the packed state), so a
    checkpoint and a best-adapter snapshot carried the whole base's: 560 entries beside 224 trainable ones for a
    16-layer model here, and 1,120 for the 7B preset, each a copy to the CPU of its own. ``get_state_dict`` took
    0.30 s for that 16-layer NF4 model on this 2-core CPU, and the trainable tensors alone 0.01 s. A resume reads the
    base's quantization state from the base, as it always did (``strict=False``)."""
    handles = []
    for module in model.modules():
        own = dict(module.named_parameters(recurse=False))
        if own and next(module.children(), None) is None and not any(p.requires_grad for p in own.values()):
            handles.append(module.register_state_dict_post_hook(_parameters_alone))
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def _parameters_alone(module: torch.nn.Module, state_dict: dict[str, Any], prefix: str, local_metadata: Any) -> None:
    """A leaf's state-dict post-hook: its entries other than its parameters leave ``state_dict``."""
    names = dict(module.named_parameters(recurse=False))
    extra = []
    for key in reversed(state_dict):  # a leaf's entries are the last ones in: no child came after them
        if not key.startswith(prefix):
            break
        if key[len(prefix) :] not in names:
            extra.append(key)
    for key in extra:
        del state_dict[key]


def _set_full_state_dict(model: torch.nn.Module, optimizer: Any, weights: dict[str, Any], optim: dict[str, Any]) -> None:
    from torch.distributed.checkpoint.state_dict import set_state_dict

    set_state_dict(model, optimizer, model_state_dict=weights, optim_state_dict=optim, options=_options(strict=False))
