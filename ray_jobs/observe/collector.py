"""Python's cyclic garbage collector, kept out of the steps and counted in each step's record.

A training worker holds about half a million objects the collector tracks once it has imported torch, transformers,
PEFT and Ray (559,008 on the 2-core machine, with a one-layer model; a 7B base, Liger, Triton and inductor's compiles add
more). Python collects its oldest generation whenever the objects that survived since the last full collection reach a
quarter of the long-lived ones. A full collection walks every tracked object and holds the GIL, so the thread that
launches the GPU's kernels stops and the GPU drains. Measured on the 7B preset on an H100 (``bench/gc_7b.sh``, two
calls, ``bench/RESULTS.md``): each of the four runs with Python's collector as it is had one full collection inside a
step, 0.33-0.36 s in steady steps 7 and 9 of the cold runs (those steps 0.4-0.5 s longer than their neighbours) and
0.37-0.42 s in the first step of the warm ones. With the start-up frozen there was none in any of the four runs' 48
steps, and every run's loss was the same to the last digit. It comes early, from the start-up's survivors: a 30-step run
with Python's collector had one, in step 7 (0.44 s), and none after. Under DDP one rank's pause stalls every rank.

So the loop freezes its start-up (:func:`gc.freeze`: every object alive once the job is set up moves to a generation
the collector never walks; the model, the imports and the compiled kernels live as long as the job does) and the
collector walks only what the steps allocate. Collection stays on: cycles the steps make are still freed. At the end,
whatever ended the steps, the frozen objects are given back to the collector (:meth:`Collector.close`): a process that
goes on after its job (a warm worker's actor until the pool stops it, a test's) frees what of the job is left in cycles.

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
    GIL, so the step's thread waits whichever thread triggered it); with ``freeze``, what is alive now frozen until
    :meth:`close` (:meth:`for_steps` freezes unless ``RAYFT_GC=auto``)."""

    def __init__(self, freeze: bool):
        self.seconds, self.full = 0.0, 0
        self._began: float | None = None
        self.froze = 0
        """How many objects the freeze took out of the collector's view (0: none frozen)."""
        self._thaw = freeze and gc.get_freeze_count() == 0
        """Whether :meth:`close` unfreezes: not where the process had frozen objects of its own before (``gc.unfreeze``
        gives back every frozen object, not only ours)."""
        began = time.perf_counter()
        if freeze:
            gc.collect()  # the start-up's own garbage first: a frozen cycle would never be freed until close()
            before = gc.get_freeze_count()
            gc.freeze()
            self.froze = gc.get_freeze_count() - before
        self.freeze_s = time.perf_counter() - began
        """What the freeze cost, before the first step: one full collection (0 without a freeze)."""
        gc.callbacks.append(self._observe)

    @classmethod
    def for_steps(cls) -> Collector:
        """Called once the job is set up, before its first step."""
        collector = cls(freeze=os.environ.get(ENV, "freeze") != "auto")
        frozen = (
            f"its start-up frozen ({collector.froze:,} objects, after a full collection of {collector.freeze_s:.2f} s)"
            if collector.froze
            else f"as Python leaves it ({ENV}=auto)"
        )
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
