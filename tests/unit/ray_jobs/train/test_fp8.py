"""quantization.fp8 (ray_jobs.train.fp8): the frozen base's matmuls in FP8, run here by torch's CPU ``_scaled_mm``."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from ray_jobs.train import fp8
from ray_jobs.train.model import apply_lora, load_base
from ray_jobs.train.strategy import Single
from rayft_contract.spec import SpecError
from tests.unit.ray_jobs.train.lora_steps import autocast_step


def _relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.detach().float() - b.detach().float()).norm() / b.detach().float().norm())


def test_a_frozen_linears_output_and_input_gradient_come_within_fp8s_precision_and_its_weight_gets_none():
    torch.manual_seed(0)
    layer = torch.nn.Linear(64, 48, bias=True).requires_grad_(False)
    fp8.prepare(layer)
    x = torch.randn(3, 16, 64, requires_grad=True)
    out = fp8.base_forward(layer, x)
    out.backward(torch.ones_like(out))
    reference_x = x.detach().clone().requires_grad_()
    reference = layer(reference_x)
    reference.backward(torch.ones_like(reference))

    assert out.shape == reference.shape and out.dtype == torch.float32
    # e4m3 keeps 3 mantissa bits: a relative error of a few percent, far from a wrong result (about 1.4)
    assert _relative(out, reference) < 0.05
    assert _relative(x.grad, reference_x.grad) < 0.05
    assert layer.weight.grad is None and layer.bias.grad is None


def test_a_row_of_zeros_stays_zeros_and_large_values_do_not_overflow():
    layer = torch.nn.Linear(32, 16, bias=False).requires_grad_(False)
    fp8.prepare(layer)
    x = torch.zeros(16, 32)
    x[1] = 1e4  # far past e4m3's 448: the row's own scale takes it
    out = fp8.base_forward(layer, x)
    assert torch.isfinite(out).all() and out[0].abs().max() == 0 and _relative(out[1], layer(x)[1]) < 0.05


def nf4_spec(tiny_spec, fp8_on: bool):
    return tiny_spec.replace(
        model=dataclasses.replace(tiny_spec.model, dtype="bfloat16"),
        quantization=dataclasses.replace(tiny_spec.quantization, mode="nf4", fp8=fp8_on),
        lora=dataclasses.replace(tiny_spec.lora, modules_to_save=()),
    )


def test_on_an_nf4_base_under_bf16_autocast_fp8_trains_what_bf16_does(tiny_spec):
    """The QLoRA case: a forward and backward of the tiny model with the base's matmuls in FP8 against bf16; the loss
    to 2% and each LoRA gradient's direction."""
    results = {}
    for on in (False, True):
        spec = nf4_spec(tiny_spec, on)
        model = apply_lora(load_base(spec, torch.device("cpu"), Single()), spec, fp8=on)
        loss, grads = autocast_step(model, spec)
        results[on] = loss, grads, {m.rayft_fp8 for m in model.modules() if hasattr(m, "rayft_fp8")}
    (plain_loss, plain, plain_flags), (loss, grads, flags) = results[False], results[True]
    assert plain_flags == {False} and flags == {True}
    assert all(
        w.dtype == fp8.FP8 for w in model.base_model.model.model.layers[0].self_attn.q_proj.base_layer.rayft_fp8_weights[::2]
    )
    assert loss == pytest.approx(plain_loss, rel=2e-2)
    for name, grad in grads.items():
        assert torch.nn.functional.cosine_similarity(grad, plain[name], dim=0) > 0.98, name


def test_fp8_needs_the_fused_forward_and_an_nf4_or_unquantized_base(tiny_spec):
    spec = nf4_spec(tiny_spec, True)
    assert spec.quantization.fp8
    with pytest.raises(SpecError, match=r"quantization.fp8: runs in lora.fused's forward"):
        spec.replace(lora=dataclasses.replace(spec.lora, fused=False))
    with pytest.raises(SpecError, match=r"quantization.fp8"):
        spec.replace(quantization=dataclasses.replace(spec.quantization, mode="int8"))
    with pytest.raises(SpecError, match=r"quantization.fp8: keeps each worker's whole base in FP8, which FSDP shards"):
        spec.replace(scaling=dataclasses.replace(spec.scaling, strategy="fsdp", num_workers=2))


