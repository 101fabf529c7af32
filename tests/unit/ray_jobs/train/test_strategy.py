"""The strategy seam: chosen from the spec, and its state dict round-trips what the loop trains."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from ray_jobs.train import checkpoint
from ray_jobs.train.strategy import DDP, FSDP2, Single, Strategy, for_spec


@pytest.mark.parametrize(
    ("name", "world", "expected"),
    [("ddp", 1, Single), ("fsdp", 1, Single), ("ddp", 2, DDP), ("fsdp", 4, FSDP2)],
)
def test_the_spec_and_the_world_size_choose_the_strategy(tiny_spec, name, world, expected):
    spec = tiny_spec.replace(scaling=dataclasses.replace(tiny_spec.scaling, strategy=name))
    strategy: Strategy = for_spec(spec, world)
    assert type(strategy) is expected and strategy.name == {Single: "single", DDP: "ddp", FSDP2: "fsdp"}[expected]


def test_only_fsdp_stores_4bit_weights_in_the_compute_dtype():
    assert FSDP2().quant_storage(torch.bfloat16) == torch.bfloat16
    assert Single().quant_storage(torch.bfloat16) == DDP().quant_storage(torch.bfloat16) == torch.uint8


def test_a_trained_state_survives_state_dict_and_load_with_frozen_weights_left_out(tmp_path):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 1))
    model[0].weight.requires_grad_(False)  # frozen, like a base under LoRA
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=0.1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    strategy = Single()
    with strategy.grad_sync(model, enabled=False):
        strategy.backward(model(torch.randn(8, 4)).pow(2).mean())
    strategy.step(optimizer, scheduler, params, max_grad_norm=1.0)
    weights, optim = strategy.state_dict(model, optimizer)
    assert "0.weight" not in weights and set(weights) == {"0.bias", "1.weight", "1.bias"}
    trained = {k: v.clone() for k, v in weights.items()}
    identity = checkpoint.RunIdentity("team", "hash")  # through disk, as a checkpoint goes
    checkpoint.write(tmp_path, {"model": weights, "optimizer": optim}, checkpoint.TrainState(), identity)
    with torch.no_grad():
        for p in params:
            p.zero_()
    saved, _ = checkpoint.read(tmp_path, identity)
    strategy.load_state_dict(model, optimizer, saved["model"], saved["optimizer"])
    assert all(torch.equal(model.state_dict()[k], v) for k, v in trained.items())


def test_the_best_snapshot_is_the_trainable_weights_alone_and_a_copy():
    from ray_jobs.train.best import snapshot_of

    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 1))
    model[0].weight.requires_grad_(False)
    strategy = Single()
    snapshot = snapshot_of(strategy, model, rank=0)()
    assert set(snapshot) == set(strategy.weights(model)) == {"0.bias", "1.weight", "1.bias"}
    with torch.no_grad():
        model[1].weight.add_(1.0)  # training goes on after the snapshot
    assert not torch.equal(snapshot["1.weight"], model[1].weight), "a copy, not the live parameter"
    assert snapshot_of(strategy, model, rank=1)() is None, "only rank 0 keeps one"
