"""A base a warm worker loads before its job (ray_jobs.train.held), on CPU: which job takes it, what is compiled on it
ahead, at which rows, and what the summary says of it."""

from __future__ import annotations

import dataclasses

import torch

from ray_jobs.train import held
from ray_jobs.train.model import LoadedBase, load_base, load_base_from
from ray_jobs.train.strategy import Single


def test_a_base_held_by_a_warm_worker_serves_only_a_job_of_the_same_base_and_is_dropped_for_any_other(tiny_spec):

    cpu = torch.device("cpu")
    held.hold_base(tiny_spec, cpu)
    kept = next(iter(held._held.values())).model
    other_dtype = tiny_spec.replace(model=dataclasses.replace(tiny_spec.model, dtype="bfloat16"))
    loaded = load_base_from(other_dtype, cpu, Single())
    assert not loaded.held and loaded.model is not kept and loaded.model.dtype == torch.bfloat16
    assert held._held == {}, "a base the job did not take is dropped, not kept beside its own"

    held.hold_base(tiny_spec, cpu)
    kept = next(iter(held._held.values())).model
    loaded = load_base_from(tiny_spec.replace(name="another-job"), cpu, Single())
    assert loaded.held and loaded.model is kept and held._held == {}, "the same base: taken once"
    assert not load_base_from(tiny_spec, cpu, Single()).held, "the next job of the process loads its own"


def test_a_base_in_s3_is_never_held_it_is_read_with_the_jobs_own_keys(tiny_spec):
    in_s3 = tiny_spec.replace(model=dataclasses.replace(tiny_spec.model, path="s3://models/llama"))
    assert held.held_key(in_s3, torch.device("cpu")) is None
    assert held.held_key(tiny_spec, torch.device("cpu")) is not None


def test_compiling_the_attention_ahead_runs_the_decoder_both_ways_and_leaves_no_gradient_on_the_base(tiny_spec):
    """What a warm worker does on a GPU with flex attention (there, to compile its kernels), here with SDPA on CPU."""
    model = load_base(tiny_spec, torch.device("cpu"), Single())
    before = {n for n, p in model.named_parameters() if p.requires_grad}
    attention, seen = model.model.layers[0].self_attn, []
    attention.register_forward_hook(lambda module, args, kwargs, out: seen.append("forward"), with_kwargs=True)
    attention.register_full_backward_hook(lambda module, grad_in, grad_out: seen.append("backward"))
    held.compile_attention(tiny_spec, model, torch.device("cpu"))
    assert seen == ["forward", "backward"]
    assert all(p.grad is None for p in model.parameters())
    assert {n for n, p in model.named_parameters() if p.requires_grad} == before


def test_a_warm_worker_holding_an_fp8_jobs_base_warms_fp8_up_for_the_bases_layer_widths(tiny_spec, monkeypatch):
    """The wiring: ``hold_base`` hands the base's widths to ``fp8.warm_up`` (which compiles only on a GPU: the gpu test
    checks the compile and that the job's shapes reuse it)."""
    from ray_jobs.train import fp8

    calls = []
    warm_up = fp8.warm_up
    monkeypatch.setattr(fp8, "warm_up", lambda device, widths: calls.append(widths) or warm_up(device, widths))
    spec = tiny_spec.replace(
        quantization=dataclasses.replace(tiny_spec.quantization, fp8=True),
        lora=dataclasses.replace(tiny_spec.lora, fused=True),
    )
    held.hold_base(spec, torch.device("cpu"))
    config = next(iter(held._held.values())).model.config
    held._held.clear()
    assert calls == [(config.hidden_size, config.intermediate_size)]
    held.hold_base(tiny_spec, torch.device("cpu"))
    held._held.clear()
    assert len(calls) == 1, "a bf16 job's base warms no FP8"


def test_a_warm_worker_plans_the_job_s_rows_before_it_loads_the_base_and_compiles_attention_for_them(tiny_spec, monkeypatch):
    """The order matters: the copy that plans is loaded through the job's own load, which drops any base held for
    another; planned after the hold, it dropped the base it was holding. On a GPU with flex attention; here the choice is
    made to say so, and CPU's SDPA runs the decoder."""
    from ray_jobs.train import one_layer

    planned, compiled = [], []
    assert not held.compiles_attention(tiny_spec, torch.device("cpu")), "on CPU nothing is compiled ahead"
    monkeypatch.setattr(held, "compiles_attention", lambda spec, device: True)
    monkeypatch.setattr(one_layer, "job_rows", lambda spec, device: planned.append(dict(held._held)) or (2, "a plan"))
    compile_as_it_does = held.compile_attention
    monkeypatch.setattr(held, "compile_attention", lambda *args: compiled.append(args[3]) or compile_as_it_does(*args))

    held.hold_base(tiny_spec, torch.device("cpu"))
    assert planned == [{}], "planned before the base was loaded"
    assert compiled == [2]
    [kept] = held._held.values()
    assert kept.compiled_rows == 2
    taken = load_base_from(tiny_spec, torch.device("cpu"), Single())
    assert taken.held and taken.model is kept.model and taken.compiled_rows == 2

    held.hold_base(tiny_spec, torch.device("cpu"), compile=False)
    assert len(planned) == 1 and next(iter(held._held.values())).compiled_rows is None, "an early worker compiles nothing"
    held._held.clear()


def test_the_summary_says_for_which_rows_a_held_base_s_attention_was_compiled_and_when_the_job_runs_others():
    base = torch.nn.Linear(1, 1)
    assert LoadedBase(base).held_line(4) == ""
    assert LoadedBase(base, held=True).held_line(4) == ", its base loaded before the job"
    assert LoadedBase(base, held=True, load_s=2.54).held_line(4) == ", its base loaded before the job (2.5 s)", "what it waited"
    assert LoadedBase(base, held=True, compiled_rows=4).held_line(4) == (
        ", its base loaded before the job, its attention compiled for 4 rows a piece"
    )
    assert (
        LoadedBase(base, held=True, compiled_rows=8)
        .held_line(4)
        .endswith("compiled for 8 rows a piece where the job runs 4: its first step compiled them again, for any size")
    )
