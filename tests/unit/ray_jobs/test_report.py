"""The job's reporter keeps every event until the service takes it (ray_jobs/report.py)."""

from __future__ import annotations

import signal
import subprocess
import sys
import tempfile
import threading

import pytest

from ray_jobs.report import Spool


@pytest.fixture
def temp_dir(tmp_path, monkeypatch):
    """The temp dir the spool is made in, empty to start with."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    return tmp_path


def test_the_spool_hands_over_every_event_in_order_while_it_is_written_and_then_ends(temp_dir):
    spool = Spool("ft-test")
    received: list[bytes] = []
    reader = threading.Thread(target=lambda: received.extend(spool))
    reader.start()
    sent = [f"event {i}".encode() + bytes([0, 10, 255]) for i in range(500)]  # binary, newlines included
    for message in sent:
        spool.put(message)
    spool.close()
    reader.join(timeout=60)
    assert not reader.is_alive() and received == sent
    assert spool.size > 0  # on disk, not in memory
    assert list(temp_dir.iterdir()) == []  # with no name there for another process to open
    spool.remove()


def test_a_spool_read_after_the_fact_still_has_everything(temp_dir):
    spool = Spool("ft-test")
    for i in range(3):
        spool.put(bytes([i]))
    spool.close()
    assert list(spool) == [b"\x00", b"\x01", b"\x02"]
    spool.remove()


KILLED_DRIVER = """
import os, signal, sys
from ray_jobs.report import Spool
spool = Spool("ft-killed")
spool.put(b"an event the service never took")
print(spool.size, flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_a_driver_killed_with_events_still_spooled_leaves_nothing_in_the_temp_dir(tmp_path):
    """A stopped job's driver is killed: whatever it had not sent goes with it, and no file stays behind."""
    import os

    ended = subprocess.run(
        [sys.executable, "-c", KILLED_DRIVER],
        env=os.environ | {"TMPDIR": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert ended.returncode == -signal.SIGKILL, ended.stderr[-2000:]
    assert int(ended.stdout) > 0  # the event was on disk when the driver died
    assert list(tmp_path.iterdir()) == []
