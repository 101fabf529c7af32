"""On a CUDA GPU: each step's record counts the caching allocator's calls for device memory
(``ray_jobs.observe.metrics``). The CPU side is ``tests/unit/ray_jobs/observe/test_metrics.py``."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.gpu


def test_a_step_that_needs_new_gpu_memory_counts_the_allocator_s_call_and_a_step_that_reuses_it_none():
    import torch

    from ray_jobs.observe.metrics import StepMeter

    device = torch.device("cuda")
    meter = StepMeter(device)
    held = torch.empty(64 * 2**20, dtype=torch.uint8, device=device)  # 64 MiB: more than anything cached
    close = dict(tokens=1, processed=1, samples=1, attn_ctx=1)
    meter.end_step(1, **close)
    del held  # back to the allocator's cache, not to the driver
    again = torch.empty(64 * 2**20, dtype=torch.uint8, device=device)
    meter.end_step(2, **close)
    grown, reused = meter.window()["step_timing"]
    assert grown.device_allocs >= 1
    assert reused.device_allocs == 0, "the cached block served it"
    assert (grown.alloc_retries, reused.alloc_retries) == (0, 0)
    del again
