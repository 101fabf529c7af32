"""Python's cyclic garbage collector, kept out of the steps and counted in each step's record.

A training worker holds about half a million objects the collector tracks once it has imported torch, transformers,
PEFT and Ray (559,008 on the 2-core machine, with a one-layer model; a 7B base, Liger, Triton and inductor's compiles add
more). Python collects its oldest generation whenever the objects that survived since the last full collection reach a
quarter of the long-lived ones. A full collection walks every tracked object: 227 ms on that machine, longer with a 7B
model's modules, and it holds the GIL, so the thread that launches the GPU's kernels stops and the GPU drains. Which step
it falls in follows the count of allocations, so it lands on the same step of the same job every time: step 8 of 12 in
two H100 runs on the same batches (3.72 s and 4.24 s against 3.35-3.46 s, all of it inside forward and backward), and
two steps in each 90-step H200 run (``bench/RESULTS.md``). Under DDP one rank's pause stalls every rank's all-reduce.

So the loop freezes its start-up (:func:`gc.freeze`: every object alive once the job is set up moves to a generation
the collector never walks; the model, the imports and the compiled kernels live as long as the job does) and the
collector walks only what the steps allocate. Collection stays on: cycles the steps make are still freed. At the end
the frozen objects are given back to the collector (:meth:`Collector.close`), so a warm worker's process, which runs
the next job (``ray_jobs.warm.pool``), frees whatever of this job's is left in cycles.

torchtitan does the same thing another way (``gc.disable()`` and a young-generation collection every ``gc_freq``
steps); a freeze keeps Python's own schedule for the young generations and leaves nothing to tune.

``RAYFT_GC=auto`` leaves Python's collector as it is: the baseline of ``bench/gc_7b.sh``'s comparison. Any other value,
or none, freezes.
"""

from __future__ import annotations

import gc
import logging
import os
import time
from typing import Any

log = logging.getLogger(__name__)
ENV = "RAYFT_GC"


class Collector:
    """The collector's time and its full collections since the last :meth:`take`, in any thread (a collection holds the
    GIL, so the step's thread waits whichever thread triggered it); the start-up frozen if :func:`frozen` says so."""

    def __init__(self, freeze: bool):
        self.seconds, self.full = 0.0, 0
        self._began: float | None = None
        self.froze = 0
        """How many objects the freeze took out of the collector's view (0: none frozen)."""
        self._thaw = freeze and gc.get_freeze_count() == 0
        """Whether :meth:`close` unfreezes: not where the process had frozen objects of its own before (``gc.unfreeze``
        gives back every frozen object, not only ours)."""
        if freeze:
            gc.collect()  # the start-up's own garbage first: a frozen cycle would never be freed until close()
            before = gc.get_freeze_count()
            gc.freeze()
            self.froze = gc.get_freeze_count() - before
        gc.callbacks.append(self._observe)

    @classmethod
    def for_steps(cls) -> Collector:
        """Called once the job is set up, before its first step."""
        collector = cls(freeze=os.environ.get(ENV, "freeze") != "auto")
        frozen = f"its start-up frozen ({collector.froze:,} objects)" if collector.froze else f"as Python leaves it ({ENV}=auto)"
        log.info("garbage collector for the steps: %s", frozen)
        return collector

    def _observe(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._began = time.perf_counter()
        elif self._began is not None:
            self.seconds += time.perf_counter() - self._began
            self.full += info["generation"] == 2
            self._began = None

    def take(self) -> tuple[float, int]:
        """Seconds collecting and full collections since the last call."""
        taken, (self.seconds, self.full) = (self.seconds, self.full), (0.0, 0)
        return taken

    def close(self) -> None:
        """Stop counting; give the frozen objects back to the collector, and free what of them is garbage now."""
        if self._observe in gc.callbacks:
            gc.callbacks.remove(self._observe)
        if self._thaw:
            gc.unfreeze()
            gc.collect()
            self._thaw, self.froze = False, 0
