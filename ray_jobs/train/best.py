"""The adapter of the best evaluation, and when to stop training for lack of a better one.

Every evaluation (after step 0: the baseline is the untrained adapter) is judged in :meth:`Best.judge` by
``train.early_stopping_metric``: a lower eval loss, or a higher token accuracy, by more than
``train.early_stopping_min_delta``, makes that step the best one, and
rank 0 keeps a CPU copy of the trainable weights (the adapter's megabytes). Checkpoints taken after it
carry that copy (``checkpoint.take(best=...)``), so the best adapter survives checkpoint retention and a
resume, and the export makes it ``adapter/``. With ``train.early_stopping_patience``, that many
evaluations in a row without a better one end the job at that step: it saves, reports and exports as
at its last step.

Every rank evaluates on the same all-reduced figures, so every rank takes the same decision and all still
call ``ray.train.report`` the same number of times.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from ray_jobs.train.checkpoint import TrainState
from rayft_contract.spec import TrainSpec


@dataclasses.dataclass
class Best:
    train: TrainSpec
    weights: dict[str, Any] | None = None
    """Rank 0: the best step's trainable weights, on the CPU (others: ``None``)."""

    def judge(
        self, state: TrainState, eval_loss: float, token_accuracy: float | None, snapshot: Callable[[], dict[str, Any] | None]
    ) -> bool:
        """Record the eval at ``state.step``; True when the job should stop there. ``snapshot``: the current
        trainable weights (collective: called on every rank alike)."""
        if self.train.early_stopping_metric == "eval_token_accuracy":
            if token_accuracy is None:
                raise ValueError(
                    "train.early_stopping_metric: eval_token_accuracy needs the model's logits at evaluation, and "
                    "this model returned none; use eval_loss"
                )
            score = token_accuracy
        else:
            score = -eval_loss
        if state.best_score is None and state.best_eval_loss is not None and self.train.early_stopping_metric == "eval_loss":
            state.best_score = -state.best_eval_loss  # a checkpoint from before best_score was kept
        better = state.best_score is None or score > state.best_score + self.train.early_stopping_min_delta
        if better:
            state.best_step, state.best_eval_loss, state.best_score, state.evals_since_best = state.step, eval_loss, score, 0
            self.weights = snapshot()
            return False
        state.evals_since_best += 1
        patience = self.train.early_stopping_patience
        return patience is not None and state.evals_since_best >= patience

    def for_checkpoint(self, state: TrainState) -> dict[str, Any] | None:
        """What a checkpoint at ``state.step`` saves beside its own weights: the best ones, if they are older."""
        return self.weights if state.best_step and state.best_step != state.step else None

    def describe(self, state: TrainState, stopped: bool) -> dict[str, Any]:
        """The summary's fields: which step the exported adapter comes from, and why the job ended there."""
        patience = self.train.early_stopping_patience
        better = "lower eval loss" if self.train.early_stopping_metric == "eval_loss" else "higher eval token accuracy"
        return {
            "best_step": state.best_step or None,
            "best_eval_loss": state.best_eval_loss,
            "stopped_early": (f"no {better} in {patience} evaluations since step {state.best_step}" if stopped else None),
        }


def snapshot_of(strategy: Any, model: Any, rank: int) -> Callable[[], dict[str, Any] | None]:
    """A callable taking rank 0's CPU copy of the trainable weights (a collective under FSDP). The optimizer's
    state is left out: the best adapter is weights only, and AdamW's state is twice their size."""

    def take() -> dict[str, Any] | None:
        weights = strategy.weights(model)
        return {k: v.detach().to("cpu").clone() for k, v in weights.items()} if rank == 0 else None

    return take
