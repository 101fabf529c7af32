"""On a CUDA GPU: Liger's kernels train the same model as transformers' own ops, and a real QLoRA job uses them.

Run on the device (``make test-gpu``); skipped elsewhere (``tests/conftest.py``). The CPU side of the
choice is ``tests/unit/ray_jobs/train/test_kernels.py``.
"""

from __future__ import annotations

import dataclasses

import pytest

pytestmark = pytest.mark.gpu


def qlora_gpu(spec, kernels="liger", modules_to_save=()):
    """The tiny preset as a one-GPU NF4 QLoRA job."""
    return spec.replace(
        model=dataclasses.replace(spec.model, dtype="bfloat16", kernels=kernels),
        quantization=dataclasses.replace(spec.quantization, mode="nf4"),
        lora=dataclasses.replace(spec.lora, modules_to_save=tuple(modules_to_save)),
        scaling=dataclasses.replace(spec.scaling, num_workers=1, use_gpu=True),
    )


def loss_and_grads(spec, patch: bool, compiled: bool = False):
    """One forward/backward of the NF4 base + LoRA on a fixed batch, as the loop runs it."""
    import torch

    from ray_jobs.train import kernels
    from ray_jobs.train.model import apply_lora, autocast, compile_layers, load_base
    from ray_jobs.train.strategy import Single

    device = torch.device("cuda")
    base = load_base(spec, device, Single())
    if patch:
        kernels.apply(base, kernels.choose(spec, "cuda", base.config.model_type))
    model = apply_lora(base, spec)
    if spec.quantization.fp8:  # as the loop decides it: on, where the FP8 weights cost the micro-batch nothing
        from ray_jobs.observe.profile import model_shape
        from ray_jobs.train import fp8

        assert fp8.enable(model, spec, model_shape(model), 0, device, world=1) == "fp8 base matmuls (rowwise)"
    if compiled:
        compile_layers(model)  # inductor, as model.compile runs it
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(5, base.config.vocab_size, (4, 128), generator=gen).to(device)
    labels = ids.clone()
    labels[:, :64] = -100  # a masked prompt, as train_on_completions_only makes
    with autocast(spec, device):
        out = model(input_ids=ids, labels=labels, num_items_in_batch=torch.tensor(4 * 63, device=device))
    out.loss.backward()
    grads = {n: p.grad.float().flatten() for n, p in model.named_parameters() if p.requires_grad and p.grad is not None}
    return float(out.loss.detach()), grads


def test_liger_kernels_give_the_loss_and_gradients_of_transformers_own_ops(tiny_spec):
    import torch

    spec = qlora_gpu(tiny_spec)
    # The reference first: Liger's RoPE patch is module-wide, so nothing after it runs unpatched.
    ref_loss, ref_grads = loss_and_grads(spec, patch=False)
    loss, grads = loss_and_grads(spec, patch=True)
    assert loss == pytest.approx(ref_loss, rel=1e-2)
    assert grads.keys() == ref_grads.keys()
    # lora_B starts at zero, so lora_A's first gradient is exactly zero on both paths; lora_B's carries the signal.
    live = [name for name, grad in ref_grads.items() if grad.abs().max() > 0]
    assert live and all("lora_B" in name for name in live)
    for name, grad in grads.items():
        if name in live:
            cos = torch.nn.functional.cosine_similarity(grad, ref_grads[name], dim=0)
            assert cos > 0.99, (name, float(cos))
        else:
            assert grad.abs().max() == 0, name


def test_decoder_layers_compiled_by_inductor_over_nf4_and_liger_give_the_same_loss_and_gradients(tiny_spec):
    """model.compile on the GPU path it is for: NF4 linears, LoRA and Liger's kernels inside each compiled layer."""
    import torch

    spec = qlora_gpu(tiny_spec)
    ref_loss, ref_grads = loss_and_grads(spec.replace(lora=dataclasses.replace(spec.lora, fused=False)), patch=True)
    loss, grads = loss_and_grads(spec, patch=True, compiled=True)
    assert loss == pytest.approx(ref_loss, rel=1e-2)
    assert grads.keys() == ref_grads.keys()
    for name, grad in grads.items():
        if ref_grads[name].abs().max() > 0:
            cos = torch.nn.functional.cosine_similarity(grad, ref_grads[name], dim=0)
            assert cos > 0.99, (name, float(cos))


def test_lora_fused_over_nf4_and_liger_gives_peft_s_loss_and_gradients(tiny_spec):
    """lora.fused on the GPU path it is for: one addmm per adapted layer in place of PEFT's clone, scale and add."""
    import torch

    spec = qlora_gpu(tiny_spec)
    ref_loss, ref_grads = loss_and_grads(spec, patch=True)
    fused = spec.replace(lora=dataclasses.replace(spec.lora, fused=True))
    loss, grads = loss_and_grads(fused, patch=True)
    assert loss == pytest.approx(ref_loss, rel=1e-2)
    assert grads.keys() == ref_grads.keys()
    for name, grad in grads.items():
        if ref_grads[name].abs().max() > 0:
            assert torch.nn.functional.cosine_similarity(grad, ref_grads[name], dim=0) > 0.99, name


