"""quantization.cache (ray_jobs.cache.quantized): the NF4 base kept in the node's model cache, read back exactly."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import threading
from pathlib import Path

import pytest
import torch

from ray_jobs.cache import entries as cache
from ray_jobs.cache import quantized as quantized_cache
from ray_jobs.train.model import cacheable_quantization, load_base_from, quantization_config
from ray_jobs.train.strategy import FSDP2, Single


def nf4(spec, **changes):
    """The tiny spec with an NF4 base in bf16 (bitsandbytes quantizes on CPU too), the cache on."""
    return spec.replace(
        model=dataclasses.replace(spec.model, dtype="bfloat16"),
        quantization=dataclasses.replace(spec.quantization, mode="nf4", cache=True, **changes),
    )


@pytest.fixture
def own_root(tmp_path, monkeypatch):
    root = tmp_path / "cache"
    monkeypatch.setenv("RAYFT_CACHE_DIR", str(root))
    return root


@pytest.fixture
def own_model(tiny_spec, tmp_path):
    """A copy of the tiny base that this test may touch."""
    copy = tmp_path / "base"
    shutil.copytree(tiny_spec.model.path, copy)
    return tiny_spec.replace(model=dataclasses.replace(tiny_spec.model, path=str(copy)))


def quantized_cache_settings(spec):
    return cacheable_quantization(spec, quantization_config(spec, Single()))


def logits(model: torch.nn.Module) -> torch.Tensor:
    ids = torch.randint(3, 100, (2, 24), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        return model(input_ids=ids).logits


def test_the_second_load_reads_the_quantized_base_the_first_kept_and_it_is_the_same_model(own_model, own_root):
    spec = nf4(own_model)
    first = load_base_from(spec, torch.device("cpu"), Single())
    # Before any forward: bitsandbytes' CPU path rewrites a layer's quantization state in its first forward.
    kept = {k: v.clone() for k, v in first.model.state_dict().items()}
    assert first.quantized_line(wait=True).startswith("quantized, then kept in the node's cache (")
    second = load_base_from(spec, torch.device("cpu"), Single())
    assert second.quantized == "read quantized from the node's cache"
    read = second.model.state_dict()
    assert read.keys() == kept.keys() and all(torch.equal(read[k], v) for k, v in kept.items())
    assert torch.equal(logits(second.model), logits(first.model))
    assert type(second.model.model.layers[0].self_attn.q_proj).__name__ == "Linear4bit"
    (entry,) = [e for e in cache.list_entries(str(own_root)) if e.key.startswith("nf4-")]
    assert entry.complete and entry.kind == "models" and "quantized base" in entry.description
    assert entry.hits == 1  # the read counts as a use, so pruning by last use keeps a base in use
    assert not list(Path(entry.uri).rglob("*.bin")) and not list(Path(entry.uri).rglob("*.pt"))  # safetensors only


def test_the_base_is_written_beside_the_job_and_what_is_kept_is_the_base_as_loaded_not_as_trained(
    own_model, own_root, monkeypatch
):
    """What is kept is taken at the load; the write runs on a thread while the job trains (held here until the job
    has wrapped the base in LoRA and trained a step)."""
    import safetensors.torch

    from ray_jobs.train.model import apply_lora

    release, save_file = threading.Event(), safetensors.torch.save_file

    def held(*args, **kwargs):
        assert release.wait(60), "the test never released the write"
        save_file(*args, **kwargs)

    monkeypatch.setattr("safetensors.torch.save_file", held)
    spec = nf4(own_model)
    first = load_base_from(spec, torch.device("cpu"), Single())
    kept = {k: v.clone() for k, v in first.model.state_dict().items()}
    expected = logits(first.model)
    assert first.quantized_line() == "quantized, being kept in the node's cache" and not first.keeping.done()
    first.keeping.start()  # as the job's loop does after its first step
    assert quantized_cache.lookup(own_model.model.path, quantized_cache_settings(spec)) is None  # nothing half-written is read

    model = apply_lora(first.model, spec)  # the job goes on: its LoRA wraps the base's layers, and it trains a step
    ids = torch.randint(3, 100, (2, 24), generator=torch.Generator().manual_seed(1))
    model(input_ids=ids, labels=ids).loss.backward()
    torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1.0).step()
    release.set()
    assert first.quantized_line(wait=True).startswith("quantized, then kept in the node's cache (")

    second = load_base_from(spec, torch.device("cpu"), Single())
    assert second.quantized == "read quantized from the node's cache"
    read = second.model.state_dict()
    assert read.keys() == kept.keys() and all(torch.equal(read[k], v) for k, v in kept.items())
    assert torch.equal(logits(second.model), expected)
    assert not any("lora" in name for name in read)


def test_other_settings_or_a_base_rewritten_in_place_quantize_again(own_model, own_root):
    spec = nf4(own_model)
    load_base_from(spec, torch.device("cpu"), Single())
    other = load_base_from(nf4(own_model, double_quant=False), torch.device("cpu"), Single())
    assert other.quantized_line(wait=True).startswith("quantized, then kept in the node's cache (")
    weights = next(Path(own_model.model.path).glob("*.safetensors"))
    os.utime(weights, ns=(weights.stat().st_atime_ns, weights.stat().st_mtime_ns + 10**9))  # a new checkpoint, same size
    again = load_base_from(spec, torch.device("cpu"), Single())
    assert again.quantized_line(wait=True).startswith("quantized, then kept in the node's cache (")


def test_nothing_is_kept_with_the_cache_off_under_fsdp_by_a_nodes_other_workers_or_with_the_cache_in_s3(
    own_model, own_root, monkeypatch
):
    off = own_model.replace(
        model=dataclasses.replace(own_model.model, dtype="bfloat16"),
        quantization=dataclasses.replace(own_model.quantization, mode="nf4"),
    )
    assert not off.quantization.cache  # off by default until a GPU has measured it
    assert load_base_from(off, torch.device("cpu"), Single()).quantized == "quantized"
    assert load_base_from(nf4(own_model), torch.device("cpu"), FSDP2()).quantized == "quantized"  # bf16 storage
    other_worker = load_base_from(nf4(own_model), torch.device("cpu"), Single(), keep=False)  # local rank 1: rank 0 keeps
    assert (other_worker.keeping, other_worker.quantized_line(wait=True)) == (None, "quantized")
    monkeypatch.setenv("RAYFT_CACHE_DIR", "s3://bucket/cache")
    assert load_base_from(nf4(own_model), torch.device("cpu"), Single()).quantized == "quantized"
    assert not own_root.exists() or not any(own_root.rglob("entry.json"))
    assert load_base_from(own_model, torch.device("cpu"), Single()).quantized == ""  # the tiny base is not quantized


@pytest.mark.parametrize("full_at", ["safetensors.torch.save_file", "transformers.PretrainedConfig.save_pretrained"])
def test_a_full_disk_costs_the_next_job_its_read_not_this_job_its_run(own_model, own_root, monkeypatch, full_at):
    """Full when the writer's thread writes the weights, or already at the configs it writes first."""

    def full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(full_at, full)
    loaded = load_base_from(nf4(own_model), torch.device("cpu"), Single())
    assert loaded.quantized_line(wait=True).startswith("quantized; not kept in the node's cache: OSError(28")
    assert not any(own_root.rglob("entry.json")) and not any(own_root.rglob("data-*"))  # no half entry left
    assert quantized_cache.lookup(own_model.model.path, {"mode": "nf4"}) is None


