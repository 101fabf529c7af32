"""On a CUDA GPU: an NF4 base read from the node's cache (``quantization.cache``) is the one quantized on the GPU,
written beside the job's first steps.

The CPU side (keys, misses, a full disk, the summary) is ``tests/unit/ray_jobs/cache/test_quantized.py``.
"""

from __future__ import annotations

import dataclasses

import pytest

pytestmark = pytest.mark.gpu


def test_a_base_read_from_the_node_s_cache_is_the_one_quantized_on_the_gpu(tiny_spec, tmp_path, monkeypatch):
    import torch

    from ray_jobs.train.model import apply_lora, load_base_from
    from ray_jobs.train.strategy import Single

    monkeypatch.setenv("RAYFT_CACHE_DIR", str(tmp_path / "cache"))
    spec = tiny_spec.replace(
        model=dataclasses.replace(tiny_spec.model, dtype="bfloat16"),
        quantization=dataclasses.replace(tiny_spec.quantization, mode="nf4", cache=True),
    )
    device = torch.device("cuda")
    first = load_base_from(spec, device, Single())
    kept = {k: v.clone() for k, v in first.model.state_dict().items()}
    ids = torch.randint(5, 100, (2, 64), generator=torch.Generator().manual_seed(0)).to(device)
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
        expected = first.model(input_ids=ids).logits
    # The job goes on while its base is written from a stream of the writer's own: LoRA, and steps on the GPU.
    first.keeping.start()
    model = apply_lora(first.model, spec)
    for _ in range(3):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            model(input_ids=ids, labels=ids).loss.backward()
    assert first.quantized_line(wait=True).startswith("quantized, then kept in the node's cache (")
    second = load_base_from(spec, device, Single())
    assert second.quantized == "read quantized from the node's cache"
    read = second.model.state_dict()
    assert read.keys() == kept.keys() and all(torch.equal(read[k], v) for k, v in kept.items())
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
        assert torch.equal(second.model(input_ids=ids).logits, expected)
