"""The best adapter and early stopping (ray_jobs/train/best.py): judged on the eval figures alone."""

from __future__ import annotations

from ray_jobs.train.best import Best
from ray_jobs.train.checkpoint import TrainState
from rayft_contract.spec import TrainSpec


def judge_all(
    best: Best, losses: dict[int, float], accuracies: dict[int, float] | None = None
) -> tuple[TrainState, list[int], int | None]:
    state, snapshots, stopped = TrainState(), [], None
    for step, loss in losses.items():
        state.step = step
        accuracy = (accuracies or {}).get(step)
        if best.judge(state, loss, accuracy, lambda step=step: snapshots.append(step) or {"w": step}):
            stopped = step
            break
    return state, snapshots, stopped


def test_the_lowest_eval_loss_is_kept_and_patience_counts_evaluations_without_a_better_one():
    best = Best(TrainSpec(early_stopping_patience=2, eval_every=10))
    state, snapshots, stopped = judge_all(best, {10: 3.0, 20: 2.0, 30: 2.5, 40: 1.5, 50: 1.6, 60: 1.7, 70: 1.0})
    assert snapshots == [10, 20, 40], "a copy of the weights at each new best, none otherwise"
    assert (stopped, state.best_step, state.best_eval_loss, best.weights) == (60, 40, 1.5, {"w": 40})
    assert best.describe(state, stopped=True)["stopped_early"] == "no lower eval loss in 2 evaluations since step 40"


def test_without_patience_it_only_keeps_the_best():
    best = Best(TrainSpec())
    state, _, stopped = judge_all(best, {10: 1.0, 20: 2.0, 30: 3.0, 40: 4.0})
    assert stopped is None and state.best_step == 10 and state.evals_since_best == 3


def test_an_improvement_smaller_than_min_delta_is_not_better():
    best = Best(TrainSpec(early_stopping_patience=1, early_stopping_min_delta=0.1, eval_every=10))
    state, _, stopped = judge_all(best, {10: 2.0, 20: 1.95})
    assert stopped == 20 and state.best_step == 10


def test_a_checkpoint_carries_the_best_weights_only_when_they_are_older_than_it():
    best = Best(TrainSpec())
    state, _, _ = judge_all(best, {10: 1.0, 20: 2.0})
    assert best.for_checkpoint(state) == {"w": 10}
    state.step = 10
    assert best.for_checkpoint(state) is None, "the checkpoint's own weights are the best"
    assert Best(TrainSpec()).for_checkpoint(TrainState(step=5)) is None, "no evaluation yet"


def test_by_token_accuracy_the_highest_is_best_whatever_the_loss_says():
    best = Best(TrainSpec(early_stopping_patience=2, eval_every=10, early_stopping_metric="eval_token_accuracy"))
    losses = {10: 3.0, 20: 2.0, 30: 1.0, 40: 0.5}  # falling all along
    state, snapshots, stopped = judge_all(best, losses, {10: 0.2, 20: 0.5, 30: 0.4, 40: 0.45})
    assert (stopped, state.best_step, state.best_eval_loss, snapshots) == (40, 20, 2.0, [10, 20])
    assert best.describe(state, stopped=True)["stopped_early"] == "no higher eval token accuracy in 2 evaluations since step 20"