def test_a_base_loaded_with_no_renaming_is_kept_in_the_files_transformers_would_write_without_renaming_each_tensor(
    own_model, own_root, monkeypatch
):
    """transformers' ``revert_weight_conversion`` compiles a regular expression per tensor even where the model was
    loaded with no renaming (``_weight_conversions == []``, as for Llama); keep() leaves it out there, and splits the
    files as it would have (here: several files, forced by a small shard size)."""
    import transformers.core_model_loading as loading
    from huggingface_hub import split_torch_state_dict_into_shards
    from transformers.modeling_utils import remove_tied_weights_from_state_dict

    real, reverted = loading.revert_weight_conversion, []
    monkeypatch.setattr(loading, "revert_weight_conversion", lambda *args: reverted.append(args) or real(*args))
    monkeypatch.setattr(quantized_cache, "SHARD_BYTES", 2**15)
    loaded = load_base_from(nf4(own_model), torch.device("cpu"), Single())
    assert loaded.model._weight_conversions == [] and reverted == []
    assert loaded.quantized_line(wait=True).startswith("quantized, then kept in the node's cache (")

    state = real(loaded.model, remove_tied_weights_from_state_dict(loaded.model.state_dict(), loaded.model))
    expected = split_torch_state_dict_into_shards(state, filename_pattern="model{suffix}.safetensors", max_shard_size=2**15)
    (index,) = own_root.rglob("model.safetensors.index.json")
    assert len(set(expected.tensor_to_filename.values())) > 2
    assert json.loads(index.read_text())["weight_map"] == expected.tensor_to_filename

    loaded.model._weight_conversions = None  # as for a model built, not loaded: transformers' own path, which looks it up
    assert quantized_cache.keep(loaded.model, own_model.model.path, {"mode": "nf4"}) is not None and len(reverted) == 1


