"""The learning-rate schedule: the curves users know from transformers recipes (ray_jobs/train/loop.py)."""

from __future__ import annotations

import dataclasses

import pytest

from rayft_contract.spec import TrainSpec

PEAK, WARMUP, TOTAL = 1e-3, 4, 20


def learning_rates(schedule: str, min_lr_ratio: float = 0.0) -> list[float]:
    """The learning rate of each of TOTAL optimizer steps, as the loop applies it."""
    import torch

    from ray_jobs.train.schedule import lr_scheduler

    optimizer = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=PEAK)
    train = dataclasses.replace(TrainSpec(), lr_schedule=schedule, warmup_steps=WARMUP, min_lr_ratio=min_lr_ratio)
    scheduler = lr_scheduler(optimizer, train, TOTAL)
    rates = []
    for _ in range(TOTAL):
        rates.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    return rates


@pytest.mark.parametrize("schedule", ["cosine", "linear", "constant"])
def test_warmup_rises_from_zero_to_the_peak_in_a_straight_line(schedule):
    rates = learning_rates(schedule)
    assert rates[: WARMUP + 1] == pytest.approx([PEAK * i / WARMUP for i in range(WARMUP + 1)])


def test_cosine_and_linear_decay_to_zero_and_constant_stays():
    cosine, linear, constant = (learning_rates(s) for s in ("cosine", "linear", "constant"))
    middle = WARMUP + (TOTAL - WARMUP) // 2  # half-way through the decay
    assert cosine[middle] == pytest.approx(PEAK / 2) and linear[middle] == pytest.approx(PEAK / 2)
    assert cosine[WARMUP + 2] > linear[WARMUP + 2]  # cosine decays slowly at first
    assert cosine[-1] < PEAK * 0.01 and linear[-1] == pytest.approx(PEAK / (TOTAL - WARMUP))
    assert constant[WARMUP:] == pytest.approx([PEAK] * (TOTAL - WARMUP))


def test_cosine_with_a_floor_decays_to_that_share_of_the_peak_and_warms_up_the_same():
    floored, plain = learning_rates("cosine", min_lr_ratio=0.1), learning_rates("cosine")
    assert floored[: WARMUP + 1] == pytest.approx(plain[: WARMUP + 1])
    assert min(floored) == 0.0 and min(floored[WARMUP:]) >= PEAK * 0.1 - 1e-12
    assert floored[-1] == pytest.approx(PEAK * 0.1, rel=0.1) and plain[-1] < PEAK * 0.01
