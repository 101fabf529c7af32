"""The base model and LoRA on top (ray_jobs.train.model), on the tiny random Llama, on CPU."""

from __future__ import annotations

import dataclasses
import os

import pytest
import torch

from ray_jobs.train.model import apply_lora, attention_for, checkpoint_activations, compile_layers, load_base
from ray_jobs.train.strategy import Single
from rayft_contract.spec import SpecError


def lora_gradients(
    spec, checkpointing: bool, compile_backend: str | None = None, seq: int = 32
) -> tuple[float, dict[str, torch.Tensor]]:
    model = apply_lora(load_base(spec, torch.device("cpu"), Single()), spec)
    if checkpointing:
        checkpoint_activations(model)
        layers = [m for m in model.modules() if hasattr(m, "gradient_checkpointing")]
        assert layers and all(m.gradient_checkpointing for m in layers), "checkpointing is on"
    if compile_backend:
        assert compile_layers(model, backend=compile_backend) == model.config.num_hidden_layers
    model.train()
    ids = torch.randint(3, 100, (2, seq), generator=torch.Generator().manual_seed(seq))
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


@pytest.mark.parametrize("checkpointing", [False, True])
def test_compiled_decoder_layers_compute_the_same_loss_and_gradients(tiny_spec, checkpointing):
    """model.compile's wiring on CPU: dynamo captures each layer (forward and backward, through AOTAutograd) and
    the step is unchanged, at two sequence lengths (the loop's 128-column shapes). ``aot_eager`` is the capture
    without inductor's code generation, which takes 46 s on this 2-core machine; the GPU test runs inductor."""
    import torch._dynamo

    torch._dynamo.reset()
    counters = torch._dynamo.utils.counters
    counters.clear()
    for seq in (32, 64):
        plain_loss, plain = lora_gradients(tiny_spec, checkpointing, seq=seq)
        loss, grads = lora_gradients(tiny_spec, checkpointing, compile_backend="aot_eager", seq=seq)
        assert loss == pytest.approx(plain_loss, rel=1e-5) and grads.keys() == plain.keys() and plain
        for name, grad in grads.items():
            assert grad is not None and torch.allclose(grad, plain[name], atol=1e-5), name
    assert counters["stats"]["unique_graphs"] >= 1, "the layers ran compiled"


def test_auto_attention_is_flex_on_a_gpu_with_packed_rows_and_sdpa_elsewhere(tiny_spec):
    gpu = tiny_spec.replace(scaling=dataclasses.replace(tiny_spec.scaling, use_gpu=True))
    unpacked = gpu.replace(data=dataclasses.replace(gpu.data, packing=False))
    assert gpu.model.attn_implementation == "auto"
    assert attention_for(gpu, "cuda") == "flex_attention"
    assert attention_for(gpu, "cpu") == "sdpa"  # flex attention has no backward on CPU
    assert attention_for(unpacked, "cuda") == "sdpa"  # one example a row: no blocks to skip
    chosen = gpu.replace(model=dataclasses.replace(gpu.model, attn_implementation="eager"))
    assert attention_for(chosen, "cuda") == "eager"


def test_a_cpu_worker_loads_the_model_with_the_attention_auto_chose(tiny_spec):
    model = load_base(tiny_spec, torch.device("cpu"), Single())
    assert model.config._attn_implementation == "sdpa"


@pytest.mark.parametrize(
    ("more", "report"), [(1, "9 not in its files (model.layers.2.*)"), (-1, "9 not in the model (model.layers.1.*)")]
)
def test_a_worker_refuses_a_base_whose_config_would_leave_weights_random_or_drop_them(tiny, tiny_spec, tmp_path, more, report):
    """The worker's own check, on transformers' load report, whatever the preflight saw: a config.json with a layer
    more than the files hold loads in transformers with that layer random, one with a layer fewer drops the last
    layer's weights, and both train on; here each is refused, naming the layer."""
    import json
    import shutil

    model = tmp_path / "misfit"
    shutil.copytree(tiny / "model", model)
    config = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**config, "num_hidden_layers": config["num_hidden_layers"] + more}))
    spec = tiny_spec.replace(model=dataclasses.replace(tiny_spec.model, path=str(model)))
    with pytest.raises(SpecError) as err:
        load_base(spec, torch.device("cpu"), Single())
    assert err.value.field == "model.path"
    assert f"config.json does not fit the weights: {report}" in str(err.value)


def test_a_spec_asking_for_flex_attention_without_gpus_is_refused_before_it_runs(tiny_spec):
    with pytest.raises(SpecError) as err:
        tiny_spec.replace(model=dataclasses.replace(tiny_spec.model, attn_implementation="flex_attention"))
    assert err.value.field == "model.attn_implementation" and "scaling.use_gpu" in str(err.value)


def test_compiled_kernels_are_kept_in_the_node_s_rayft_cache_unless_the_operator_chose(tmp_path, monkeypatch):
    from ray_jobs.train.model import COMPILE_CACHE_ENV, TRITON_CACHE_ENV, keep_compiled_kernels

    monkeypatch.delenv(COMPILE_CACHE_ENV, raising=False)
    monkeypatch.delenv(TRITON_CACHE_ENV, raising=False)
    monkeypatch.setenv("RAYFT_CACHE_DIR", str(tmp_path))
    assert keep_compiled_kernels() == str(tmp_path / "compile")
    assert os.environ[COMPILE_CACHE_ENV] == str(tmp_path / "compile")

    monkeypatch.setenv(COMPILE_CACHE_ENV, "/operator/chose")
    assert keep_compiled_kernels() == "/operator/chose"  # left as it is

    monkeypatch.delenv(COMPILE_CACHE_ENV)
    assert keep_compiled_kernels("s3://bucket/cache") is None  # kernels cannot live in S3: torch's own default
    assert COMPILE_CACHE_ENV not in os.environ