def test_a_files_tensors_are_staged_side_by_side_through_a_small_chunk_and_written_as_they_were(tmp_path):
    """On a GPU the writer copies a file's tensors through a pinned chunk into one buffer (``_Staging``); here, on CPU
    buffers, with a chunk of 16 bytes: every dtype and shape a quantized base holds, each view at its own aligned
    offset, none overlapping, a tensor larger than the chunk split across it, one wait a chunkful, and safetensors
    writes and reads back each tensor as it was."""
    from safetensors.torch import load_file, save_file

    generator = torch.Generator().manual_seed(0)
    tensors = {
        "weight": torch.randint(0, 255, (37, 1), dtype=torch.uint8, generator=generator),  # odd: what follows realigns
        "absmax": torch.rand(5, generator=generator),
        "norm": torch.rand(3, 4, generator=generator).to(torch.bfloat16),
        "scalar": torch.tensor(2.5, dtype=torch.float64),
        "empty": torch.empty(0, 8),
        "strided": torch.rand(4, 6, generator=generator).t(),  # not contiguous: staged contiguous
    }
    buffer = torch.full((sum(quantized_cache._aligned(t) for t in tensors.values()),), 7, dtype=torch.uint8)
    views = quantized_cache._laid_out(buffer, tensors)
    waits = []
    pairs = [(quantized_cache._bytes(tensors[k].contiguous()), quantized_cache._bytes(v)) for k, v in views.items()]
    quantized_cache._through(torch.empty(16, dtype=torch.uint8), pairs, lambda: waits.append(1))

    starts = sorted((v.data_ptr(), v.data_ptr() + v.numel() * v.element_size()) for v in views.values() if v.numel())
    assert all(start % quantized_cache._ALIGN == 0 for start, _ in starts) and all(
        end <= after for (_, end), (after, _) in zip(starts, starts[1:])
    )
    assert all(v.untyped_storage().data_ptr() == buffer.data_ptr() for v in views.values() if v.numel())
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    assert total // 16 <= len(waits) <= total // 16 + len(tensors)  # a chunkful at a time: 37 bytes alone take three
    save_file(views, str(tmp_path / "model.safetensors"))
    read = load_file(str(tmp_path / "model.safetensors"))
    assert read.keys() == tensors.keys()
    assert all(read[k].dtype == t.dtype and torch.equal(read[k], t) for k, t in tensors.items())


def test_the_summary_says_how_the_quantized_base_came_to_be_and_keeps_it_through_json():
    from rayft.progress import _cache_rows
    from rayft_contract.records import JobSummary

    summary = JobSummary.from_dict(JobSummary(name="x", quantized_base="read quantized from the node's cache").to_dict())
    assert ("quantized base", "read quantized from the node's cache") in _cache_rows(summary)
    assert not [row for row in _cache_rows(JobSummary(name="x")) if row[0] == "quantized base"]