def test_a_cpu_worker_says_its_fp8_is_emulated_and_has_nothing_to_compile_ahead():
    assert fp8.usable(torch.device("cpu")) == (True, "fp8 base matmuls (rowwise, emulated on CPU)")
    assert not fp8.warm_up(torch.device("cpu"), (64,)), "on CPU the row scaling runs eager: no warm-up (the gpu test has it)"


def test_enabling_fp8_on_a_fused_lora_model_prepares_every_adapted_layer_and_counts_its_bytes(tiny_spec):
    """The loop's path (``fp8.enable`` after LoRA, before the memory plan): on CPU the spec decides, so every fused
    layer gets its FP8 weights; what they cost is one byte a base weight, twice."""
    from ray_jobs.observe.profile import model_shape
    from ray_jobs.train.lora_fused import fused_layers

    spec = nf4_spec(tiny_spec, fp8_on=True)
    model = apply_lora(load_base(spec, torch.device("cpu"), Single()), spec)
    layers = fused_layers(model)
    assert layers and not any(m.rayft_fp8 for m in layers)
    expected = sum(2 * m.base_layer.in_features * m.base_layer.out_features for m in layers)
    assert fp8.weight_bytes(model) == expected
    line = fp8.enable(model, spec, model_shape(model), 0, torch.device("cpu"), world=1)
    assert line == "fp8 base matmuls (rowwise, emulated on CPU)"
    assert all(m.rayft_fp8 and hasattr(m.base_layer, "rayft_fp8_weights") for m in layers)
    made = sum(w.numel() for m in layers for w in m.base_layer.rayft_fp8_weights if w.dtype == fp8.FP8)
    assert made == expected


def test_the_compiled_row_scaling_compiles_once_for_inputs_with_and_without_grad_and_views_of_any_base():
    """The 7B job's first step compiled it 5 times, once per kind of input (H200): each time a compile its one-layer
    first step ahead (ray_jobs.train.compile_ahead) had not done. Counted here with dynamo's compile counter on CPU."""
    from torch._dynamo.testing import CompileCounter

    def inputs() -> list[torch.Tensor]:
        plain = torch.randn(32, 64)
        wants_grad = torch.randn(32, 64, requires_grad=True)
        of_3d = torch.randn(2, 16, 64).reshape(-1, 64)  # a view of a [batch, rows, width] activation
        of_wider = torch.randn(2, 16, 128)[..., :64].reshape(-1, 64)  # a copy of a strided slice
        of_grad = (torch.randn(4, 8, 64, requires_grad=True) * 2).reshape(-1, 64)  # a view that requires grad
        return [plain, wants_grad, of_3d, of_wider, of_grad, torch.randn(48, 64)]

    torch._dynamo.reset()
    direct = CompileCounter()
    compiled = torch.compile(fp8._rowwise, dynamic=True, backend=direct)
    for t in inputs():
        compiled(t)
    assert direct.frame_count > 1, "the inputs as they come recompile it (the test's own check)"

    torch._dynamo.reset()
    detached = CompileCounter()
    compiled = torch.compile(fp8._rowwise, dynamic=True, backend=detached)
    for t in inputs():
        a8, scale = fp8._quantize_rows(t, compiled)
        assert a8.dtype == fp8.FP8 and scale.shape == (t.shape[0], 1) and not scale.requires_grad
    assert detached.frame_count == 1


def _counting_quantize(monkeypatch) -> list[torch.Tensor]:
    """Each input ``fp8._quantize_rows`` is called on, recorded as it runs (it still runs)."""
    seen: list[torch.Tensor] = []
    real = fp8._quantize_rows

    def counted(a, rowwise):
        seen.append(a)
        return real(a, rowwise)

    monkeypatch.setattr(fp8, "_quantize_rows", counted)
    return seen


def test_layers_that_take_the_same_input_quantize_it_once_and_give_the_bytes_each_would_alone(monkeypatch):
    """A decoder layer's q, k and v projections take one tensor: the forward quantizes it for the first and the
    others take those FP8 rows. Each output is the one the layer gives on its own, bit for bit."""
    torch.manual_seed(0)
    layers = [torch.nn.Linear(64, n, bias=False).requires_grad_(False) for n in (48, 32, 32)]
    for layer in layers:
        fp8.prepare(layer)
    x = torch.randn(2, 16, 64, requires_grad=True)
    alone = [fp8._matmul(x.detach().reshape(-1, 64), *layer.rayft_fp8_weights[:2]).view(2, 16, -1) for layer in layers]
    seen = _counting_quantize(monkeypatch)
    outs = [fp8.base_forward(layer, x) for layer in layers]
    assert len(seen) == 1, "one quantization for the three layers"
    for out, expected in zip(outs, alone):
        assert torch.equal(out.detach(), expected)

    other = torch.randn(2, 16, 64)  # another tensor is quantized for itself, even with x's values
    fp8.base_forward(layers[0], x.detach().clone())
    fp8.base_forward(layers[0], other)
    assert len(seen) == 3