def test_torch_s_own_default_written_into_the_environment_is_not_taken_for_the_operator_s_choice(tmp_path, monkeypatch):
    """torch writes its default directory into TORCHINDUCTOR_CACHE_DIR the first time anything asks for it (the
    training stack's imports do), before the job's base is loaded: that value must not keep the kernels in /tmp."""
    from torch._inductor.runtime.cache_dir_utils import cache_dir

    from ray_jobs.train.model import COMPILE_CACHE_ENV, TRITON_CACHE_ENV, keep_compiled_kernels

    monkeypatch.delenv(COMPILE_CACHE_ENV, raising=False)
    monkeypatch.delenv(TRITON_CACHE_ENV, raising=False)
    monkeypatch.setenv("RAYFT_CACHE_DIR", str(tmp_path))
    torch_s = cache_dir()  # what an import does
    assert os.environ[COMPILE_CACHE_ENV] == torch_s and not torch_s.startswith(str(tmp_path))

    assert keep_compiled_kernels() == str(tmp_path / "compile")
    assert cache_dir() == str(tmp_path / "compile")  # inductor reads it from here on
    assert os.environ[TRITON_CACHE_ENV] == str(tmp_path / "compile" / "triton")  # Liger's Triton kernels beside it

    monkeypatch.setenv(TRITON_CACHE_ENV, "/operator/triton")
    keep_compiled_kernels()
    assert os.environ[TRITON_CACHE_ENV] == "/operator/triton"  # an operator's Triton directory is left as it is


def test_a_base_held_by_a_warm_worker_serves_only_a_job_of_the_same_base_and_is_dropped_for_any_other(tiny_spec):
    from ray_jobs.train import model as models

    cpu = torch.device("cpu")
    models.hold_base(tiny_spec, cpu)
    held = next(iter(models._held.values())).model
    other_dtype = tiny_spec.replace(model=dataclasses.replace(tiny_spec.model, dtype="bfloat16"))
    loaded = models.load_base_from(other_dtype, cpu, Single())
    assert not loaded.held and loaded.model is not held and loaded.model.dtype == torch.bfloat16
    assert models._held == {}, "a base the job did not take is dropped, not kept beside its own"

    models.hold_base(tiny_spec, cpu)
    held = next(iter(models._held.values())).model
    loaded = models.load_base_from(tiny_spec.replace(name="another-job"), cpu, Single())
    assert loaded.held and loaded.model is held and models._held == {}, "the same base: taken once"
    assert not models.load_base_from(tiny_spec, cpu, Single()).held, "the next job of the process loads its own"


def test_a_base_in_s3_is_never_held_it_is_read_with_the_jobs_own_keys(tiny_spec):
    from ray_jobs.train.model import held_key

    in_s3 = tiny_spec.replace(model=dataclasses.replace(tiny_spec.model, path="s3://models/llama"))
    assert held_key(in_s3, torch.device("cpu")) is None
    assert held_key(tiny_spec, torch.device("cpu")) is not None


def test_compiling_the_attention_ahead_runs_the_decoder_both_ways_and_leaves_no_gradient_on_the_base(tiny_spec):
    """What a warm worker does on a GPU with flex attention (there, to compile its kernels), here with SDPA on CPU."""
    from ray_jobs.train.model import compile_attention

    model = load_base(tiny_spec, torch.device("cpu"), Single())
    before = {n for n, p in model.named_parameters() if p.requires_grad}
    attention, seen = model.model.layers[0].self_attn, []
    attention.register_forward_hook(lambda module, args, kwargs, out: seen.append("forward"), with_kwargs=True)
    attention.register_full_backward_hook(lambda module, grad_in, grad_out: seen.append("backward"))
    compile_attention(tiny_spec, model, torch.device("cpu"))
    assert seen == ["forward", "backward"]
    assert all(p.grad is None for p in model.parameters())
    assert {n for n, p in model.named_parameters() if p.requires_grad} == before


def test_a_warm_worker_holding_an_fp8_jobs_base_warms_fp8_up_for_the_bases_layer_widths(tiny_spec, monkeypatch):
    """The wiring: ``hold_base`` hands the base's widths to ``fp8.warm_up`` (which compiles only on a GPU: the gpu test
    checks the compile and that the job's shapes reuse it)."""
    from ray_jobs.train import fp8
    from ray_jobs.train import model as models

    calls = []
    warm_up = fp8.warm_up
    monkeypatch.setattr(fp8, "warm_up", lambda device, widths: calls.append(widths) or warm_up(device, widths))
    spec = tiny_spec.replace(
        quantization=dataclasses.replace(tiny_spec.quantization, fp8=True),
        lora=dataclasses.replace(tiny_spec.lora, fused=True),
    )
    models.hold_base(spec, torch.device("cpu"))
    config = next(iter(models._held.values())).model.config
    models._held.clear()
    assert calls == [(config.hidden_size, config.intermediate_size)]
    models.hold_base(tiny_spec, torch.device("cpu"))
    models._held.clear()
    assert len(calls) == 1, "a bf16 job's base warms no FP8"
