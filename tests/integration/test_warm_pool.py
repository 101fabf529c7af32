"""The warm pool (``RAYFT_WARM_WORKERS``) on the session's Ray cluster, with the tiny model on one CPU worker."""

from __future__ import annotations

import dataclasses
import json
import re
import time

import pytest

from ray_jobs.chaos import Chaos
from ray_jobs.data.quality import DataQualityError
from ray_jobs.run import run
from ray_jobs.tiny import write_dataset_with_bad_rows
from ray_jobs.warm.control import state_of, until_ready
from ray_jobs.warm.pool import running_pool
from tests.integration.dashboard import train_view_runs

pytestmark = pytest.mark.integration

LOADED_BEFORE = r", its base loaded before the job \(\d+\.\d s\)$"
"""The summary's worker line for a base the worker loaded before its job, with the seconds the load took."""


@pytest.fixture
def warm_pool_on(ray_cluster, monkeypatch):
    """The operator's setting, as the service passes it to every job; the pool (and its workers) ends with the test."""
    import ray

    monkeypatch.setenv("RAYFT_WARM_WORKERS", "1")
    yield
    if (pool := running_pool()) is not None:
        ray.kill(pool)  # its workers are its own: they go with it
    deadline = time.monotonic() + 60
    while running_pool() is not None:  # the name is free again before the next test makes a pool of its own
        assert time.monotonic() < deadline, "the killed pool kept its name for 60 s"
        time.sleep(0.5)


def _losses(events) -> dict[int, float]:
    return {e.data["step"]: e.data["loss"] for e in events if e.kind == "progress"}


def test_a_one_worker_job_takes_the_worker_the_job_before_left_warm_ray_train_resumes_its_failure_and_other_jobs_stand_the_pool_down(
    warm_pool_on, tiny_spec
):
    """Job 1 finds the pool empty: Ray Train runs it, and the pool stands down while it does. Once it ended,
    the pool starts a worker, which loads job 1's base ahead. Job 2 (same recipe, another name) takes that worker
    and that base; it fails at step 6, and Ray Train resumes from the checkpoint the warm worker wrote at step 4.
    At every step both jobs have the same loss.

    Then the pool's life goes on (one pool: each worker it starts costs its imports, about 15 s here). The pool
    never keeps a job waiting: a job that takes no warm worker (here one of two DDP workers) stops the idle ones
    first, and no new one starts until that job's queue is gone, its end."""
    import ray
    from ray.util.queue import Queue

    from ray_jobs.warm import pool as warm_pool

    spec = tiny_spec.replace(
        scaling=dataclasses.replace(tiny_spec.scaling, num_workers=1),
        train=dataclasses.replace(tiny_spec.train, max_steps=8, checkpoint_every=4, log_every=1, eval_every=None),
        data=dataclasses.replace(tiny_spec.data, val_fraction=0.0),
    )
    cold_events, events = [], []
    cold = run(spec.replace(name="warm-1"), on_event=cold_events.append).summary
    assert cold.worker == "Ray Train's, started for this job" and cold.restarts == 0
    pool = running_pool()
    state = until_ready(pool, 300.0)
    assert state.lent_in_all == 0 and state.standing_down_for == 0, state

    result = run(spec.replace(name="warm-2"), on_event=events.append, chaos=Chaos(fail_at_step=6))
    summary = result.summary

    kinds = [e.kind for e in events]
    assert kinds.count("failure") == 1 and summary.restarts == 1
    cut = kinds.index("failure")
    assert "injected failure at step 6 on rank 0" in json.dumps(events[cut].data)
    before = [e.data for e in events[:cut] if e.kind == "progress"]
    after = [e.data for e in events[cut:] if e.kind == "progress"]
    assert [p["step"] for p in before] == [1, 2, 3, 4, 5]
    warm_worker = before[0]["facts"]["worker"]
    assert warm_worker.startswith("warm: started ") and re.search(LOADED_BEFORE, warm_worker), warm_worker
    assert all(p["facts"]["worker"] == warm_worker for p in before)
    assert [p["step"] for p in after] == [5, 6, 7, 8], "Ray Train resumed from the warm worker's step-4 checkpoint"
    assert summary.worker == "Ray Train's, started for this job" and summary.steps == 8
    assert (result.local_dir / "adapter" / "adapter_model.safetensors").is_file()
    warm_checkpoints = sorted(p.name for p in (result.local_dir / "warm-2" / "warm").iterdir())
    assert warm_checkpoints == ["checkpoint_00000004"], "step 8's checkpoint was Ray Train's"
    cold_losses, warm_losses = _losses(cold_events), {p["step"]: p["loss"] for p in before + after}
    assert warm_losses == pytest.approx(cold_losses, rel=1e-5), "the warm worker trains as Ray Train's does"

    state = state_of(pool)
    assert state.lent_in_all == 1 and state.lent == 0, state

    # Job 2 is over: its replacement starts (the pool's second worker).
    assert until_ready(pool, 300.0).started == 2
    two_workers = Queue()
    assert warm_pool.take(tiny_spec, two_workers) is None, "a two-worker job runs on Ray Train"
    state = state_of(pool)
    assert state.idle == 0 and state.standing_down_for == 1, state
    time.sleep(3 * warm_pool.WarmPool.CHECK_S)  # the pool looks every CHECK_S: it must not start one meanwhile
    assert state_of(pool).started == 2, "nothing started while that job holds its resources"
    ray.kill(two_workers.actor)  # the job ended
    assert until_ready(pool, 300.0).started == 3

    lent = Queue()
    lease = warm_pool.take(spec, lent)
    assert lease is not None and state_of(pool).lent == 1
    lease.end()
    ray.kill(lent.actor)