def test_an_input_changed_in_place_between_two_layers_is_quantized_again(monkeypatch):
    layer = torch.nn.Linear(64, 32, bias=False).requires_grad_(False)
    fp8.prepare(layer)
    x = torch.randn(16, 64)
    seen = _counting_quantize(monkeypatch)
    first = fp8.base_forward(layer, x)
    x.mul_(3)  # the same object, a new version
    second = fp8.base_forward(layer, x)
    assert len(seen) == 2
    assert torch.equal(second, fp8._matmul(x, *layer.rayft_fp8_weights[:2])) and not torch.equal(first, second)


def test_the_backward_lets_go_of_the_forwards_last_input_and_its_gradients_are_each_layers_own(monkeypatch):
    layers = [torch.nn.Linear(64, 32, bias=False).requires_grad_(False) for _ in range(2)]
    for layer in layers:
        fp8.prepare(layer)
    x = torch.randn(16, 64, requires_grad=True)
    out = sum(fp8.base_forward(layer, x).sum() for layer in layers)
    assert fp8._LAST_INPUT._kept is not None and fp8._LAST_INPUT._kept[0] is x
    out.backward()
    assert fp8._LAST_INPUT._kept is None, "nothing of the forward held through the backward"
    ones = torch.ones(16, 32)
    expected = sum(fp8._matmul(ones, *layer.rayft_fp8_weights[2:]) for layer in layers)
    assert torch.equal(x.grad, expected)


def test_a_forward_of_the_tiny_model_quantizes_four_inputs_a_decoder_layer_not_seven(tiny_spec, monkeypatch):
    """q, k and v share one input and gate and up another: 4 quantizations for 7 adapted matmuls a layer. The backward
    quantizes each incoming gradient, its own for each matmul."""
    from ray_jobs.train.model import autocast

    spec = nf4_spec(tiny_spec, fp8_on=True)
    model = apply_lora(load_base(spec, torch.device("cpu"), Single()), spec, fp8=True)
    layers = model.base_model.model.model.layers
    assert sum(m.rayft_fp8 for m in layers.modules() if hasattr(m, "rayft_fp8")) == 7 * len(layers)
    seen = _counting_quantize(monkeypatch)
    ids = torch.randint(3, 100, (2, 48), generator=torch.Generator().manual_seed(1))
    with autocast(spec, torch.device("cpu")):
        loss = model(input_ids=ids, labels=ids).loss
    assert len(seen) == 4 * len(layers)
    loss.backward()
    # every matmul's gradient but the first layer's q, k and v: their input (the embeddings, normed) needs none
    assert len(seen) - 4 * len(layers) == 7 * len(layers) - 3


def test_under_gradient_checkpointing_the_shared_quantization_gives_the_same_loss_and_gradients(tiny_spec, monkeypatch):
    """A checkpointed layer's forward runs again inside the backward, on autograd's thread, taking and dropping the
    kept input there: the loss and every LoRA gradient are those of the run without checkpointing, exactly."""
    from ray_jobs.train.model import checkpoint_activations

    spec = nf4_spec(tiny_spec, fp8_on=True)
    seen = _counting_quantize(monkeypatch)
    results, quantized = [], []
    for checkpointed in (False, True):
        torch.manual_seed(0)
        model = apply_lora(load_base(spec, torch.device("cpu"), Single()), spec, fp8=True)
        if checkpointed:
            checkpoint_activations(model)
        model.train()
        seen.clear()
        results.append(autocast_step(model, spec))
        quantized.append(len(seen))
    assert quantized[1] > quantized[0], "the checkpointed forwards ran again in the backward (the test's own check)"
    (loss, grads), (checkpointed_loss, checkpointed_grads) = results
    assert checkpointed_loss == loss and checkpointed_grads.keys() == grads.keys()
    for name, grad in grads.items():
        assert torch.equal(checkpointed_grads[name], grad), name
