"""Loading the base model (bf16, or 4-bit/8-bit through bitsandbytes) and putting LoRA on top.

What is fast, measured on an H200 (``../shared/NOTES.md``): keep the frozen base in bf16 and the
LoRA weights in fp32, and run under bf16 autocast. PEFT's ``prepare_model_for_kbit_training``
upcasts norms and embeddings to fp32, which turns the whole residual stream fp32: 24% slower and
25% more memory, so rayft does not call it. bitsandbytes is imported wherever it is installed, quantized base or not:
PEFT's LoRA dispatch imports it (``peft.tuners.lora.model``), and so does ``ray_jobs.train.lora_fused``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
from typing import TYPE_CHECKING, Any

from rayft_contract.spec import FineTuneSpec, LoraSpec

if TYPE_CHECKING:
    import torch

    from ray_jobs.cache.quantized import Keeping
    from ray_jobs.train.kernels import KernelChoice
    from ray_jobs.train.memory import Forecast
    from ray_jobs.train.strategy import Strategy
    from rayft_contract.records import ModelShape

log = logging.getLogger(__name__)


def torch_dtype(name: str) -> torch.dtype:
    import torch

    return {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}[name]


def quantization_config(spec: FineTuneSpec, strategy: Strategy) -> Any:
    """``BitsAndBytesConfig`` for the spec, or ``None`` when the base stays unquantized."""
    q = spec.quantization
    if q.mode == "none":
        return None
    from transformers import BitsAndBytesConfig

    if q.mode == "int8":
        return BitsAndBytesConfig(load_in_8bit=True)
    dtype = torch_dtype(spec.model.dtype)
    return BitsAndBytesConfig(
        load_in_4bit=True,
        bnb_4bit_quant_type="nf4",
        bnb_4bit_use_double_quant=q.double_quant,
        bnb_4bit_compute_dtype=dtype,
        bnb_4bit_quant_storage=strategy.quant_storage(dtype),
    )


def attention_for(spec: FineTuneSpec, device_type: str) -> str:
    """The attention kernel for ``model.attn_implementation`` on a ``device_type`` worker (``auto`` resolved).

    ``auto`` takes ``flex_attention`` where it pays: on a CUDA GPU with packed rows. transformers builds every
    implementation's mask from the packed rows' ``position_ids`` (no token attends across examples); SDPA is given
    that mask whole and computes all of each 2,048-token row's causal square, while flex attention's block mask
    skips the blocks no example spans. On the 7B preset (H200, ``bench/RESULTS.md``) attention fell from 21% of
    the GPU's time to 8%. Without packing a row is one example and there is nothing to skip; on CPU flex attention
    has no backward."""
    setting = spec.model.attn_implementation
    if setting != "auto":
        return setting
    return "flex_attention" if device_type == "cuda" and spec.data.packing else "sdpa"


COMPILE_CACHE_ENV = "TORCHINDUCTOR_CACHE_DIR"
TRITON_CACHE_ENV = "TRITON_CACHE_DIR"


def keep_compiled_kernels(root: str | None = None) -> str | None:
    """Point torch's compile cache (inductor's) and Triton's (Liger's kernels, and inductor's own under it) at
    ``{root}/compile``, the node's rayft cache (``$RAYFT_CACHE_DIR``), unless the operator chose a directory; returns
    the directory used (``None``: torch's own, as under an ``s3://`` cache root, which compiled kernels cannot live in).

    Flex attention compiles its kernels in a job's first steps: 31-35 s of the 7B preset's first step on a node whose
    cache is empty (H200, ``bench/RESULTS.md``). torch's default, ``/tmp/torchinductor_$USER``, shares the node's
    scratch space; the rayft cache is where the operator keeps and sizes the node's caches (the cache volume on
    Kubernetes, ``k8s/``), and it lasts as long as that does. Only rayft's own job code writes there (a team's spec only
    names what is compiled, never the code), and torch keys each kernel by the graph and its inputs' shapes, so one
    job's kernels are another's hits.

    torch writes its default into ``TORCHINDUCTOR_CACHE_DIR`` the first time anything asks for the directory, and the
    training stack's imports (transformers, peft) do. A value equal to torch's default is therefore torch's, not the
    operator's, and is replaced; until 2026-12-04 it was taken for the operator's, and jobs kept their kernels in
    ``/tmp`` (found by ``bench/compile_ahead.sh``)."""
    import os

    from ray_jobs.cache import entries
    from ray_jobs.storage import location

    chosen = os.environ.get(COMPILE_CACHE_ENV)
    if chosen and chosen != _torch_default_dir():
        return chosen
    here = location(root or entries.default_root())
    if not here.is_local:
        return None
    kept = here.child("compile").path
    os.environ[COMPILE_CACHE_ENV] = kept
    os.environ.setdefault(TRITON_CACHE_ENV, os.path.join(kept, "triton"))
    return kept


def _torch_default_dir() -> str:
    """Where torch keeps compiled kernels when nobody chose: ``/tmp/torchinductor_$USER``."""
    import os

    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    return os.path.abspath(default_cache_dir())


def set_numerics() -> None:
    """The process-wide numerics every process that trains or compiles for a job runs under: TF32 matmuls on Ampere
    and newer. One call for the job's worker, the copy that compiles its kernels ahead (:mod:`ray_jobs.train.compile_ahead`)
    and a warm worker's :func:`hold_base`: torch keys every compiled kernel by them too (inductor's FX graph cache hashes
    ``torch.backends.cuda.matmul.fp32_precision``), and a copy compiled without them missed every kernel the 7B job then
    looked up (H200, ``bench/RESULTS.md``)."""
    import torch

    torch.set_float32_matmul_precision("high")


def load_base(spec: FineTuneSpec, device: torch.device, strategy: Strategy) -> torch.nn.Module:
    """The frozen base model, placed on ``device``, with the KV cache off (training)."""
    return load_base_from(spec, device, strategy).model


@dataclasses.dataclass(frozen=True)
class LoadedBase:
    model: torch.nn.Module
    quantized: str = ""
    """How a quantized base came to be (the summary's line, :meth:`quantized_line`): ``quantized``; ``read quantized
    from the node's cache``; ``quantized, then kept in the node's cache`` (``quantization.cache``,
    :mod:`ray_jobs.cache.quantized`). Empty for a base that is not quantized."""
    keeping: Keeping | None = None
    """The quantized base to keep in the node's cache, written beside the job once its loop starts it after the first
    step (:class:`ray_jobs.cache.quantized.Keeping`)."""
    held: bool = False
    """Loaded before the job, by the warm worker that runs it (:func:`ray_jobs.train.held.hold_base`)."""
    compiled_rows: int | None = None
    """The rows a piece for which that worker compiled flex attention's kernels (``held.compile_attention``)."""
    load_s: float | None = None
    """Seconds ``from_pretrained`` took: reading and quantizing the base, or reading it quantized. The summary's worker
    line gives them for a base loaded before the job, where the job waits on that load (:meth:`held_line`)."""

    def quantized_line(self, wait: bool = False) -> str:
        """:attr:`quantized`, once the base is kept or was not (``wait``: for as long as its write takes); while it is
        still being written, what it is so far."""
        if self.keeping is None:
            return self.quantized
        if not (wait or self.keeping.done()):
            return "quantized, being kept in the node's cache"
        try:
            kept = self.keeping.wait()
        except Exception as error:  # raised in the writer, logged there; the job runs on, and its summary says why
            return f"quantized; not kept in the node's cache: {error!r}"
        return f"quantized, then kept in the node's cache ({kept.bytes / 1e9:.1f} GB written in {kept.seconds} s beside the job)"

    def held_line(self, rows: int) -> str:
        """What the summary's worker line adds for a base loaded before the job that runs ``rows`` rows a piece."""
        if not self.held:
            return ""
        line = ", its base loaded before the job" + (f" ({self.load_s:.1f} s)" if self.load_s is not None else "")
        if self.compiled_rows is not None:
            line += f", its attention compiled for {self.compiled_rows} rows a piece"
            if self.compiled_rows != rows:
                line += f" where the job runs {rows}: its first step compiled them again, for any size"
        return line


def load_base_from(spec: FineTuneSpec, device: torch.device, strategy: Strategy, keep: bool = True) -> LoadedBase:
    """:func:`load_base`, saying how the quantized base came to be; torch's compile cache in the node's rayft cache
    (:func:`keep_compiled_kernels`). ``keep``: this worker may keep a base it quantizes in the node's cache
    (``quantization.cache``); the job's first worker on each node does, so that a node writes one copy, not one per
    GPU (3.9 GB for a 7B base)."""

    from ray_jobs.cache import quantized as quantized_cache
    from ray_jobs.cache.model_files import load_pretrained
    from ray_jobs.cache.models import fetch_model
    from ray_jobs.train import held

    keep_compiled_kernels()
    if (taken := held.take(spec, device, strategy)) is not None:
        return taken
    kwargs: dict[str, Any] = {
        "dtype": torch_dtype(spec.model.dtype),
        "attn_implementation": attention_for(spec, device.type),
        "device_map": {"": device},
    }
    # Each worker fetches on its own node (once per node); the driver counted the job's hit.
    local = fetch_model(spec.model.path, spec.model.revision, count_hit=False).path
    quant = quantization_config(spec, strategy)
    settings = cacheable_quantization(spec, quant)
    kept = quantized_cache.lookup(local, settings) if settings is not None else None
    began = time.perf_counter()
    if kept is not None:  # quantized as saved: its config.json holds the quantization
        model = load_pretrained(kept, spec.model.path, **kwargs)
    else:
        model = load_pretrained(local, spec.model.path, revision=spec.model.revision, quantization_config=quant, **kwargs)
    load_s = time.perf_counter() - began
    model.config.use_cache = False
    if kept is not None:
        return LoadedBase(model, "read quantized from the node's cache", load_s=load_s)
    if quant is None:
        return LoadedBase(model, load_s=load_s)
    keeping = quantized_cache.keep(model, local, settings) if settings is not None and keep else None
    return LoadedBase(model, "quantized", keeping=keeping, load_s=load_s)


def cacheable_quantization(spec: FineTuneSpec, quant: Any) -> dict[str, Any] | None:
    """What keys a quantized base in the node's cache, or ``None`` where it is not kept: ``quantization.cache`` off,
    a base not in NF4, or 4-bit weights stored in another dtype than bytes (FSDP shards them in the compute dtype)."""
    import torch

    if not spec.quantization.cache or quant is None or spec.quantization.mode != "nf4":
        return None
    if quant.bnb_4bit_quant_storage != torch.uint8:
        return None
    return {"mode": "nf4", "double_quant": spec.quantization.double_quant, "compute_dtype": spec.model.dtype}


def apply_lora(model: torch.nn.Module, spec: FineTuneSpec, fp8: bool = False) -> torch.nn.Module:
    """Wrap ``model`` in a PEFT LoRA model whose trainable weights are fp32; ``fp8``: the base layers' matmuls in FP8
    (``quantization.fp8`` where the device has FP8 tensor cores)."""
    import torch
    from peft import LoraConfig, get_peft_model

    lora = spec.lora
    targets: Any = "all-linear" if lora.target_modules == ("all-linear",) else list(lora.target_modules)
    config = LoraConfig(
        r=lora.r,
        lora_alpha=lora.alpha,
        lora_dropout=lora.dropout,
        target_modules=targets,
        modules_to_save=list(lora.modules_to_save) or None,
        task_type="CAUSAL_LM",
    )
    torch.manual_seed(spec.train.seed)
    model = get_peft_model(model, config)
    for param in model.parameters():
        if param.requires_grad:
            param.data = param.data.float()
    if lora.fused:
        from ray_jobs.train.lora_fused import fuse

        fuse(model, fp8)
    if spec.train.gradient_checkpointing:
        checkpoint_activations(model)
    return model


@dataclasses.dataclass(frozen=True)
class Adapted:
    """A base with the job's kernels, LoRA and FP8 on it (:func:`adapt`), and what the summary says of them."""

    model: torch.nn.Module
    kernels: KernelChoice
    trainable: int
    total: int
    shape: ModelShape
    fp8: str
    """The summary's FP8 words (on, or off and why); empty where the spec asks for none."""


def adapt(
    base: torch.nn.Module, spec: FineTuneSpec, device: torch.device, world: int, forecast: Forecast | None = None
) -> Adapted:
    """The job's kernels (Liger patches the base's own modules, so before LoRA), its LoRA and FP8 (collective on GPU).
    One function for the job's set-up and the one-layer first step of :mod:`ray_jobs.train.compile_ahead`: what that step
    compiles is what the job's will look up. ``forecast``: the copy's forecast of the job's memory
    (:class:`ray_jobs.train.one_layer.JobForecast`), which FP8's choice reads in place of this GPU's."""
    from ray_jobs.observe.profile import model_shape
    from ray_jobs.train import fp8, kernels

    fused = kernels.choose(spec, device.type, base.config.model_type)
    kernels.apply(base, fused)
    model = apply_lora(base, spec)
    trainable, total = count_parameters(model)
    shape = model_shape(model, spec.train.gradient_checkpointing)
    line = fp8.enable(model, spec, shape, trainable, device, world, forecast) if spec.quantization.fp8 else ""
    return Adapted(model, fused, trainable, total, shape, line)


def checkpoint_activations(model: torch.nn.Module) -> None:
    """Gradient checkpointing on the PEFT model (non-reentrant; the inputs require grad, or the frozen
    base's first layer would cut the graph)."""
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.enable_input_require_grads()


def compile_layers(model: torch.nn.Module, backend: str = "inductor") -> int:
    """``torch.compile`` each decoder layer in place (``model.compile``); returns how many.

    Per layer, not the whole model: the layers are one code object, so dynamo compiles one graph and every layer
    reuses it, and what runs around them (the packed rows' attention mask, the loss) stays eager. Before the
    strategy wraps the model (torchtitan's order: compile the blocks, then shard them). A part dynamo may not
    trace breaks the graph there and runs eagerly: slower, never wrong (on the H200 only Liger's RoPE did, which
    Liger keeps out of compilation; bitsandbytes' matmuls were traced). Measured there: no gain with Liger on."""
    from ray_jobs.train.strategy import decoder_layers

    layers = decoder_layers(model)
    if not layers:
        raise ValueError(
            "model.compile compiles each decoder layer, and this model has no `layers` ModuleList: set model.compile: false"
        )
    for layer in layers:
        layer.compile(backend=backend)
    return len(layers)


def autocast(spec: FineTuneSpec, device: torch.device) -> contextlib.AbstractContextManager:
    """bf16/fp16 autocast matching the base dtype; nothing for fp32 bases."""
    import torch

    dtype = torch_dtype(spec.model.dtype)
    if dtype == torch.float32:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)


def count_parameters(model: torch.nn.Module) -> tuple[int, int]:
    """``(trainable, total)`` parameter counts; 4-bit weights count as their unpacked size."""
    trainable = total = 0
    for param in model.parameters():
        n = param.numel() * (2 if param.dtype.itemsize == 1 and hasattr(param, "quant_state") else 1)
        total += n
        trainable += n if param.requires_grad else 0
    return trainable, total


def serving_notes(lora: LoraSpec) -> tuple[str, ...]:
    """What keeps the adapter from loading as it is where adapters are served.

    vLLM loads LoRA adapters only without ``modules_to_save``: it refuses one that has them ("vLLM only
    supports modules_to_save being None", vLLM 0.10; earlier, "lm_head.weight is unsupported LoRA weight").
    PEFT and ``rayft generate`` load it; the merged model (``rayft merge``) serves anywhere."""
    if not lora.modules_to_save:
        return ()
    return (
        f"lora.modules_to_save ({', '.join(lora.modules_to_save)}) makes an adapter vLLM refuses to load: serve the "
        "merged model (rayft merge RUN), or train without lora.modules_to_save",
    )
