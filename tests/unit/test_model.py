"""The base model and LoRA on top (ray_jobs.model), on the tiny random Llama, on CPU."""

from __future__ import annotations

import torch

from ray_jobs.model import apply_lora, checkpoint_activations, load_base
from ray_jobs.strategy import Single


def lora_gradients(spec, checkpointing: bool) -> tuple[float, dict[str, torch.Tensor]]:
    model = apply_lora(load_base(spec, torch.device("cpu"), Single()), spec)
    if checkpointing:
        checkpoint_activations(model)
        layers = [m for m in model.modules() if hasattr(m, "gradient_checkpointing")]
        assert layers and all(m.gradient_checkpointing for m in layers), "checkpointing is on"
    model.train()
    ids = torch.randint(3, 100, (2, 32), generator=torch.Generator().manual_seed(0))
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    return float(loss), {n: p.grad for n, p in model.named_parameters() if p.requires_grad}


def test_gradient_checkpointing_turned_on_after_loading_recomputes_the_same_gradients(tiny_spec):
    """What the memory plan does when one row a piece would not fit: the same step, computed again in backward."""
    plain_loss, plain = lora_gradients(tiny_spec, checkpointing=False)
    loss, grads = lora_gradients(tiny_spec, checkpointing=True)
    assert loss == plain_loss and grads.keys() == plain.keys() and plain
    for name, grad in grads.items():
        assert grad is not None and torch.allclose(grad, plain[name], atol=1e-6), name
