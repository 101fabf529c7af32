"""On a CUDA GPU: nothing of the job's inside a step's micro-batches waits for the GPU
(``ray_jobs.train.loop._forward_backward``).

A call that waits (a copy from the host's pageable memory, ``.item()``, a sync) empties the GPU's queue, so every
pause of the host after it idles the GPU. On an H100 the loop's copy of a host tensor in every micro-batch took 9% of
the 7B preset's step (``bench/RESULTS.md``). torch's sync debug mode reports each wait with the line that made it.

Liger's fused linear cross-entropy waited three times a micro-batch (its label count's ``.item()``, its check of the
incoming gradient against a 1.0 copied from the host); the loop's loss goes through ``ray_jobs.train.fused_loss``
now, the same kernels without them, so no wait at all is allowed.
"""

from __future__ import annotations

import dataclasses
import warnings

import pytest

from tests.gpu.test_kernels import qlora_gpu

pytestmark = pytest.mark.gpu


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
    assert waits == [], "\n".join(waits)
    assert torch.isfinite(loss)
    # The check's own: the copy the loop made in every micro-batch before (a host tensor to the GPU) is caught.
    before, _ = waits_in(lambda: torch.tensor(4.0 * spec.data.max_seq_len).to(device))
    assert before, "a copy from the host's pageable memory waits for the GPU"
