"""A job's first step on a one-layer copy of its base, run as the job will run it on this GPU: the kernels the node
compiles ahead of the job (:mod:`ray_jobs.train.compile_ahead`).

Each of the step's kernels is keyed by one decoder layer's shapes and the rows a step runs, not by how many layers there
are. So a copy of the base with one decoder layer of random weights, quantized and adapted as the job does
(:func:`ray_jobs.train.model.adapt`) and stepped on packed rows of the job's shape compiles the job's kernels.

The rows a step runs are the job's memory plan's (:func:`ray_jobs.train.memory.plan`): the job plans from the GPU memory
left once its whole base is loaded, and runs fewer rows a piece where the spec's would not fit. A copy that compiled the
spec's micro-batch compiled the wrong shapes wherever the plan cut it: on an H100 80 GB the 7B preset runs its
micro-batch of 8 as 2 pieces of 4, and the job's first step compiled again, 27.5 s of warm-up against 5.8 s on an H200
(``bench/RESULTS.md``, 2026-12-06). The plan is a function of the model's shape, its trainable parameters and the free
memory; the copy has all three for one layer, and each grows by the same amount with every layer of the same kind
(:class:`JobForecast`). Measured on that H100: 62 GiB free after the 7B base with its FP8 weights, of 79.2 GiB.

What the forecast cannot see: memory another process holds when the job plans (the copy's has gone by then: the job
waits for it), the allocator's cache beyond the live tensors, and a cap the job sets on itself (``rayft train
--cap-gpu-memory``). A forecast that misses costs what no forecast cost: the job compiles its own shapes on its first
step.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

    from ray_jobs.train.memory import Plan
    from rayft_contract.records import ModelShape
    from rayft_contract.spec import FineTuneSpec


@dataclasses.dataclass(frozen=True)
class AheadReport:
    """What one run did, in seconds, and what torch's compile caches answered."""

    layers: int
    copy_s: float
    load_s: float
    step_s: tuple[float, ...]
    """Each step's forward and backward, the first with its compiles."""
    cache_hits: int
    cache_misses: int
    """inductor's FX graph cache, over the run: a job's first step after a copy's should miss nothing."""
    attention: str
    micro_batch: int
    """The rows each step ran: the job's memory plan's (:func:`ray_jobs.train.memory.fit_plan`), forecast for the copy."""
    plan: str
    """Why the plan cut the spec's micro-batch or turned gradient checkpointing on; empty where it did neither."""
    forecast_free_gib: float | None = None
    """The GPU memory the job will find free after its base's load, as forecast (``None``: the plan read this GPU's)."""

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))


