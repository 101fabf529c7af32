"""Throughput between reports: one meter, read by the train loop at each report.

The loop wraps its phases in ``meter.phase("data")`` / ``meter.phase("compute")`` and counts what
each step trained with ``meter.add``; ``meter.window()`` returns rates since the last window.
Host clocks: time blocked waiting for data is exact; GPU compute is measured up to the
synchronisation that the loss all-reduce forces at each step.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager


class StepMeter:
    def __init__(self) -> None:
        self._start = time.perf_counter()
        self._phases: dict[str, float] = defaultdict(float)
        self._tokens = self._samples = self._steps = 0

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self._phases[name] += time.perf_counter() - t0

    def add(self, tokens: int, samples: int) -> None:
        """One optimizer step over ``tokens`` real (non-padding) tokens and ``samples`` examples (all workers)."""
        self._tokens += tokens
        self._samples += samples
        self._steps += 1

    def window(self) -> dict[str, float]:
        """Rates since the previous call, then start a new window."""
        now = time.perf_counter()
        elapsed = max(now - self._start, 1e-9)
        stats = {
            "tokens_per_s": self._tokens / elapsed,
            "samples_per_s": self._samples / elapsed,
            "step_time_s": elapsed / max(self._steps, 1),
            "data_wait_frac": self._phases["data"] / elapsed,
        }
        self.__init__()  # type: ignore[misc]
        return stats
