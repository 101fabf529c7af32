"""A job's first step on a one-layer copy of its base (ray_jobs.train.one_layer), on CPU: what the step runs, under which
numerics, at which micro-batch, and the forecast of the job's model and memory it plans from. What the copy saves is a
GPU's measure (bench/compile_ahead.sh): on CPU nothing is compiled."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import tempfile
import weakref

import pytest
import torch

from ray_jobs.train import one_layer
from ray_jobs.train.memory import HEADROOM, activation_bytes, plan
from ray_jobs.train.model import adapt, load_base_from
from ray_jobs.train.strategy import Single


def short(spec, max_seq_len=64):
    return spec.replace(data=dataclasses.replace(spec.data, max_seq_len=max_seq_len))


def loaded(spec):
    """``spec``'s base loaded and adapted on CPU as the job's worker does: ``(base, adapted)``."""
    base = load_base_from(spec, torch.device("cpu"), Single()).model
    return base, adapt(base, spec, torch.device("cpu"), world=1)


def held(model) -> int:
    return one_layer.tensor_bytes(model.parameters(), model.buffers())


def memory_for_half_the_rows(spec):
    """``(usable bytes, the job's plan)`` on a GPU made to fit 2 of the spec's 4 rows a piece: about half of its
    activations, with the job's own weights besides."""
    _, whole = loaded(spec)
    size, seq = spec.train.micro_batch_size, spec.data.max_seq_len
    budget = 1.5 * activation_bytes(whole.shape, size // 2 * seq, gradient_checkpointing=False)
    free = (budget + 16 * whole.trainable) / HEADROOM
    job = plan(size, seq, whole.shape, whole.trainable, free, alone=True)
    assert (job.split, job.gradient_checkpointing) == (2, False), "the test's own arithmetic: the job runs pieces of 2"
    return free + held(whole.model), job


def test_the_copy_s_first_step_loads_and_adapts_as_the_job_does_and_leaves_no_copy_behind(
    tiny, tiny_spec, tmp_path, monkeypatch, own_caches
):
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    spec = short(tiny_spec)
    report = one_layer.first_steps(spec, torch.device("cpu"), steps=2)
    assert (report.layers, len(report.step_s), report.attention) == (1, 2, "sdpa")
    assert (report.micro_batch, report.plan, report.forecast_free_gib) == (spec.train.micro_batch_size, "", None), (
        "no GPU, no forecast: the spec's"
    )
    assert report.copy_s > 0 and list(scratch.iterdir()) == [], "the copy is removed"
    whole = one_layer.first_steps(spec, torch.device("cpu"), whole=True)
    assert whole.layers == json.loads((tiny / "model" / "config.json").read_text())["num_hidden_layers"]
    assert whole.copy_s == 0.0


def test_the_copy_forecasts_the_whole_base_s_shape_trainable_weights_and_memory_from_its_one_layer(tiny, tiny_spec, tmp_path):
    """The tiny preset trains its embeddings and head in full (modules_to_save): weights outside the layers, which the
    forecast must count once, not once a layer."""
    spec = short(tiny_spec)
    whole_base, whole = loaded(spec)
    copy_dir = one_layer.one_layer_copy(spec.model.path, tmp_path / "copy", torch.float32, torch.device("cpu"))
    copy_spec = spec.replace(model=dataclasses.replace(spec.model, path=str(copy_dir)))
    copy_base, copy = loaded(copy_spec)
    layers = whole_base.config.num_hidden_layers
    assert layers > 1 and copy_base.config.num_hidden_layers == 1 and whole.trainable > layers * (whole.trainable // 100)

    usable = 10 * held(whole.model)
    forecast = one_layer.JobForecast.on(copy_base, layers, torch.device("cpu"), usable_bytes=usable)
    shape, trainable, free = forecast(copy.shape, copy.trainable)
    assert shape == whole.shape
    assert trainable == whole.trainable
    assert free == usable - held(whole.model)
    with pytest.raises(ValueError, match="usable_bytes"):
        one_layer.JobForecast.on(copy_base, layers, torch.device("cpu"))
    flat = torch.nn.Sequential(torch.nn.Linear(4, 4))
    assert one_layer.JobForecast.on(flat, layers, torch.device("cpu"), usable) is None, "no layers to grow by: no forecast"


def test_the_copy_steps_the_micro_batch_the_job_s_memory_plan_will_run_on_a_gpu_too_small_for_the_spec_s(
    tiny_spec, tmp_path, own_caches
):
    """The memory a GPU of the job's would have is made to fit 2 of the spec's 4 rows a piece (about half of its
    activations): the copy plans as the job will there, and steps pieces of 2."""
    spec = short(tiny_spec)
    usable, job = memory_for_half_the_rows(spec)
    size = spec.train.micro_batch_size

    report = one_layer.first_steps(spec, torch.device("cpu"), usable_bytes=usable)
    assert report.micro_batch == size // 2
    assert report.plan == job.reason and report.plan.startswith(f"micro-batch {size // 2}: ")


def test_the_copy_compiles_under_the_numerics_the_job_trains_under(tiny_spec, tmp_path):
    """torch keys a compiled kernel by the process's matmul precision too: on the H200 a copy compiled without the
    job's TF32 setting missed every kernel the job then looked up. Fresh processes, as the copy's and the job's are."""
    spec_file = tmp_path / "spec.json"
    spec_file.write_text(json.dumps(short(tiny_spec).to_dict()))
    probe = "import torch; {}; print(torch.backends.cuda.matmul.fp32_precision)"
    env = {"RAYFT_CACHE_DIR": str(tmp_path / "cache"), "PATH": "/usr/bin:/bin"}

    def precision(code: str) -> str:
        out = subprocess.run([sys.executable, "-c", probe.format(code)], capture_output=True, text=True, env=env, check=True)
        return out.stdout.strip().splitlines()[-1]

    untouched = precision("pass")
    job = precision("from ray_jobs.train.model import set_numerics; set_numerics()")
    copy = precision(
        "from ray_jobs.train import one_layer; from rayft_contract.spec import FineTuneSpec; "
        f"one_layer.first_steps(FineTuneSpec.load({str(spec_file)!r}), torch.device('cpu'))"
    )
    assert job != untouched, "the job's numerics are not torch's defaults (the test's own check)"
    assert copy == job


def test_a_warm_worker_plans_the_job_s_rows_on_a_copy_adapted_without_the_job_s_kernels(tiny_spec, monkeypatch, own_caches):
    """What a warm worker compiles attention for (ray_jobs.train.held.hold_base): the rows the job will run, planned as
    the copy ahead plans them, but adapted with no kernels (Liger's patches would outlive the copy in the worker's
    process) and no compile; the copy's memory goes back before the job comes."""
    from ray_jobs.train import model as models

    spec = short(tiny_spec)
    usable, job = memory_for_half_the_rows(spec)
    size = spec.train.micro_batch_size
    adapted_with, copies, adapt_as_the_job_does = [], [], models.adapt

    def adapt(base, spec, *args, **kwargs):
        adapted = adapt_as_the_job_does(base, spec, *args, **kwargs)
        adapted_with.append(spec.model)
        copies.append(weakref.ref(adapted.model))
        return adapted

    monkeypatch.setattr(models, "adapt", adapt)
    spec = spec.replace(model=dataclasses.replace(spec.model, compile=True))

    assert one_layer.job_rows(spec, torch.device("cpu"), usable_bytes=usable) == (size // 2, job.reason)
    assert [(m.kernels, m.compile) for m in adapted_with] == [("none", False)]
    assert copies[0]() is None, "the copy is gone when the rows come back"
    assert one_layer.job_rows(spec, torch.device("cpu")) == (size, ""), "no GPU and no memory given: the spec's micro-batch"
