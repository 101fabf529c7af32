"""The service's job entrypoint (ray_jobs/submitted.py)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

from tests.paths import REPO


def test_the_driver_ends_with_its_jobs_code_and_loses_nothing_it_printed():
    """It ends without Python's teardown, which is what flushes a buffered stdout: the exit code and the last line,
    printed into a pipe's buffer, are there all the same."""
    driver = textwrap.dedent("""
        from ray_jobs.submitted import exit_now
        print("the last line")  # a pipe: block-buffered, not yet written
        exit_now(3)
    """)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    done = subprocess.run([sys.executable, "-c", driver], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 3, done.stderr
    assert done.stdout == "the last line\n"
