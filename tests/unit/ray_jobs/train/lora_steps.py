"""One LoRA training step on the tiny model, as the LoRA-forward tests (lora.fused, quantization.fp8) compare them."""

from __future__ import annotations

import torch

from ray_jobs.train.model import autocast


def lora_b_off_zero(model: torch.nn.Module) -> None:
    """lora_B starts at zero, where any two forwards of the update agree whatever they do: make it count."""
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.normal_(std=0.02, generator=torch.Generator().manual_seed(len(name)))


def autocast_step(model: torch.nn.Module, spec) -> tuple[float, dict[str, torch.Tensor]]:
    """One forward and backward on fixed ids under the spec's autocast; the loss and each trainable gradient, flat fp32."""
    lora_b_off_zero(model)
    ids = torch.randint(3, 100, (2, 48), generator=torch.Generator().manual_seed(1))
    with autocast(spec, torch.device("cpu")):
        loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    return float(loss.detach()), {n: p.grad.float().flatten() for n, p in model.named_parameters() if p.requires_grad}