def one_layer_copy(base_dir: str, into: Path, dtype: torch.dtype, device: torch.device) -> Path:
    """``base_dir``'s architecture with one decoder layer of random weights, saved in ``into`` (safetensors).

    Its embedding, head, norms and the layer's every matmul have the base's shapes; a 7B Llama's copy is 0.5B
    parameters (0.9 GB in bf16), built on ``device``."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(base_dir)
    config.num_hidden_layers = 1
    if isinstance(getattr(config, "layer_types", None), list):  # per-layer attention kinds (Gemma, Qwen3): the first
        config.layer_types = config.layer_types[:1]
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    model.save_pretrained(into)
    del model
    return into


@dataclasses.dataclass(frozen=True)
class AdaptedCopy:
    """The one-layer copy (or the base itself, ``whole``) loaded and adapted as the job will be, its micro-batch planned."""

    spec: FineTuneSpec
    """The spec the copy was loaded from (``model.path`` the copy's)."""
    base: torch.nn.Module
    model: torch.nn.Module
    """``base`` adapted: the job's kernels, LoRA and FP8."""
    chosen: Plan
    rows: int
    """The rows a piece the job will run: the spec's micro-batch, cut by ``chosen`` (:class:`MicroBatches`)."""
    forecast_free_gib: float | None
    copy_s: float
    copied_at: float
    """``time.perf_counter()`` once the copy was written, before its load."""


@contextlib.contextmanager
def adapted_copy(
    spec: FineTuneSpec, device: torch.device, *, whole: bool = False, usable_bytes: float | None = None
) -> Iterator[AdaptedCopy]:
    """``spec``'s base as one decoder layer of random weights (the base itself if ``whole``), loaded and adapted as the job
    does, and its micro-batch planned as the job will plan it on this GPU, from :class:`JobForecast` (``usable_bytes``: the
    job's usable memory, the GPU's unless given, which on CPU it must be for a plan; ``whole`` plans from the GPU's free
    memory, as the job does). The copy's files are removed when the block ends."""
    from ray_jobs.cache.models import fetch_model
    from ray_jobs.train.memory import MicroBatches, fit_plan
    from ray_jobs.train.model import adapt, load_base_from, torch_dtype
    from ray_jobs.train.strategy import Single

    with tempfile.TemporaryDirectory(prefix="rayft-ahead-") as scratch:
        started = time.perf_counter()
        forecast, job_layers = None, None
        if not whole:
            local = fetch_model(spec.model.path, spec.model.revision, count_hit=False).path
            job_layers = json.loads((Path(local) / "config.json").read_text()).get("num_hidden_layers")
            copy = one_layer_copy(str(local), Path(scratch), torch_dtype(spec.model.dtype), device)
            spec = spec.replace(
                model=dataclasses.replace(spec.model, path=str(copy), revision=None),
                quantization=dataclasses.replace(spec.quantization, cache=False),  # a copy is never kept as a base
            )
        copied = time.perf_counter()
        base = load_base_from(spec, device, Single()).model
        if isinstance(job_layers, int) and (device.type == "cuda" or usable_bytes is not None):
            forecast = JobForecast.on(base, job_layers, device, usable_bytes)
        adapted = adapt(base, spec, device, world=1, forecast=forecast)
        chosen = fit_plan(spec, adapted.shape, adapted.trainable, device, 1, forecast)
        foreseen = round(forecast(adapted.shape, adapted.trainable)[2] / 2**30, 2) if forecast else None
        micro = MicroBatches(spec.train.micro_batch_size, world=1)
        micro.follow(chosen)  # the job's pieces, as its loop runs them
        yield AdaptedCopy(spec, base, adapted.model, chosen, micro.running, foreseen, round(copied - started, 3), copied)


def first_steps(
    spec: FineTuneSpec, device: torch.device, *, whole: bool = False, steps: int = 1, usable_bytes: float | None = None
) -> AheadReport:
    """Load ``spec``'s base (its one-layer copy unless ``whole``) as the job does, adapt it, plan its micro-batch
    (:func:`adapted_copy`), and run ``steps`` forward and backward passes of the planned rows under the job's autocast."""
    import torch
    from torch._dynamo.utils import counters

    from ray_jobs.data.packing import rows_of_job_shape
    from ray_jobs.train.attention_mask import model_inputs
    from ray_jobs.train.model import autocast, checkpoint_activations, compile_layers, keep_compiled_kernels, set_numerics

    keep_compiled_kernels()
    set_numerics()  # the job's: torch keys the kernels by them
    with adapted_copy(spec, device, whole=whole, usable_bytes=usable_bytes) as copy:
        model = copy.model
        if copy.spec.train.gradient_checkpointing or copy.chosen.gradient_checkpointing:
            checkpoint_activations(model)
        if copy.spec.model.compile:
            compile_layers(model)
        model.train()
        loaded = time.perf_counter()
        attention = copy.base.config._attn_implementation
        batch = rows_of_job_shape(copy.spec, copy.base.config.vocab_size, attention, device, copy.rows)
        timings = []
        for _ in range(steps):
            began = time.perf_counter()
            with autocast(copy.spec, device):
                count = torch.tensor(batch["labels"].numel(), device=device)
                out = model(**model_inputs(batch, attention), num_items_in_batch=count, use_cache=False)
            out.loss.backward()
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            timings.append(round(time.perf_counter() - began, 3))
        layers = copy.base.config.num_hidden_layers
    inductor = counters["inductor"]
    return AheadReport(
        layers=layers,
        copy_s=copy.copy_s,
        load_s=round(loaded - copy.copied_at, 3),
        step_s=tuple(timings),
        cache_hits=int(inductor["fxgraph_cache_hit"]),
        cache_misses=int(inductor["fxgraph_cache_miss"]),
        attention=attention,
        micro_batch=copy.rows,
        plan=copy.chosen.reason,
        forecast_free_gib=copy.forecast_free_gib,
    )


def job_rows(spec: FineTuneSpec, device: torch.device, usable_bytes: float | None = None) -> tuple[int, str]:
    """The rows a piece ``spec``'s job will run on this GPU, and why (empty: the spec's micro-batch), planned on its
    one-layer copy: for a warm worker (:func:`ray_jobs.train.held.hold_base`) to compile the job's attention at the
    shapes the job will run. A worker that compiled them at the spec's 8 rows where an H100 80 GB job then ran pieces
    of 4 took 16.7 s for the job's first step, against 5.7 s on Ray Train (``bench/RESULTS.md``, 2026-12-06): dynamo,
    seeing a second batch size, compiled the attention again for sizes of any value, which no cache held.

    The copy is adapted without the job's kernels: Liger patches transformers' modules for the whole process, and a
    warm worker's process keeps nothing of a job's for the next (:mod:`ray_jobs.warm.pool`). The plan does not depend on
    them. Its memory is freed before this returns. ``usable_bytes``: as :func:`adapted_copy`'s."""
    import gc

    import torch

    plain = spec.replace(model=dataclasses.replace(spec.model, kernels="none", compile=False))
    with adapted_copy(plain, device, usable_bytes=usable_bytes) as copy:
        planned = copy.rows, copy.chosen.reason
    del copy  # the last reference to the copy's model
    gc.collect()  # PEFT's model holds cycles; its GPU memory goes back to the allocator only once collected
    if device.type == "cuda":
        torch.cuda.empty_cache()  # and back to the GPU, whose free memory the job's plan reads
    return planned


CONTEXT_BYTES = 0.6 * 2**30
"""GPU memory a process holds beyond its tensors: its CUDA context with cuBLAS's and the allocator's bookkeeping (about
500 MB on an H200, ``ray_jobs.node_gpus``), and a margin for the allocator's cache."""


@dataclasses.dataclass(frozen=True)
class JobForecast:
    """Called as :func:`ray_jobs.train.memory.fit_plan` and :func:`ray_jobs.train.memory.fp8_cost_here` call theirs: from
    the copy's ``(shape, trainable)`` at that moment, the job's ``(shape, trainable, free bytes)`` at the same moment of
    its own set-up."""

    layers: int
    """The job's base's decoder layers."""
    copy: torch.nn.Module
    """The copy's base (LoRA and FP8 change its modules in place, so it stays the model that is adapted)."""
    usable_bytes: float
    """What the job's process may hold on its GPU: the GPU's memory less :data:`CONTEXT_BYTES`."""
    allocated: Callable[[], float]
    """The bytes the copy's tensors hold now: ``torch.cuda.memory_allocated`` on a GPU."""

    @classmethod
    def on(
        cls, copy: torch.nn.Module, layers: int, device: torch.device, usable_bytes: float | None = None
    ) -> JobForecast | None:
        """The forecast for a job of ``layers`` decoder layers from ``copy`` loaded on ``device``; ``None`` for a model
        with no decoder layers to grow by (``ray_jobs.train.strategy.decoder_layers``): the copy then steps the spec's
        micro-batch. ``usable_bytes``: the GPU's memory less :data:`CONTEXT_BYTES` unless given (on CPU, the tests, it
        must be, and the copy's parameters and buffers stand for what the allocator would count)."""
        import torch

        from ray_jobs.train.strategy import decoder_layers

        if not decoder_layers(copy):
            return None
        if device.type == "cuda":
            usable = torch.cuda.mem_get_info(device)[1] - CONTEXT_BYTES if usable_bytes is None else usable_bytes
            return cls(layers, copy, usable, lambda: float(torch.cuda.memory_allocated(device)))
        if usable_bytes is None:
            raise ValueError("a forecast off the GPU needs usable_bytes: there is no GPU memory to read")
        return cls(layers, copy, usable_bytes, lambda: float(tensor_bytes(copy.parameters(), copy.buffers())))

    def __call__(self, shape: ModelShape, trainable: int) -> tuple[ModelShape, int, float]:
        from ray_jobs.observe.profile import matmul_params
        from ray_jobs.train.strategy import decoder_layers

        layer, more = decoder_layers(self.copy)[0], self.layers - shape.layers
        matmuls, trainable_matmuls = matmul_params(layer)
        inside = {id(t) for t in (*layer.parameters(), *layer.buffers())}
        outside = tensor_bytes(
            (p for p in self.copy.parameters() if id(p) not in inside), (b for b in self.copy.buffers() if id(b) not in inside)
        )
        job_bytes = outside + self.layers * (self.allocated() - outside)  # the layer's share: all the copy holds but those
        job = dataclasses.replace(
            shape,
            matmul_params=shape.matmul_params + more * matmuls,
            trainable_matmul_params=shape.trainable_matmul_params + more * trainable_matmuls,
            layers=self.layers,
        )
        return (
            job,
            trainable + more * sum(p.numel() for p in layer.parameters() if p.requires_grad),
            self.usable_bytes - job_bytes,
        )


def tensor_bytes(*groups: object) -> int:
    """The bytes of the distinct storages among ``groups`` of tensors (a tied embedding and head count once)."""
    seen: dict[int, int] = {}
    for group in groups:
        for tensor in group:  # type: ignore[attr-defined]
            storage = tensor.untyped_storage()
            seen[storage.data_ptr()] = storage.nbytes()
    return sum(seen.values())
