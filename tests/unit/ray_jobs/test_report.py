"""The job's reporter keeps every event until the service takes it (ray_jobs/report.py)."""

from __future__ import annotations

import threading

from ray_jobs.report import Spool


def test_the_spool_hands_over_every_event_in_order_while_it_is_written_and_then_ends():
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
    assert spool.path.stat().st_size > 0  # on disk, not in memory
    spool.remove()
    assert not spool.dir.exists()


def test_a_spool_read_after_the_fact_still_has_everything():
    spool = Spool("ft-test")
    for i in range(3):
        spool.put(bytes([i]))
    spool.close()
    assert list(spool) == [b"\x00", b"\x01", b"\x02"]
    spool.remove()
