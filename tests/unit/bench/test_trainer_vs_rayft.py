"""bench/trainer_vs_rayft.sh checks rayft's spec before it builds the 7B model or runs the Trainer: a preset the spec
refuses costs seconds, not a GPU call."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.paths import REPO


def check_only(**env: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "CHECK_ONLY": "1", "PY": sys.executable, **env}
    return subprocess.run(["bash", "bench/trainer_vs_rayft.sh"], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)


def test_the_comparison_runs_a_preset_the_job_accepts():
    done = check_only()
    assert done.returncode == 0, done.stderr


def test_a_preset_the_spec_refuses_stops_the_comparison_before_it_builds_anything(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: bad\ntrain:\n  lerning_rate: 1.0\n")
    done = check_only(PRESET=str(bad))
    assert done.returncode != 0 and "learning_rate" in done.stderr
