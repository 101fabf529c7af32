"""Ray Train's settings, which every job's driver sets on any cluster (ray_jobs.local_ray.train_settings)."""

from __future__ import annotations

import os

from ray_jobs.local_ray import train_settings


def test_a_driver_polls_its_workers_every_quarter_second_unless_the_cluster_says_otherwise(monkeypatch):
    monkeypatch.delenv("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", raising=False)
    monkeypatch.setenv("RAY_TRAIN_V2_ENABLED", "")  # empty: Ray would silently pick Train V1
    train_settings()
    assert os.environ["RAY_TRAIN_HEALTH_CHECK_INTERVAL_S"] == "0.25" and os.environ["RAY_TRAIN_V2_ENABLED"] == "1"
    monkeypatch.setenv("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "0.5")  # rayft's KubeRay pods
    train_settings()
    assert os.environ["RAY_TRAIN_HEALTH_CHECK_INTERVAL_S"] == "0.5"
