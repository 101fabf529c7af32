"""Backing off once from an out-of-memory step: half the micro-batch, the same rows per step, and the reason."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from ray_jobs.chaos import Chaos
from ray_jobs.memory import MicroBatches, OutOfMemory


def batch(rows: int, start: int = 0) -> dict[str, np.ndarray]:
    ids = np.arange(start, start + rows)[:, None].repeat(4, axis=1)
    return {"input_ids": ids, "labels": ids, "position_ids": ids, "num_tokens": np.full(rows, 4)}


def test_halved_pieces_hold_every_row_of_the_step_once_in_order():
    micro = MicroBatches(size=5, world=1)
    micro.back_off(torch.OutOfMemoryError("boom"), step=1, free=lambda: None)
    group = [batch(5, 0), batch(5, 5)]
    pieces = micro.pieces(group)
    assert [len(p["num_tokens"]) for p in pieces] == [2, 3, 2, 3]
    assert np.concatenate([p["input_ids"][:, 0] for p in pieces]).tolist() == list(range(10))


def test_the_back_off_frees_the_failed_step_and_says_why_once():
    freed = []
    micro = MicroBatches(size=8, world=1)
    assert micro.describe() == "8 (train.micro_batch_size)"
    micro.back_off(torch.OutOfMemoryError("boom"), step=3, free=lambda: freed.append(True))
    assert freed == [True] and micro.running == 4
    assert micro.describe() == "4 (step 3 ran out of GPU memory at micro-batch 8: halved, global batch unchanged)"
    with pytest.raises(OutOfMemory, match="even at micro-batch 4 after backing off.*train.micro_batch_size"):
        micro.back_off(torch.OutOfMemoryError("again"), step=3, free=lambda: freed.append(True))
    assert freed == [True], "nothing more is freed for a retry that will not come"


def test_with_several_workers_it_fails_naming_the_fix_instead_of_retrying_alone():
    micro = MicroBatches(size=8, world=2)
    with pytest.raises(OutOfMemory, match="micro-batch 8.*train.gradient_checkpointing: true"):
        micro.back_off(torch.OutOfMemoryError("boom"), step=1, free=lambda: pytest.fail("must not free"))
    assert micro.split == 1


def test_a_micro_batch_of_one_row_has_nothing_to_halve():
    with pytest.raises(OutOfMemory):
        MicroBatches(size=1, world=1).back_off(torch.OutOfMemoryError("boom"), step=1, free=lambda: None)


def test_the_injected_cause_is_torchs_own_out_of_memory_error():
    Chaos(oom_above_rows=2).check_memory(2)
    with pytest.raises(torch.OutOfMemoryError):
        Chaos(oom_above_rows=2).check_memory(3)
