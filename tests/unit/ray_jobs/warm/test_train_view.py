"""ray_jobs.warm.train_view: Ray Train's state tracking, which the Train view reads, is on unless the operator says
otherwise; with it off no run is recorded (the records themselves: tests/integration/test_warm_pool.py and
service/test_jobs.py, read back from the dashboard)."""

from __future__ import annotations

import os

from ray_jobs.warm import train_view


def test_state_tracking_is_on_unless_the_operator_turned_it_off(monkeypatch, tiny_spec):
    monkeypatch.delenv(train_view.TRACKING_ENV, raising=False)
    assert train_view.tracking_on()
    assert os.environ[train_view.TRACKING_ENV] == "1", "set for Ray Train's controller too"
    monkeypatch.setenv(train_view.TRACKING_ENV, "0")
    assert not train_view.tracking_on()
    # Off: nothing is asked of Ray (no worker, no state actor; this process has no cluster), and the job goes on.
    assert train_view.open_run(tiny_spec, "team-a", worker=None, place=None, datasets={}, checkpoints=None) is None
    train_view.end_run(None, None)
