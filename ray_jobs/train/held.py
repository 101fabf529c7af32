"""A base loaded before its job, by a warm worker (:mod:`ray_jobs.warm.pool`): what the next job with the same base takes
in place of reading and quantizing it, with its attention and FP8 kernels compiled at the shapes that job will run.

A warm worker runs one job and is stopped, so what it holds here serves that job or none: the job takes it in
:func:`ray_jobs.train.model.load_base_from` (:func:`take`), which drops any other first.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import TYPE_CHECKING

from ray_jobs.train.model import LoadedBase, attention_for, autocast, load_base_from, set_numerics

if TYPE_CHECKING:
    import torch

    from ray_jobs.train.strategy import Strategy
    from rayft_contract.spec import FineTuneSpec

log = logging.getLogger(__name__)

_held: dict[str, LoadedBase] = {}
"""The base a warm worker loaded before its job came, by :func:`held_key`; the job takes it, or it is dropped."""


def held_key(spec: FineTuneSpec, device: torch.device) -> str | None:
    """What a held base must match to serve a job: the base's files (names, sizes, mtimes), its dtype, attention
    kernel and quantization. ``None`` for a base in ``s3://``: it is read with the job's team's own keys."""
    from ray_jobs.cache import quantized as quantized_cache
    from ray_jobs.cache.models import fetch_model

    if spec.model.path.startswith("s3://"):
        return None
    local = fetch_model(spec.model.path, spec.model.revision, count_hit=False).path
    settings = {"dtype": spec.model.dtype, "attention": attention_for(spec, device.type), **dataclasses.asdict(spec.quantization)}
    return quantized_cache.key(local, settings)


def hold_base(spec: FineTuneSpec, device: torch.device, compile: bool = True) -> None:
    """Load ``spec``'s base now, on a warm worker before its job (``ray_jobs.warm.pool``): the next job with the same
    base (:func:`held_key`) takes it in :func:`ray_jobs.train.model.load_base_from` instead of reading and quantizing it again.
    ``compile=False`` for the job's own early worker (``ray_jobs.warm.early``), which runs only where the node has
    the job's kernels: there these compiles cost 7.6-9.6 s more on the H200 than they saved the first step. (That was
    measured before a warm worker imported Liger's ``monkey_patch`` ahead, whose later import made the job compile
    again anyway: :data:`ray_jobs.warm.pool.WARM_IMPORTS`. Not measured since.)"""
    from ray_jobs.train.strategy import Single

    key = held_key(spec, device)
    if key is None:
        return
    set_numerics()  # before the compiles below, whose kernels the job looks up under its own numerics
    rows = None
    if compile and compiles_attention(spec, device):
        from ray_jobs.train.one_layer import job_rows

        # Planned before the base is loaded: the copy's load would drop a held base (take), and the forecast counts
        # only what the copy holds.
        rows, why = job_rows(spec, device)
        log.info("warm worker: attention to compile for %d rows a piece (%s)", rows, why or "train.micro_batch_size")
    _held[key] = loaded = load_base_from(spec, device, Single())
    if rows is not None:
        compile_attention(spec, loaded.model, device, rows)
        _held[key] = dataclasses.replace(loaded, compiled_rows=rows)
    if compile and spec.quantization.fp8:  # its row scaling's compile and cuBLASLt's first FP8 call, out of the first step
        from ray_jobs.train import fp8

        config = loaded.model.config
        fp8.warm_up(device, (config.hidden_size, config.intermediate_size))


def compiles_attention(spec: FineTuneSpec, device: torch.device) -> bool:
    """Whether a warm worker compiles the job's attention ahead: flex attention's, on a GPU (on CPU it has no backward)."""
    return device.type == "cuda" and attention_for(spec, device.type) == "flex_attention"


def compile_attention(spec: FineTuneSpec, model: torch.nn.Module, device: torch.device, rows: int | None = None) -> None:
    """One forward and backward of the base's decoder on packed rows of the job's shape (``rows`` a piece, the spec's
    micro-batch unless given, x max_seq_len, two examples a row), so that flex attention's kernels, forward and
    backward, are compiled in this process (or read from the node's compile cache) before the job comes. The job's
    first step on a warm worker took 6.3 s against a steady 3.7 (H200). Liger and LoRA, applied by the job, leave the
    attention call as it is."""
    import torch

    from ray_jobs.data.packing import rows_of_job_shape
    from ray_jobs.train.attention_mask import mask_for

    batch = rows_of_job_shape(spec, model.config.vocab_size, model.config._attn_implementation, device, rows)
    ids, positions = batch["input_ids"], batch["position_ids"]
    trainable = [p for p in model.parameters() if p.requires_grad]
    model.requires_grad_(False)  # the gradient goes to the inputs alone: no weight keeps one
    try:
        embeds = model.get_input_embeddings()(ids).detach().requires_grad_()
        with autocast(spec, device):
            mask = mask_for(positions, model.config._attn_implementation)
            decoder = getattr(model, model.base_model_prefix)
            hidden = decoder(inputs_embeds=embeds, position_ids=positions, attention_mask=mask).last_hidden_state
        hidden.float().mean().backward()
    finally:
        for param in trainable:
            param.requires_grad_(True)
    if device.type == "cuda":
        torch.cuda.empty_cache()


def take(spec: FineTuneSpec, device: torch.device, strategy: Strategy) -> LoadedBase | None:
    """The held base if it is this job's (``None`` if none is); any other is dropped first, for the memory the job's own
    base needs."""
    import gc

    import torch

    if not _held:
        return None
    held = _held.pop(held_key(spec, device) or "", None) if strategy.name == "single" else None
    if _held:
        _held.clear()
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    return dataclasses.replace(held, held=True) if held is not None else None
