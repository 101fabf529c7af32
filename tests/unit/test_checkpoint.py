"""Resuming never runs code from the run directory (a team's own, writable storage)."""

from __future__ import annotations

import pickle

import pytest


class _Payload:
    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        import os

        return (os.system, (f"touch {self.marker}",))


def test_a_planted_pickle_in_train_state_is_refused_not_run(tmp_path):
    import ray.train
    import torch

    from ray_jobs import checkpoint
    from ray_jobs.strategy import Single

    torch.save({"model": {}, "state": _Payload(tmp_path / "ran")}, tmp_path / "train_state.pt")
    model = torch.nn.Linear(2, 2)
    optimizer = torch.optim.AdamW(model.parameters())
    with pytest.raises(pickle.UnpicklingError, match="Weights only load failed"):
        checkpoint.load(ray.train.Checkpoint.from_directory(str(tmp_path)), Single(), model, optimizer, None)
    assert not (tmp_path / "ran").exists(), "the planted code ran"
