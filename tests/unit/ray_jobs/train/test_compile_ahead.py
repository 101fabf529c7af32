"""A job's first step on a one-layer copy of its base, ahead of the job (ray_jobs.train.compile_ahead), on CPU: what the copy
keeps, what the step runs, when it is started and that it never fails a job. What it saves is a GPU's measure
(bench/compile_ahead.sh): on CPU nothing is compiled."""

from __future__ import annotations

import dataclasses
import json

import torch

from ray_jobs.train import compile_ahead, one_layer


def one_gpu(spec):
    return spec.replace(scaling=dataclasses.replace(spec.scaling, use_gpu=True, num_workers=1))


def test_a_one_layer_copy_keeps_every_shape_of_its_base_but_the_layer_count(tiny, tiny_spec, tmp_path):
    base = json.loads((tiny / "model" / "config.json").read_text())
    copy = one_layer.one_layer_copy(str(tiny / "model"), tmp_path / "copy", torch.float32, torch.device("cpu"))
    copied = json.loads((copy / "config.json").read_text())
    assert base["num_hidden_layers"] > 1 and copied["num_hidden_layers"] == 1
    differ = {k for k in base.keys() | copied.keys() if base.get(k) != copied.get(k)}
    assert differ <= {"num_hidden_layers", "dtype", "torch_dtype", "transformers_version"}, differ
    assert compile_ahead.kernels_key(tiny_spec, base) == compile_ahead.kernels_key(tiny_spec, copied)


def test_the_kernels_key_follows_what_is_compiled_and_not_what_is_not(tiny, tiny_spec):
    config = json.loads((tiny / "model" / "config.json").read_text())
    key = compile_ahead.kernels_key(tiny_spec, config)
    train, lora = tiny_spec.train, tiny_spec.lora
    same = [
        tiny_spec.replace(name="another-run"),
        tiny_spec.replace(train=dataclasses.replace(train, learning_rate=train.learning_rate / 2, max_steps=7)),
    ]
    other = [
        tiny_spec.replace(train=dataclasses.replace(train, micro_batch_size=train.micro_batch_size + 1)),
        tiny_spec.replace(lora=dataclasses.replace(lora, r=lora.r * 2)),
        tiny_spec.replace(data=dataclasses.replace(tiny_spec.data, max_seq_len=tiny_spec.data.max_seq_len * 2)),
    ]
    assert all(compile_ahead.kernels_key(s, config) == key for s in same)
    assert len({compile_ahead.kernels_key(s, config) for s in other} | {key}) == len(other) + 1
    assert compile_ahead.kernels_key(tiny_spec, {**config, "hidden_size": 2 * config["hidden_size"]}) != key


def test_compiling_ahead_starts_only_for_a_one_gpu_job_on_a_base_the_node_reads(tiny_spec):
    gpu = one_gpu(tiny_spec)
    assert compile_ahead.why_not(gpu, gpus_free=1) == ""
    assert "CPU" in compile_ahead.why_not(tiny_spec.replace(scaling=dataclasses.replace(gpu.scaling, use_gpu=False)), 1)
    assert "several" in compile_ahead.why_not(gpu.replace(scaling=dataclasses.replace(gpu.scaling, num_workers=2)), 1)
    s3 = gpu.replace(model=dataclasses.replace(gpu.model, path="s3://team/base"))
    assert "team's keys" in compile_ahead.why_not(s3, 1)
    assert "no GPU" in compile_ahead.why_not(gpu, gpus_free=0.5)
    assert compile_ahead.why_not(gpu, 1, setting="0") == "RAYFT_COMPILE_AHEAD=0"


def test_the_task_compiles_nothing_on_a_node_that_has_the_kernels_or_no_gpu_free_of_other_processes(tiny, tiny_spec, own_caches):
    gpu = one_gpu(tiny_spec)
    assert "no GPU on this node" in compile_ahead._ahead_on_node(gpu)  # this machine has none
    key = compile_ahead.kernels_key(gpu, json.loads((tiny / "model" / "config.json").read_text()))
    marker = own_caches / "compile" / "ahead" / key
    assert not marker.exists(), "nothing ran, so nothing is marked"
    assert compile_ahead.kernels_at(gpu) == "", "the probe: a job's early worker gives way to Ray Train and a copy"
    marker.parent.mkdir(parents=True)
    marker.write_text("{}")
    assert "already has the kernels" in compile_ahead._ahead_on_node(gpu)
    assert compile_ahead.kernels_at(gpu) == "node", "the probe: the early worker runs the job"


def test_the_kernels_key_follows_rayft_s_training_code(tiny, tiny_spec, tmp_path, monkeypatch):
    """A rayft whose training modules changed (the loss's kernel arguments, FP8's scaling, the mask) compiles other
    kernels: a node keyed by an older one's must not say it has them."""
    import shutil
    from pathlib import Path

    code = tmp_path / "train"
    shutil.copytree(Path(compile_ahead.__file__).parent, code, ignore=shutil.ignore_patterns("__pycache__"))
    before = compile_ahead.training_code(code)
    assert before == compile_ahead.training_code(code) == compile_ahead.training_code()
    (code / "fused_loss.py").write_text((code / "fused_loss.py").read_text() + "\n# changed\n")
    changed = compile_ahead.training_code(code)
    assert changed != before
    (code / "notes.txt").write_text("not code")
    assert compile_ahead.training_code(code) == changed

    config = json.loads((tiny / "model" / "config.json").read_text())
    key = compile_ahead.kernels_key(tiny_spec, config)
    monkeypatch.setattr(compile_ahead, "training_code", lambda: before[::-1])
    assert compile_ahead.kernels_key(tiny_spec, config) != key