def test_an_operator_primed_pool_gives_the_first_job_a_worker_holding_its_base_and_status_and_stop_say_so(
    warm_pool_on, tiny_spec, capsys
):
    """``rayft warm start`` before any job (here its function; the CLI's checks are unit-tested): the first job of that
    shape takes a warm worker that loaded its base ahead, where the test above shows a first job on an unprimed pool
    running on Ray Train. ``rayft warm status`` names the base; ``rayft warm stop`` ends the pool and its workers."""

    from ray_jobs.warm import control as warm_control
    from rayft.cli import main

    spec = tiny_spec.replace(
        scaling=dataclasses.replace(tiny_spec.scaling, num_workers=1),
        train=dataclasses.replace(tiny_spec.train, max_steps=2, log_every=1, eval_every=None),
        data=dataclasses.replace(tiny_spec.data, val_fraction=0.0),
    )
    pool = warm_control.prime(spec)
    state = until_ready(pool, 300.0)
    assert state.base == spec.model.path and state.lent_in_all == 0, state

    summary = run(spec.replace(name="primed")).summary
    assert summary.worker.startswith("warm: ") and re.search(LOADED_BEFORE, summary.worker), summary.worker
    assert summary.steps == 2 and state_of(pool).lent_in_all == 1

    assert main(["warm", "status", "--address", "auto"]) == 0
    assert f"base {spec.model.path}" in capsys.readouterr().out
    assert main(["warm", "stop", "--address", "auto"]) == 0
    assert "stopped" in capsys.readouterr().out
    deadline = time.monotonic() + 60
    while running_pool() is not None:
        assert time.monotonic() < deadline, "the stopped pool kept its name for 60 s"
        time.sleep(0.5)


def _live_warm_workers() -> int:
    """WarmWorker actors not dead: alive, or still in their ``__init__`` (pending creation)."""
    from ray.util.state import list_actors

    return len(list_actors(filters=[("class_name", "=", "WarmWorker"), ("state", "!=", "DEAD")]))


def test_a_one_worker_job_trains_in_its_own_worker_started_at_connect_as_ray_train_would_and_stops_it_when_done(
    ray_cluster, tiny_spec, monkeypatch, tmp_path
):
    """``RAYFT_EARLY_WORKER=1`` (one-GPU jobs get it by default; here a CPU job): the worker imports and loads the base
    while the driver prepares the data, then runs the loop. Its losses are Ray Train's at every step; a failure resumes
    on Ray Train from its checkpoint; the worker is stopped with its job, and with a job that fails before training."""
    spec = tiny_spec.replace(
        scaling=dataclasses.replace(tiny_spec.scaling, num_workers=1),
        train=dataclasses.replace(tiny_spec.train, max_steps=8, checkpoint_every=4, log_every=1, eval_every=None),
        data=dataclasses.replace(tiny_spec.data, val_fraction=0.0),
    )
    monkeypatch.setenv("RAYFT_EARLY_WORKER", "0")
    ray_train_events, events = [], []
    assert (
        run(spec.replace(name="early-0"), on_event=ray_train_events.append).summary.worker == "Ray Train's, started for this job"
    )

    monkeypatch.setenv("RAYFT_EARLY_WORKER", "1")
    summary = run(spec.replace(name="early-1"), on_event=events.append, chaos=Chaos(fail_at_step=6)).summary
    kinds = [e.kind for e in events]
    cut = kinds.index("failure")
    before = [e.data for e in events[:cut] if e.kind == "progress"]
    after = [e.data for e in events[cut:] if e.kind == "progress"]
    worker = before[0]["facts"]["worker"]
    assert worker.startswith("early: the job's own, started at its connect"), worker
    assert re.search(LOADED_BEFORE, worker), "the base was loaded beside the data's preparation"
    assert [p["step"] for p in after] == [5, 6, 7, 8] and summary.worker == "Ray Train's, started for this job"
    assert {p["step"]: p["loss"] for p in before + after} == pytest.approx(_losses(ray_train_events), rel=1e-5)
    assert summary.restarts == 1 and _live_warm_workers() == 0
    # The dashboard's Train view lists the early worker's run as it lists Ray Train's: ERRORED with the injected
    # failure and its one worker, then Ray Train's run that resumed it.
    (ray_train,) = train_view_runs(ray_cluster, "early-0")  # a local run's name is the spec's
    early, resumed = train_view_runs(ray_cluster, "early-1")
    assert ray_train["status"] == resumed["status"] == "FINISHED" and early["status"] == "ERRORED", (early, resumed)
    assert "injected failure at step 6" in early["status_detail"] and early["job_id"] == ray_train["job_id"]
    (attempt,) = early["attempts"]
    assert attempt["status"] == "ERRORED" and [w["world_rank"] for w in attempt["workers"]] == [0]

    path = tmp_path / "mixed.jsonl"
    write_dataset_with_bad_rows(path, rows=200, bad=20)  # 10%: the fill fails, after the worker started
    bad = spec.replace(name="early-bad", data=dataclasses.replace(spec.data, path=str(path)))
    with pytest.raises(DataQualityError):
        run(bad)
    assert _live_warm_workers() == 0, "the early worker of a job that failed before training was stopped"
