"""The driver's forwarder (``ray_jobs.events.fit_while_forwarding``) on a real Ray queue: every event the fit
caused reaches the sink in order, and the forwarder returns when the fit does, not at a poll's timeout."""

from __future__ import annotations

import threading

import pytest

from ray_jobs.events import Fitted, fit_while_forwarding
from rayft_contract.events import Event

pytestmark = pytest.mark.integration


class CountedQueue:
    """The driver's ``ray.util.queue.Queue``, counting the ``get`` calls that found nothing in time."""

    def __init__(self):
        from ray.util.queue import Queue

        self.queue, self.timeouts = Queue(), 0

    def put(self, item):
        self.queue.put(item)

    def empty(self):
        return self.queue.empty()

    def get(self, timeout):
        from ray.util.queue import Empty

        try:
            return self.queue.get(timeout=timeout)
        except Empty:
            self.timeouts += 1
            raise


def test_the_forwarder_passes_every_event_on_in_order_and_ends_with_the_fit_not_at_a_timeout(ray_cluster):
    queue, seen, all_seen = CountedQueue(), [], threading.Event()
    sent = [Event("progress", {"step": step}) for step in range(1, 6)]

    def sink(event):
        seen.append(event)
        if len(seen) == len(sent):
            all_seen.set()

    def fit():
        for event in sent:
            queue.put(event)
        # The fit returns only once the forwarder has passed everything on, so it is waiting on the queue when
        # the fit ends: a forwarder that polled would wait out a timeout here, one with the end mark does not.
        assert all_seen.wait(timeout=60)
        return Fitted(None, checkpoint="ckpt")

    result = fit_while_forwarding(fit, queue, sink)
    assert result.checkpoint == "ckpt" and result.error is None
    assert [e.data["step"] for e in seen] == [1, 2, 3, 4, 5]
    assert queue.timeouts == 0
    assert queue.empty(), "the end mark was taken off too"
    queue.queue.shutdown()
