"""Checkpoints hold data, never code, and a job resumes only its own run (ray_jobs/train/checkpoint.py)."""

from __future__ import annotations

import json

import pytest

from rayft_contract.spec import FineTuneSpec

SPEC = FineTuneSpec.from_dict({"name": "job", "model": {"path": "org/model"}, "data": {"path": "/d/train.jsonl"}})


class _Payload:
    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        import os

        return (os.system, (f"touch {self.marker}",))


def trained():
    """A model, optimizer and scheduler one step in: real optimizer state (int keys, moments, step)."""
    import torch

    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0 / (1 + step))
    model(torch.randn(5, 4)).sum().backward()
    optimizer.step()
    scheduler.step()
    return model, optimizer, scheduler


def test_a_checkpoint_round_trips_through_safetensors_and_json(tmp_path):
    import torch

    from ray_jobs.train.checkpoint import RunIdentity, TrainState, read, write

    model, optimizer, scheduler = trained()
    states = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict()}
    identity = RunIdentity.of(SPEC, "vision")
    write(tmp_path, states, TrainState(step=7, epoch=1, batches_in_epoch=3, tokens=900, samples=40), identity)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["train_state.json", "train_state.safetensors"]
    back, state = read(tmp_path, identity)
    assert state == TrainState(step=7, epoch=1, batches_in_epoch=3, tokens=900, samples=40)
    assert back["optimizer"]["param_groups"] == states["optimizer"]["param_groups"]
    assert set(back["optimizer"]["state"]) == set(states["optimizer"]["state"]) == {0, 1, 2, 3}  # int keys stay ints
    for key, moments in states["optimizer"]["state"].items():
        for name, value in moments.items():
            assert torch.equal(back["optimizer"]["state"][key][name], value)
    assert all(torch.equal(back["model"][k], v) for k, v in states["model"].items())
    assert back["scheduler"] == states["scheduler"]

    fresh, fresh_optimizer, fresh_scheduler = trained()  # restoring in place gives the saved values back
    fresh.load_state_dict(back["model"])
    fresh_optimizer.load_state_dict(back["optimizer"])
    fresh_scheduler.load_state_dict(back["scheduler"])
    assert fresh_scheduler.get_last_lr() == scheduler.get_last_lr()


def test_a_checkpoint_taken_then_written_later_holds_the_step_it_was_taken_at(tmp_path):
    """The write runs on a thread while training goes on (ray_jobs.train.checkpoint.Pending): what it writes is the
    copy taken at the step, not the live tensors the next optimizer steps change in place."""
    import torch

    from ray_jobs.train.checkpoint import RunIdentity, TrainState, _copied, live_storages, read, write

    model, optimizer, scheduler = trained()
    live = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict()}
    taken = _copied(live, live_storages(model, optimizer))  # on the CPU every tensor here is a live one
    at_step = {k: v.clone() for k, v in model.state_dict().items()}
    moments = {k: {n: v.clone() for n, v in m.items()} for k, m in optimizer.state_dict()["state"].items()}
    for _ in range(3):  # training goes on before the write
        model(torch.randn(5, 4)).sum().backward()
        optimizer.step()
        scheduler.step()
    assert not torch.equal(model.state_dict()["0.weight"], at_step["0.weight"]), "training changed the live weights"
    identity = RunIdentity.of(SPEC, "vision")
    write(tmp_path, taken, TrainState(step=1), identity)
    back, state = read(tmp_path, identity)
    assert state.step == 1
    assert all(torch.equal(back["model"][k], v) for k, v in at_step.items())
    for key, names in moments.items():
        assert all(torch.equal(back["optimizer"]["state"][key][n], v) for n, v in names.items())
    assert back["optimizer"]["param_groups"] == live["optimizer"]["param_groups"]
    assert back["scheduler"]["last_epoch"] == 1 != scheduler.state_dict()["last_epoch"]


def test_a_planted_pickle_is_never_read_let_alone_run(tmp_path):
    """Issue 10: a team writes a pickle where a checkpoint goes, in its own storage, and resubmits."""
    import torch

    from ray_jobs.train.checkpoint import CheckpointRefused, RunIdentity, read

    torch.save({"model": {}, "state": _Payload(tmp_path / "ran")}, tmp_path / "train_state.pt")
    with pytest.raises(CheckpointRefused, match="no train_state.json"):
        read(tmp_path, RunIdentity.of(SPEC, "vision"))
    assert not (tmp_path / "ran").exists(), "the planted code ran"


@pytest.mark.parametrize(
    ("owner", "spec", "message"),
    [
        ("nlp", SPEC, "started by 'vision', not 'nlp'"),  # another team's run, by name and place
        ("vision", SPEC.replace(name="job2"), "another spec"),  # the same team, another spec
    ],
)
def test_a_job_resumes_only_its_own_teams_run_of_the_same_spec(tmp_path, owner, spec, message):
    from ray_jobs.train.checkpoint import CheckpointRefused, RunIdentity, TrainState, read, write

    model, optimizer, scheduler = trained()
    write(tmp_path, {"model": model.state_dict()}, TrainState(step=3), RunIdentity.of(SPEC, "vision"))
    with pytest.raises(CheckpointRefused, match=message):
        read(tmp_path, RunIdentity.of(spec, owner))


def test_a_tampered_manifest_is_refused_not_interpreted(tmp_path):
    from ray_jobs.train.checkpoint import CheckpointRefused, RunIdentity, TrainState, read, write

    identity = RunIdentity.of(SPEC, "vision")
    write(tmp_path, {"x": [1, 2]}, TrainState(), identity)
    manifest = json.loads((tmp_path / "train_state.json").read_text())
    manifest["states"] = {"dict": [["x", {"class": "os.system"}]]}
    (tmp_path / "train_state.json").write_text(json.dumps(manifest))
    with pytest.raises(CheckpointRefused, match="unknown node 'class'"):
        read(tmp_path, identity)


def test_only_what_shares_a_live_tensor_s_storage_is_copied_again():
    """What a GPU state dict hands over is already a CPU copy of its own: copied again, it cost the step time."""
    import torch

    from ray_jobs.train.checkpoint import _copied, live_storages

    model, optimizer, _ = trained()
    fresh = {name: p.detach().clone() for name, p in model.named_parameters()}  # as a GPU's state dict comes
    view = model.state_dict()["0.weight"][:1]  # a view still reads the live weights
    taken = _copied(
        {"fresh": fresh, "view": view, "steps": [s["step"] for s in optimizer.state.values()]}, live_storages(model, optimizer)
    )

    assert all(taken["fresh"][name].data_ptr() == t.data_ptr() for name, t in fresh.items())  # not copied again
    assert taken["view"].untyped_storage().data_ptr() != view.untyped_storage().data_ptr()
    assert torch.equal(taken["view"], view)
    for copied, step in zip(taken["steps"], (s["step"] for s in optimizer.state.values())):
        assert copied.untyped_storage().data_ptr() != step.untyped_storage().data_ptr() and torch.equal(copied, step)
