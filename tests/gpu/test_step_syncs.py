"""On a CUDA GPU: nothing of the job's inside a step's micro-batches waits for the GPU
(``ray_jobs.train.loop._forward_backward``).

A call that waits (a copy from the host's pageable memory, ``.item()``, a sync) empties the GPU's queue, so every
pause of the host after it idles the GPU. On an H100 the loop's copy of a host tensor in every micro-batch took 9% of
the 7B preset's step (``bench/RESULTS.md``). torch's sync debug mode reports each wait with the line that made it.

Liger's fused linear cross-entropy waits, and the job does not choose its lines: its forward reads the count of label
tokens with ``.item()`` (``total_n_non_ignore``, a scalar argument of its Triton kernel; its own TODO weighs the cost),
and its backward checks whether the incoming gradient is 1.0 with ``torch.equal`` against a tensor it copies from the
host (``fused_linear_cross_entropy_backward``; under ``num_items_in_batch`` it is not). They are allowed by their
source lines, at most those three a micro-batch; any other wait fails.
"""

from __future__ import annotations

import dataclasses
import linecache
import warnings

import pytest

from tests.gpu.test_kernels import qlora_gpu

pytestmark = pytest.mark.gpu

LIGER_FLCE = "liger_kernel/ops/fused_linear_cross_entropy.py"
LIGER_WAITS = ("target_mask.sum().item()", "torch.equal(grad_output")
"""The source lines of Liger's fused linear cross-entropy that wait: the forward's count, the backward's check (two
waits on one line: the copy of the host's 1.0 and the comparison's result)."""


def _liger_s(wait: str) -> bool:
    filename, lineno = wait.split(":")[:2]
    return LIGER_FLCE in filename and any(line in linecache.getline(filename, int(lineno)) for line in LIGER_WAITS)


def test_nothing_of_the_job_s_in_the_micro_batches_of_the_gpu_preset_s_model_waits_for_the_gpu(tiny_spec):
    """The 7B preset's set-up on the tiny model: Liger's kernels, flex attention over packed rows, NF4 with its
    matmuls in FP8, LoRA's update inside them; two micro-batches a step, as the loop runs them."""
    import torch

    from ray_jobs.chaos import NO_CHAOS
    from ray_jobs.data.packing import rows_of_job_shape
    from ray_jobs.train.loop import _forward_backward
    from ray_jobs.train.model import adapt, load_base_from
    from ray_jobs.train.strategy import Single

    device = torch.device("cuda", 0)
    spec = qlora_gpu(tiny_spec)
    spec = spec.replace(
        model=dataclasses.replace(spec.model, attn_implementation="flex_attention"),
        quantization=dataclasses.replace(spec.quantization, fp8=True),
        lora=dataclasses.replace(spec.lora, fused=True),
    )
    strategy = Single()
    base = load_base_from(spec, device, strategy, keep=False).model
    model = strategy.wrap(adapt(base, spec, device, world=1).model)
    model.train()

    def pieces() -> list[dict]:
        out = []
        for _ in range(2):
            batch = rows_of_job_shape(spec, base.config.vocab_size, "flex_attention", device, rows=2)
            batch["num_tokens"] = torch.full((2,), batch["input_ids"].shape[1])
            out.append(batch)
        return out

    def waits_in(run) -> tuple[list[str], object]:
        """What ``run`` returned, and each call in it that waited for the GPU, with its line."""
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("warn")
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                out = run()
        finally:
            torch.cuda.set_sync_debug_mode("default")
        return [f"{w.filename}:{w.lineno}: {w.message}" for w in caught if "synchroniz" in str(w.message)], out

    tokens = torch.tensor(4.0 * spec.data.max_seq_len, device=device)
    _forward_backward(model, strategy, pieces(), spec, device, tokens, NO_CHAOS)  # the first compiles and tunes
    batches = pieces()
    waits, loss = waits_in(lambda: _forward_backward(model, strategy, batches, spec, device, tokens, NO_CHAOS))
    liger = [w for w in waits if _liger_s(w)]
    print(f"{len(liger)} of Liger's waits in {len(batches)} micro-batches:", *liger, sep="\n")  # shown by pytest -rP
    assert [w for w in waits if not _liger_s(w)] == [], "\n".join(waits)
    assert len(liger) <= 3 * len(batches), "Liger's count and check, once a micro-batch at most:\n" + "\n".join(liger)
    assert torch.isfinite(loss)
    # The check's own: the copy the loop made in every micro-batch before (a host tensor to the GPU) is caught.
    before, _ = waits_in(lambda: torch.tensor(4.0 * spec.data.max_seq_len).to(device))
    assert before, "a copy from the host's pageable memory waits for the GPU"