def test_fp8_base_matmuls_over_nf4_and_liger_train_what_bf16_does(tiny_spec):
    """quantization.fp8 on the GPU it is for: the base's two matmuls per adapted layer on FP8 tensor cores; FP8's
    precision, so the loss to 2% and each gradient's direction."""
    import torch

    from ray_jobs.train.fp8 import usable

    assert usable(torch.device("cuda")) == (True, "fp8 base matmuls (rowwise)")
    spec = qlora_gpu(tiny_spec)
    ref_loss, ref_grads = loss_and_grads(spec, patch=True)
    loss, grads = loss_and_grads(spec.replace(quantization=dataclasses.replace(spec.quantization, fp8=True)), patch=True)
    assert loss == pytest.approx(ref_loss, rel=2e-2)
    assert grads.keys() == ref_grads.keys()
    for name, grad in grads.items():
        if ref_grads[name].abs().max() > 0:
            assert torch.nn.functional.cosine_similarity(grad, ref_grads[name], dim=0) > 0.98, name


def test_a_warm_worker_compiles_fp8_s_row_scaling_ahead_and_the_job_s_own_shapes_compile_nothing_more():
    """What ``hold_base`` does for an FP8 job on a warm worker (``fp8.warm_up``): one compile of the row scaling, with
    dynamic shapes, that the job's micro-batches and layer widths then reuse in its first step."""
    import torch
    from torch._dynamo.utils import counters

    from ray_jobs.train import fp8

    device = torch.device("cuda", 0)
    torch._dynamo.reset()  # whatever an earlier test compiled
    before = counters["stats"]["unique_graphs"]
    assert fp8.warm_up(device, (256, 688))
    warmed = counters["stats"]["unique_graphs"]
    assert warmed > before, "the warm-up compiled the row scaling"
    for rows, width, out in ((8 * 2048, 256, 688), (4 * 1024, 688, 256), (2048, 256, 256)):
        b8, b_scale = fp8._rowwise(torch.randn(out, width, device=device, dtype=torch.bfloat16))
        fp8._matmul(torch.randn(rows, width, device=device, dtype=torch.bfloat16), b8, b_scale)
    assert counters["stats"]["unique_graphs"] == warmed, "the job's shapes recompiled what the warm-up compiled"


def test_attention_a_warm_worker_compiled_for_the_job_s_rows_is_what_the_job_s_first_micro_batch_runs(tiny_spec):
    """``held.compile_attention`` at the rows the job's plan runs (``one_layer.job_rows``): the job's LoRA model, Liger's
    kernels on it, then runs micro-batches of those rows and compiles nothing more. Rows of another count compile again
    (dynamo's second size, for any size): what a worker that compiled the spec's 8 rows cost an H100's job of 4. The
    worker's imports first, as its own: a module the job imports later that registers pytree nodes (Liger's output
    classes did) fails every compiled function's guards."""
    import torch
    from torch._dynamo.utils import counters

    from ray_jobs.data.packing import rows_of_job_shape
    from ray_jobs.train import held, kernels
    from ray_jobs.train.attention_mask import model_inputs
    from ray_jobs.train.model import apply_lora, autocast, load_base
    from ray_jobs.train.strategy import Single
    from ray_jobs.warm.pool import import_training_stack

    import_training_stack()
    device = torch.device("cuda", 0)
    spec = qlora_gpu(tiny_spec)
    spec = spec.replace(model=dataclasses.replace(spec.model, attn_implementation="flex_attention"))
    torch._dynamo.reset()  # whatever an earlier test compiled
    base = load_base(spec, device, Single())
    held.compile_attention(spec, base, device, rows=2)
    compiled = counters["stats"]["unique_graphs"]
    assert compiled > 0, "the attention compiled ahead"
    kernels.apply(base, kernels.choose(spec, "cuda", base.config.model_type))
    model = apply_lora(base, spec)

    def micro_batch(rows: int) -> None:  # as the loop runs one: the job's own block mask (ray_jobs.train.attention_mask)
        batch = rows_of_job_shape(spec, base.config.vocab_size, "flex_attention", device, rows)
        with autocast(spec, device):
            inputs = model_inputs(batch, "flex_attention")
            out = model(**inputs, num_items_in_batch=torch.tensor(batch["labels"].numel(), device=device))
        out.loss.backward()

    micro_batch(2)
    micro_batch(2)
    assert counters["stats"]["unique_graphs"] == compiled, "the job's rows compiled again"
    micro_batch(1)
    assert counters["stats"]["unique_graphs"] > compiled, "another row count compiles (the test's own check)"


