"""Fixtures of the training worker's tests."""

from __future__ import annotations

import pytest

from ray_jobs.train.model import COMPILE_CACHE_ENV, TRITON_CACHE_ENV


@pytest.fixture
def own_caches(tmp_path, monkeypatch):
    """This test's node cache; torch's cache variables restored after (the code under test sets them)."""
    monkeypatch.setenv("RAYFT_CACHE_DIR", str(tmp_path / "node-cache"))
    monkeypatch.delenv(COMPILE_CACHE_ENV, raising=False)
    monkeypatch.delenv(TRITON_CACHE_ENV, raising=False)
    return tmp_path / "node-cache"
