"""Where a job's time went, and how much of the GPU it used: the phase table, throughput and MFU.

The driver times its own phases (connect, model fetch, data preparation, export) and folds in what
the workers report (``setup`` timings, then one record per step from ``ray_jobs.observe.metrics``). The
phase table adds up to the job's wall time by construction: whatever no phase covers is "other".

**Warm-up.** Leading steps whose compute time is over 1.5x the steady median (the median of the
second half of the run), and over the slowest tenth of the second half, are warm-up: compilation,
autotuning, allocator growth. They get their own row, and steady-state figures exclude them. The
second condition judges the run against its own noise: on a busy machine steps vary, and an early
step no slower than the run's own slow steps is noise, not warm-up.

**FLOPs** (per trained, non-padding token; N = parameters of every matmul, the LM head included and
embeddings excluded; N_lora = the trainable LoRA matmul parameters; L layers; d = heads x head dim;
c = the token's causal context, its position in its example + 1)::

    LoRA on a frozen base:  2N (forward) + 2N (backward, activation gradients only)
                            + 2 N_lora (LoRA weight gradients) + 12 L d c (attention: 4 L d c forward, twice that backward)

Gradient checkpointing recomputes the forward (2N + 4 L d c more); that work is counted only in
HFU (hardware FLOPs utilization), never in MFU. MFU = model FLOPs per second / (peak dense bf16
FLOPs of one GPU x GPUs). Padding does no useful work, so it is not counted.
"""

from __future__ import annotations

import contextlib
import os
import statistics
import time
from collections.abc import Iterator
from typing import Any

from rayft_contract.data_records import FillTimes
from rayft_contract.phases import STEP_PHASES, Phase
from rayft_contract.records import Efficiency, ModelShape, Progress, RunFacts, SetupTimes, StepRecord

PEAK_BF16_FLOPS = {
    "H200": 989.4e12,
    "H100 PCIe": 756.0e12,
    "H100": 989.4e12,
    "A100": 312.0e12,
    "L40S": 362.1e12,
    "L4": 121.0e12,
    "A10G": 70.0e12,
    "RTX 4090": 165.2e12,
}
"""Dense (no sparsity) bf16 tensor-core peaks from NVIDIA's datasheets, by device-name substring
(first match wins). Set ``RAYFT_PEAK_TFLOPS`` for a GPU not listed here."""
WARMUP_RATIO = 1.5


def peak_flops(device: Any) -> float | None:
    """Peak dense bf16 FLOPs of ``device`` (None on CPU or an unknown GPU)."""
    if os.environ.get("RAYFT_PEAK_TFLOPS"):
        return float(os.environ["RAYFT_PEAK_TFLOPS"]) * 1e12
    if getattr(device, "type", "cpu") != "cuda":
        return None
    import torch

    name = torch.cuda.get_device_name(device)
    return next((peak for key, peak in PEAK_BF16_FLOPS.items() if key in name), None)


def model_shape(model: Any, gradient_checkpointing: bool = False) -> ModelShape:
    """What the FLOPs formula needs, read from the (PEFT) model before it is wrapped."""
    total, trainable = matmul_params(model)
    config = model.config
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return ModelShape(
        matmul_params=total,
        trainable_matmul_params=trainable,
        layers=config.num_hidden_layers,
        attn_dim=config.num_attention_heads * head_dim,
        gradient_checkpointing=gradient_checkpointing,
    )


def matmul_params(module: Any) -> tuple[int, int]:
    """``(all, trainable)`` weights of the matmuls in ``module`` (a model or one of its layers)."""
    frozen = trainable = 0
    for name, leaf in module.named_modules():
        if list(leaf.children()) or not hasattr(leaf, "in_features") or "original_module" in name:
            continue  # leaf matmuls only (LoRA A/B included); PEFT keeps an unused copy of modules_to_save
        size = leaf.in_features * leaf.out_features
        if getattr(leaf, "weight", None) is not None and leaf.weight.requires_grad:
            trainable += size
        else:
            frozen += size
    return frozen + trainable, trainable