def test_a_warm_worker_on_a_gpu_holds_the_base_with_attention_compiled_for_the_rows_its_copy_planned(
    tiny_spec, tmp_path, monkeypatch
):
    """``held.hold_base`` as the pool's worker runs it on a GPU: the rows planned on the one-layer copy first (its memory
    back before the base loads), then the base held, its attention compiled for them; the job takes it."""
    import gc

    import torch

    from ray_jobs.train import held
    from ray_jobs.train.model import load_base_from
    from ray_jobs.train.one_layer import job_rows
    from ray_jobs.train.strategy import Single
    from ray_jobs.warm.pool import import_training_stack

    held._held.clear()
    monkeypatch.setenv("RAYFT_CACHE_DIR", str(tmp_path / "node-cache"))
    import_training_stack()
    device = torch.device("cuda", 0)
    spec = qlora_gpu(tiny_spec)
    spec = spec.replace(model=dataclasses.replace(spec.model, attn_implementation="flex_attention"))
    gc.collect()
    before = torch.cuda.memory_allocated(device)  # what earlier tests left
    rows, _ = job_rows(spec, device)
    assert rows == spec.train.micro_batch_size, "a tiny model fits the spec's rows on any GPU"
    assert torch.cuda.memory_allocated(device) == before, "the copy's memory is back"
    held.hold_base(spec, device)
    [kept] = held._held.values()
    assert kept.compiled_rows == rows
    taken = load_base_from(spec, device, Single())
    assert taken.held and taken.model is kept.model and held._held == {}


def test_flex_attention_on_packed_rows_gives_sdpas_loss_and_gradients(tiny_spec):
    """What model.attn_implementation: auto picks on a GPU: the same masked attention (no token sees another packed
    example), computed block-sparse, with the mask the job makes (ray_jobs.train.attention_mask) against SDPA's
    from transformers."""
    import torch

    from ray_jobs.train.attention_mask import model_inputs
    from ray_jobs.train.model import apply_lora, autocast, load_base
    from ray_jobs.train.strategy import Single

    device = torch.device("cuda")
    ids = torch.randint(5, 300, (2, 256), generator=torch.Generator().manual_seed(0)).to(device)
    positions = torch.cat([torch.arange(n) for n in (100, 60, 96)]).expand(2, -1).to(device)  # three examples a row
    results = {}
    for attn in ("sdpa", "flex_attention"):
        spec = qlora_gpu(tiny_spec, kernels="none")
        spec = spec.replace(model=dataclasses.replace(spec.model, attn_implementation=attn))
        model = apply_lora(load_base(spec, device, Single()), spec)
        assert model.config._attn_implementation == attn
        with autocast(spec, device):
            loss = model(**model_inputs({"input_ids": ids, "position_ids": positions, "labels": ids}, attn)).loss
        loss.backward()
        results[attn] = float(loss), {n: p.grad.float().flatten() for n, p in model.named_parameters() if p.grad is not None}
        with torch.no_grad(), autocast(spec, device):
            unmasked = model(input_ids=ids, labels=ids).loss  # the rows as one example each: a different loss
        assert abs(float(unmasked) - float(loss)) > 1e-4
    (ref_loss, ref), (loss, grads) = results["sdpa"], results["flex_attention"]
    assert loss == pytest.approx(ref_loss, rel=1e-3) and grads.keys() == ref.keys()
    for name, grad in grads.items():
        if ref[name].abs().max() > 0:
            assert torch.nn.functional.cosine_similarity(grad, ref[name], dim=0) > 0.99, name


def test_every_liger_op_is_chosen_for_llama_on_a_gpu_and_the_fused_loss_skips_a_trained_head(tiny_spec):
    from ray_jobs.train import kernels

    assert kernels.choose(qlora_gpu(tiny_spec), "cuda", "llama").ops == kernels.OPS
    trained_head = kernels.choose(qlora_gpu(tiny_spec, modules_to_save=["lm_head"]), "cuda", "llama")
    assert "fused_linear_cross_entropy" not in trained_head.ops and "rms_norm" in trained_head.ops


def test_a_qlora_job_on_one_gpu_trains_with_the_kernels_and_learns(tiny_spec):
    from ray_jobs.run import run

    spec = qlora_gpu(tiny_spec, modules_to_save=tiny_spec.lora.modules_to_save)
    summary = run(spec).summary
    assert summary.steps == spec.train.max_steps
    # the head is trained here; lora.fused is on by default
    assert summary.kernels == "liger (rope, rms_norm, swiglu); LoRA update inside its matmul (lora.fused)", summary.kernels
    assert summary.quantized_layers > 0 and summary.gpu_mem_peak_gb > 0
    assert summary.eval_loss < 0.5 * summary.initial_eval_loss, summary
    assert summary.initial_eval_token_accuracy < summary.eval_token_accuracy, summary


def test_with_the_fused_loss_evaluation_still_gets_logits_for_its_token_accuracy(tiny_spec):
    """The fused linear cross-entropy skips the logits in training only: in eval mode they come back, and
    the token accuracy reads them (ray_jobs.train.evaluation)."""
    from ray_jobs.run import run

    spec = qlora_gpu(tiny_spec)  # no trained head: the fused loss is on
    spec = spec.replace(name="tiny-fused-eval", train=dataclasses.replace(spec.train, max_steps=10, eval_every=5))
    summary = run(spec).summary
    assert "fused_linear_cross_entropy" in summary.kernels, summary.kernels
    assert summary.eval_token_accuracy is not None and 0 <= summary.eval_token_accuracy <= 1, summary
