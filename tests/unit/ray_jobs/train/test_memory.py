"""Fitting the GPU: the micro-batch planned from the model's shape and the free memory, then one back-off from
an out-of-memory step (half the micro-batch, the same rows per step), each with its reason."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from ray_jobs.chaos import Chaos
from ray_jobs.train.memory import MicroBatches, OutOfMemory, Plan, activation_bytes, plan
from rayft_contract.records import ModelShape


def batch(rows: int, start: int = 0) -> dict[str, np.ndarray]:
    ids = np.arange(start, start + rows)[:, None].repeat(4, axis=1)
    return {"input_ids": ids, "labels": ids, "position_ids": ids, "num_tokens": np.full(rows, 4)}


def test_halved_pieces_hold_every_row_of_the_step_once_in_order():
    micro = MicroBatches(size=5, world=1)
    micro.back_off(torch.OutOfMemoryError("boom"), step=1, free=lambda: None)
    group = [batch(5, 0), batch(5, 5)]
    pieces = micro.pieces(group)
    assert [len(p["num_tokens"]) for p in pieces] == [2, 3, 2, 3]
    assert np.concatenate([p["input_ids"][:, 0] for p in pieces]).tolist() == list(range(10))


def test_the_back_off_frees_the_failed_step_and_says_why_once():
    freed = []
    micro = MicroBatches(size=8, world=1)
    assert micro.describe() == "8 (train.micro_batch_size)"
    micro.back_off(torch.OutOfMemoryError("boom"), step=3, free=lambda: freed.append(True))
    assert freed == [True] and micro.running == 4
    assert micro.describe() == "4 (step 3 ran out of GPU memory at micro-batch 8: halved, global batch unchanged)"
    with pytest.raises(OutOfMemory, match="even at micro-batch 4 after backing off.*train.micro_batch_size"):
        micro.back_off(torch.OutOfMemoryError("again"), step=3, free=lambda: freed.append(True))
    assert freed == [True], "nothing more is freed for a retry that will not come"


def test_with_several_workers_it_fails_naming_the_fix_instead_of_retrying_alone():
    micro = MicroBatches(size=8, world=2)
    with pytest.raises(OutOfMemory, match="micro-batch 8.*train.gradient_checkpointing: true"):
        micro.back_off(torch.OutOfMemoryError("boom"), step=1, free=lambda: pytest.fail("must not free"))
    assert micro.split == 1


def test_a_micro_batch_of_one_row_has_nothing_to_halve():
    with pytest.raises(OutOfMemory):
        MicroBatches(size=1, world=1).back_off(torch.OutOfMemoryError("boom"), step=1, free=lambda: None)


def test_the_injected_cause_is_torchs_own_out_of_memory_error():
    Chaos(oom_above_rows=2).check_memory(2)
    with pytest.raises(torch.OutOfMemoryError):
        Chaos(oom_above_rows=2).check_memory(3)


GIB = 2**30
LLAMA_7B = ModelShape(matmul_params=6_476_000_000, trainable_matmul_params=40_000_000, layers=32, attn_dim=4096)
"""The 7B preset's shape (Llama-2-7B with LoRA r=16 on all linear layers)."""


def test_the_activation_estimate_matches_the_7b_presets_measured_peak():
    """71.4 GiB peak at micro-batch 8 x 2,048 tokens on an H200 with Liger's kernels, about 4 GiB of it the 4-bit
    base, the LoRA weights and Adam's moments (bench/RESULTS.md)."""
    estimate = activation_bytes(LLAMA_7B, 8 * 2048, gradient_checkpointing=False) / GIB
    assert estimate == pytest.approx(71.4 - 4, rel=0.05)
    assert activation_bytes(LLAMA_7B, 8 * 2048, gradient_checkpointing=True) / GIB < estimate / 5


def test_the_preset_runs_as_the_spec_says_on_an_h200():
    assert plan(8, 2048, LLAMA_7B, 40_000_000, free_bytes=134 * GIB, alone=True) == Plan()


def test_a_smaller_gpu_runs_each_micro_batch_in_pieces_that_fit_and_says_so():
    chosen = plan(8, 2048, LLAMA_7B, 40_000_000, free_bytes=36 * GIB, alone=True)
    assert (chosen.split, chosen.gradient_checkpointing) == (4, False)  # micro-batch 2: 17 GiB of activations
    assert chosen.reason.startswith("micro-batch 2: about 68 GiB of activations at micro-batch 8 against 36 GiB free")
    micro = MicroBatches(size=8, world=1)
    micro.follow(chosen)
    assert micro.running == 2 and micro.describe().startswith("2 (micro-batch 2: about 68 GiB")
    assert [len(p["num_tokens"]) for p in micro.pieces([batch(8)])] == [2, 2, 2, 2]