def step_flops(shape: ModelShape, tokens: float, attn_ctx: float) -> tuple[float, float]:
    """(model FLOPs, hardware FLOPs) of a step that trained ``tokens`` with ``attn_ctx`` total context."""
    n, lora, ld = shape.matmul_params, shape.trainable_matmul_params, shape.layers * shape.attn_dim
    model = (4 * n + 2 * lora) * tokens + 12 * ld * attn_ctx
    recompute = (2 * n * tokens + 4 * ld * attn_ctx) if shape.gradient_checkpointing else 0.0
    return model, model + recompute


class JobProfile:
    """Collects the driver's phases and the workers' reports; answers with the table and the figures."""

    def __init__(self, start: float):
        self.start = start
        """Driver ``time.time()`` at job start."""
        self.driver: dict[str, float] = {}
        self.fit_start: float | None = None
        self.fit_end: float | None = None
        self.setup: SetupTimes | None = None
        self.steps: list[StepRecord] = []
        self.facts = RunFacts()
        self.total_steps: int | None = None
        """The run's last step, once a report has said how many there are."""
        self.gpu_mem_peak_gb: float | None = None
        self.gpu_mem_total_gb: float | None = None
        self.worker_end: float | None = None

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        t0 = time.time()
        try:
            yield
        finally:
            self.driver[name] = self.driver.get(name, 0.0) + time.time() - t0

    def carve(self, name: str, parts: dict[str, float]) -> None:
        """Move ``parts`` (seconds by phase) out of the driver phase ``name``, which held them: the cache fill's
        own phases out of ``data_prepare``."""
        self.driver[name] = self.driver.get(name, 0.0) - sum(parts.values())
        for part, seconds in parts.items():
            self.driver[part] = self.driver.get(part, 0.0) + seconds

    def add(self, report: Progress) -> None:
        """Fold in one progress report (rank 0's)."""
        self.setup = report.setup or self.setup
        self.steps.extend(report.step_timing)
        self.facts = report.facts or self.facts
        self.total_steps = report.total_steps or self.total_steps
        self.gpu_mem_peak_gb = report.gpu_mem_peak_gb if report.gpu_mem_peak_gb is not None else self.gpu_mem_peak_gb
        self.gpu_mem_total_gb = report.gpu_mem_total_gb or self.gpu_mem_total_gb
        self.worker_end = report.worker_end_ts or self.worker_end

    # -- analysis ----------------------------------------------------------------------------

    def warmup_steps(self) -> int:
        busy = [s.busy for s in self.steps]
        if len(busy) < 4:
            return 0
        second_half = busy[len(busy) // 2 :]
        slow_tenth = statistics.quantiles(second_half, n=10)[-1] if len(second_half) > 1 else second_half[0]
        threshold = max(WARMUP_RATIO * statistics.median(second_half), slow_tenth)
        k = 0
        while k < len(busy) // 2 and busy[k] > threshold:
            k += 1
        return k

    def training_time(self) -> float:
        """Seconds from the first step's first batch to the last step's end (the loop's own time)."""
        return sum(s.wall for s in self.steps) - (self.steps[0].seconds(Phase.DATA_WAIT) if self.steps else 0.0)

    def head_steps(self) -> int:
        """Steps left out of steady state: the warm-up, and always the first (it waits for the first batch)."""
        return max(self.warmup_steps(), 1) if len(self.steps) > 1 else 0

    def steady(self) -> list[StepRecord]:
        return self.steps[self.head_steps() :]

    def breakdown(self, wall: float) -> dict[str, float]:
        """Seconds per :class:`~rayft_contract.phases.Phase`, in its order; the values sum to ``wall``."""
        rows: dict[str, float] = {
            name: self.driver.get(name, 0.0)
            for name in ("preflight", "connect", "model_fetch", "data_prepare", *FillTimes.PHASES, "trainer_setup", "tracking")
        }
        setup = self.setup or SetupTimes(worker_start_ts=0.0)
        worker_start = setup.worker_start_ts
        if worker_start and self.fit_start:
            # A process Ray started before the run (its worker pool's) launched in no time of this run's.
            launched = min(max(setup.process_start_ts or self.fit_start, self.fit_start), worker_start)
            rows["worker_launch"] = launched - self.fit_start
            rows["worker_start"] = worker_start - launched
        else:
            rows["worker_launch"] = rows["worker_start"] = 0.0
        rows["model_load"] = setup.model_load_s
        rows["compile_wait"] = setup.compile_wait_s
        rows["resume"] = setup.resume_s
        rows["first_eval"] = setup.first_eval_s
        loop_start = setup.loop_start_ts
        rows["worker_setup"] = (
            max(0.0, loop_start - worker_start - rows["model_load"] - rows["compile_wait"] - rows["resume"] - rows["first_eval"])
            if loop_start and worker_start
            else 0.0
        )
        rows["first_batch"] = self.steps[0].seconds(Phase.DATA_WAIT) if self.steps else 0.0
        k = self.head_steps()
        rows["warmup_steps"] = sum(s.wall for s in self.steps[:k]) - (rows["first_batch"] if k else 0.0)
        steady = self.steps[k:]
        for phase in STEP_PHASES:
            rows[phase] = sum(s.seconds(phase) for s in steady)
        rows["step_other"] = sum(s.wall - sum(s.phases.values()) for s in steady)
        rows["shutdown"] = max(0.0, self.fit_end - self.worker_end) if self.fit_end and self.worker_end else 0.0
        rows["export"] = self.driver.get("export", 0.0)
        ordered = {p.value: rows.pop(p, 0.0) for p in Phase if p is not Phase.OTHER}  # the table's order
        assert not rows, f"phases missing from rayft_contract.phases.Phase: {sorted(rows)}"
        ordered[Phase.OTHER.value] = wall - sum(ordered.values())
        return ordered

    def efficiency(self) -> Efficiency:
        """Steady-state throughput, MFU/HFU, padding share and memory."""
        steady = self.steady()
        wall = sum(s.training_wall for s in steady) or 1e-9  # evaluation is not training
        tokens = sum(s.tokens for s in steady)
        world, shape, peak = self.facts.world_size, self.facts.model_shape, self.facts.peak_flops
        flops: dict[str, float] = {}
        if shape and steady:
            model, hardware = (sum(f) for f in zip(*(step_flops(shape, s.tokens, s.attn_ctx) for s in steady)))
            flops["flops_per_s"] = model / wall
            if peak:
                flops["mfu"] = model / wall / (peak * world)
                flops["hfu"] = hardware / wall / (peak * world)
        return Efficiency(
            steady_steps=len(steady),
            warmup_steps=self.warmup_steps(),
            head_steps=self.head_steps(),
            tokens_per_s=tokens / wall,
            tokens_per_s_per_worker=tokens / wall / world,
            samples_per_s=sum(s.samples for s in steady) / wall,
            step_time_s=wall / max(len(steady), 1),
            padding_frac=1 - sum(s.tokens for s in self.steps) / max(sum(s.processed for s in self.steps), 1),
            gpu_mem_peak_gb=self.gpu_mem_peak_gb,
            gpu_mem_total_gb=self.gpu_mem_total_gb,
            collector_s=sum(s.collector_s for s in steady),
            full_collections=sum(s.full_collections for s in steady),
            **flops,
        )

    def warmup_slowdown(self) -> float:
        """How many times slower the warm-up steps ran than steady ones (1.0 without warm-up)."""
        k = self.warmup_steps()
        if not k:
            return 1.0
        steady = statistics.median(s.busy for s in self.steps[k:])
        return statistics.mean(s.busy for s in self.steps[:k]) / max(steady, 1e-9)
