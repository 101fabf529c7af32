"""lora.fused (ray_jobs.train.lora_fused): the update inside its matmul trains the same adapter as PEFT's own forward."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from ray_jobs.train.lora_fused import fuse
from ray_jobs.train.model import apply_lora, load_base
from ray_jobs.train.strategy import Single
from tests.unit.ray_jobs.train.lora_steps import autocast_step, lora_b_off_zero


def with_lora(spec, **changes):
    return spec.replace(lora=dataclasses.replace(spec.lora, **changes))


def step(spec, seed: int = 0) -> tuple[torch.nn.Module, float, dict[str, torch.Tensor]]:
    """The tiny model with LoRA (PEFT's forward, or the fused one as the spec says), one forward and backward."""
    model = apply_lora(load_base(spec, torch.device("cpu"), Single()), spec)
    lora_b_off_zero(model)
    model.train()
    ids = torch.randint(3, 100, (2, 48), generator=torch.Generator().manual_seed(1))
    torch.manual_seed(seed)  # the same dropout masks on both paths
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    return model, float(loss), {n: p.grad for n, p in model.named_parameters() if p.requires_grad}


@pytest.mark.parametrize("dropout", [0.0, 0.1])
def test_the_fused_update_gives_peft_s_loss_and_gradients(tiny_spec, dropout):
    plain_model, plain_loss, plain = step(with_lora(tiny_spec, dropout=dropout, fused=False))
    model, loss, grads = step(with_lora(tiny_spec, dropout=dropout, fused=True))
    lora_layers = [m for m in model.modules() if type(m).__name__ == "FusedLinear"]
    assert len(lora_layers) == 7 * model.config.num_hidden_layers  # every adapted projection
    assert not any(type(m).__name__.startswith("Fused") for m in plain_model.modules())
    assert loss == pytest.approx(plain_loss, rel=1e-6)
    assert grads.keys() == plain.keys()
    for name, grad in grads.items():
        assert torch.allclose(grad, plain[name], rtol=1e-4, atol=1e-6), name
    assert model.state_dict().keys() == plain_model.state_dict().keys()  # the adapter files are PEFT's
    x = torch.randn(5, lora_layers[0].in_features, requires_grad=True)
    assert _last_op(lora_layers[0](x)) == "AddmmBackward0"  # the update went through one addmm
    assert (
        _last_op(next(m for m in plain_model.modules() if type(m).__name__ == "Linear" and hasattr(m, "lora_A"))(x))
        == "AddBackward0"
    )


def _last_op(out: torch.Tensor) -> str:
    """The autograd node that made ``out``, through a view."""
    node = out.grad_fn
    while node.name().startswith("View") or node.name().startswith("Reshape") or node.name().startswith("ToCopy"):
        node = node.next_functions[0][0]
    return node.name()


def test_outside_the_plain_case_the_fused_layers_run_peft_s_forward(tiny_spec):
    """Adapters off (what the base-model answers use) and a second adapter: PEFT's own paths, not the fused one."""
    model, _, _ = step(with_lora(tiny_spec, fused=True))
    model.eval()
    ids = torch.randint(3, 100, (1, 16), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        with model.disable_adapter():
            base_logits = model(input_ids=ids).logits
        adapted = model(input_ids=ids).logits
        assert not torch.allclose(base_logits, adapted)
        layer = next(m for m in model.modules() if type(m).__name__ == "FusedLinear")
        x = torch.randn(3, layer.in_features)
        fused_out = layer(x)
        layer.merged_adapters.append("default")  # merged: PEFT's forward, which uses the base weights alone
        assert torch.allclose(layer(x), layer.base_layer(x))
        layer.merged_adapters.clear()
        assert torch.allclose(layer(x), fused_out)


def test_fusing_counts_what_it_changed_and_leaves_a_model_without_lora_alone(tiny_spec):
    base = load_base(tiny_spec, torch.device("cpu"), Single())
    assert fuse(base) == 0


def test_on_an_nf4_base_under_bf16_autocast_the_fused_update_trains_what_peft_s_does(tiny_spec):
    """The QLoRA case (bitsandbytes' CPU backend here): PEFT's 4-bit layer, its clone and bf16 roundings, against
    one addmm; bf16 rounds differently, so the check is the loss to 1% and each gradient's direction."""
    spec = tiny_spec.replace(
        model=dataclasses.replace(tiny_spec.model, dtype="bfloat16"),
        quantization=dataclasses.replace(tiny_spec.quantization, mode="nf4"),
        lora=dataclasses.replace(tiny_spec.lora, modules_to_save=()),
    )
    results = {}
    for fused in (False, True):
        s = with_lora(spec, fused=fused)
        model = apply_lora(load_base(s, torch.device("cpu"), Single()), s)
        loss, grads = autocast_step(model, s)
        results[fused] = loss, grads, {type(m).__name__ for m in model.modules() if hasattr(m, "lora_A")}
    (plain_loss, plain, plain_kinds), (loss, grads, kinds) = results[False], results[True]
    assert plain_kinds == {"Linear4bit"} and kinds == {"FusedLinear4bit"}
    assert loss == pytest.approx(plain_loss, rel=1e-2)
    for name, grad in grads.items():
        assert torch.nn.functional.cosine_similarity(grad, plain[name], dim=0) > 0.99, name


def test_a_fused_layer_pickles_and_comes_back_fused(tiny_spec):
    import pickle

    model, _, _ = step(with_lora(tiny_spec, fused=True))
    layer = next(m for m in model.modules() if type(m).__name__ == "FusedLinear")
    x = torch.randn(3, layer.in_features)
    again = pickle.loads(pickle.dumps(layer))
    assert type(again) is type(layer) and torch.allclose(again(x), layer(x))