def test_when_one_row_a_piece_is_too_much_a_worker_alone_turns_gradient_checkpointing_on():
    chosen = plan(8, 2048, LLAMA_7B, 40_000_000, free_bytes=3 * GIB, alone=True)
    assert chosen.gradient_checkpointing and chosen.split == 4  # micro-batch 2: 1.5 GiB with checkpointing
    assert "gradient checkpointing on" in chosen.reason
    # Several workers: checkpointing stays as the spec says (the back-off names the fix); nothing fits, so no plan.
    assert plan(8, 2048, LLAMA_7B, 40_000_000, free_bytes=3 * GIB, alone=False) == Plan()
    with_gc = dataclasses.replace(LLAMA_7B, gradient_checkpointing=True)
    assert not plan(8, 2048, with_gc, 40_000_000, free_bytes=3 * GIB, alone=True).gradient_checkpointing


FP8_7B = 2 * 6_476_000_000
"""What ``quantization.fp8`` adds for the 7B base: one byte a base weight, in two layouts (12 GiB)."""


def test_fp8_stays_on_where_its_weights_cost_the_micro_batch_nothing_and_off_where_they_would():
    from ray_jobs.train.memory import fp8_cost

    def cost(free_gib):
        return fp8_cost(8, 2048, LLAMA_7B, 40_000_000, free_gib * GIB, FP8_7B, alone=True)

    assert cost(134) == "", "an H200: micro-batch 8 either way"
    assert cost(75) == "", "an 80 GB GPU: micro-batch 4 either way"
    assert cost(19) == (  # a 24 GB GPU: bf16 at micro-batch 1 beats FP8 with gradient checkpointing
        "fp8 off: its 12 GiB of FP8 weights would leave 7 of 19 GiB free, micro-batch 4, gradient checkpointing on "
        "instead of micro-batch 1"
    )
    assert cost(12.5).endswith("free, too little for one row instead of micro-batch 1")
    assert "too little for one row instead of too little for one row" in cost(0.5)


def test_a_planned_split_can_still_back_off_once_more():
    micro = MicroBatches(size=8, world=1)
    micro.follow(Plan(split=2, reason="planned"))
    micro.back_off(torch.OutOfMemoryError("boom"), step=1, free=lambda: None)
    assert micro.running == 2 and "at micro-batch 4: halved" in micro.describe()
    with pytest.raises(OutOfMemory, match="even at micro-batch 2"):
        micro.back_off(torch.OutOfMemoryError("again"), step=2, free=lambda: None)


def test_on_cpu_the_spec_decides():
    from ray_jobs.train.memory import fit_plan

    assert fit_plan(None, LLAMA_7B, 40_000_000, torch.device("cpu"), world=1) == Plan()


def test_with_fit_memory_off_the_spec_decides_and_the_gpu_is_not_asked(tiny_spec):
    """On this CPU-only torch, asking a CUDA device for its free memory would raise."""
    from ray_jobs.train.memory import fit_plan

    off = tiny_spec.replace(train=dataclasses.replace(tiny_spec.train, fit_memory=False))
    assert fit_plan(off, LLAMA_7B, 40_000_000, torch.device("cuda"), world=1) == Plan()
    if not torch.cuda.is_available():
        with pytest.raises((RuntimeError, AssertionError)):
            fit_plan(tiny_spec, LLAMA_7B, 40_000_000, torch.device("cuda"), world=1)


def test_a_forecast_plans_in_place_of_the_gpu_and_scales_fp8_s_weights_with_the_layers(tiny_spec):
    """The one-layer copy that compiles a job's kernels ahead plans from its forecast of the job (ray_jobs.train.one_layer),
    on any device; its FP8 weights are one layer's, and the job's as many times more as it has layers."""
    from ray_jobs.train.memory import fit_plan, fp8_cost_here

    one = dataclasses.replace(LLAMA_7B, layers=1)
    spec = tiny_spec.replace(train=dataclasses.replace(tiny_spec.train, micro_batch_size=8))
    spec = spec.replace(data=dataclasses.replace(spec.data, max_seq_len=2048))

    def seen(free_gib):
        return lambda shape, trainable: (LLAMA_7B, 40_000_000, free_gib * GIB)

    cpu = torch.device("cpu")
    assert fit_plan(spec, one, 1_250_000, cpu, 1, seen(134)).split == 1, "an H200's memory: the spec's micro-batch"
    assert fit_plan(spec, one, 1_250_000, cpu, 1, seen(62)).split == 2, "an H100's: pieces of 4"
    one_layer_fp8 = FP8_7B // LLAMA_7B.layers
    assert fp8_cost_here(spec, one, 1_250_000, one_layer_fp8, cpu, 1, seen(134)) == ""
    assert fp8_cost_here(spec, one, 1_250_000, one_layer_fp8, cpu, 1, seen(19)).startswith("fp8 off: its 12 GiB")
