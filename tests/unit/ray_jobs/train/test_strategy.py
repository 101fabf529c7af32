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


def test_fsdp_and_model_compile_refuse_a_model_without_decoder_layers_each_naming_its_own_field():
    from ray_jobs.train.model import compile_layers

    flat = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 4))
    with pytest.raises(ValueError, match="scaling.strategy: fsdp needs a model with a `layers` ModuleList"):
        FSDP2().wrap(flat)
    with pytest.raises(ValueError, match="model.compile.*set model.compile: false"):
        compile_layers(flat)


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


def test_an_nf4_bases_quantization_state_stays_out_of_the_state_dict_and_a_resume_still_loads(tiny, tmp_path):
    """ignore_frozen_params drops frozen parameters, not the five entries each Linear4bit adds beside its weight
    (absmax, quant_map, ...): checkpoints and best-adapter snapshots carried the whole base's quantization state."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig

    quantized = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True)
    base = AutoModelForCausalLM.from_pretrained(tiny / "model", quantization_config=quantized, dtype=torch.bfloat16)
    model = get_peft_model(base, LoraConfig(r=4, target_modules=["q_proj", "v_proj", "down_proj"]))
    trainable = {name: p for name, p in model.named_parameters() if p.requires_grad}
    optimizer = torch.optim.AdamW(trainable.values(), lr=0.1)
    ids = torch.randint(0, base.config.vocab_size, (2, 16))
    model(input_ids=ids, labels=ids).loss.backward()
    optimizer.step()
    strategy = Single()
    weights, optim = strategy.state_dict(model, optimizer)
    assert set(weights) == set(strategy.weights(model)) == set(trainable)
    assert len(optim["state"]) == len(trainable)
    assert any(key.endswith(".absmax") for key in model.state_dict()), "outside the call, the model's own state dict is whole"

    identity = checkpoint.RunIdentity("team", "hash")
    checkpoint.write(tmp_path, {"model": weights, "optimizer": optim}, checkpoint.TrainState(), identity)
    trained = {k: v.clone() for k, v in weights.items()}
    with torch.no_grad():
        for p in trainable.values():
            p.zero_()
    saved, _ = checkpoint.read(tmp_path, identity)
    strategy.load_state_dict(model, optimizer, saved["model"], saved["optimizer"])
    assert all(torch.equal(trainable[k].detach().cpu(), v) for k, v in trained.items())
    again = model(input_ids=ids, labels=ids).loss
    assert torch.isfinite(again), "the base's quantization state is as it was"
