"""bench/code_ab_7b.sh checks what it is asked to run before a device call builds anything."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.paths import REPO


def check_only(runs: str | None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "CHECK_ONLY": "1", "PY": sys.executable, "BEFORE": str(REPO)}
    env.pop("RUNS", None)
    if runs is not None:
        env["RUNS"] = runs
    return subprocess.run(["bash", "bench/code_ab_7b.sh"], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)


def test_the_default_runs_and_a_later_calls_pair_are_accepted():
    for runs in (None, "before-2 after-2"):
        done = check_only(runs)
        assert done.returncode == 0, done.stderr


def test_a_run_that_is_none_of_cold_before_or_after_is_named_and_refused():
    done = check_only("before-2 warm-3")
    assert done.returncode == 2 and "RUNS: warm-3 is none of cold, before-N, after-N" in done.stderr
