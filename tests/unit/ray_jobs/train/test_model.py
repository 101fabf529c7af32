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
